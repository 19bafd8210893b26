#!/usr/bin/env bash
# Installs what the operator console's browser test (tests/tests/console.rs)
# needs and prints the environment it reads:
#
#   eval "$(.ci/console.sh)"      # then: cargo nextest run --test console
#
#   BELAY_CHROMIUM              Debian's chromium (`apt-get install chromium`)
#   BELAY_CONSOLE_NODE_MODULES  node_modules with playwright-core and axe-core,
#                               from tests/console/package-lock.json (npm ci),
#                               in ~/.cache/belay-console/<lock hash>
#
# playwright-core never downloads a browser (`playwright install` is never
# run): it drives the system's Chromium. Idempotent: a second run installs
# nothing. Concurrent runs wait for each other (a lock on the cache,
# .ci/lib/install.sh); node_modules is built in a temporary folder and
# renamed into place, so a folder that exists is complete. Everything but
# the `export` lines goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
dir="${BELAY_CONSOLE_CACHE:-$HOME/.cache/belay-console}"
# shellcheck source=lib/install.sh
source .ci/lib/install.sh
lock_cache "$dir"

chromium=/usr/bin/chromium
[[ -x "$chromium" ]] || apt_install chromium fonts-liberation
need_node_and_python

lock="$repo/tests/console/package-lock.json"
hash="$(cat "$repo/tests/console/package.json" "$lock" | sha256sum | cut -c1-16)"
built="$dir/$hash"
if [[ ! -f "$built/.complete" ]]; then
  echo "installing playwright-core and axe-core into $built" >&2
  tmp="$built.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  cp "$repo/tests/console/package.json" "$lock" "$tmp/"
  (cd "$tmp" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error) >&2
  : >"$tmp/.complete"
  rm -rf "$built"
  mv -T "$tmp" "$built"
  # Builds of older lock files are not needed any more.
  find "$dir" -mindepth 1 -maxdepth 1 -type d ! -name "$hash" ! -name '*.tmp.*' -exec rm -rf {} + 2>/dev/null || true
fi

printf 'export BELAY_CHROMIUM=%q\n' "$chromium"
printf 'export BELAY_CONSOLE_NODE_MODULES=%q\n' "$built/node_modules"
