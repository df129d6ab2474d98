{{/*
The backstop's expressions for the custom resources of the workload-kind table (docs/policy.md section
12), rendered from the same table as the webhook rules ("modelgate.workloadKinds", with
workloadKinds.extra): the text is the binary's (`modelgate backstop`,
crates/modelgate-core/src/backstop.rs: table_row, walk), which tests/assets/test_backstop.py
compares with this render.
*/}}

{{/* The rows the backstop judges: not the built-in controllers, and with a complete template. */}}
{{- define "modelgate.backstopTableKinds" -}}
{{- $builtin := list "apps/Deployment" "apps/StatefulSet" "apps/DaemonSet" "apps/ReplicaSet" "/ReplicationController" "batch/CronJob" -}}
{{- $out := list -}}
{{- range (include "modelgate.workloadKinds" . | fromJsonArray) -}}
{{- $complete := false -}}
{{- range .templates -}}
{{- if ne (default "complete" .completeness) "partial" -}}{{- $complete = true -}}{{- end -}}
{{- end -}}
{{- if and $complete (not (has (printf "%s/%s" (default "" .group) .kind) $builtin)) -}}
{{- $out = append $out . -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
How many of those rows workloadKinds.extra adds (not a row of the shipped table replaced): the
binary refuses more than MAX_EXTRA_WORKLOAD_KINDS (32), each row being a variable of its own
that every API server compiles.
*/}}
{{- define "modelgate.backstopAddedKinds" -}}
{{- $shipped := list -}}
{{- range (.Files.Get "files/workload-kinds.yaml" | fromYamlArray) -}}
{{- $shipped = append $shipped (printf "%s/%s" (default "" .group) .kind) -}}
{{- end -}}
{{- $added := 0 -}}
{{- range (include "modelgate.backstopTableKinds" . | fromJsonArray) -}}
{{- if not (has (printf "%s/%s" (default "" .group) .kind) $shipped) -}}
{{- $added = add1 $added -}}
{{- end -}}
{{- end -}}
{{- $added -}}
{{- end -}}

{{/* The rows' `group/Kind` as a CEL list, as variables.kindKey reads a request's. */}}
{{- define "modelgate.backstopKindKeys" -}}
{{- $keys := list -}}
{{- range (include "modelgate.backstopTableKinds" . | fromJsonArray) -}}
{{- $keys = append $keys (printf "'%s/%s'" (default "" .group) .kind) -}}
{{- end -}}
{{- printf "[%s]" (join ", " $keys) -}}
{{- end -}}

{{/*
One row's variable (.row; .classes: the excluded priority classes as JSON, or empty): for a
request of its kind that creates it or changes one of its templates, and whose one template is
not of an excluded class, the findings of every complete template as one string; else ''.
*/}}
{{- define "modelgate.backstopTableRow" -}}
{{- $row := .row -}}
{{- $changed := list -}}
{{- range $row.templates -}}
{{- $changed = append $changed (printf "(%s)" (include "modelgate.templateChanged" .path)) -}}
{{- end -}}
{{- $priority := "true" -}}
{{- if .classes -}}
{{- $t := first $row.templates -}}
{{- if and (eq (len $row.templates) 1) (not (contains "*" $t.path)) (eq (default "PodTemplateSpec" $t.shape) "PodTemplateSpec") -}}
{{- $keys := concat (splitList "." $t.path) (list "spec" "priorityClassName") -}}
{{- $priority = printf "!(%s) || !(%s in %s)" (include "modelgate.celHas" (dict "root" "object" "keys" $keys)) (include "modelgate.celGet" (dict "root" "object" "keys" $keys)) .classes -}}
{{- end -}}
{{- end -}}
{{- $templates := list -}}
{{- range $row.templates -}}
{{- if ne (default "complete" .completeness) "partial" -}}
{{- $walk := dict "steps" (include "modelgate.backstopSteps" .path | fromJsonArray) "value" "object" "dyn" "" "tail" "" "shape" (default "PodTemplateSpec" .shape) "depth" 0 -}}
{{- $templates = append $templates (include "modelgate.backstopWalk" $walk) -}}
{{- end -}}
{{- end -}}
{{- printf "variables.kindKey == '%s/%s' && (request.operation != 'UPDATE' || %s) && (%s) ? [%s].filter(s, s != '').join('; ') : ''" (default "" $row.group) $row.kind (join " || " $changed) $priority (join ", " $templates) -}}
{{- end -}}

