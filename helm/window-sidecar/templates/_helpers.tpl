{{/*
Named templates of the window-sidecar chart: everything the sidecar container, its volumes and
its Redis Secret need. This file is copied verbatim into the library chart
helm/window-sidecar-lib (templates/_helpers.tpl), so the chart's example and a chart built on
the library render the same container; helm/tests/run.sh fails when the two copies differ. What
only the example needs is in _example.tpl.

The public ones, for other charts to include into their own pod specs, take this chart's
root context: `.` inside this chart, `(index .Subcharts "window-sidecar")` from a parent
chart that lists window-sidecar as a dependency, `(index .Subcharts "window-sidecar-lib")`
from a chart that lists the library (Helm 3.14 or later):

  window-sidecar.container                      the sidecar container (one list item)
  window-sidecar.volumes                        the volumes it mounts (list items)
  window-sidecar.appVolumeMounts                what the application container mounts to reach
                                                the sidecar (list items; empty unless
                                                sidecar.unixSocket.enabled)
  window-sidecar.terminationGracePeriodSeconds  shutdown grace + margin, a number
  window-sidecar.native                         "true" when it belongs in initContainers
  window-sidecar.grpcAddress                    host:port for the application (127.0.0.1:50051),
                                                or unix:PATH with sidecar.unixSocket.enabled
  window-sidecar.redisSecret                    the Secret with the Redis connection (a whole
                                                manifest; empty with redis.existingSecret)
  window-sidecar.podMonitor                     a PodMonitor (a whole manifest) scraping the
                                                sidecar's metrics port on the pods that match a
                                                selector; takes a dict, not the root context:
                                                "sidecar" (the root context above), "selector"
                                                (pod labels), and optionally "name", "labels",
                                                "interval", "scrapeTimeout", "honorLabels",
                                                "relabelings", "metricRelabelings"

Everything else here is internal.
*/}}

{{/* Chart name, overridable. */}}
{{- define "window-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name, truncated to 63 characters (the DNS label limit).
If the release name already contains the chart name it is used as is.
*/}}
{{- define "window-sidecar.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "window-sidecar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "window-sidecar.labels" -}}
helm.sh/chart: {{ include "window-sidecar.chart" . }}
{{ include "window-sidecar.selectorLabels" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: window-sidecar
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels: stable for the life of a release. */}}
{{- define "window-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "window-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* An image reference from {repository, tag, digest}; $.appVersion is the default tag. */}}
{{- define "window-sidecar.imageRef" -}}
{{- $image := .image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .appVersion $image.tag | toString) }}
{{- end }}
{{- end }}

