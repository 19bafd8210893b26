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
mkdir -p "$dir"

# Node and Python come with the machine image; install them from Debian if a
# machine lacks them.
if ! command -v npm >/dev/null 2>&1 || ! command -v python3 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "installing nodejs, npm and python3 from Debian" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm python3 python3-venv >&2
  fi
fi

npm_dir="$dir/npm"
npm_stamp="$npm_dir/.installed-$EVERYTHING_VERSION"
if [[ ! -f "$npm_stamp" || ! -x "$npm_dir/node_modules/.bin/mcp-server-everything" ]]; then
  command -v npm >/dev/null 2>&1 || { echo "npm is needed to install @modelcontextprotocol/server-everything" >&2; exit 1; }
  echo "installing @modelcontextprotocol/server-everything@$EVERYTHING_VERSION into $npm_dir" >&2
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-everything@$EVERYTHING_VERSION" >&2
  rm -f "$npm_dir"/.installed-*
  touch "$npm_stamp"
fi

venv="$dir/venv"
py_stamp="$venv/.installed-time-$TIME_VERSION-mcp-$MCP_VERSION"
if [[ ! -f "$py_stamp" || ! -x "$venv/bin/mcp-server-time" ]]; then
  python="$(command -v python3 || true)"
  [[ -n "$python" ]] || { echo "python3 is needed to install mcp-server-time" >&2; exit 1; }
  echo "installing mcp-server-time==$TIME_VERSION and mcp==$MCP_VERSION into $venv" >&2
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "mcp-server-time==$TIME_VERSION" "mcp==$MCP_VERSION" >&2
  rm -f "$venv"/.installed-*
  touch "$py_stamp"
fi

printf 'export BELAY_MCP_EVERYTHING=%q\n' "$npm_dir/node_modules/.bin/mcp-server-everything"
printf 'export BELAY_MCP_TIME=%q\n' "$venv/bin/mcp-server-time"
printf 'export BELAY_MCP_PYTHON=%q\n' "$venv/bin/python"
