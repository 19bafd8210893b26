#!/usr/bin/env bash
# PostgreSQL must be up on 127.0.0.1:5432 (trust auth, database `test`):
# starts the machine's local cluster when it is down, or says why not.
set -euo pipefail
pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null && exit 0
if command -v pg_lsclusters >/dev/null 2>&1; then
  version=$(pg_lsclusters --no-header | awk '{print $1; exit}')
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
fi
for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && exit 0; sleep 1; done
echo "PostgreSQL is not reachable on 127.0.0.1:5432 (trust auth, database test): start it" >&2
exit 1
