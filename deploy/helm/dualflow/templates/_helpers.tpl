{{- define "dualflow.labels" -}}
app.kubernetes.io/name: dualflow
app.kubernetes.io/part-of: dualflow
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dualflow.selector" -}}
app.kubernetes.io/name: dualflow
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dualflow.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "dualflow.check" -}}
{{- if and .Values.traceflow.enabled (not .Values.tls.enabled) -}}
{{- fail "traceflow.enabled needs tls.enabled: the agents' token never crosses the network in clear" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) -}}
{{- fail "tls.certManager.enabled needs tls.enabled" -}}
{{- end -}}
{{- end -}}
