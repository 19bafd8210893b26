{{/*
Names and labels, as `helm create` makes them, plus the component parts.
*/}}
{{- define "belay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's prefix of resource names (at most 63 characters; the
components add at most "-migrations", so it is cut at 52).
*/}}
{{- define "belay.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "belay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "belay.labels" -}}
helm.sh/chart: {{ include "belay.chart" . }}
{{ include "belay.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "belay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "belay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of one component: include with (list $ "engine"). */}}
{{- define "belay.componentSelectorLabels" -}}
{{ include "belay.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "belay.componentLabels" -}}
{{ include "belay.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "belay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "belay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret the pods read: the user's, or the chart's. */}}
{{- define "belay.secretName" -}}
{{- default (printf "%s-secrets" (include "belay.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{/* image: include with (list $ .Values.engine.image). */}}
{{- define "belay.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}

{{/* The engine's gRPC URL as workers and the health probe reach it. */}}
{{- define "belay.engineUrl" -}}
{{- printf "%s://%s-engine:50051" (ternary "https" "http" .Values.engine.tls.enabled) (include "belay.fullname" .) }}
{{- end }}

{{/* An env entry from the Secret: include with (list $ "NAME" "keyField" optional). */}}
{{- define "belay.secretEnv" -}}
{{- $root := index . 0 -}}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "belay.secretName" $root }}
      key: {{ index $root.Values.secrets.keys (index . 2) }}
      optional: {{ index . 3 }}
{{- end }}

{{/* The database URL is required: in a Secret of yours, or as a value. */}}
{{- define "belay.checkSecrets" -}}
{{- if and (not .Values.secrets.existingSecret) (not .Values.secrets.databaseUrl) }}
{{- fail "secrets.databaseUrl is empty: give the PostgreSQL URL (postgres://USER:PASSWORD@HOST:5432/DB) or secrets.existingSecret" }}
{{- end }}
{{- if and .Values.engine.tls.enabled (not .Values.engine.tls.existingSecret) }}
{{- fail "engine.tls.enabled needs engine.tls.existingSecret: a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt" }}
{{- end }}
{{- if and (ne .Values.engine.service.type "ClusterIP") (not .Values.engine.tls.enabled) (not .Values.engine.service.allowPlaintext) }}
{{- fail (printf "engine.service.type %s without engine.tls.enabled would publish gRPC (API keys in plaintext), the admin endpoint and /metrics outside the cluster: turn TLS on, or set engine.service.allowPlaintext=true if a proxy in front terminates TLS" .Values.engine.service.type) }}
{{- end }}
{{- end }}

{{/*
Volumes of a pod: a writable /tmp, the TLS Secret, then the pod's own
extraVolumes. Include with (list $ extraVolumes "engine") in the engine's
pods, which serve with tls.crt and tls.key, and with (list $ extraVolumes
"client") in every other pod (workers, the helm test), which only verify
the engine and so get ca.crt alone: the engine's private key never reaches
a pod that runs tools. belay.volumeMounts takes (list $ extraVolumeMounts).
*/}}
{{- define "belay.volumes" -}}
{{- $root := index . 0 -}}
{{- $who := index . 2 -}}
{{- if not (has $who (list "engine" "client")) }}
{{- fail (printf "belay.volumes: the third element is %q, not \"engine\" or \"client\"" $who) }}
{{- end }}
- name: tmp
  emptyDir: {}
{{- if $root.Values.engine.tls.enabled }}
- name: tls
  secret:
    secretName: {{ $root.Values.engine.tls.existingSecret }}
    {{- if eq $who "client" }}
    items:
      - key: ca.crt
        path: ca.crt
    {{- end }}
{{- end }}
{{- with index . 1 }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "belay.volumeMounts" -}}
{{- $root := index . 0 -}}
- name: tmp
  mountPath: /tmp
{{- if $root.Values.engine.tls.enabled }}
- name: tls
  mountPath: /etc/belay/tls
  readOnly: true
{{- end }}
{{- with index . 1 }}
{{ toYaml . }}
{{- end }}
{{- end }}
