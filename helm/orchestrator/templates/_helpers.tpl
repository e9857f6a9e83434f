{{/* Name of every object of the release. */}}
{{- define "orchestrator.fullname" -}}
{{- printf "%s-orchestrator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orchestrator.labels" -}}
app.kubernetes.io/name: orchestrator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "orchestrator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "orchestrator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The environment every Ray container gets: the DSN from the Secret, the namespace arms run in. */}}
{{- define "orchestrator.env" -}}
- name: ORCH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret: create a Secret holding the DSN and name it here" .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
- name: ORCH_K8S_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}
