{{/* The name of every object: the release's. */}}
{{- define "nftproxy.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "nftproxy.labels" -}}
app.kubernetes.io/name: nftproxy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The pods' selector. */}}
{{- define "nftproxy.selector" -}}
app.kubernetes.io/name: nftproxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The image, required. */}}
{{- define "nftproxy.image" -}}
{{- $repo := required "image.repository is required: build deploy/Dockerfile, push it, and set image.repository (and image.tag)" .Values.image.repository -}}
{{- printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The healthz port, from config.healthzBindAddress. */}}
{{- define "nftproxy.healthzPort" -}}
{{- $addr := .Values.config.healthzBindAddress | default "0.0.0.0:10256" -}}
{{- splitList ":" $addr | last -}}
{{- end -}}