{{/* The pod-level ranges of the pod spec @POD@, each finding named under the CEL string @PATH@. */}}
{{- define "modelgate.backstopPodRanges" -}}
(has(@POD@.securityContext) && has(@POD@.securityContext.runAsUser) && (@POD@.securityContext.runAsUser < 1 || @POD@.securityContext.runAsUser > 2147483647) ? [@PATH@ + '.securityContext.runAsUser: ' + string(@POD@.securityContext.runAsUser) + ' is outside 1..2147483647'] : []) + (has(@POD@.securityContext) && has(@POD@.securityContext.runAsGroup) && (@POD@.securityContext.runAsGroup < 0 || @POD@.securityContext.runAsGroup > 2147483647) ? [@PATH@ + '.securityContext.runAsGroup: ' + string(@POD@.securityContext.runAsGroup) + ' is outside 0..2147483647'] : []) + (has(@POD@.securityContext) && has(@POD@.securityContext.fsGroup) && (@POD@.securityContext.fsGroup < 0 || @POD@.securityContext.fsGroup > 2147483647) ? [@PATH@ + '.securityContext.fsGroup: ' + string(@POD@.securityContext.fsGroup) + ' is outside 0..2147483647'] : [])
{{- end -}}

{{/* A container c's ids outside their ranges, each finding starting with the mark '\u0001'. */}}
{{- define "modelgate.backstopContainerRanges" -}}
(has(c.securityContext) && has(c.securityContext.runAsUser) && (c.securityContext.runAsUser < 1 || c.securityContext.runAsUser > 2147483647) ? ['\u0001.securityContext.runAsUser: ' + string(c.securityContext.runAsUser) + ' is outside 1..2147483647'] : []) + (has(c.securityContext) && has(c.securityContext.runAsGroup) && (c.securityContext.runAsGroup < 0 || c.securityContext.runAsGroup > 2147483647) ? ['\u0001.securityContext.runAsGroup: ' + string(c.securityContext.runAsGroup) + ' is outside 0..2147483647'] : [])
{{- end -}}

{{/*
Of a list of findings strings .f (one per element, '' for none, each holding the CEL string
.mark where the CEL string expression .prefix and the element's index go), the first element's
findings, then how many other elements have findings (.what), named under .listPath.
*/}}
{{- define "modelgate.backstopFirstWithFindings" -}}
{{- $first := printf "%s.map(s, s != '').indexOf(true)" .f -}}
{{- $others := printf "size(%s.filter(s, s != '')) - 1" .f -}}
{{- printf "(%s.exists(s, s != '') ? %s[%s].replace(%s, %s + '[' + string(%s) + ']') + (%s > 0 ? '; ' + %s + ': ' + string(%s) + ' more %s' : '') : '')" .f .f $first .mark .prefix $first $others .listPath $others .what -}}
{{- end -}}

{{/* A path's literal tail after its dynamic part (.dyn), with .more: a CEL string expression. */}}
{{- define "modelgate.backstopPathWith" -}}
{{- $literal := printf "'%s%s'" .tail .more -}}
{{- if .dyn -}}{{ printf "%s + %s" .dyn $literal }}{{- else -}}{{ $literal }}{{- end -}}
{{- end -}}

{{/* A path's tail with one more key. */}}
{{- define "modelgate.backstopPathKey" -}}
{{- if or .dyn .tail -}}{{ printf "%s.%s" .tail .key }}{{- else -}}{{ .key }}{{- end -}}
{{- end -}}

