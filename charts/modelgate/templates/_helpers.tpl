{{/* Chart name. */}}
{{- define "modelgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name when it already contains the chart name. */}}
{{- define "modelgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "modelgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "modelgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "modelgate.tlsSecretName" -}}
{{- printf "%s-tls" (include "modelgate.fullname" .) -}}
{{- end -}}

{{- define "modelgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "modelgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "modelgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelgate
{{- end -}}

{{- define "modelgate.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
A uid or gid flag value: the word "none", or the number as an integer. Helm decodes numbers in
values files as float64, and printing a float64 gives 1.00068e+09 for 1000680000: int64 first.
*/}}
{{- define "modelgate.idOrNone" -}}
{{- if kindIs "string" . -}}
{{- . -}}
{{- else -}}
{{- int64 . -}}
{{- end -}}
{{- end -}}

{{/* Namespaces never sent to the webhook: kube-system, the release namespace, exemptNamespaces. */}}
{{- define "modelgate.exemptNamespaces" -}}
{{- concat (list "kube-system" .Release.Namespace) .Values.exemptNamespaces | uniq | toJson -}}
{{- end -}}

{{/* The namespaceSelector of every webhook: the opt-in selector, minus the exempt namespaces. */}}
{{- define "modelgate.namespaceSelector" -}}
{{- with .Values.namespaceSelector.matchLabels }}
matchLabels:
  {{- toYaml . | nindent 2 }}
{{- end }}
matchExpressions:
{{- with .Values.namespaceSelector.matchExpressions }}
  {{- toYaml . | nindent 2 }}
{{- end }}
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: {{ include "modelgate.exemptNamespaces" . }}
{{- end -}}

{{/* The requests the Pod and Job webhooks (mutate.modelgate.io, validate.modelgate.io) see. */}}
{{- define "modelgate.webhookRules" -}}
- apiGroups: [""]
  apiVersions: ["v1"]
  operations: ["CREATE"]
  resources: ["pods"]
  scope: Namespaced
- apiGroups: [""]
  apiVersions: ["v1"]
  operations: ["UPDATE"]
  resources: ["pods/ephemeralcontainers"]
  scope: Namespaced
- apiGroups: ["batch"]
  apiVersions: ["v1"]
  operations: ["CREATE"]
  resources: ["jobs"]
  scope: Namespaced
{{- end -}}

{{/*
The workload controllers whose pod templates the validating webhook judges (SPEC.md §11), in
a webhook entry of their own (validate-controllers.modelgate.io). UPDATE only with
matchConditions: without the condition that skips an unchanged template, every scale of a
ReplicaSet by the Deployment controller (an UPDATE of the resource itself) would wait on
modelgate, and fail while it is down.
*/}}
{{- define "modelgate.controllerRules" -}}
{{- $ops := ternary (list "CREATE" "UPDATE") (list "CREATE") .Values.matchConditions.enabled -}}
- apiGroups: ["apps"]
  apiVersions: ["v1"]
  operations: {{ $ops | toJson | replace "," ", " }}
  resources: ["deployments", "statefulsets", "daemonsets", "replicasets"]
  scope: Namespaced
- apiGroups: [""]
  apiVersions: ["v1"]
  operations: {{ $ops | toJson | replace "," ", " }}
  resources: ["replicationcontrollers"]
  scope: Namespaced
- apiGroups: ["batch"]
  apiVersions: ["v1"]
  operations: {{ $ops | toJson | replace "," ", " }}
  resources: ["cronjobs"]
  scope: Namespaced
{{- end -}}
