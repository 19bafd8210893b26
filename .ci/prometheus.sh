#!/usr/bin/env bash
# Installs Prometheus and promtool (Debian package `prometheus`, 2.42 on
# bookworm), which the metrics test (tests/tests/metrics.rs) runs against the
# engine's and worker's `/metrics`, and prints the environment the test
# reads. Idempotent: a second run installs nothing. The package starts no
# daemon here (no systemd); the test runs its own on 127.0.0.1.
#
#   eval "$(.ci/prometheus.sh)"      # then: cargo nextest run --test metrics
#
# Everything but the `export` lines goes to stderr.
set -euo pipefail

# shellcheck source=lib/install.sh
source "$(dirname "$0")/lib/install.sh"
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  # Without starting its service (--no-install-recommends; no systemd
  # here): the test runs its own server.
  apt_install prometheus
fi

printf 'export BELAY_PROMETHEUS=%q\n' "$(command -v prometheus)"
printf 'export BELAY_PROMTOOL=%q\n' "$(command -v promtool)"
