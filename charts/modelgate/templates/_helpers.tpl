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
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "modelgate.fullname" .)) -}}
{{- end -}}

{{- /*
The serving certificate when the chart makes it (certManager.enabled=false, no
tls.existingSecret), as JSON {crt, key, ca} of base64 PEM: the Secret of an earlier release
when there is one (helm upgrade), else a new CA and certificate. Made once per render and kept
in .Values, so that the Secret, the caBundle and the Deployment's checksum all see the same
pair (each template that asks would otherwise generate its own).
*/}}
{{- define "modelgate.generatedTLS" -}}
{{- if not (hasKey .Values "__modelgateGeneratedTLS") -}}
{{- $fullname := include "modelgate.fullname" . -}}
{{- $svc := printf "%s.%s.svc" $fullname .Release.Namespace -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "modelgate.tlsSecretName" .) -}}
{{- $m := dict -}}
{{- if and $existing $existing.data (index $existing.data "ca.crt") (index $existing.data "tls.crt") (index $existing.data "tls.key") -}}
{{- $m = dict "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key") "ca" (index $existing.data "ca.crt") -}}
{{- else -}}
{{- $days := int .Values.generatedCertificate.validityDays -}}
{{- $ca := genCA (printf "%s-ca" $fullname) $days -}}
{{- $dnsNames := list $fullname (printf "%s.%s" $fullname .Release.Namespace) $svc (printf "%s.cluster.local" $svc) -}}
{{- $cert := genSignedCert $svc nil $dnsNames $days $ca -}}
{{- $m = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($ca.Cert | b64enc) -}}
{{- end -}}
{{- $_ := set .Values "__modelgateGeneratedTLS" $m -}}
{{- end -}}
{{- index .Values "__modelgateGeneratedTLS" | toJson -}}
{{- end -}}

{{- /* The caBundle of the webhook configurations, or empty under cert-manager (injected). */}}
{{- define "modelgate.caBundle" -}}
{{- if .Values.certManager.enabled -}}
{{- else if .Values.tls.existingSecret -}}
{{- required "tls.caBundle is required with tls.existingSecret: the base64 PEM of the CA that signed the Secret's certificate" .Values.tls.caBundle -}}
{{- else -}}
{{- (include "modelgate.generatedTLS" . | fromJson).ca -}}
{{- end -}}
{{- end -}}

{{- define "modelgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "modelgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "modelgate.selectorLabels" . }}
{{ include "modelgate.releaseLabels" . }}
{{- end -}}