{{/* The Secret with the Redis connection. */}}
{{- define "window-sidecar.redisSecretName" -}}
{{- if .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else }}
{{- printf "%s-redis" (include "window-sidecar.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/* The Secret with the Redis TLS material. */}}
{{- define "window-sidecar.redisTlsSecretName" -}}
{{- default (include "window-sidecar.redisSecretName" .) .Values.redis.tls.existingSecret }}
{{- end }}

{{/* Whether the chart creates the Redis Secret: "true" or "". */}}
{{- define "window-sidecar.createsRedisSecret" -}}
{{- if not .Values.redis.existingSecret }}true{{ end }}
{{- end }}

{{/* Where the TLS material is mounted in the sidecar. */}}
{{- define "window-sidecar.tlsDir" -}}
/etc/window-sidecar/redis-tls
{{- end }}

{{/* Where the gRPC listener's own TLS material (sidecar.tls) is mounted in the sidecar. */}}
{{- define "window-sidecar.listenerTlsDir" -}}
/etc/window-sidecar/tls
{{- end }}

{{/* Where the bearer token (sidecar.auth.token) is mounted in the sidecar. */}}
{{- define "window-sidecar.authDir" -}}
/etc/window-sidecar/auth
{{- end }}

{{/* The directory of the Unix socket: the shared emptyDir's mount path. */}}
{{- define "window-sidecar.socketDir" -}}
{{- dir .Values.sidecar.unixSocket.path }}
{{- end }}

{{/* A size value (a string such as 4MiB, or a number of bytes) as a flag value. */}}
{{- define "window-sidecar.size" -}}
{{- if kindIs "string" . }}{{ . }}{{ else }}{{ . | int64 | toString }}{{ end }}
{{- end }}

{{/* A socket address from a host and a port; IPv6 hosts get brackets. */}}
{{- define "window-sidecar.socketAddress" -}}
{{- if contains ":" .host }}
{{- printf "[%s]:%d" .host (.port | int) }}
{{- else }}
{{- printf "%s:%d" .host (.port | int) }}
{{- end }}
{{- end }}

{{/*
Where the application in the same pod reaches the sidecar: the bind address, or loopback when
the sidecar binds to every address.
*/}}
{{- define "window-sidecar.grpcAddress" -}}
{{- if .Values.sidecar.unixSocket.enabled }}
{{- printf "unix:%s" .Values.sidecar.unixSocket.path }}
{{- else }}
{{- $host := .Values.sidecar.grpcBindAddress }}
{{- if eq $host "0.0.0.0" }}
{{- $host = "127.0.0.1" }}
{{- else if eq $host "::" }}
{{- $host = "::1" }}
{{- end }}
{{- include "window-sidecar.socketAddress" (dict "host" $host "port" .Values.sidecar.ports.grpc) }}
{{- end }}
{{- end }}

{{/*
"true" when the sidecar is rendered as a native sidecar (an init container with restartPolicy
Always), else empty. sidecar.native true or false decides; "auto" (the default) is native on
Kubernetes 1.29 or later, where native sidecars are on by default (1.28 has them only behind a
feature gate), by .Capabilities.KubeVersion: the cluster's at install and upgrade, --kube-version
or Helm's built-in default with `helm template`.
*/}}
{{- define "window-sidecar.native" -}}
{{- $native := .Values.sidecar.native }}
{{- if kindIs "bool" $native }}
{{- if $native }}true{{ end }}
{{- else if semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version }}true
{{- end }}
{{- end }}

{{/* The pod's terminationGracePeriodSeconds: the sidecar's drain grace plus a margin. */}}
{{- define "window-sidecar.terminationGracePeriodSeconds" -}}
{{- add (.Values.sidecar.shutdownGraceSeconds | int) (.Values.sidecar.terminationGraceExtraSeconds | int) }}
{{- end }}

{{/*
Checks what values.schema.json cannot express. Included by every template that renders
something, so `helm template` fails early with a message instead of rendering a broken pod.
*/}}
{{- define "window-sidecar.validate" -}}
{{- $v := .Values }}
{{- $s := $v.sidecar }}
{{- if not (has (toString $s.native) (list "auto" "true" "false")) }}
{{- fail (printf "sidecar.native must be auto, true or false, got %v" $s.native) }}
{{- end }}
{{- if and (eq (toString $s.native) "true") (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "sidecar.native=true needs Kubernetes 1.29 or later (native sidecars); this cluster is %s. Set sidecar.native=auto (native where the cluster has it) or false for the classic second container." .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- /* Each listener needs a port of its own. */}}
{{- $ports := list }}
{{- if not $s.unixSocket.enabled }}
{{- $ports = append $ports (list "grpc" ($s.ports.grpc | int)) }}
{{- end }}
{{- $ports = append $ports (list "health" ($s.ports.health | int)) }}
{{- if $v.metrics.enabled }}
{{- $ports = append $ports (list "metrics" ($s.ports.metrics | int)) }}
{{- end }}
{{- range $i, $a := $ports }}
{{- range $j, $b := $ports }}
{{- if and (lt $i $j) (eq (index $a 1) (index $b 1)) }}
{{- fail (printf "sidecar.ports.%s and sidecar.ports.%s are both %d: each listener needs a port of its own" (index $a 0) (index $b 0) (index $a 1)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $s.unixSocket.enabled (or (ne $s.grpcBindAddress "127.0.0.1") (ne ($s.ports.grpc | int) 50051)) }}
{{- fail "sidecar.grpcBindAddress and sidecar.ports.grpc are unused with sidecar.unixSocket.enabled (the window service listens on the socket alone): leave them at their defaults, or turn the socket off to listen on TCP" }}
{{- end }}
{{- if eq $s.livenessProbe.service "window_sidecar.v1.WindowService" }}
{{- fail "sidecar.livenessProbe.service=window_sidecar.v1.WindowService goes NOT_SERVING whenever Redis does not answer, so liveness would restart every sidecar during a Redis outage: leave it empty (the overall status, SERVING while the process runs) and probe the WindowService with readiness" }}
{{- end }}
{{- if and $s.tls.existingSecret (not $s.tls.enabled) }}
{{- fail "sidecar.tls.existingSecret is set but sidecar.tls.enabled is false, so the gRPC listener would serve plaintext: set sidecar.tls.enabled=true, or clear sidecar.tls.existingSecret" }}
{{- end }}
{{- /* Credentials and TLS material that would be written nowhere, or mounted from nothing. */}}
{{- range $key := list "username" "password" }}
{{- if index $v.redis.auth $key }}
{{- if not $v.redis.auth.enabled }}
{{- fail (printf "redis.auth.%s is set but redis.auth.enabled is false, so the sidecar would not get it: set redis.auth.enabled=true, or put the credentials in redis.url" $key) }}
{{- end }}
{{- if $v.redis.existingSecret }}
{{- fail (printf "redis.auth.%s is written only to the Secret the chart creates, and redis.existingSecret names one of your own: put it in that Secret under redis.secretKeys.%s" $key $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.redis.tls.existingSecret (not $v.redis.tls.enabled) }}
{{- fail "redis.tls.existingSecret is set but redis.tls.enabled is false, so nothing would be mounted from it: set redis.tls.enabled=true, or clear redis.tls.existingSecret" }}
{{- end }}
{{- range $key, $mount := dict "ca" "mountCA" "cert" "mountClientCertificate" "key" "mountClientCertificate" }}
{{- if index $v.redis.tls $key }}
{{- if not (and $v.redis.tls.enabled (index $v.redis.tls $mount) (not $v.redis.existingSecret) (not $v.redis.tls.existingSecret)) }}
{{- fail (printf "redis.tls.%s is set but unused: it is written to the Secret the chart creates only with redis.tls.enabled and redis.tls.%s, and without redis.existingSecret or redis.tls.existingSecret" $key $mount) }}
{{- end }}
{{- end }}
{{- end }}
{{- if include "window-sidecar.createsRedisSecret" . }}
{{- if not $v.redis.url }}
{{- fail "redis.url is required when redis.existingSecret is not set" }}
{{- end }}
{{- if and $v.redis.tls.enabled (not (hasPrefix "rediss://" $v.redis.url)) }}
{{- fail "redis.tls.enabled needs a rediss:// URL in redis.url" }}
{{- end }}
{{- if and $v.redis.auth.enabled (not $v.redis.auth.password) }}
{{- fail "redis.auth.password is required when redis.auth.enabled is set without redis.existingSecret" }}
{{- end }}
{{- end }}
{{- if and $v.redis.tls.enabled (not $v.redis.tls.existingSecret) (not $v.redis.existingSecret) }}
{{- if and $v.redis.tls.mountCA (not $v.redis.tls.ca) }}
{{- fail "redis.tls.ca is required when redis.tls.mountCA is set and the chart creates the Secret (or set redis.tls.existingSecret)" }}
{{- end }}
{{- if and $v.redis.tls.mountClientCertificate (or (not $v.redis.tls.cert) (not $v.redis.tls.key)) }}
{{- fail "redis.tls.cert and redis.tls.key are required when redis.tls.mountClientCertificate is set and the chart creates the Secret" }}
{{- end }}
{{- end }}
{{- if and $v.redis.tls.enabled (not $v.redis.tls.mountCA) (not $v.redis.tls.mountClientCertificate) }}
{{- fail "redis.tls.enabled needs redis.tls.mountCA or redis.tls.mountClientCertificate (with neither, a rediss:// URL alone is enough)" }}
{{- end }}
{{- if and $v.sidecar.tls.enabled (not $v.sidecar.tls.existingSecret) }}
{{- fail "sidecar.tls.enabled needs sidecar.tls.existingSecret, a Secret with tls.crt and tls.key (and ca.crt for sidecar.tls.mutual)" }}
{{- end }}
{{- if and $v.sidecar.tls.mutual (not $v.sidecar.tls.enabled) }}
{{- fail "sidecar.tls.mutual needs sidecar.tls.enabled (client certificates are checked only on a TLS listener)" }}
{{- end }}
{{- if $v.sidecar.unixSocket.enabled }}
{{- $path := $v.sidecar.unixSocket.path }}
{{- $dir := include "window-sidecar.socketDir" . }}
{{- if or (not (isAbs $path)) (ne (clean $path) $path) }}
{{- fail (printf "sidecar.unixSocket.path must be a clean absolute path such as /run/window-sidecar/grpc.sock, got %q" $path) }}
{{- end }}
{{- if or (eq $dir "/") (eq $dir "/tmp") (hasPrefix "/etc/window-sidecar" $dir) }}
{{- fail (printf "sidecar.unixSocket.path must be in a directory of its own (it becomes the shared emptyDir), not in %s" $dir) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The sidecar's command-line flags. A flag that sidecar.extraArgs also sets is left out here,
so extraArgs can override any of them (clap refuses a flag given twice).
*/}}
{{- define "window-sidecar.args" -}}
{{- $v := .Values }}
{{- $s := $v.sidecar }}
{{- $overridden := list }}
{{- range $s.extraArgs }}
{{- $overridden = append $overridden (regexReplaceAll "=.*$" (toString .) "") }}
{{- end }}
{{- $p := $s.policy }}
{{- $flags := list }}
{{- if $s.unixSocket.enabled }}
{{- $flags = append $flags (list "--listen" (printf "unix:%s" $s.unixSocket.path)) }}
{{- else }}
{{- $flags = append $flags (list "--listen" (include "window-sidecar.socketAddress" (dict "host" $s.grpcBindAddress "port" $s.ports.grpc))) }}
{{- end }}
{{- $flags = append $flags (list "--health-listen" (printf "0.0.0.0:%d" ($s.ports.health | int))) }}
{{- if $v.metrics.enabled }}
{{- $flags = append $flags (list "--metrics-listen" (printf "0.0.0.0:%d" ($s.ports.metrics | int))) }}
{{- end }}
{{- $flags = append $flags (list "--pool-size" ($s.poolSize | int64 | toString)) }}
{{- $flags = append $flags (list "--max-count" ($s.maxCount | int64 | toString)) }}
{{- $flags = append $flags (list "--max-in-flight" ($s.maxInFlight | int64 | toString)) }}
{{- $flags = append $flags (list "--max-commands-per-slot" ($s.maxCommandsPerSlot | int64 | toString)) }}
{{- $flags = append $flags (list "--max-parked" ($s.maxParked | int64 | toString)) }}
{{- /* Policy, replication and keepalive: only what differs from the sidecar's defaults. */}}
{{- $allowKeys := join "," $p.allowKeys }}
{{- if ne $allowKeys "*" }}
{{- $flags = append $flags (list "--allow-keys" $allowKeys) }}
{{- end }}
{{- $allowChannels := join "," $p.allowChannels }}
{{- if ne $allowChannels "*" }}
{{- $flags = append $flags (list "--allow-channels" $allowChannels) }}
{{- end }}
{{- $allowCommands := regexSplit "\\s+" (trim $p.allowCommands) -1 | join " " }}
{{- if ne $allowCommands "+@read +@write +publish +spublish -@dangerous -@blocking -@admin -@scripting" }}
{{- $flags = append $flags (list "--allow-commands" $allowCommands) }}
{{- end }}
{{- $maxMessageSize := include "window-sidecar.size" $p.maxMessageSize }}
{{- if ne $maxMessageSize "4MiB" }}
{{- $flags = append $flags (list "--max-message-size" $maxMessageSize) }}
{{- end }}
{{- $maxArgSize := include "window-sidecar.size" $p.maxArgSize }}
{{- if ne $maxArgSize "1MiB" }}
{{- $flags = append $flags (list "--max-arg-size" $maxArgSize) }}
{{- end }}
{{- if ne ($p.maxSubscriptionsPerConnection | int64) 256 }}
{{- $flags = append $flags (list "--max-subscriptions-per-connection" ($p.maxSubscriptionsPerConnection | int64 | toString)) }}
{{- end }}
{{- if ne ($s.workerThreads | int64) 1 }}
{{- $flags = append $flags (list "--worker-threads" ($s.workerThreads | int64 | toString)) }}
{{- end }}
{{- if gt ($s.waitReplicas | int64) 0 }}
{{- $flags = append $flags (list "--wait-replicas" ($s.waitReplicas | int64 | toString)) }}
{{- end }}
{{- if ne $s.waitTimeout "1s" }}
{{- $flags = append $flags (list "--wait-timeout" $s.waitTimeout) }}
{{- end }}
{{- if ne $s.clientKeepalive "20s" }}
{{- $flags = append $flags (list "--client-keepalive" $s.clientKeepalive) }}
{{- end }}
{{- /* Who may talk to the gRPC listener: bearer token and TLS from mounted Secrets. */}}
{{- if $s.auth.token.existingSecret }}
{{- $flags = append $flags (list "--auth-token-file" (printf "%s/token" (include "window-sidecar.authDir" .))) }}
{{- end }}
{{- if $s.tls.enabled }}
{{- $tlsDir := include "window-sidecar.listenerTlsDir" . }}
{{- $flags = append $flags (list "--tls-cert" (printf "%s/tls.crt" $tlsDir)) }}
{{- $flags = append $flags (list "--tls-key" (printf "%s/tls.key" $tlsDir)) }}
{{- if $s.tls.mutual }}
{{- $flags = append $flags (list "--tls-client-ca" (printf "%s/ca.crt" $tlsDir)) }}
{{- end }}
{{- end }}
{{- $flags = append $flags (list "--shutdown-grace" (printf "%ds" ($s.shutdownGraceSeconds | int64))) }}
{{- $flags = append $flags (list "--redis-timeout" $s.redisTimeout) }}
{{- $flags = append $flags (list "--promote-interval" $s.promoteInterval) }}
{{- $flags = append $flags (list "--reclaim-interval" $s.reclaimInterval) }}
{{- $flags = append $flags (list "--log-format" $s.logFormat) }}
{{- if ne $s.adminView "loopback" }}
{{- $flags = append $flags (list "--admin-view" $s.adminView) }}
{{- end }}
{{- range $s.backlog.watch }}
{{- $flags = append $flags (list "--watch" .) }}
{{- end }}
{{- if ne $s.backlog.sampleInterval "5s" }}
{{- $flags = append $flags (list "--sample-interval" $s.backlog.sampleInterval) }}
{{- end }}
{{- range $s.retention.streams }}
{{- $flags = append $flags (list "--ack-retention" .) }}
{{- end }}
{{- if ne $s.retention.interval "1s" }}
{{- $flags = append $flags (list "--retention-interval" $s.retention.interval) }}
{{- end }}
{{- $args := list }}
{{- range $flags }}
{{- if not (has (index . 0) $overridden) }}
{{- $args = append $args (printf "%s=%s" (index . 0) (index . 1)) }}
{{- end }}
{{- end }}
{{- range $s.extraArgs }}
{{- $args = append $args (toString .) }}
{{- end }}
{{- toYaml $args }}
{{- end }}

{{/*
The sidecar's environment. POD_NAME and POD_NAMESPACE come first: Kubernetes expands
$(POD_NAME) only from variables defined earlier in the list.
*/}}
{{- define "window-sidecar.env" -}}
{{- $v := .Values }}
{{- $secret := include "window-sidecar.redisSecretName" . }}
{{- $tlsDir := include "window-sidecar.tlsDir" . -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: WINDOW_CONSUMER_NAME
  value: {{ default "$(POD_NAME)" $v.sidecar.consumerName | quote }}
- name: WINDOW_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $v.redis.secretKeys.url }}
{{- if $v.redis.auth.enabled }}
{{- if or $v.redis.existingSecret $v.redis.auth.username }}
- name: WINDOW_REDIS_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $v.redis.secretKeys.username }}
      optional: true
{{- end }}
- name: WINDOW_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $v.redis.secretKeys.password }}
{{- end }}
{{- if $v.redis.tls.enabled }}
{{- if $v.redis.tls.mountCA }}
- name: WINDOW_REDIS_TLS_CA
  value: {{ printf "%s/ca.crt" $tlsDir | quote }}
{{- end }}
{{- if $v.redis.tls.mountClientCertificate }}
- name: WINDOW_REDIS_TLS_CERT
  value: {{ printf "%s/tls.crt" $tlsDir | quote }}
- name: WINDOW_REDIS_TLS_KEY
  value: {{ printf "%s/tls.key" $tlsDir | quote }}
{{- end }}
{{- end }}
{{- with $v.sidecar.rustLog }}
- name: RUST_LOG
  value: {{ . | quote }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ $v.otel.serviceName | quote }}
{{- with $v.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with $v.otel.protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- $attributes := list "k8s.pod.name=$(POD_NAME)" "k8s.namespace.name=$(POD_NAMESPACE)" (printf "k8s.container.name=%s" $v.sidecar.name) }}
{{- range $key := keys $v.otel.resourceAttributes | sortAlpha }}
{{- $attributes = append $attributes (printf "%s=%v" $key (index $v.otel.resourceAttributes $key)) }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- with $v.sidecar.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* A native gRPC probe against the health listener. */}}
{{- define "window-sidecar.probe" -}}
grpc:
  port: {{ .port | int }}
  {{- with .probe.service }}
  service: {{ . | quote }}
  {{- end }}
{{- if hasKey .probe "initialDelaySeconds" }}
initialDelaySeconds: {{ .probe.initialDelaySeconds | int }}
{{- end }}
periodSeconds: {{ .probe.periodSeconds | int }}
timeoutSeconds: {{ .probe.timeoutSeconds | int }}
failureThreshold: {{ .probe.failureThreshold | int }}
{{- end }}

