{{/* Names, labels and the pieces every pod shares. */}}

{{- define "pyrula.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pyrula.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pyrula.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pyrula.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "pyrula.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "pyrula.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{/* Fails the render on values that cannot work. */}}
{{- define "pyrula.validate" -}}
{{- if not .Values.agent.spec }}{{ fail "agent.spec (MODULE:AGENT) is required" }}{{ end -}}
{{- if not .Values.agent.name }}{{ fail "agent.name is required" }}{{ end -}}
{{- if not .Values.kafka.bootstrapServers }}{{ fail "kafka.bootstrapServers is required" }}{{ end -}}
{{- if le (int .Values.worker.terminationGracePeriodSeconds) (int .Values.worker.shutdownGrace) -}}
{{ fail "worker.terminationGracePeriodSeconds must exceed worker.shutdownGrace: Kubernetes would kill a drain that takes its full time" }}
{{- end -}}
{{- if and .Values.keda.enabled (gt (int .Values.keda.maxReplicas) (int .Values.agent.partitions)) -}}
{{ fail "keda.maxReplicas must not exceed agent.partitions: a worker past the partition count gets none" }}
{{- end -}}
{{- if and .Values.topics.acls.enabled (not .Values.topics.acls.workerPrincipal) -}}
{{ fail "topics.acls.workerPrincipal is required with topics.acls.enabled" }}
{{- end -}}
{{- end -}}

{{/* A librdkafka property's variable: `_` -> `__`, `-` -> `___`, `.` -> `_` (the
     convention of Confluent's images), upper case, after PYRULA_KAFKA_. */}}
{{- define "pyrula.kafkaEnvName" -}}
{{- printf "PYRULA_KAFKA_%s" (. | replace "_" "__" | replace "-" "___" | replace "." "_" | upper) -}}
{{- end -}}

{{- define "pyrula.env" -}}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
{{- range $key, $value := .Values.kafka.config }}
- name: {{ include "pyrula.kafkaEnvName" $key }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "pyrula.envFrom" -}}
{{- if .Values.kafka.existingSecret }}
- secretRef:
    name: {{ .Values.kafka.existingSecret }}
{{- end }}
{{- with .Values.envFrom }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "pyrula.tlsVolume" -}}
{{- if .Values.kafka.tlsSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tlsSecret }}
{{- end }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "pyrula.tlsMount" -}}
{{- if .Values.kafka.tlsSecret }}
- name: kafka-tls
  mountPath: /etc/pyrula/kafka-tls
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}
