{{- /*
Labels: Kubernetes' recommended ones. The selectors are name, instance and
component, the same as deploy/kubernetes (whose instance is "dualflow"):
a release named dualflow and the kustomize install select the same pods,
so either can take over the other's objects (docs/deploy.md).
*/ -}}
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

{{- /*
dualflow.check stops an install or upgrade that would not work, with what
to do instead. It renders nothing.
*/ -}}
{{- define "dualflow.check" -}}
{{- if and .Values.traceflow.enabled (not .Values.tls.enabled) -}}
{{- fail "traceflow.enabled needs tls.enabled: the agents' token never crosses the network in clear" -}}
{{- end -}}
{{- if and .Values.tls.certManager.enabled (not .Values.tls.enabled) -}}
{{- fail "tls.certManager.enabled needs tls.enabled" -}}
{{- end -}}
{{- if hasKey (.Values.namespace | default dict) "create" -}}
{{- fail (printf "namespace.create is gone: Helm writes its release into namespace %s before it creates anything, so the chart cannot make it. Create and label it first: kubectl apply -f deploy/kubernetes/base/namespace.yaml (docs/deploy.md)" .Release.Namespace) -}}
{{- end -}}
{{- include "dualflow.checkNamespace" . -}}
{{- end -}}

{{- /*
dualflow.checkNamespace: the exporter (host network, NET_ADMIN) is admitted
only where Pod Security enforces "privileged". Without the label a cluster
whose default level is baseline refuses every exporter pod while Helm says
"deployed", so install and upgrade look the namespace up and stop. lookup
answers nothing without a cluster (helm template, --dry-run=client); then
kube-system, which every cluster has, is missing too and nothing is checked.
*/ -}}
{{- define "dualflow.checkNamespace" -}}
{{- if .Values.namespace.requirePrivileged -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace -}}
{{- $fix := printf "kubectl apply -f deploy/kubernetes/base/namespace.yaml (namespace dualflow), or kubectl label --overwrite namespace %s pod-security.kubernetes.io/enforce=privileged (docs/deploy.md); or set namespace.requirePrivileged=false if something else admits the exporter" .Release.Namespace -}}
{{- if $ns -}}
{{- $level := index ($ns.metadata.labels | default dict) "pod-security.kubernetes.io/enforce" | default "" -}}
{{- if not $level -}}
{{- fail (printf "namespace %s has no Pod Security label, so the cluster's default level applies, and the exporter (host network, NET_ADMIN) is admitted only at \"privileged\": %s" .Release.Namespace $fix) -}}
{{- else if ne $level "privileged" -}}
{{- fail (printf "namespace %s enforces Pod Security %q, and the exporter (host network, NET_ADMIN) is admitted only at \"privileged\": %s" .Release.Namespace $level $fix) -}}
{{- end -}}
{{- else if lookup "v1" "Namespace" "" "kube-system" -}}
{{- fail (printf "namespace %s does not exist, and --create-namespace would make it without the Pod Security level the exporter needs (\"privileged\"): create it labelled, kubectl apply -f deploy/kubernetes/base/namespace.yaml (namespace dualflow), or kubectl create namespace %s and kubectl label --overwrite namespace %s pod-security.kubernetes.io/enforce=privileged (docs/deploy.md)" .Release.Namespace .Release.Namespace .Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- end -}}
