#!/usr/bin/env bash
# Installs what code tools (`type: sandbox`) need to run here: bubblewrap
# (Debian package `bubblewrap`), beside the machine's node and python3, and
# prints the environment worker/tests/sandbox.rs and tests/tests/sandbox.rs
# read. Idempotent; safe to run several times at once (dpkg's lock is
# waited for: .ci/lib/install.sh).
#
#   eval "$(.ci/sandbox-tools.sh)"     # then: cargo nextest run --test sandbox
#
# Everything but the `export` lines goes to stderr.
set -euo pipefail
# shellcheck source=lib/install.sh
source "$(dirname "$0")/lib/install.sh"
lock_cache "${BELAY_SANDBOX_CACHE:-$HOME/.cache/belay-sandbox}"
command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap
command -v prlimit >/dev/null 2>&1 || apt_install util-linux
need_node_and_python
printf 'export BELAY_BWRAP=%q\n' "$(command -v bwrap)"
