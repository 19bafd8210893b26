#!/usr/bin/env bash
# Smoke test of the images: runs the engine and the worker as containers
# (host network, 127.0.0.1, free ports) against PostgreSQL on the host, and
# completes the onboarding example through them: the migrations run as their
# own container (`belay-engine migrate`, as the chart's hook Job does), both
# containers must pass their image's HEALTHCHECK (`podman healthcheck run`),
# the host's `belay` registers examples/onboarding/definitions and runs the
# `onboarding` workflow (documents signal, approval) to `completed`, and
# both containers stop cleanly on SIGTERM. The example's test doubles
# (crm-server, scripted-model) run on the host.
#
#   deploy/container/smoke.sh [--bin-dir DIR] [--tag TAG] [--build]
#
#   --bin-dir  the host's belay, crm-server and scripted-model (default:
#              $CARGO_TARGET_DIR/debug, else target/debug)
#   --tag      the images' tag (default: dev)
#   --build    build the images first (build.sh --bin-dir DIR --tag TAG)
#
# Needs PostgreSQL on 127.0.0.1:5432 (trust auth, user postgres) and
# python3 (free ports, JSON). Exits 0 when the run completed; prints the
# time of each phase. Logs of the containers go to
# $TMPDIR/belay-test-logs/smoke-*.log.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
. "$here/tools.sh"

bin_dir="${CARGO_TARGET_DIR:-$repo/target}/debug"
tag=dev
build=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) bin_dir="$2"; shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    --build) build=1; shift ;;
    *) echo "smoke.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
engine_image="localhost/belay-engine:$tag"
worker_image="localhost/belay-worker:$tag"
belay="$bin_dir/belay"

t0=$(date +%s%N)
phase() { # NAME: prints the time since the last phase
  local now
  now=$(date +%s%N)
  printf '  %-44s %6d ms\n' "$1" $(((now - t0) / 1000000))
  t0=$now
}

if [[ $build == 1 ]]; then
  "$here/build.sh" --bin-dir "$bin_dir" --tag "$tag"
  phase "images built"
fi
for image in "$engine_image" "$worker_image"; do
  podman image exists "$image" || {
    echo "smoke.sh: no image $image: run deploy/container/build.sh (or pass --build)" >&2
    exit 1
  }
done
for bin in belay crm-server scripted-model; do
  [[ -x "$bin_dir/$bin" ]] || { echo "smoke.sh: $bin_dir/$bin is missing: cargo build --workspace --bins" >&2; exit 1; }
done

logs="${TMPDIR:-/tmp}/belay-test-logs"
mkdir -p "$logs"
work="$(mktemp -d "${TMPDIR:-/tmp}/belay-smoke.XXXXXX")"
suffix="$$-$RANDOM"
engine="belay-smoke-engine-$suffix"
worker="belay-smoke-worker-$suffix"
database="belay_smoke_${suffix//-/_}"
pids=()
cleanup() {
  local code=$?
  podman rm -f -t 0 "$engine" "$worker" >/dev/null 2>&1 || true
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  psql -q -h 127.0.0.1 -U postgres -d test -c "DROP DATABASE IF EXISTS $database WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$code"
}
trap cleanup EXIT

# Four free ports on 127.0.0.1: gRPC, admin, worker health, callbacks (the
# workflow's `kyc_check` is `type: async_webhook`).
read -r grpc_port admin_port health_port callback_port < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)
engine_url="http://127.0.0.1:$grpc_port"
admin_url="http://127.0.0.1:$admin_port"
database_url="postgres://postgres@127.0.0.1:5432/$database"
token="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"

psql -q -h 127.0.0.1 -U postgres -d test -c "CREATE DATABASE $database" >/dev/null
phase "database $database created"

# The test doubles, each printing `listening on http://ADDR` first.
start_double() { # NAME VAR: starts $bin_dir/NAME, sets VAR to its URL
  local fd line
  exec {fd}< <(exec "$bin_dir/$1" --listen 127.0.0.1:0 2>"$logs/smoke-$1.log")
  pids+=("$!")
  IFS= read -r -t 30 line <&"$fd" || { echo "smoke.sh: $1 did not start (see $logs/smoke-$1.log)" >&2; exit 1; }
  printf -v "$2" '%s' "${line#listening on }"
}
start_double crm-server crm_url
start_double scripted-model model_url
phase "crm-server $crm_url, scripted-model $model_url"

