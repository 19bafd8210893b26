#!/usr/bin/env bash
# Installs what the trace test's OTLP/gRPC receiver (tests/otlp/receiver.py)
# needs, from PyPI, into a virtualenv in a cache outside the clone, and
# prints the environment the test reads. Idempotent: a second run with the
# same pins installs nothing; safe to run several times at once.
#
#   eval "$(.ci/otlp-receiver.sh)"     # then: cargo nextest run --workspace --test traces
#
# Everything but the `export` lines goes to stderr.
set -euo pipefail

# Pinned versions (bump together with tests/otlp/receiver.py).
GRPCIO_VERSION=1.85.3
OTEL_PROTO_VERSION=1.45.2

dir="${BELAY_OTLP_CACHE:-$HOME/.cache/belay-otlp}"
# shellcheck source=lib/install.sh
source "$(dirname "$0")/lib/install.sh"
lock_cache "$dir"
venv="$dir/venv"
venv_install "$venv" "$venv/.installed-grpcio-$GRPCIO_VERSION-proto-$OTEL_PROTO_VERSION" \
  "grpcio==$GRPCIO_VERSION" "opentelemetry-proto==$OTEL_PROTO_VERSION"

printf 'export BELAY_OTLP_PYTHON=%q\n' "$venv/bin/python"
