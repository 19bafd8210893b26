#!/usr/bin/env bash
# Installs the real, unmodified MCP servers that the worker's MCP tests run
# against, from their registries, into a cache outside the clone, and prints
# the environment the tests read. Idempotent: a second run with the same pins
# installs nothing.
#
#   eval "$(.ci/mcp-servers.sh)"      # then: cargo nextest run -p belay-worker mcp
#
# Everything but the `export` lines goes to stderr.
set -euo pipefail

# Pinned versions (bump together with the assertions in worker/tests/mcp.rs).
EVERYTHING_VERSION=2026.8.31 # npm @modelcontextprotocol/server-everything
TIME_VERSION=2026.10.19      # PyPI mcp-server-time
MCP_VERSION=2.3.0            # PyPI mcp (the Python SDK: a standard MCP client)

dir="${BELAY_MCP_CACHE:-$HOME/.cache/belay-mcp}"
# shellcheck source=lib/install.sh
source "$(dirname "$0")/lib/install.sh"
lock_cache "$dir"

npm_dir="$dir/npm"
npm_install_atomically "$npm_dir" ".installed-$EVERYTHING_VERSION" \
  "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION"
[[ -x "$npm_dir/node_modules/.bin/mcp-server-everything" ]] ||
  { echo "mcp-server-everything is missing from $npm_dir" >&2; exit 1; }

venv="$dir/venv"
venv_install "$venv" "$venv/.installed-time-$TIME_VERSION-mcp-$MCP_VERSION" \
  "mcp-server-time==$TIME_VERSION" "mcp==$MCP_VERSION"

printf 'export BELAY_MCP_EVERYTHING=%q\n' "$npm_dir/node_modules/.bin/mcp-server-everything"
printf 'export BELAY_MCP_TIME=%q\n' "$venv/bin/mcp-server-time"
printf 'export BELAY_MCP_PYTHON=%q\n' "$venv/bin/python"