{{/*
The sidecar container, as one item of a containers (or initContainers) list:

  containers:
    {{- include "window-sidecar.container" . | nindent 4 }}
*/}}
{{- define "window-sidecar.container" -}}
{{- include "window-sidecar.validate" . }}
{{- $v := .Values }}
{{- $s := $v.sidecar -}}
- name: {{ $s.name }}
  image: {{ include "window-sidecar.imageRef" (dict "image" $v.image "appVersion" .Chart.AppVersion) | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if include "window-sidecar.native" . }}
  # A native sidecar (Kubernetes 1.29+): started before the application containers and
  # stopped after them, so the application's last outcomes still reach Redis.
  restartPolicy: Always
  {{- end }}
  args:
    {{- include "window-sidecar.args" . | nindent 4 }}
  env:
    {{- include "window-sidecar.env" . | nindent 4 }}
  ports:
    {{- if not $s.unixSocket.enabled }}
    - name: grpc
      containerPort: {{ $s.ports.grpc | int }}
      protocol: TCP
    {{- end }}
    - name: grpc-health
      containerPort: {{ $s.ports.health | int }}
      protocol: TCP
    {{- if $v.metrics.enabled }}
    - name: metrics
      containerPort: {{ $s.ports.metrics | int }}
      protocol: TCP
    {{- end }}
  {{- if $s.startupProbe.enabled }}
  startupProbe:
    {{- include "window-sidecar.probe" (dict "port" $s.ports.health "probe" $s.startupProbe) | nindent 4 }}
  {{- end }}
  {{- if $s.livenessProbe.enabled }}
  livenessProbe:
    {{- include "window-sidecar.probe" (dict "port" $s.ports.health "probe" $s.livenessProbe) | nindent 4 }}
  {{- end }}
  {{- if $s.readinessProbe.enabled }}
  readinessProbe:
    {{- include "window-sidecar.probe" (dict "port" $s.ports.health "probe" $s.readinessProbe) | nindent 4 }}
  {{- end }}
  {{- with $s.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $s.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    # The root filesystem is read-only; /tmp is the writable scratch space.
    - name: window-sidecar-tmp
      mountPath: /tmp
    {{- if $v.redis.tls.enabled }}
    - name: window-sidecar-redis-tls
      mountPath: {{ include "window-sidecar.tlsDir" . }}
      readOnly: true
    {{- end }}
    {{- if $s.auth.token.existingSecret }}
    - name: window-sidecar-auth-token
      mountPath: {{ include "window-sidecar.authDir" . }}
      readOnly: true
    {{- end }}
    {{- if $s.tls.enabled }}
    - name: window-sidecar-tls
      mountPath: {{ include "window-sidecar.listenerTlsDir" . }}
      readOnly: true
    {{- end }}
    {{- if $s.unixSocket.enabled }}
    # The Unix socket (--listen unix:...), shared with the application's containers.
    - name: window-sidecar-socket
      mountPath: {{ include "window-sidecar.socketDir" . }}
    {{- end }}
    {{- with $s.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}

{{/*
The volumes the sidecar container mounts, as items of the pod's volumes list:

  volumes:
    {{- include "window-sidecar.volumes" . | nindent 4 }}
*/}}
{{- define "window-sidecar.volumes" -}}
- name: window-sidecar-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if .Values.redis.tls.enabled }}
- name: window-sidecar-redis-tls
  secret:
    secretName: {{ include "window-sidecar.redisTlsSecretName" . }}
    defaultMode: 0444
    items:
      {{- if .Values.redis.tls.mountCA }}
      - key: ca.crt
        path: ca.crt
      {{- end }}
      {{- if .Values.redis.tls.mountClientCertificate }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- with .Values.sidecar.auth.token.existingSecret }}
