{{/*
Operations: what keeps the webhooks from locking up the cluster, and the names the monitoring
objects (servicemonitor.yaml, prometheusrule.yaml, grafana-dashboard.yaml) select by.
*/}}

{{/*
failurePolicy of one webhook ("mutate" or "validate"): its own value, else the chart-wide one,
else Ignore when the backstop holds the policy inside the API server and Fail when nothing does.
*/}}
{{- define "modelgate.failurePolicy" -}}
{{- $hook := index .root.Values.webhooks .hook -}}
{{- $default := ternary "Ignore" "Fail" (eq (include "modelgate.backstopEnabled" .root) "true") -}}
{{- $hook.failurePolicy | default .root.Values.failurePolicy | default $default -}}
{{- end -}}

{{/*
The namespaces one webhook ("mutate" or "validate") is registered for, each scope an entry of its
own with its failurePolicy, as a JSON list of {suffix, failurePolicy, expressions}: expressions
are added to the namespaceSelector, suffix to the entry's name.
With the backstop on and no failurePolicy of the operator's, the webhook may fail open only
where an outage cannot let a root pod in (docs/operations.md, "failurePolicy × the backstop"):
- Ignore in the namespaces not opened for exceptions: in enforce the backstop is bound there, in
  warn, audit and off nothing blocks;
- Fail in the enforce namespaces opened for exceptions (modelgate.io/exceptions: allowed), which
  the backstop leaves out because it cannot see exceptions (docs/exceptions.md);
- Ignore in the opened namespaces that never block: a warn, audit or off mode label, or none
  when defaultMode is not enforce.
Otherwise one scope: every opted-in namespace, with the failurePolicy of modelgate.failurePolicy.
*/}}
{{- define "modelgate.webhookScopes" -}}
{{- $hook := index .root.Values.webhooks .hook -}}
{{- $explicit := $hook.failurePolicy | default .root.Values.failurePolicy -}}
{{- if or $explicit (ne (include "modelgate.backstopEnabled" .root) "true") -}}
{{- list (dict "suffix" "" "failurePolicy" (include "modelgate.failurePolicy" .) "expressions" (list)) | toJson -}}
{{- else -}}
{{- $opened := dict "key" "modelgate.io/exceptions" "operator" "In" "values" (list "allowed") -}}
{{- $notOpened := dict "key" "modelgate.io/exceptions" "operator" "NotIn" "values" (list "allowed") -}}
{{- $nonBlocking := list "warn" "audit" "off" -}}
{{- $enforce := include "modelgate.enforceExpressions" .root | fromJsonArray -}}
{{- $scopes := list
  (dict "suffix" "" "failurePolicy" "Ignore" "expressions" (list $notOpened))
  (dict "suffix" "-exceptions" "failurePolicy" "Fail" "expressions" (prepend $enforce $opened))
  (dict "suffix" "-exceptions-nonblocking" "failurePolicy" "Ignore" "expressions" (list $opened (dict "key" "modelgate.io/mode" "operator" "In" "values" $nonBlocking)))
-}}
{{- if ne .root.Values.defaultMode "enforce" -}}
{{- $scopes = append $scopes (dict "suffix" "-exceptions-unlabelled" "failurePolicy" "Ignore" "expressions" (list $opened (dict "key" "modelgate.io/mode" "operator" "DoesNotExist"))) -}}
{{- end -}}
{{- $scopes | toJson -}}
{{- end -}}
{{- end -}}

{{/*
The label requirements that select the namespaces in enforce (docs/policy.md section 9), as a
JSON list: a mode label that is none of the others (an unknown value counts as enforce), or
none at all when defaultMode is enforce (NotIn matches a namespace without the key).
*/}}
{{- define "modelgate.enforceExpressions" -}}
{{- $modes := list -}}
{{- if ne .Values.defaultMode "enforce" -}}
{{- $modes = append $modes (dict "key" "modelgate.io/mode" "operator" "Exists") -}}
{{- end -}}
{{- append $modes (dict "key" "modelgate.io/mode" "operator" "NotIn" "values" (list "warn" "audit" "off")) | toJson -}}
{{- end -}}

{{/* The namespaceSelector of one scope of modelgate.webhookScopes: the webhooks' own, and the scope's expressions. */}}
{{- define "modelgate.scopedNamespaceSelector" -}}
{{- $selector := include "modelgate.namespaceSelector" .root | fromYaml -}}
{{- $_ := set $selector "matchExpressions" (concat $selector.matchExpressions .scope.expressions) -}}
{{- toYaml $selector -}}
{{- end -}}

{{/* timeoutSeconds of one webhook: its own value (1..30), else the chart-wide one. */}}
{{- define "modelgate.timeoutSeconds" -}}
{{- $hook := index .root.Values.webhooks .hook -}}
{{- int64 (default .root.Values.timeoutSeconds $hook.timeoutSeconds) -}}
{{- end -}}

