#!/usr/bin/env bash
# Installs what the Python and TypeScript client suites need into a cache
# outside the clone and prints the environment tests/tests/clients.rs reads:
#
#   eval "$(.ci/clients.sh)"     # then: cargo nextest run --test clients
#
#   BELAY_CLIENTS_PYTHON  a venv's python with belay-client installed from
#                         clients/python (built: protoc runs in its hook),
#                         pytest and mypy
#   BELAY_CLIENTS_TS      a built copy of clients/typescript (node_modules
#                         from its package-lock.json, dist/ by tsc)
#   BELAY_BUF             buf (npm @bufbuild/buf, a devDependency there)
#
# Idempotent: pinned dependencies install once; each package is rebuilt only
# when its sources (or the proto) changed. Everything but the `export`
# lines goes to stderr. Concurrent runs wait for each other (flock), and a
# run killed half-way leaves no stamp (.ci/lib/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
dir="${BELAY_CLIENTS_CACHE:-$HOME/.cache/belay-clients}"
# shellcheck source=lib/install.sh
source .ci/lib/install.sh
lock_cache "$dir"

# Pinned (bump together; clients/python/pyproject.toml gives the ranges).
PY_PINS=(grpcio==1.85.1 grpcio-tools==1.85.1 protobuf==7.36.2 tenacity==9.2.1
  mypy-protobuf==5.1.0 hatchling==1.33.0 mypy==2.4.1 types-grpcio==1.85.0.20261028
  types-protobuf==7.35.1.20260906 pytest==9.2.0 pytest-asyncio==1.5.0)

need_node_and_python

# The hash of some source trees (stamps: rebuild only what changed).
tree_hash() { (cd "$repo" && find "$@" -type f ! -path '*/node_modules/*' ! -path '*/dist/*' \
  ! -path '*/src/gen/*' ! -path '*/_gen/belay/*' ! -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16; }

venv="$dir/venv"
pins_stamp="$venv/.pins-$(printf '%s\n' "${PY_PINS[@]}" | sha256sum | cut -c1-16)"
venv_install "$venv" "$pins_stamp" "${PY_PINS[@]}"
py_stamp="$venv/.package-$(tree_hash clients/python proto/proto)"
if [[ ! -f "$py_stamp" ]]; then
  echo "installing clients/python into $venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation \
    --no-deps --force-reinstall "$repo/clients/python" >&2
  rm -f "$venv"/.package-*
  stamp_done "$py_stamp"
fi

# The TypeScript package is built in a copy (node_modules stays out of the
# clone), laid out as in the repository so `buf generate ../../proto` works.
ts_root="$dir/ts"
ts="$ts_root/clients/typescript"
ts_stamp="$ts/.built-$(tree_hash clients/typescript proto)"
if [[ ! -f "$ts_stamp" ]]; then
  echo "building clients/typescript in $ts" >&2
  mkdir -p "$ts" "$ts_root/proto"
  rm -rf "$ts/src" "$ts/test" "$ts/examples" "$ts/dist" "$ts_root/proto"/*
  tar -C "$repo/clients/typescript" --exclude=node_modules --exclude=dist --exclude=src/gen -cf - . | tar -C "$ts" -xf -
  tar -C "$repo/proto" -cf - buf.yaml proto | tar -C "$ts_root/proto" -xf -
  lock_stamp="$ts/node_modules/.lock-$(sha256sum <"$ts/package-lock.json" | cut -c1-16)"
  if [[ ! -f "$lock_stamp" ]]; then
    (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error) >&2
    stamp_done "$lock_stamp"
  fi
  (cd "$ts" && npm run --silent build) >&2
  rm -f "$ts"/.built-*
  stamp_done "$ts_stamp"
fi

printf 'export BELAY_CLIENTS_PYTHON=%q\n' "$venv/bin/python"
printf 'export BELAY_CLIENTS_TS=%q\n' "$ts"
printf 'export BELAY_BUF=%q\n' "$ts/node_modules/.bin/buf"
