{{/* Named templates that only this chart uses: its example workload and its own checks (not part of the library). */}}

{{/* The example pods' ServiceAccount. */}}
{{- define "window-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "window-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "true" when the ScaledObject scales the example Deployment (which then leaves replicas to KEDA), else empty. */}}
{{- define "window-sidecar.kedaScalesExample" -}}
{{- $keda := .Values.autoscaling.keda }}
{{- if and $keda.enabled .Values.example.enabled (eq $keda.scaleTargetRef.kind "Deployment") (has $keda.scaleTargetRef.name (list "" (include "window-sidecar.fullname" .))) }}true{{ end }}
{{- end }}

{{/*
Values that contradict each other across the chart's resources, refused with what to add or
change (templates/validate.yaml includes it). Each check is one that would otherwise render
something that cannot work, or silently nothing.
*/}}
{{- define "window-sidecar.validateChart" -}}
{{- $v := .Values }}
{{- $m := $v.metrics }}
{{- $keda := $v.autoscaling.keda }}
{{- $pdb := $v.podDisruptionBudget }}
{{- /* Scraping: the monitors read the sidecar's metrics port, which metrics.enabled serves. */}}
{{- if and $m.serviceMonitor.enabled (not $m.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled: without it the sidecar serves no /metrics and the chart renders no metrics Service" }}
{{- end }}
{{- if and $m.podMonitor.enabled (not $m.enabled) }}
{{- fail "metrics.podMonitor.enabled needs metrics.enabled: without it the sidecar serves no /metrics port to scrape" }}
{{- end }}
{{- if and $m.serviceMonitor.enabled (not $v.example.enabled) }}
{{- fail "metrics.serviceMonitor.enabled scrapes the example's metrics Service, which example.enabled=false does not render: use metrics.podMonitor.enabled with metrics.podMonitor.selector set to your pods' labels" }}
{{- end }}
{{- if and $m.serviceMonitor.enabled $m.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled would both scrape the same sidecars, every series twice: enable one of them (the PodMonitor also scrapes the keeper)" }}
{{- end }}
{{- if and $v.prometheusRule.enabled (not $m.enabled) }}
{{- fail "prometheusRule.enabled alerts on the sidecars' metrics, which metrics.enabled=false turns off: set metrics.enabled=true, or prometheusRule.enabled=false" }}
{{- end }}
{{- /* Autoscaling: KEDA reads window_sidecar_work_waiting_entries from Prometheus. */}}
{{- if $keda.enabled }}
{{- if and (not $keda.scaleTargetRef.name) (not $v.example.enabled) }}
{{- fail "autoscaling.keda.enabled needs autoscaling.keda.scaleTargetRef.name (the Deployment of the workers) when example.enabled is false" }}
{{- end }}
{{- if gt ($keda.minReplicaCount | int) ($keda.maxReplicaCount | int) }}
{{- fail (printf "autoscaling.keda.minReplicaCount (%d) is above autoscaling.keda.maxReplicaCount (%d): raise maxReplicaCount or lower minReplicaCount" ($keda.minReplicaCount | int) ($keda.maxReplicaCount | int)) }}
{{- end }}
{{- $scraped := or $keda.prometheus.scrapedElsewhere (and $m.enabled $m.podMonitor.enabled) }}
{{- if eq ($keda.minReplicaCount | int) 0 }}
{{- if not $v.keeper.enabled }}
{{- fail "autoscaling.keda.minReplicaCount=0 scales the workers to zero, and at zero no sidecar runs to report the work waiting or promote due retry_after entries, so nothing would wake them: add keeper.enabled=true with keeper.keep (the workers' stream groups and lists) and metrics.podMonitor.enabled=true, or set autoscaling.keda.minReplicaCount to 1 or more" }}
{{- end }}
{{- if not $scraped }}
{{- fail "autoscaling.keda.minReplicaCount=0 scales the workers to zero, where only the keeper reports the work waiting, and nothing in this release has Prometheus scrape it: add metrics.podMonitor.enabled=true (its default selector covers the keeper), or set autoscaling.keda.prometheus.scrapedElsewhere=true if a scrape configuration of your own reaches the keeper" }}
{{- end }}
{{- else if not (or $scraped (and $m.enabled $m.serviceMonitor.enabled)) }}
{{- fail "autoscaling.keda.enabled scales on window_sidecar_work_waiting_entries, and nothing in this release has Prometheus scrape it: add metrics.podMonitor.enabled=true (or metrics.serviceMonitor.enabled=true), or set autoscaling.keda.prometheus.scrapedElsewhere=true if a scrape configuration of your own reaches the sidecars" }}
{{- end }}
{{- end }}
{{- /* The keeper exits at start (64) on a kept key outside --allow-keys (Redis glob: * and ?). */}}
{{- if $v.keeper.enabled }}
{{- $patterns := list }}
{{- range $v.sidecar.policy.allowKeys }}
{{- $patterns = append $patterns (trim .) }}
{{- end }}
{{- if not (has "*" $patterns) }}
{{- range $spec := $v.keeper.keep }}
{{- $key := trimPrefix "list:" $spec }}
{{- if hasPrefix "stream:" $spec }}
{{- $key = trimPrefix "stream:" $spec | splitList ":" | initial | join ":" }}
{{- end }}
{{- $allowed := false }}
{{- range $patterns }}
{{- if regexMatch (printf "(?s)^%s$" (regexQuoteMeta . | replace "\\*" ".*" | replace "\\?" ".")) $key }}
{{- $allowed = true }}
{{- end }}
{{- end }}
{{- if not $allowed }}
{{- fail (printf "keeper.keep %q: the key %q is outside sidecar.policy.allowKeys (%s), so the keeper would exit at start: allow the key there, or keep another" $spec $key (join ", " $patterns)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.serviceAccount.annotations (not $v.serviceAccount.create) }}
{{- fail "serviceAccount.annotations are set but serviceAccount.create is false, so no ServiceAccount of this chart carries them: set serviceAccount.create=true, or annotate the ServiceAccount that serviceAccount.name names" }}
{{- end }}
{{- /* The PodDisruptionBudget covers the example Deployment. */}}
{{- if $pdb.enabled }}
{{- if not $v.example.enabled }}
{{- fail "podDisruptionBudget.enabled covers the example Deployment, which example.enabled=false does not render: give your own workload a PodDisruptionBudget of its own" }}
{{- end }}
{{- if not (kindIs "invalid" $pdb.maxUnavailable) }}
{{- if has (toString $pdb.maxUnavailable) (list "0" "0%") }}
{{- fail (printf "podDisruptionBudget.maxUnavailable=%v lets no pod be evicted, so every node drain would hang: allow at least 1" $pdb.maxUnavailable) }}
{{- end }}
{{- else if and (not (include "window-sidecar.kedaScalesExample" .)) (or (eq (toString $pdb.minAvailable) "100%") (and (kindIs "float64" $pdb.minAvailable) (ge ($pdb.minAvailable | int) ($v.example.replicaCount | int))) (and (kindIs "int64" $pdb.minAvailable) (ge ($pdb.minAvailable | int) ($v.example.replicaCount | int)))) }}
{{- fail (printf "podDisruptionBudget.minAvailable=%v leaves no pod of the example's %d evictable, so every node drain would hang: set it below example.replicaCount, or use maxUnavailable" $pdb.minAvailable ($v.example.replicaCount | int)) }}
{{- end }}
{{- end }}
{{- if and $v.example.worker.tlsServerName (not $v.sidecar.tls.enabled) }}
{{- fail "example.worker.tlsServerName is set but sidecar.tls.enabled is false, so the worker dials plaintext: set sidecar.tls.enabled=true with sidecar.tls.existingSecret, or clear example.worker.tlsServerName" }}
{{- end }}
{{- /* Each replica of the example must be a consumer of its own. */}}
{{- $name := $v.sidecar.consumerName }}
{{- if and $v.example.enabled $name (not (contains "$(POD_NAME)" $name)) }}
{{- $replicas := $v.example.replicaCount | int }}
{{- if include "window-sidecar.kedaScalesExample" . }}
{{- $replicas = $keda.maxReplicaCount | int }}
{{- end }}
{{- if gt $replicas 1 }}
{{- fail (printf "sidecar.consumerName %q would be the same in each of up to %d replicas of the example, and replicas sharing a consumer name refuse each other (ALREADY_EXISTS): put $(POD_NAME) in it, or leave it empty (the pod name)" $name $replicas) }}
{{- end }}
{{- end }}
{{- end }}
