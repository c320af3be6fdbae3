{{/* The chart's name. */}}
{{- define "cojob.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: <release>, or <release>-cojob when the release name lacks "cojob". */}}
{{- define "cojob.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "cojob.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "cojob.labels" -}}
helm.sh/chart: {{ include "cojob.chart" . }}
{{ include "cojob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The controller pods' selector. */}}
{{- define "cojob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cojob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cojob.serviceAccountName" -}}
{{- default (include "cojob.fullname" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The pre-delete hook's own ServiceAccount, ClusterRole and binding. */}}
{{- define "cojob.drainName" -}}
{{- printf "%s-drain" (include "cojob.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cojob.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "cojob.sidecarImage" -}}
{{- default (include "cojob.image" .) .Values.sidecarImage }}
{{- end }}

{{- define "cojob.credentialsSecretName" -}}
{{- if .Values.credentials.secretName }}
{{- .Values.credentials.secretName }}
{{- else if .Values.credentials.create }}
{{- printf "%s-credentials" (include "cojob.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "cojob.dnsPolicy" -}}
{{- if .Values.dnsPolicy }}
{{- .Values.dnsPolicy }}
{{- else if .Values.hostNetwork }}
{{- "ClusterFirstWithHostNet" }}
{{- else }}
{{- "ClusterFirst" }}
{{- end }}
{{- end }}

{{/* KUBERNETES_SERVICE_HOST/PORT, when the apiserver is not reachable through its Service. */}}
{{- define "cojob.kubernetesServiceEnv" -}}
{{- with .Values.kubernetesService }}
{{- if .host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .host | quote }}
{{- end }}
{{- if .port }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .port | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret that keeps the holder key (key "key"). */}}
{{- define "cojob.holderKeySecretName" -}}
{{- default (printf "%s-holder-key" (include "cojob.fullname" .) | trunc 63 | trimSuffix "-") .Values.holderKey.existingSecret }}
{{- end }}

{{/* A duration such as 90s, 30m or 2h, in seconds. */}}
{{- define "cojob.seconds" -}}
{{- $d := toString . }}
{{- if hasSuffix "h" $d }}{{ mul (trimSuffix "h" $d | int) 3600 }}
{{- else if hasSuffix "m" $d }}{{ mul (trimSuffix "m" $d | int) 60 }}
{{- else }}{{ trimSuffix "s" $d | int }}
{{- end }}
{{- end }}