{{/*
The findings (one CEL string) of the templates that .steps (keys, "[*]", "*") find below .value,
at the path .dyn + .tail (the tail holds the marks of the list indexes not known yet, as CEL
escapes '\u0010' + depth); the template's spec bound to p<depth>. Under a list the first element
with findings is named and the others counted.
*/}}
{{- define "modelgate.backstopWalk" -}}
{{- $d := int .depth -}}
{{- if not .steps -}}
{{- $spec := .value -}}
{{- $tail := .tail -}}
{{- $guard := "true" -}}
{{- if ne .shape "PodSpec" -}}
{{- $spec = printf "%s.spec" .value -}}
{{- $tail = include "modelgate.backstopPathKey" (dict "dyn" .dyn "tail" .tail "key" "spec") -}}
{{- $guard = printf "has(%s.spec)" .value -}}
{{- end -}}
{{- $specPath := include "modelgate.backstopPathWith" (dict "dyn" .dyn "tail" $tail "more" "") -}}
{{- $p := printf "p%d" $d -}}
{{- $l := printf "l%d" $d -}}
{{- $f := printf "f%d" $d -}}
{{- $lists := list -}}
{{- range (list "initContainers" "containers" "ephemeralContainers") -}}
{{- $lists = append $lists (printf "[dyn('%s'), has(%s.%s) ? %s.%s : []]" . $p . $p .) -}}
{{- end -}}
{{- $listPath := printf "%s + '.' + %s[0]" $specPath $l -}}
{{- $first := include "modelgate.backstopFirstWithFindings" (dict "f" $f "mark" "'\\u0001'" "prefix" $listPath "listPath" $listPath "what" "containers with an id outside its range") -}}
{{- $perList := printf "[%s].map(%s, [%s[1].map(c, !(%s[0] == 'initContainers' && has(c.name) && c.name == 'model-cache-prep') ? (%s).join('; ') : '')].map(%s, %s)[0])" (join ", " $lists) $l $l $l (include "modelgate.backstopContainerRanges" .) $f $first -}}
{{- $podRanges := include "modelgate.backstopPodRanges" . | replace "@POD@" $p | replace "@PATH@" $specPath -}}
{{- printf "(%s ? [%s].map(%s, ((%s) + %s).filter(s, s != '').join('; '))[0] : '')" $guard $spec $p $podRanges $perList -}}
{{- else -}}
{{- $step := first .steps -}}
{{- $next := dict "steps" (rest .steps) "shape" .shape "depth" $d -}}
{{- if eq $step "[*]" -}}
{{- $e := printf "e%d" $d -}}
{{- $l := printf "l%d" $d -}}
{{- $mark := printf "\\u%04x" (add 16 $d) -}}
{{- $_ := set $next "value" $e -}}
{{- $_ = set $next "dyn" .dyn -}}
{{- $_ = set $next "tail" (printf "%s%s" .tail $mark) -}}
{{- $_ = set $next "depth" (add1 $d) -}}
{{- $listPath := include "modelgate.backstopPathWith" (dict "dyn" .dyn "tail" .tail "more" "") -}}
{{- $first := include "modelgate.backstopFirstWithFindings" (dict "f" $l "mark" (printf "'%s'" $mark) "prefix" "''" "listPath" $listPath "what" "elements with an id outside its range") -}}
{{- printf "[%s.map(%s, %s)].map(%s, %s)[0]" .value $e (include "modelgate.backstopWalk" $next) $l $first -}}
{{- else if eq $step "*" -}}
{{- $k := printf "k%d" $d -}}
{{- $at := include "modelgate.backstopPathWith" (dict "dyn" .dyn "tail" .tail "more" ".") -}}
{{- $_ := set $next "value" (printf "%s[%s]" .value $k) -}}
{{- $_ = set $next "dyn" (printf "%s + %s" $at $k) -}}
{{- $_ = set $next "tail" "" -}}
{{- $_ = set $next "depth" (add1 $d) -}}
{{- printf "%s.map(%s, %s).filter(s, s != '').join('; ')" .value $k (include "modelgate.backstopWalk" $next) -}}
{{- else -}}
{{- $_ := set $next "value" (printf "%s.%s" .value $step) -}}
{{- $_ = set $next "dyn" .dyn -}}
{{- $_ = set $next "tail" (include "modelgate.backstopPathKey" (dict "dyn" .dyn "tail" .tail "key" $step)) -}}
{{- printf "(has(%s.%s) ? %s : '')" .value $step (include "modelgate.backstopWalk" $next) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A path as steps: keys, "[*]" after a list's key, "*" for every value of a map. */}}
{{- define "modelgate.backstopSteps" -}}
{{- $steps := list -}}
{{- range (splitList "." .) -}}
{{- if eq . "*" -}}
{{- $steps = append $steps "*" -}}
{{- else if hasSuffix "[*]" . -}}
{{- $steps = append $steps (trimSuffix "[*]" .) -}}
{{- $steps = append $steps "[*]" -}}
{{- else -}}
{{- $steps = append $steps . -}}
{{- end -}}
{{- end -}}
{{- toJson $steps -}}
{{- end -}}

{{/*
The backstop's matchConditions, the webhooks' own (docs/policy.md section 13), for the
ValidatingAdmissionPolicy and the MutatingAdmissionPolicy alike: the binary's text.
*/}}
{{- define "modelgate.backstopMatchConditions" -}}
- name: exclude-mirror-pods
  expression: |-
    request.kind.kind != 'Pod' || !has(object.metadata.annotations) || !('kubernetes.io/config.mirror' in object.metadata.annotations)
- name: exclude-unchanged-pod-template
  expression: |-
    !(request.kind.group + '/' + request.kind.kind in ['apps/Deployment', 'apps/StatefulSet', 'apps/DaemonSet', 'apps/ReplicaSet', '/ReplicationController', 'batch/CronJob']) || request.operation != 'UPDATE' || (request.kind.kind == 'CronJob' ? object.spec.jobTemplate.spec.template != oldObject.spec.jobTemplate.spec.template : object.spec.template != oldObject.spec.template)
- name: only-pod-updates-that-change-init-images
  expression: |-
    request.kind.kind != 'Pod' || request.operation != 'UPDATE' || request.?subResource.orValue('') != '' || (has(object.spec.initContainers) && has(oldObject.spec.initContainers) && object.spec.initContainers.map(c, has(c.image) ? c.image : '') != oldObject.spec.initContainers.map(c, has(c.image) ? c.image : ''))
- name: exclude-own-service-account
  expression: >-
    request.userInfo.?username.orValue('') != 'system:serviceaccount:{{ .Release.Namespace }}:{{ include "modelgate.serviceAccountName" . }}'
- name: exclude-exempt-namespaces
  expression: >-
    !(request.?namespace.orValue('') in {{ include "modelgate.exemptNamespaces" . | replace "\"" "'" }})
{{- with .Values.matchConditions.excludePriorityClasses }}
- name: exclude-priority-classes
  expression: |-
    !(request.kind.group + '/' + request.kind.kind in ['/Pod', 'batch/Job', 'apps/Deployment', 'apps/StatefulSet', 'apps/DaemonSet', 'apps/ReplicaSet', '/ReplicationController', 'batch/CronJob']) || (request.kind.kind == 'Pod' ? !has(object.spec.priorityClassName) || !(object.spec.priorityClassName in {{ toJson . }}) : (request.kind.kind == 'CronJob' ? !has(object.spec.jobTemplate.spec.template.spec.priorityClassName) || !(object.spec.jobTemplate.spec.template.spec.priorityClassName in {{ toJson . }}) : !has(object.spec.template.spec.priorityClassName) || !(object.spec.template.spec.priorityClassName in {{ toJson . }})))
{{- end }}
{{- end -}}

{{/*
The namespaces both backstop bindings select: the webhooks' own, in enforce
(modelgate.enforceExpressions), and not opened for exceptions, which the policies cannot see (docs/exceptions.md).
*/}}
{{- define "modelgate.backstopBindingSelector" -}}
{{- $selector := include "modelgate.namespaceSelector" . | fromYaml -}}
{{- $modes := include "modelgate.enforceExpressions" . | fromJsonArray -}}
{{- $closed := list (dict "key" "modelgate.io/exceptions" "operator" "NotIn" "values" (list "allowed")) -}}
{{- $_ := set $selector "matchExpressions" (concat $selector.matchExpressions $modes $closed) -}}
{{- toYaml $selector -}}
{{- end -}}

{{/* Whether the MutatingAdmissionPolicy is rendered: with the backstop, where the cluster serves it (auto). */}}
{{- define "modelgate.backstopMutatingEnabled" -}}
{{- if ne (include "modelgate.backstopEnabled" .) "true" -}}
false
{{- else if eq (toString .Values.backstop.mutating) "auto" -}}
{{- .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
{{- else -}}
{{- toString .Values.backstop.mutating -}}
{{- end -}}
{{- end -}}

{{/*
The settings the MutatingAdmissionPolicy reads, by variable name, each one literal as the
binary writes it (crates/modelgate-core/src/backstop/mutating.rs, settings): none is -1.
*/}}
{{- define "modelgate.backstopMutatingSettings" -}}
{{- $prefixes := list -}}
{{- range .Values.prepHostPaths }}{{ $prefixes = append $prefixes (clean .) }}{{ end -}}
{{- $id := dict -}}
{{- range $k, $v := dict "runAsUser" .Values.runAsUser "runAsGroup" .Values.runAsGroup -}}
{{- $_ := set $id $k (ternary "-1" (include "modelgate.idOrNone" $v) (eq (include "modelgate.idOrNone" $v) "none")) -}}
{{- end -}}
{{- dict
  "prepAlways" (printf "%t" (eq .Values.modelCachePrep "always"))
  "defaultCacheVolume" (.Values.cacheVolume | toJson)
  "initContainerUser" (printf "%d" (int64 .Values.initContainer.user))
  "podSecurityDefault" (printf "'%s'" .Values.podSecurityDefault)
  "prepVolumeTypes" (.Values.prepVolumeTypes | toJson)
  "prepHostPaths" ($prefixes | toJson)
  "runAsUser" $id.runAsUser
  "runAsGroup" $id.runAsGroup
  "prepStorageClasses" (.Values.prepStorageClasses | toJson)
  | toJson -}}
{{- end -}}
