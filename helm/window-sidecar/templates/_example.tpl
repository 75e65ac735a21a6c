{{/* Named templates that only this chart's example workload uses (not part of the library). */}}

{{/* The example pods' ServiceAccount. */}}
{{- define "window-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "window-sidecar.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}
