{{- define "shopfloor.name" -}}{{ .Chart.Name }}{{- end -}}
{{- define "shopfloor.fullname" -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "shopfloor.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "shopfloor.labels" -}}
app.kubernetes.io/name: {{ include "shopfloor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
{{- define "shopfloor.dbSecret" -}}{{ .Values.database.existingSecret | default (printf "%s-db" (include "shopfloor.fullname" .)) }}{{- end -}}
{{- define "shopfloor.keySecret" -}}{{ .Values.secretKey.existingSecret | default (printf "%s-secret-key" (include "shopfloor.fullname" .)) }}{{- end -}}
{{- /* The API pods (signing keys, webhook secrets) and the engines (webhook secrets, to sign
deliveries) hold the key; the migration Job does not. */ -}}
{{- define "shopfloor.secretKeyEnv" -}}
- name: SHOPFLOOR_SECRET_KEY
  valueFrom: { secretKeyRef: { name: {{ include "shopfloor.keySecret" . }}, key: secret-key } }
{{- end -}}
{{- define "shopfloor.githubSecret" -}}{{ .Values.github.existingSecret | default (printf "%s-github" (include "shopfloor.fullname" .)) }}{{- end -}}
{{- define "shopfloor.env" -}}
- name: DATABASE_URL
  valueFrom: { secretKeyRef: { name: {{ include "shopfloor.dbSecret" . }}, key: database-url } }
{{- if or .Values.database.listenUrl (and .Values.database.existingSecret .Values.database.existingSecretHasListenUrl) }}
- name: SHOPFLOOR_LISTEN_DATABASE_URL
  valueFrom: { secretKeyRef: { name: {{ include "shopfloor.dbSecret" . }}, key: listen-database-url } }
{{- end }}
- name: SHOPFLOOR_LOG
  value: {{ .Values.log | quote }}
{{- if .Values.github.appId }}
- name: SHOPFLOOR_GITHUB_APP_ID
  value: {{ .Values.github.appId | quote }}
- name: SHOPFLOOR_GITHUB_APP_KEY
  valueFrom: { secretKeyRef: { name: {{ include "shopfloor.githubSecret" . }}, key: app-key } }
- name: SHOPFLOOR_GITHUB_WEBHOOK_SECRET
  valueFrom: { secretKeyRef: { name: {{ include "shopfloor.githubSecret" . }}, key: webhook-secret } }
- name: SHOPFLOOR_GITHUB_API_URL
  value: {{ .Values.github.apiUrl | quote }}
- name: SHOPFLOOR_GITHUB_GRAPHQL_URL
  value: {{ .Values.github.graphqlUrl | quote }}
{{- end }}
- name: SHOPFLOOR_WEBHOOKS_ALLOW_PRIVATE
  value: {{ .Values.webhooks.allowPrivate | quote }}
{{- if .Values.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otel.endpoint | quote }}
{{- end }}
{{- end -}}
