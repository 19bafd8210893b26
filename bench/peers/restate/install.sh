#!/usr/bin/env bash
# Installs Restate for `belay-bench --peer restate`: its server (the npm
# package @restatedev/restate-server carries the binary) and TypeScript SDK,
# at the versions package-lock.json pins, into
# ~/.cache/belay-peers/restate/<lock hash> (BELAY_PEERS_CACHE to move it),
# and prints the environment the bench reads:
#
#   BELAY_RESTATE_SERVER  the restate-server binary
#   BELAY_RESTATE_DIR     a folder with service.mjs and drive.mjs (copied
#                         from here, so they find its node_modules)
#
# Idempotent and safe to run several times at once (a lock on the cache;
# node_modules is built beside its place and renamed into it). Everything
# but the `export` lines goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../../../.ci/lib/install.sh
source "$here/../../../.ci/lib/install.sh"
dir="${BELAY_PEERS_CACHE:-$HOME/.cache/belay-peers}/restate"
lock_cache "$dir"
need_node_and_python

files=(package.json package-lock.json polyfill.mjs service.mjs drive.mjs)
hash="$(cd "$here" && cat "${files[@]}" | sha256sum | cut -c1-16)"
built="$dir/$hash"
if [[ ! -f "$built/.complete" ]]; then
  echo "installing Restate (server and TypeScript SDK) into $built" >&2
  tmp="$built.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  (cd "$here" && cp "${files[@]}" "$tmp/")
  (cd "$tmp" && npm ci --no-audit --no-fund --loglevel=error) >&2
  : >"$tmp/.complete"
  rm -rf "$built"
  mv -T "$tmp" "$built"
  # Builds of older versions are not needed any more.
  find "$dir" -mindepth 1 -maxdepth 1 -type d ! -name "$hash" ! -name '*.tmp.*' -exec rm -rf {} + 2>/dev/null || true
fi
server="$built/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
[[ -x "$server" ]] || { echo "restate-server is not at $server (not linux-x64?)" >&2; exit 1; }
printf 'export BELAY_RESTATE_SERVER=%q\n' "$server"
printf 'export BELAY_RESTATE_DIR=%q\n' "$built"
