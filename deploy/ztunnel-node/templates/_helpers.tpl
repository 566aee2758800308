{{/* The name of the DaemonSet, ServiceAccount and ResourceQuota: `resourceName`, else ztunnel (what istiod trusts). */}}
{{- define "ztunnel.name" -}}
{{ .Values.resourceName | default "ztunnel" }}
{{- end }}

{{/* Labels of every top-level resource: Istio's common labels, then `labels`. */}}
{{- define "ztunnel.labels" -}}
app.kubernetes.io/name: ztunnel
{{ include "ztunnel.commonLabels" . }}
{{- with .Values.labels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Istio's labels for all its resources (app.kubernetes.io/version and helm.sh/chart name this chart). */}}
{{- define "ztunnel.commonLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: istio
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
istio.io/rev: {{ .Values.revision | default "default" | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Annotations of every top-level resource: `annotations`, plus istio.io/rev with a revision. */}}
{{- define "ztunnel.annotations" -}}
{{- $a := deepCopy (.Values.annotations | default dict) }}
{{- with .Values.revision }}{{ $_ := set $a "istio.io/rev" . }}{{ end }}
{{- toYaml $a }}
{{- end }}

{{/* The image: ztunnel-node's (`ztunnelNode.image`); Istio's hub/image/tag/variant name Istio's ztunnel image. */}}
{{- define "ztunnel.image" -}}
{{- $image := (.Values.ztunnelNode).image | default dict -}}
{{ $image.repository | default "ghcr.io/ztunnel-node/ztunnel-node" }}:{{ $image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* istiod's address as Istio's chart derives it (host:port; the daemon assumes https). */}}
{{- define "ztunnel.istiod" -}}
istiod{{ with .Values.revision }}-{{ . }}{{ end }}.{{ .Values.istioNamespace }}.svc:15012
{{- end }}

{{/* "true" when `resourceScope` (all | namespace | cluster, any case) covers resources of the given scope. */}}
{{- define "ztunnel.inScope" -}}
{{- $scope := lower (.root.Values.resourceScope | default "all") }}
{{- if not (has $scope (list "all" "namespace" "cluster")) }}
{{- fail (printf "resourceScope %q is not one of all, namespace, cluster" .root.Values.resourceScope) }}
{{- end }}
{{- if or (eq $scope "all") (eq $scope .scope) }}true{{ end }}
{{- end }}