# Secrets go to the containers by env file (mode 600), not on argv.
umask 077
cat >"$work/engine.env" <<EOF
DATABASE_URL=$database_url
BELAY_LISTEN=127.0.0.1:$grpc_port
BELAY_ADMIN_LISTEN=127.0.0.1:$admin_port
BELAY_CALLBACK_LISTEN=127.0.0.1:$callback_port
BELAY_ENGINE_URL=$engine_url
BELAY_ADMIN_TOKENS=smoke:$token
EOF
podman run --rm --network host --env-file "$work/engine.env" "$engine_image" migrate \
  >"$logs/smoke-migrate.log" 2>&1 || { cat "$logs/smoke-migrate.log" >&2; exit 1; }
phase "migrations (belay-engine migrate container)"

podman run -d --name "$engine" --health-interval=disable --network host --env-file "$work/engine.env" "$engine_image" >/dev/null

# Waits until the container's own HEALTHCHECK passes (60 s at most). The
# containers run with --health-interval=disable: podman's timers need
# systemd, which a CI container lacks; `podman healthcheck run` runs the
# image's check all the same.
await_healthy() { # CONTAINER
  local deadline=$((SECONDS + 60))
  until podman healthcheck run "$1" >/dev/null 2>&1; do
    if ((SECONDS > deadline)) || [[ "$(podman inspect --format '{{.State.Running}}' "$1")" != true ]]; then
      echo "smoke.sh: $1 never became healthy; its log:" >&2
      podman logs "$1" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
}
await_healthy "$engine"
phase "engine healthy (belay health: gRPC SERVING)"

export BELAY_ENGINE_URL="$engine_url" BELAY_ADMIN_URL="$admin_url" BELAY_API_KEY="$token" BELAY_TENANT=acme
worker_key="$("$belay" keys create --principal smoke-worker --role worker --tenants '*' | sed -n 's/^key: //p')"
[[ -n "$worker_key" ]] || { echo "smoke.sh: no worker key was made" >&2; exit 1; }
cat >"$work/worker.env" <<EOF
BELAY_ENGINE_URL=$engine_url
BELAY_API_KEY=$worker_key
BELAY_MODEL_BASE_URL=$model_url/v1
BELAY_HTTP_BASE_URL=$crm_url
BELAY_ALLOW_PRIVATE_NETWORKS=127.0.0.0/8
BELAY_WORKER_HEALTH_LISTEN=127.0.0.1:$health_port
BELAY_HEALTH_URL=http://127.0.0.1:$health_port/readyz
EOF
podman run -d --name "$worker" --health-interval=disable --network host --env-file "$work/worker.env" "$worker_image" >/dev/null
await_healthy "$worker"
phase "worker healthy (belay health: /readyz 200)"

"$belay" definitions register "$repo/examples/onboarding/definitions" >/dev/null
"$belay" tenant set-grants crm.read crm.write email.send >/dev/null
run_id="$("$belay" --json run start onboarding \
  --input '{"email":"grace@example.com","name":"Grace Hopper","plan":"pro"}' \
  --grant crm.read --grant crm.write --grant email.send |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["run_id"])')"
phase "definitions registered, run $run_id started"

# Play the outside world from the run's events: the documents arrive when
# the run waits for them, the approver approves what it asks.
while IFS= read -r event; do
  kind="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1]).get("kind", ""))' "$event")"
  case "$kind" in
    wait_started)
      "$belay" run signal "$run_id" documents_received --payload '{"files":["passport.pdf"]}' >/dev/null ;;
    approval_requested)
      "$belay" run approve "$run_id" approve --grant onboarding.approve --reason "smoke test" >/dev/null ;;
  esac
done < <("$belay" --json run watch "$run_id")
status="$("$belay" --json run get "$run_id" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])')"
phase "run ended: $status"
if [[ "$status" != completed ]]; then
  echo "smoke.sh: run $run_id ended $status; events:" >&2
  "$belay" run events "$run_id" >&2 || true
  podman logs "$worker" >"$logs/smoke-worker.log" 2>&1 || true
  exit 1
fi

# SIGTERM: the worker drains and the engine stops, both with exit code 0.
podman stop -t 40 "$worker" >/dev/null
podman stop -t 15 "$engine" >/dev/null
podman logs "$engine" >"$logs/smoke-engine.log" 2>&1 || true
podman logs "$worker" >"$logs/smoke-worker.log" 2>&1 || true
for c in "$worker" "$engine"; do
  code="$(podman inspect --format '{{.State.ExitCode}}' "$c")"
  [[ "$code" == 0 ]] || { echo "smoke.sh: $c exited $code on SIGTERM (log in $logs)" >&2; exit 1; }
done
phase "worker and engine stopped on SIGTERM (exit 0)"
echo "smoke: the onboarding run completed through $engine_image and $worker_image"