{{- define "modelgate.releaseLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelgate
{{- end -}}

{{/*
The audit CronJob's objects (audit-*.yaml). The name is at most 52 characters: the CronJob
controller names each Job <name>-<minutes since the epoch>, and a Job's name must fit in 63.
component: audit keeps its pods out of every selector of the webhook's (Service, PDB,
anti-affinity, NetworkPolicy).
*/}}
{{- define "modelgate.auditName" -}}
{{- printf "%s-audit" (include "modelgate.fullname" . | trunc 46 | trimSuffix "-") -}}
{{- end -}}

{{- define "modelgate.auditSelectorLabels" -}}
app.kubernetes.io/name: {{ include "modelgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: audit
{{- end -}}

{{- define "modelgate.auditLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "modelgate.auditSelectorLabels" . }}
{{ include "modelgate.releaseLabels" . }}
{{- end -}}

{{/*
What the audit reads and writes in the namespaces it audits (a ClusterRole's rules, or each
audit.namespaces' Role's): list on the seven kinds it judges, and the writes on the report kind
of audit.reportApi only.
*/}}
{{- define "modelgate.auditNamespacedRules" -}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list"]
{{- /* The kinds of the workload-kind table: the audit lists those the cluster serves. */}}
{{- range (include "modelgate.workloadKinds" . | fromJsonArray) }}
- apiGroups: [{{ default "" .group | quote }}]
  resources: [{{ .plural | quote }}]
  verbs: ["list"]
{{- end }}
{{- if eq .Values.audit.reportApi "policyreport" }}
- apiGroups: ["wgpolicyk8s.io"]
  resources: ["policyreports"]
{{- else }}
- apiGroups: ["openreports.io"]
  resources: ["reports"]
{{- end }}
  verbs: ["create", "patch", "list", "delete"]
{{- if .Values.audit.images.enabled }}
{{- /* --images: each workload's pull secrets, its own or its ServiceAccount's, one get each. */}}
- apiGroups: [""]
  resources: ["secrets", "serviceaccounts"]
  verbs: ["get"]
{{- end }}
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

{{/*
The policy flags (docs/policy.md section 2), which `serve` and `audit` take alike: one list for the
webhook's Deployment and the audit CronJob, so that the audit judges workloads by the policy the
webhook enforces. Without exemptNamespaces no --exempt-namespace is given: both then exempt
kube-system and their own namespace (POD_NAMESPACE), which is the release namespace.
*/}}
{{- define "modelgate.policyArgs" -}}
- --run-as-user={{ include "modelgate.idOrNone" .Values.runAsUser }}
- --run-as-group={{ include "modelgate.idOrNone" .Values.runAsGroup }}
- --default-fsgroup={{ int64 .Values.defaultFSGroup }}
- --init-container-user={{ int64 .Values.initContainer.user }}
- --model-cache-prep={{ .Values.modelCachePrep }}
- --default-mode={{ .Values.defaultMode }}
- {{ printf "--init-image=%s" .Values.initContainer.image | quote }}
- {{ printf "--cache-volume=%s" .Values.cacheVolume | quote }}
- {{ printf "--cache-mount-path=%s" .Values.cacheMountPath | quote }}
- {{ printf "--model-mount-path=%s" .Values.modelMountPath | quote }}
- --cache-layout={{ .Values.cacheLayout }}
{{- range .Values.prepHostPaths }}
- {{ printf "--prep-host-path=%s" . | quote }}
{{- end }}
{{- range .Values.prepVolumeTypes }}
- {{ printf "--prep-volume-type=%s" . | quote }}
{{- end }}
{{- range .Values.prepStorageClasses }}
- {{ printf "--prep-storage-class=%s" . | quote }}
{{- end }}
- --pod-security-default={{ .Values.podSecurityDefault }}
{{- if .Values.workloadKinds.extra }}
- --workload-kinds={{ include "modelgate.workloadKindsPath" . }}
{{- end }}
{{- if .Values.exemptNamespaces }}
{{- range (include "modelgate.exemptNamespaces" . | fromJsonArray) }}
- --exempt-namespace={{ . }}
{{- end }}
{{- end }}
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

{{/* The ConfigMap of workloadKinds.extra, and where the server reads it. */}}
{{- define "modelgate.workloadKindsName" -}}
{{- printf "%s-workload-kinds" (include "modelgate.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "modelgate.workloadKindsPath" -}}
/etc/modelgate/workload-kinds/workload-kinds.yaml
{{- end -}}

{{/*
The workload-kind table (docs/policy.md §11, §12) as JSON: the rows the server ships
(files/workload-kinds.yaml, the same file as crates/modelgate-core/src/admission/
workload-kinds.yaml), each replaced by the entry of workloadKinds.extra of the same group and
kind, then the other extra entries. The server reads the same extra entries (--workload-kinds),
so what is registered here is what it judges.
*/}}
{{- define "modelgate.workloadKinds" -}}
{{- $rows := .Files.Get "files/workload-kinds.yaml" | fromYamlArray -}}
{{- $extra := .Values.workloadKinds.extra | default list -}}
{{- $out := list -}}
{{- range $rows -}}
{{- $row := . -}}
{{- range $extra -}}
{{- if and (eq (default "" .group) (default "" $row.group)) (eq .kind $row.kind) -}}
{{- $row = . -}}
{{- end -}}
{{- end -}}
{{- $out = append $out $row -}}
{{- end -}}
{{- range $extra -}}
{{- $e := . -}}
{{- $shipped := false -}}
{{- range $rows -}}
{{- if and (eq (default "" .group) (default "" $e.group)) (eq .kind $e.kind) -}}
{{- $shipped = true -}}
{{- end -}}
{{- end -}}
{{- if not $shipped -}}
{{- $out = append $out $e -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
The rules of validate-controllers.modelgate.io: one per row of the table. UPDATE only with
matchConditions: without the condition that skips an unchanged template, every scale of a
ReplicaSet by the Deployment controller (an UPDATE of the resource itself) would wait on
modelgate, and fail while it is down. A rule may name a resource the cluster does not serve
(a CRD not installed): the API server accepts it and never matches it.
*/}}
{{- define "modelgate.controllerRules" -}}
{{- $ops := ternary (list "CREATE" "UPDATE") (list "CREATE") .Values.matchConditions.enabled -}}
{{- range (include "modelgate.workloadKinds" . | fromJsonArray) }}
- apiGroups: [{{ default "" .group | quote }}]
  apiVersions: {{ .versions | toJson | replace "," ", " }}
  operations: {{ $ops | toJson | replace "," ", " }}
  resources: [{{ .plural | quote }}]
  scope: {{ default "Namespaced" .scope }}
{{- end }}
{{- end -}}

{{/* `has(r.a) && has(r.a.b)`: every key of a path exists under r ("true" without keys). */}}
{{- define "modelgate.celHas" -}}
{{- $at := .root -}}
{{- $has := list -}}
{{- range .keys -}}
{{- $at = printf "%s.%s" $at . -}}
{{- $has = append $has (printf "has(%s)" $at) -}}
{{- end -}}
{{- if $has -}}{{ join " && " $has }}{{- else -}}true{{- end -}}
{{- end -}}

{{/* `r.a.b`: the value at a path under r. */}}
{{- define "modelgate.celGet" -}}
{{- $at := .root -}}
{{- range .keys -}}
{{- $at = printf "%s.%s" $at . -}}
{{- end -}}
{{- $at -}}
{{- end -}}

{{/*
A CEL expression, true when an UPDATE changed what a template path of the table finds: the
value at the path, or what a list or map step finds in each element. `spec.tasks[*].template`
compares the tasks' templates in order (a change of a task's replicas is not a change);
`spec.pytorchReplicaSpecs.*.template` compares each key's template, whatever the maps' order;
a path with a second wildcard compares the whole list or map at the first. Never an error on an
absent field: each step is guarded by has().
*/}}
{{- define "modelgate.templateChanged" -}}
{{- $prefix := list -}}
{{- $wild := "" -}}
{{- $suffix := list -}}
{{- $more := false -}}
{{- range (splitList "." .) -}}
{{- $seg := . -}}
{{- if eq $wild "" -}}
{{- if eq $seg "*" -}}
{{- $wild = "map" -}}
{{- else if hasSuffix "[*]" $seg -}}
{{- $prefix = append $prefix (trimSuffix "[*]" $seg) -}}
{{- $wild = "list" -}}
{{- else -}}
{{- $prefix = append $prefix $seg -}}
{{- end -}}
{{- else -}}
{{- if or (eq $seg "*") (hasSuffix "[*]" $seg) -}}
{{- $more = true -}}
{{- end -}}
{{- $suffix = append $suffix (trimSuffix "[*]" $seg) -}}
{{- end -}}
{{- end -}}
{{- $gNew := include "modelgate.celHas" (dict "root" "object" "keys" $prefix) -}}
{{- $gOld := include "modelgate.celHas" (dict "root" "oldObject" "keys" $prefix) -}}
{{- $vNew := include "modelgate.celGet" (dict "root" "object" "keys" $prefix) -}}
{{- $vOld := include "modelgate.celGet" (dict "root" "oldObject" "keys" $prefix) -}}
{{- $differ := printf "%s != %s" $vNew $vOld -}}
{{- if and (eq $wild "list") (not $more) $suffix -}}
{{- $h := include "modelgate.celHas" (dict "root" "e" "keys" $suffix) -}}
{{- $get := include "modelgate.celGet" (dict "root" "e" "keys" $suffix) -}}
{{- $differ = printf "%s.filter(e, %s).map(e, %s) != %s.filter(e, %s).map(e, %s)" $vNew $h $get $vOld $h $get -}}
{{- else if and (eq $wild "map") (not $more) -}}
{{- $nk := printf "%s[k]" $vNew -}}
{{- $ok := printf "%s[k]" $vOld -}}
{{- $hN := include "modelgate.celHas" (dict "root" $nk "keys" $suffix) -}}
{{- $hO := include "modelgate.celHas" (dict "root" $ok "keys" $suffix) -}}
{{- $sN := include "modelgate.celGet" (dict "root" $nk "keys" $suffix) -}}
{{- $sO := include "modelgate.celGet" (dict "root" $ok "keys" $suffix) -}}
{{- $differ = printf "%s.exists(k, %s && !(k in %s && %s && %s == %s)) || %s.exists(k, %s && !(k in %s && %s))" $vNew $hN $vOld $hO $sN $sO $vOld $hO $vNew $hN -}}
{{- end -}}
{{- printf "(%s) != (%s) || (%s) && (%s)" $gNew $gOld $gNew $differ -}}
{{- end -}}

{{/* `request.kind.group == 'g' && request.kind.kind == 'K'`: a request for a row's kind. */}}
{{- define "modelgate.celKind" -}}
{{- printf "request.kind.group == '%s' && request.kind.kind == '%s'" (default "" .group) .kind -}}
{{- end -}}

{{/* The unchanged-template condition: each row's kind, any of its template paths changed. */}}
{{- define "modelgate.celTemplatesChanged" -}}
{{- range (include "modelgate.workloadKinds" . | fromJsonArray) -}}
{{- $changed := list -}}
{{- range .templates -}}
{{- $changed = append $changed (printf "(%s)" (include "modelgate.templateChanged" .path)) -}}
{{- end }}
{{ include "modelgate.celKind" . }}
? {{ join " || " $changed }}
:
{{- end }} true
{{- end -}}

{{/*
The excluded priority classes, for the rows with one pod template at a fixed path (the built-in
controllers): a template of such a class is not sent. A kind with several templates is always
sent (one template of the class does not say what the others are).
*/}}
{{- define "modelgate.celPriorityExcluded" -}}
{{- $classes := .classes -}}
{{- range (include "modelgate.workloadKinds" .root | fromJsonArray) -}}
{{- $t := first .templates -}}
{{- if and (eq (len .templates) 1) (not (contains "*" $t.path)) (eq (default "PodTemplateSpec" $t.shape) "PodTemplateSpec") -}}
{{- $keys := concat (splitList "." $t.path) (list "spec" "priorityClassName") }}
{{ include "modelgate.celKind" . }}
? !({{ include "modelgate.celHas" (dict "root" "object" "keys" $keys) }}) || !({{ include "modelgate.celGet" (dict "root" "object" "keys" $keys) }} in {{ $classes }})
:
{{- end -}}
{{- end }} true
{{- end -}}
