#!/usr/bin/env bash
# Installs what the trace test's OTLP/gRPC receiver (tests/otlp/receiver.py)
# needs, from PyPI, into a virtualenv in a cache outside the clone, and
# prints the environment the test reads. Idempotent: a second run with the
# same pins installs nothing.
#
#   eval "$(.ci/otlp-receiver.sh)"     # then: cargo nextest run --workspace --test traces
#
# Everything but the `export` lines goes to stderr.
set -euo pipefail

# Pinned versions (bump together with tests/otlp/receiver.py).
GRPCIO_VERSION=1.85.3
OTEL_PROTO_VERSION=1.45.2

dir="${BELAY_OTLP_CACHE:-$HOME/.cache/belay-otlp}"
venv="$dir/venv"
stamp="$venv/.installed-grpcio-$GRPCIO_VERSION-proto-$OTEL_PROTO_VERSION"
if [[ ! -f "$stamp" || ! -x "$venv/bin/python" ]]; then
  if ! command -v python3 >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "installing python3 from Debian" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >&2
  fi
  python="$(command -v python3 || true)"
  [[ -n "$python" ]] || { echo "python3 is needed for the OTLP receiver" >&2; exit 1; }
  echo "installing grpcio==$GRPCIO_VERSION and opentelemetry-proto==$OTEL_PROTO_VERSION into $venv" >&2
  mkdir -p "$dir"
  [[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "grpcio==$GRPCIO_VERSION" "opentelemetry-proto==$OTEL_PROTO_VERSION" >&2
  rm -f "$venv"/.installed-*
  touch "$stamp"
fi

printf 'export BELAY_OTLP_PYTHON=%q\n' "$venv/bin/python"
