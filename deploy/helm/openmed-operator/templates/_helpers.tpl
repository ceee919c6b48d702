{{/*
The release's full name: fullnameOverride, else the release name when it
already says openmed-operator, else <release>-openmed-operator. Every
object, the leader-election Lease and (by default) the ServiceAccount carry
it, so a release named openmed-operator has the names of deploy/operator.
*/}}
{{- define "openmed-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "openmed-operator.serviceAccountName" -}}
{{- default (include "openmed-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The identity the API server sees the operator as. */}}
{{- define "openmed-operator.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "openmed-operator.serviceAccountName" .) -}}
{{- end -}}

{{/* What selects the operator's pods (immutable once installed). */}}
{{- define "openmed-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{/*
The metrics Service: a DNS-1035 label (63 characters, a letter first), so
the full name is cut to leave room for "-metrics".
*/}}
{{- define "openmed-operator.metricsService" -}}
{{- $name := printf "%s-metrics" (include "openmed-operator.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- if not (regexMatch "^[a-z]" $name) -}}
{{- fail (printf "the metrics Service would be named %q, which must start with a letter: choose a release name that does, or set fullnameOverride" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "openmed-operator.labels" -}}
{{ include "openmed-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "openmed-operator.image" -}}
{{- $tag := default .Chart.AppVersion (toString .Values.image.tag) -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
Exactly what the operator uses, and nothing else: no Secrets, no Services,
no Nodes; Pods are only read, and only their status condition
openmed.ai/model-quality is written (pods/status); it can neither create nor
delete Deployments or Pods. The
ClusterRole (all namespaces) and each Role (watchNamespaces) grant these.
docs/operations.md gives the reason for every rule.
*/}}
{{- define "openmed-operator.rules" -}}
# Watch OpenMedModels; add and remove the finalizer (JSON patch).
- apiGroups: [openmed.ai]
  resources: [openmedmodels]
  verbs: [get, list, watch, patch]
# Write status through the status subresource (with resourceVersion).
- apiGroups: [openmed.ai]
  resources: [openmedmodels/status]
  verbs: [update]
# Owner references with blockOwnerDeletion on the owned ConfigMaps.
- apiGroups: [openmed.ai]
  resources: [openmedmodels/finalizers]
  verbs: [update]
# Watch managed Deployments, read a target not yet managed, apply the
# owned fields. No create, no delete.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, patch]
# The owned ConfigMaps: watch, create by apply, restore, delete.
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
# Which manifest snapshots the target's ReplicaSets still reference:
# their metadata only, never their pods.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list, watch]
# Whether a pod of the template being rolled out keeps crashing, and
# its termination message: only pods with the snapshot label (the
# targets' pods), read; the pods themselves are never written.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
# spec.qualityGate: the condition openmed.ai/model-quality on a judged
# pod's status (the pod's readiness gate). Nothing else of a pod.
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
# Never write replicas while an autoscaler scales the target; with
# spec.autoscaling, the model's own autoscaler (applied, and deleted when
# the block is removed).
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch, create, patch, delete]
{{- if .Values.keda.enabled }}
# spec.autoscaling.keda: the model's own ScaledObject (--keda); KEDA makes
# and owns the autoscaler.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [list, watch, create, patch, delete]
{{- end }}
# Canaries: read the HTTPRoute a canary names and patch its two backend
# weights.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, patch]
# Events about OpenMedModels (events.k8s.io/v1); a repeat extends the
# series of the same object.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [get, create, patch]
{{- end -}}
