#!/usr/bin/env bash
# buf lint and buf breaking of proto/ (proto/buf.yaml says which rules).
# Breaking changes are judged against, in this order: $BELAY_BUF_AGAINST (a
# git ref), the last release tag, the merge base with origin/main when this
# is a branch, else HEAD^ (on main: the commit before the last merge). The
# base's proto/proto is checked with today's buf.yaml (older commits have
# none).
#
#   .ci/buf.sh                     # finds or installs buf itself
#   BELAY_BUF=/path/to/buf .ci/buf.sh
#
# buf is $BELAY_BUF when set, else `buf` on PATH, else the one
# .ci/clients.sh installs (npm @bufbuild/buf, a devDependency of
# clients/typescript; the first run installs the clients' toolchains into
# ~/.cache/belay-clients, later runs find them there at once).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${BELAY_BUF:-}" ]]; then
  buf="$BELAY_BUF"
elif command -v buf >/dev/null; then
  buf=buf
else
  echo "buf.sh: BELAY_BUF is not set and buf is not on PATH; getting it from .ci/clients.sh" >&2
  buf="$(eval "$(.ci/clients.sh)" && printf '%s' "$BELAY_BUF")"
fi

"$buf" lint proto
echo "buf lint: clean" >&2

against="${BELAY_BUF_AGAINST:-}"
if [[ -z "$against" ]]; then
  against="$(git describe --tags --abbrev=0 2>/dev/null || true)"
fi
if [[ -z "$against" ]]; then
  base="$(git merge-base HEAD origin/main 2>/dev/null || true)"
  if [[ -n "$base" && "$base" != "$(git rev-parse HEAD)" ]]; then against="$base"; fi
fi
if [[ -z "$against" ]] && git rev-parse -q --verify 'HEAD^' >/dev/null; then
  against="HEAD^"
fi
if [[ -z "$against" ]]; then
  echo "buf breaking: no earlier commit to compare with (a shallow clone?); skipped" >&2
  exit 0
fi
if ! git cat-file -e "$against:proto/proto" 2>/dev/null; then
  echo "buf breaking: $against has no proto/proto; nothing to compare" >&2
  exit 0
fi
old="$(mktemp -d)"
trap 'rm -rf "$old"' EXIT
git archive "$against" proto/proto | tar -C "$old" -xf -
cp proto/buf.yaml "$old/proto/"
"$buf" breaking proto --against "$old/proto"
echo "buf breaking: no breaking change against $against" >&2
