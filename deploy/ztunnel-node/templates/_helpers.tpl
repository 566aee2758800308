{{/* istiod's address, as Istio's ztunnel chart derives it (host:port; the daemon assumes https). */}}
{{- define "ztunnel-node.istiod" -}}
istiod{{ with .Values.revision }}-{{ . }}{{ end }}.{{ .Values.istioNamespace }}.svc:15012
{{- end }}

{{- define "ztunnel-node.labels" -}}
app.kubernetes.io/name: ztunnel-node
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Where the chart mounts what the daemon reads: XDS_ROOT_CA / CA_ROOT_CA and AUTH_TOKEN point here. */}}
{{- define "ztunnel-node.rootCertDir" -}}/var/run/secrets/istio{{- end }}
{{- define "ztunnel-node.tokenDir" -}}/var/run/secrets/tokens{{- end }}
