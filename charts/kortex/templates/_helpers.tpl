{{/* Names and labels shared by every template. */}}

{{- define "kortex.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kortex.fullname" -}}
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

{{/* What selects Kortex's pods. */}}
{{- define "kortex.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kortex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kortex.labels" -}}
{{ include "kortex.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kortex.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kortex.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kortex.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if and .Values.image.flavor (not .Values.image.tag) -}}
{{- $tag = printf "%s-%s" $tag .Values.image.flavor -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The claim holding the SQLite database, when it is persistent. */}}
{{- define "kortex.sqliteClaim" -}}
{{- default (printf "%s-data" (include "kortex.fullname" .)) .Values.database.sqlite.persistence.existingClaim -}}
{{- end -}}

{{/*
Refuses values that would give a broken or unsafe install, with the reason. SQLite is one
file on one volume: one writer, so one replica, replaced (not rolled) on upgrade.
*/}}
{{- define "kortex.validate" -}}
{{- $db := .Values.database -}}
{{- if eq $db.type "sqlite" -}}
{{- if gt (int .Values.replicaCount) 1 -}}
{{- fail (printf "database.type sqlite allows one replica only, not replicaCount=%d: set database.type=postgres with database.postgres.existingSecret for more" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if ne .Values.updateStrategy.type "Recreate" -}}
{{- fail (printf "database.type sqlite needs updateStrategy.type=Recreate (two pods must never share the SQLite file), not %s" .Values.updateStrategy.type) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $db.type "postgres") (not $db.postgres.existingSecret) -}}
{{- fail "database.type postgres needs database.postgres.existingSecret: the name of a Secret holding the PostgreSQL URL" -}}
{{- end -}}
{{- if and .Values.auth.proxy.header (not .Values.auth.proxy.from) -}}
{{- fail "auth.proxy.header needs auth.proxy.from: identity headers are trusted only from the proxy's own networks" -}}
{{- end -}}
{{- if and .Values.sso.issuer (not .Values.sso.clientId) -}}
{{- fail "sso.issuer needs sso.clientId: Kortex's client id at the provider" -}}
{{- end -}}
{{- if and .Values.sso.issuer (eq .Values.sso.kubernetes "impersonate") (not .Values.sso.impersonation.groups) -}}
{{- fail "sso.kubernetes=impersonate needs sso.impersonation.groups: the groups Kortex may impersonate (docs/sso.md#impersonation)" -}}
{{- end -}}
{{- if and .Values.podDisruptionBudget.enabled (kindIs "invalid" .Values.podDisruptionBudget.maxUnavailable) (kindIs "invalid" .Values.podDisruptionBudget.minAvailable) -}}
{{- fail "podDisruptionBudget needs maxUnavailable or minAvailable" -}}
{{- end -}}
{{- end -}}

{{/*
The Secret holding the session key: the one named, or the chart's own.
*/}}
{{- define "kortex.sessionKeySecret" -}}
{{- default (printf "%s-session-key" (include "kortex.fullname" .)) .Values.sso.sessionKey.name -}}
{{- end -}}