- name: window-sidecar-auth-token
  secret:
    secretName: {{ . }}
    defaultMode: 0444
    items:
      - key: {{ $.Values.sidecar.auth.token.key }}
        path: token
{{- end }}
{{- if .Values.sidecar.tls.enabled }}
- name: window-sidecar-tls
  secret:
    secretName: {{ .Values.sidecar.tls.existingSecret }}
    defaultMode: 0444
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- if .Values.sidecar.tls.mutual }}
      - key: ca.crt
        path: ca.crt
      {{- end }}
{{- end }}
{{- if .Values.sidecar.unixSocket.enabled }}
- name: window-sidecar-socket
  emptyDir:
    sizeLimit: 1Mi
{{- end }}
{{- end }}

{{/*
What the application container mounts to reach the sidecar, as items of its volumeMounts list
(empty unless sidecar.unixSocket.enabled: then the directory of the socket):

  {{- with include "window-sidecar.appVolumeMounts" . }}
  volumeMounts:
    {{- . | nindent 4 }}
  {{- end }}
*/}}
{{- define "window-sidecar.appVolumeMounts" -}}
{{- if .Values.sidecar.unixSocket.enabled -}}
- name: window-sidecar-socket
  mountPath: {{ include "window-sidecar.socketDir" . }}
{{- end }}
{{- end }}

