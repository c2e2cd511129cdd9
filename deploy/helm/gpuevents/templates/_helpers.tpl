{{/* The labels of an object, a flow mapping: the argument is agent, engine, runner or "" (shared objects). */}}
{{- define "gpuevents.labels" -}}
{{ "{" }}{{ if . }}app.kubernetes.io/name: gpuevents-{{ . }}, {{ end }}app.kubernetes.io/part-of: gpuevents{{ "}" }}
{{- end -}}

{{- define "gpuevents.image" -}}
{{ with .Values.image.registry }}{{ trimSuffix "/" . }}/{{ end }}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The engine's and runners' affinity: off GPU nodes (values offGpuNodes), and `extra` (a map) beside it. */}}
{{- define "gpuevents.affinity" -}}
{{- $out := merge (deepCopy (.extra | default dict)) (deepCopy (.root.Values.offGpuNodes | default dict)) -}}
{{- if $out -}}
affinity:
  {{- toYaml $out | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A warning needs a channel once the engine enforces: the Slack token's Secret, a notify service or SMTP. */}}
{{- define "gpuevents.channelCheck" -}}
{{- $engine := .Values.config.engine | default dict -}}
{{- $dry := true -}}
{{- if hasKey $engine "dry_run" }}{{ $dry = $engine.dry_run }}{{ end -}}
{{- $actions := .Values.config.actions | default dict -}}
{{- $services := ($actions.notify | default dict).services | default dict -}}
{{- if and (not $dry) (not .Values.slack.enabled) (not $services) (not $actions.email) -}}
{{- fail "config.engine.dry_run is false (enforcing) but no warning channel is configured: set slack.enabled=true (the Secret slack.secretName holds the bot token), config.actions.notify.services or config.actions.email; a warning that is only printed is not delivered, and every remedy staged after it would be refused" -}}
{{- end -}}
{{- end -}}

{{/* The NATS password and Slack token of the engine's NATS user, shared by the engine and the runners. */}}
{{- define "gpuevents.engineEnv" -}}
- name: CLUSTER
  valueFrom: {configMapKeyRef: {name: gpuevents-config, key: cluster}}
- {name: GPUEVENTS_CLUSTER, value: $(CLUSTER)}
- {name: NATS_USER, value: gpuevents-engine}
- name: NATS_PASSWORD
  valueFrom: {secretKeyRef: {name: gpuevents-engine, key: nats-password}}
- name: SLACK_BOT_TOKEN
  valueFrom: {secretKeyRef: {name: {{ .Values.slack.secretName }}, key: token, optional: {{ not .Values.slack.enabled }}}}
{{- end -}}

{{/*
RBAC rules from rbac-needs.yaml (this chart's one table of what each component needs): the union of the
rows in the argument (a map of group -> feature or action -> list of {apiGroup, resource, verbs}), one rule per
apiGroup and resource, sorted.
*/}}
{{- define "gpuevents.rules" -}}
{{- $acc := dict -}}
{{- range $group := . }}{{ range $name, $rows := $group }}{{ range $row := $rows }}
{{- $key := printf "%s|%s" $row.apiGroup $row.resource -}}
{{- $_ := set $acc $key (concat (get $acc $key | default list) $row.verbs | uniq) -}}
{{- end }}{{ end }}{{ end -}}
rules:
{{- range $key := keys $acc | sortAlpha }}
  - apiGroups: [{{ index (splitList "|" $key) 0 | quote }}]
    resources: [{{ index (splitList "|" $key) 1 }}]
    verbs: [{{ get $acc $key | join ", " }}]
{{- end }}
{{- end -}}
