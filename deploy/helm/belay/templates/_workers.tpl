{{/*
The worker groups. The default group is `worker` (unless worker.enabled is
false): resources `<fullname>-worker`, component `worker`, as before groups
existed. Each enabled entry of `workerGroups` is `worker`'s values with
the group's own over them (maps merged key by key; lists, nodeSelector and
affinity replaced whole; `enabled` and `pool` never inherited): resources
`<fullname>-worker-<name>`, component `worker-<name>`, so no Deployment's
selector matches another's pods.

Use: {{- $groups := include "belay.workerGroups" . | fromJson }} would lose
the values' types, so the list is handed back in a dict instead:
  {{- $w := dict }}{{- include "belay.workerGroups" (list . $w) }}
  {{- range $w.groups }} … {{ end }}
Each group is a dict of the merged values plus `name` ("" for the default
group), `component` and `fullname`.
*/}}
{{- define "belay.workerGroups" -}}
{{- $root := index . 0 }}
{{- $out := index . 1 }}
{{- $groups := list }}
{{- $fullname := include "belay.fullname" $root }}
{{- if $root.Values.worker.enabled }}
{{- $default := deepCopy $root.Values.worker }}
{{- $_ := set $default "name" "" }}
{{- $_ = set $default "component" "worker" }}
{{- $_ = set $default "fullname" (printf "%s-worker" $fullname) }}
{{- $groups = append $groups $default }}
{{- end }}
{{- $names := dict }}
{{- range $src := $root.Values.workerGroups }}
{{- if hasKey $names .name }}
{{- fail (printf "workerGroups: the name %q is given twice" .name) }}
{{- end }}
{{- $_ := set $names .name true }}
{{- if (ternary .enabled true (hasKey . "enabled")) }}
{{- $g := deepCopy $root.Values.worker }}
{{- $_ = set $g "pool" "" }}
{{- include "belay.mergeInto" (list $g (omit . "enabled")) }}
{{- range $key := list "nodeSelector" "affinity" }}
{{- if hasKey $src $key }}
{{- $_ = set $g $key (index $src $key) }}
{{- end }}
{{- end }}
{{- $name := printf "%s-worker-%s" $fullname .name }}
{{- if gt (len $name) 63 }}
{{- fail (printf "workerGroups: the group %q makes the Service name %s, longer than 63 characters: shorten the name (or fullnameOverride)" .name $name) }}
{{- end }}
{{- $_ = set $g "component" (printf "worker-%s" .name) }}
{{- $_ = set $g "fullname" $name }}
{{- $groups = append $groups $g }}
{{- end }}
{{- end }}
{{- $_ := set $out "groups" $groups }}
{{- end }}

{{/*
Merges map (index . 1) into map (index . 0), in place: a key of both whose
values are maps is merged the same way, any other value replaces. (Sprig's
mergeOverwrite keeps the old value where the new one is false, 0 or "" in
older Helm releases.)
*/}}
{{- define "belay.mergeInto" -}}
{{- $dst := index . 0 }}
{{- range $key, $value := index . 1 }}
{{- if and (kindIs "map" $value) (kindIs "map" (index $dst $key)) }}
{{- include "belay.mergeInto" (list (index $dst $key) $value) }}
{{- else }}
{{- $_ := set $dst $key $value }}
{{- end }}
{{- end }}
{{- end }}

{{/* Every worker group's component label value, as a JSON list. */}}
{{- define "belay.workerComponents" -}}
{{- $w := dict }}
{{- include "belay.workerGroups" (list . $w) }}
{{- $components := list }}
{{- range $w.groups }}
{{- $components = append $components .component }}
{{- end }}
{{- toJson $components }}
{{- end }}

{{/*
A podSelector of every worker pod of the release: include with (list $ indent).
*/}}
{{- define "belay.workerPodSelector" -}}
matchLabels:
  {{- include "belay.selectorLabels" . | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: {{ include "belay.workerComponents" . }}
{{- end }}