{{/*
The Secret with the Redis connection, a whole manifest; nothing when redis.existingSecret names
one of your own.
*/}}
{{- define "window-sidecar.redisSecret" -}}
{{- include "window-sidecar.validate" . }}
{{- if include "window-sidecar.createsRedisSecret" . }}
{{- $r := .Values.redis }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ include "window-sidecar.redisSecretName" . }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "window-sidecar.labels" . | nindent 4 }}
    app.kubernetes.io/component: redis-connection
type: Opaque
data:
  {{ $r.secretKeys.url }}: {{ $r.url | b64enc | quote }}
  {{- if $r.auth.enabled }}
  {{- with $r.auth.username }}
  {{ $r.secretKeys.username }}: {{ . | b64enc | quote }}
  {{- end }}
  {{ $r.secretKeys.password }}: {{ $r.auth.password | b64enc | quote }}
  {{- end }}
  {{- if and $r.tls.enabled (not $r.tls.existingSecret) }}
  {{- if $r.tls.mountCA }}
  ca.crt: {{ $r.tls.ca | b64enc | quote }}
  {{- end }}
  {{- if $r.tls.mountClientCertificate }}
  tls.crt: {{ $r.tls.cert | b64enc | quote }}
  tls.key: {{ $r.tls.key | b64enc | quote }}
  {{- end }}
  {{- end }}
{{- end }}
{{- end }}

