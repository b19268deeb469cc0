{{/* The controllers flag, refusing `*` and an empty list. */}}
{{- define "pilothouse.controllers" -}}
{{- if not .Values.controllers -}}
{{- fail "controllers: name the controllers Pilothouse runs (an explicit list)" -}}
{{- end -}}
{{- range .Values.controllers -}}
{{- if or (contains "*" .) (hasPrefix "-" .) -}}
{{- fail (printf "controllers: %q: name each controller explicitly, never `*` or a `-` exclusion" .) -}}
{{- end -}}
{{- end -}}
--controllers={{ join "," .Values.controllers }}
{{- end -}}
