{{/* The labels of an object, a flow mapping: the argument is agent, engine, runner or "" (shared objects). */}}
{{- define "gpuevents.labels" -}}
{{ "{" }}{{ if . }}app.kubernetes.io/name: gpuevents-{{ . }}, {{ end }}app.kubernetes.io/part-of: gpuevents{{ "}" }}
{{- end -}}

{{- define "gpuevents.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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
  valueFrom: {secretKeyRef: {name: gpuevents-slack, key: token, optional: true}}
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
