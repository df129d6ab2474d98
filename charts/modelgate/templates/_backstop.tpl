{{/*
The backstop's expressions for the custom resources of the workload-kind table (SPEC.md section
12), rendered from the same table as the webhook rules ("modelgate.workloadKinds", with
workloadKinds.extra): the text is the binary's (`modelgate backstop`), which
tests/assets/test_backstop.py compares with this render.
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

{{/* A request for any of those rows (false without rows). */}}
{{- define "modelgate.backstopTableKind" -}}
{{- $rows := list -}}
{{- range (include "modelgate.backstopTableKinds" . | fromJsonArray) -}}
{{- $rows = append $rows (printf "(%s)" (include "modelgate.celKind" .)) -}}
{{- end -}}
{{- if $rows -}}{{ printf "(%s)" (join " || " $rows) }}{{- else -}}false{{- end -}}
{{- end -}}

{{/* For each row, a request of its kind changed one of its templates (or is not an UPDATE). */}}
{{- define "modelgate.backstopTemplatesChanged" -}}
{{- $rows := list -}}
{{- range (include "modelgate.backstopTableKinds" . | fromJsonArray) -}}
{{- $any := list -}}
{{- range .templates -}}
{{- $any = append $any (printf "(%s)" (include "modelgate.templateChanged" .path)) -}}
{{- end -}}
{{- $rows = append $rows (printf "(!(%s) || (request.operation != 'UPDATE' || %s))" (include "modelgate.celKind" .) (join " || " $any)) -}}
{{- end -}}
{{- if $rows -}}{{ join " && " $rows }}{{- else -}}true{{- end -}}
{{- end -}}

{{/* For each row, its one template at a fixed path is not of the excluded classes (.classes). */}}
{{- define "modelgate.backstopPriorityExcluded" -}}
{{- $classes := .classes -}}
{{- $rows := list -}}
{{- range (include "modelgate.backstopTableKinds" .root | fromJsonArray) -}}
{{- $t := first .templates -}}
{{- $value := "true" -}}
{{- if and (eq (len .templates) 1) (not (contains "*" $t.path)) (eq (default "PodTemplateSpec" $t.shape) "PodTemplateSpec") -}}
{{- $keys := concat (splitList "." $t.path) (list "spec" "priorityClassName") -}}
{{- $value = printf "!(%s) || !(%s in %s)" (include "modelgate.celHas" (dict "root" "object" "keys" $keys)) (include "modelgate.celGet" (dict "root" "object" "keys" $keys)) $classes -}}
{{- end -}}
{{- $rows = append $rows (printf "(!(%s) || (%s))" (include "modelgate.celKind" .) $value) -}}
{{- end -}}
{{- if $rows -}}{{ join " && " $rows }}{{- else -}}true{{- end -}}
{{- end -}}