{{/*
matchConditions of the Pod and Job webhooks, mutate.modelgate.io and validate.modelgate.io (CEL,
evaluated by the API server before it calls modelgate, so a request they keep out is admitted
even while modelgate is down):
- mirror pods: the kubelet's API copies of static pods (the control plane's own on kubeadm
  clusters); the API server cannot change what runs, and the code skips them too;
- requests made by modelgate's own service account;
- the exempt namespaces (also kept out by the namespaceSelector, which a values file may replace);
- pods and Jobs of the priority classes in matchConditions.excludePriorityClasses.
*/}}
{{- define "modelgate.matchConditions" -}}
{{- if .Values.matchConditions.enabled }}
matchConditions:
  - name: exclude-mirror-pods
    expression: >-
      request.kind.kind != 'Pod' || !has(object.metadata.annotations) ||
      !('kubernetes.io/config.mirror' in object.metadata.annotations)
  - name: exclude-own-service-account
    expression: >-
      request.userInfo.?username.orValue('') != 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "modelgate.serviceAccountName" . }}'
  - name: exclude-exempt-namespaces
    expression: >-
      !(request.?namespace.orValue('') in {{ include "modelgate.exemptNamespaces" . | replace "\"" "'" }})
  {{- with .Values.matchConditions.excludePriorityClasses }}
  {{- $classes := toJson . | replace "\"" "'" }}
  - name: exclude-priority-classes
    expression: >-
      request.kind.kind == 'Pod'
      ? !has(object.spec.priorityClassName) || !(object.spec.priorityClassName in {{ $classes }})
      : request.kind.kind != 'Job' || !has(object.spec.template.spec.priorityClassName) || !(object.spec.template.spec.priorityClassName in {{ $classes }})
  {{- end }}
{{- end }}
{{- end -}}

{{/*
matchConditions of validate.modelgate.io: those of both Pod and Job webhooks, and a Pod UPDATE
only when an init container's image changed (the validator judges nothing else of it: the
model-cache-prep image may not change after admission).
*/}}
{{- define "modelgate.validateMatchConditions" -}}
{{- with include "modelgate.matchConditions" . | trim }}
{{ . }}
  - name: only-pod-updates-that-change-init-images
    expression: >-
      request.kind.kind != 'Pod' || request.operation != 'UPDATE' ||
      request.?subResource.orValue('') != '' ||
      (has(object.spec.initContainers) && has(oldObject.spec.initContainers) &&
      object.spec.initContainers.map(c, has(c.image) ? c.image : '') !=
      oldObject.spec.initContainers.map(c, has(c.image) ? c.image : ''))
{{- end }}
{{- end -}}

{{/*
matchConditions of the workload kinds' entry (validate-controllers.modelgate.io, docs/policy.md §11,
§12), rendered from the workload-kind table:
- an UPDATE that leaves every pod template as it was (a scale of the resource itself or of a
  worker group, a label, an annotation, status, the Deployment controller's bookkeeping on its
  ReplicaSets): nothing its pods will be judged on changed. Each step of a template path is
  guarded by has(), so an absent template (optional in most custom resources) is no error; on
  CREATE oldObject is null and the first test decides;
- modelgate's own service account and the exempt namespaces, as for Pods and Jobs;
- templates of the priority classes in matchConditions.excludePriorityClasses, whose pods the
  Pod webhook never sees either (kinds with one template at a fixed path).
No mirror-pod condition: only Pods are mirror pods.
*/}}
{{- define "modelgate.controllerMatchConditions" -}}
{{- if .Values.matchConditions.enabled }}
matchConditions:
  - name: exclude-unchanged-pod-template
    expression: >-
      request.operation != 'UPDATE' || (
      {{- include "modelgate.celTemplatesChanged" . | trim | nindent 6 }})
  - name: exclude-own-service-account
    expression: >-
      request.userInfo.?username.orValue('') != 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "modelgate.serviceAccountName" . }}'
  - name: exclude-exempt-namespaces
    expression: >-
      !(request.?namespace.orValue('') in {{ include "modelgate.exemptNamespaces" . | replace "\"" "'" }})
  {{- with .Values.matchConditions.excludePriorityClasses }}
  {{- $classes := toJson . | replace "\"" "'" }}
  - name: exclude-priority-classes
    expression: >-
      {{- include "modelgate.celPriorityExcluded" (dict "root" $ "classes" $classes) | trim | nindent 6 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The job label Prometheus gives modelgate's targets: the Service's name (ServiceMonitor default). */}}
{{- define "modelgate.metricsJob" -}}
{{- include "modelgate.fullname" . -}}
{{- end -}}

{{/*
Whether the backstop is rendered: backstop.enabled true or false, or with auto (the default)
whether the cluster serves ValidatingAdmissionPolicy v1 (what helm install and upgrade read
from discovery; helm template knows it only from --api-versions).
*/}}
{{- define "modelgate.backstopEnabled" -}}
{{- $enabled := .Values.backstop.enabled -}}
{{- if eq (toString $enabled) "auto" -}}
{{- .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" -}}
{{- else -}}
{{- toString $enabled -}}
{{- end -}}
{{- end -}}
