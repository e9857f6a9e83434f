{{/* Name of every object of the release. KubeRay names the head's Service <cluster>-head-svc
and shortens longer names, so the name is kept short enough for that Service to be found. */}}
{{- define "orchestrator.fullname" -}}
{{- $name := printf "%s-orchestrator" .Release.Name -}}
{{- if gt (len $name) 40 -}}
{{- fail (printf "release name %q is too long: %q must be at most 40 characters (KubeRay's head Service name is derived from it)" .Release.Name $name) -}}
{{- end -}}
{{- $name -}}
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

{{/* The image every container runs: the Dockerfile's, tagged with the chart's appVersion unless set. */}}
{{- define "orchestrator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Ray Client address of the head, for processes that are not Ray nodes (the controller). */}}
{{- define "orchestrator.rayClientAddress" -}}
{{- printf "ray://%s-head-svc:10001" (include "orchestrator.fullname" .) -}}
{{- end -}}

{{/* The GPU pools as the JSON of Ray's --resources (types with 0 GPUs left out). */}}
{{- define "orchestrator.gpuPoolsJson" -}}
{{- $pools := dict -}}
{{- range $gpu, $n := .Values.gpuPools -}}
{{- if gt (int $n) 0 -}}
{{- $_ := set $pools $gpu (int $n) -}}
{{- end -}}
{{- end -}}
{{- if not $pools -}}
{{- fail "gpuPools: every pool is 0, so `orch submit` would refuse every plan; declare the GPUs experiments may hold, e.g. --set gpuPools.H200=8" -}}
{{- end -}}
{{- toJson $pools -}}
{{- end -}}

{{/* Pod-level fields every pod of the chart shares: identity, pull secrets, security, placement. */}}
{{- define "orchestrator.podSpec" -}}
serviceAccountName: {{ include "orchestrator.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . | quote }}
  {{- end }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Container-level fields every container of the chart shares. */}}
{{- define "orchestrator.container" -}}
image: {{ include "orchestrator.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- with .Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The environment of every container that runs Ray or talks to it (head, workers, controller):
the runtime role's DSN, the namespace arms run in, where run state goes, Ray's token. Never the
migration owner's DSN (orchestrator.ownerDsnEnv, the db-upgrade init container only). */}}
{{- define "orchestrator.runtimeEnv" -}}
- name: ORCH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret: create a Secret holding the DSN and name it here" .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
- name: ORCH_K8S_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: ORCH_STATE_DIR
  value: /var/lib/orchestrator/state
{{- with (include "orchestrator.modelCacheClaim" .) }}
- name: ORCH_K8S_MODEL_CACHE_PVC
  value: {{ . | quote }}
{{- end }}
{{- include "orchestrator.rayAuthEnv" . }}
{{- end -}}

{{/* The weights claim arms use when a plan names none (modelCache): an existing one, the
chart's own, or none (empty). */}}
{{- define "orchestrator.modelCacheClaim" -}}
{{- if .Values.modelCache.existingClaim -}}
{{ .Values.modelCache.existingClaim }}
{{- else if .Values.modelCache.enabled -}}
{{ include "orchestrator.fullname" . }}-model-cache
{{- end -}}
{{- end -}}

{{/* The Secret holding the migration owner's DSN: database.ownerExistingSecret, else the
runtime's Secret. */}}
{{- define "orchestrator.ownerSecret" -}}
{{- .Values.database.ownerExistingSecret | default .Values.database.existingSecret -}}
{{- end -}}

{{/* The migration owner's DSN, for `orch db upgrade` only (the db-upgrade init container): it
owns the tables, so it may UPDATE and DELETE measurements and pass the append-only triggers'
maintenance escape. Refused when it is not a DSN of its own: the controller and every Ray pod
would then run as the owner, and measurements would not be append-only. */}}
{{- define "orchestrator.ownerDsnEnv" -}}
{{- $db := .Values.database -}}
{{- if not $db.ownerSecretKey -}}
{{- fail "database.ownerSecretKey: empty, so `orch db upgrade` has no migration owner's DSN; the chart runs the controller and every Ray pod as the runtime role (database.secretKey) and migrates as the owner: put the owner's DSN under a key of its own (default owner_url), or set database.migrate=false and run `orch db upgrade` with the owner's DSN yourself" -}}
{{- end -}}
{{- if and (eq (include "orchestrator.ownerSecret" .) $db.existingSecret) (eq $db.ownerSecretKey $db.secretKey) -}}
{{- fail (printf "database.ownerSecretKey: %q is also database.secretKey (Secret %s), so the controller and every Ray pod would run as the migration owner, which may UPDATE and DELETE measurements (README \"What is guaranteed\"): keep the owner's DSN under a key of its own (or in database.ownerExistingSecret), the runtime role's under database.secretKey" $db.ownerSecretKey $db.existingSecret) -}}
{{- end -}}
- name: ORCH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "orchestrator.ownerSecret" . }}
      key: {{ $db.ownerSecretKey }}
{{- end -}}

{{/* The chart's own pods, as a NetworkPolicy peer (labels every pod of this release carries). */}}
{{- define "orchestrator.chartPodsPeer" -}}
- podSelector:
    matchLabels:
      app.kubernetes.io/name: orchestrator
      app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Secret holding Ray's auth token: the user's, or the one the chart makes. */}}
{{- define "orchestrator.rayAuthSecret" -}}
{{- .Values.rayAuth.existingSecret | default (printf "%s-ray-auth" (include "orchestrator.fullname" .)) -}}
{{- end -}}

{{/* Ray token authentication (Ray >= 2.52): the same token in every Ray process and client. */}}
{{- define "orchestrator.rayAuthEnv" -}}
{{- if .Values.rayAuth.enabled }}
{{- if semverCompare "<2.52.0-0" .Values.rayVersion }}
{{- fail (printf "rayAuth.enabled needs Ray >= 2.52 (token authentication); rayVersion is %s: rebuild the image with a newer RAY_VERSION or set rayAuth.enabled=false on a network you trust" .Values.rayVersion) }}
{{- end }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "orchestrator.rayAuthSecret" . }}
      key: {{ .Values.rayAuth.secretKey }}
{{- end }}
{{- end -}}

{{- define "orchestrator.stateMount" -}}
- name: state
  mountPath: /var/lib/orchestrator
{{- end -}}