{{/* The ranges of one pod spec @POD@, its fields named under the CEL string @PATH@. */}}
{{- define "modelgate.backstopRanges" -}}
(has(@POD@.securityContext) && has(@POD@.securityContext.runAsUser) && (@POD@.securityContext.runAsUser < 1 || @POD@.securityContext.runAsUser > 2147483647) ? [@PATH@ + '.securityContext.runAsUser' + ': ' + string(@POD@.securityContext.runAsUser) + ' is outside 1..2147483647'] : []) + (has(@POD@.securityContext) && has(@POD@.securityContext.runAsGroup) && (@POD@.securityContext.runAsGroup < 0 || @POD@.securityContext.runAsGroup > 2147483647) ? [@PATH@ + '.securityContext.runAsGroup' + ': ' + string(@POD@.securityContext.runAsGroup) + ' is outside 0..2147483647'] : []) + (has(@POD@.securityContext) && has(@POD@.securityContext.fsGroup) && (@POD@.securityContext.fsGroup < 0 || @POD@.securityContext.fsGroup > 2147483647) ? [@PATH@ + '.securityContext.fsGroup' + ': ' + string(@POD@.securityContext.fsGroup) + ' is outside 0..2147483647'] : []) + (has(@POD@.initContainers) ? @POD@.initContainers.filter(c, !(true && c.name == 'model-cache-prep') && has(c.securityContext) && has(c.securityContext.runAsUser) && (c.securityContext.runAsUser < 1 || c.securityContext.runAsUser > 2147483647)).map(c, @PATH@ + '.initContainers[' + string(@POD@.initContainers.indexOf(c)) + '].securityContext.runAsUser' + ': ' + string(c.securityContext.runAsUser) + ' is outside 1..2147483647') : []) + (has(@POD@.initContainers) ? @POD@.initContainers.filter(c, !(true && c.name == 'model-cache-prep') && has(c.securityContext) && has(c.securityContext.runAsGroup) && (c.securityContext.runAsGroup < 0 || c.securityContext.runAsGroup > 2147483647)).map(c, @PATH@ + '.initContainers[' + string(@POD@.initContainers.indexOf(c)) + '].securityContext.runAsGroup' + ': ' + string(c.securityContext.runAsGroup) + ' is outside 0..2147483647') : []) + (has(@POD@.containers) ? @POD@.containers.filter(c, has(c.securityContext) && has(c.securityContext.runAsUser) && (c.securityContext.runAsUser < 1 || c.securityContext.runAsUser > 2147483647)).map(c, @PATH@ + '.containers[' + string(@POD@.containers.indexOf(c)) + '].securityContext.runAsUser' + ': ' + string(c.securityContext.runAsUser) + ' is outside 1..2147483647') : []) + (has(@POD@.containers) ? @POD@.containers.filter(c, has(c.securityContext) && has(c.securityContext.runAsGroup) && (c.securityContext.runAsGroup < 0 || c.securityContext.runAsGroup > 2147483647)).map(c, @PATH@ + '.containers[' + string(@POD@.containers.indexOf(c)) + '].securityContext.runAsGroup' + ': ' + string(c.securityContext.runAsGroup) + ' is outside 0..2147483647') : []) + (has(@POD@.ephemeralContainers) ? @POD@.ephemeralContainers.filter(c, has(c.securityContext) && has(c.securityContext.runAsUser) && (c.securityContext.runAsUser < 1 || c.securityContext.runAsUser > 2147483647)).map(c, @PATH@ + '.ephemeralContainers[' + string(@POD@.ephemeralContainers.indexOf(c)) + '].securityContext.runAsUser' + ': ' + string(c.securityContext.runAsUser) + ' is outside 1..2147483647') : []) + (has(@POD@.ephemeralContainers) ? @POD@.ephemeralContainers.filter(c, has(c.securityContext) && has(c.securityContext.runAsGroup) && (c.securityContext.runAsGroup < 0 || c.securityContext.runAsGroup > 2147483647)).map(c, @PATH@ + '.ephemeralContainers[' + string(@POD@.ephemeralContainers.indexOf(c)) + '].securityContext.runAsGroup' + ': ' + string(c.securityContext.runAsGroup) + ' is outside 0..2147483647') : [])
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
at the path .dyn + .tail; the template's spec bound to p<depth>.
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
{{- $path := include "modelgate.backstopPathWith" (dict "dyn" .dyn "tail" $tail "more" "") -}}
{{- $ranges := include "modelgate.backstopRanges" . | replace "@POD@" (printf "p%d" $d) | replace "@PATH@" $path -}}
{{- printf "(%s ? [%s].map(p%d, (%s).join('; '))[0] : '')" $guard $spec $d $ranges -}}
{{- else -}}
{{- $step := first .steps -}}
{{- $next := dict "steps" (rest .steps) "shape" .shape "depth" $d -}}
{{- if eq $step "[*]" -}}
{{- $e := printf "e%d" $d -}}
{{- $at := include "modelgate.backstopPathWith" (dict "dyn" .dyn "tail" .tail "more" "[") -}}
{{- $_ := set $next "value" $e -}}
{{- $_ = set $next "dyn" (printf "%s + string(%s.indexOf(%s))" $at .value $e) -}}
{{- $_ = set $next "tail" "]" -}}
{{- $_ = set $next "depth" (add1 $d) -}}
{{- printf "%s.map(%s, %s).filter(s, s != '').join('; ')" .value $e (include "modelgate.backstopWalk" $next) -}}
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

{{/* The ranges of every complete template of the request's kind, a flat sum over the rows. */}}
{{- define "modelgate.backstopTableRanges" -}}
{{- $rows := list -}}
{{- range (include "modelgate.backstopTableKinds" . | fromJsonArray) -}}
{{- $templates := list -}}
{{- range .templates -}}
{{- if ne (default "complete" .completeness) "partial" -}}
{{- $walk := dict "steps" (include "modelgate.backstopSteps" .path | fromJsonArray) "value" "object" "dyn" "" "tail" "" "shape" (default "PodTemplateSpec" .shape) "depth" 0 -}}
{{- $templates = append $templates (include "modelgate.backstopWalk" $walk) -}}
{{- end -}}
{{- end -}}
{{- $rows = append $rows (printf "(%s ? [%s].filter(s, s != '') : [])" (include "modelgate.celKind" .) (join ", " $templates)) -}}
{{- end -}}
{{- if $rows -}}{{ join " + " $rows }}{{- else -}}[]{{- end -}}
{{- end -}}