{{/*
A Prometheus Operator PodMonitor for the sidecar's metrics port (named "metrics", rendered while
metrics.enabled) on the pods that match .selector, in the release namespace. A chart that puts
the sidecar into its own pods (named templates or the library) includes it with its own pod
labels; this chart's templates/podmonitor.yaml does the same with metrics.podMonitor. A native
sidecar is an init container: Prometheus discovers its ports like any other container's.
*/}}
{{- define "window-sidecar.podMonitor" -}}
{{- $root := .sidecar }}
{{- if not .selector }}
{{- fail "window-sidecar.podMonitor needs a selector: the labels of the pods that carry the sidecar" }}
{{- end }}
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ .name | default (include "window-sidecar.fullname" $root) }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "window-sidecar.labels" $root | nindent 4 }}
    app.kubernetes.io/component: metrics
    {{- with .labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- toYaml .selector | nindent 6 }}
  namespaceSelector:
    matchNames:
      - {{ $root.Release.Namespace }}
  podMetricsEndpoints:
    - port: metrics
      path: /metrics
      scheme: http
      {{- with .interval }}
      interval: {{ . }}
      {{- end }}
      {{- with .scrapeTimeout }}
      scrapeTimeout: {{ . }}
      {{- end }}
      honorLabels: {{ .honorLabels | default false }}
      {{- with .relabelings }}
      relabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .metricRelabelings }}
      metricRelabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
