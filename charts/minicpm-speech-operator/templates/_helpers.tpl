{{/*
Chart name, overridable. Truncated to 63 characters: the limit of a label value.
*/}}
{{- define "minicpm-speech-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of every resource name. A release named after the chart ("minicpm-speech-operator",
or "prod-minicpm-speech-operator") is not repeated twice. Truncated to 52 characters so
that the longest suffix added below ("-leader-election") keeps names within 63.
*/}}
{{- define "minicpm-speech-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"name-version" for the helm.sh/chart label; "+" is not allowed in a label value.
*/}}
{{- define "minicpm-speech-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object. The selector labels are a fixed subset: a Deployment's selector
cannot change after creation, so nothing version-dependent may enter it.
*/}}
{{- define "minicpm-speech-operator.labels" -}}
helm.sh/chart: {{ include "minicpm-speech-operator.chart" . }}
{{ include "minicpm-speech-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: minicpm-speech
{{- end }}

{{- define "minicpm-speech-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "minicpm-speech-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "minicpm-speech-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "minicpm-speech-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator image: a digest, when given, pins the exact bytes and wins over the tag.
*/}}
{{- define "minicpm-speech-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
Name of the Lease used for leader election; the Role's resourceNames and the operator's
--leader-election-name both come from here, so they cannot disagree.
*/}}
{{- define "minicpm-speech-operator.leaseName" -}}
{{- printf "%s-leader" (include "minicpm-speech-operator.fullname" .) }}
{{- end }}

{{/*
The watched namespaces as a JSON list. A named template can only return a string, so
callers decode it with fromJsonArray. Empty list in cluster-wide mode; the release
namespace when watch.namespaces is empty.
*/}}
{{- define "minicpm-speech-operator.watchedNamespaces" -}}
{{- if .Values.watch.clusterWide }}
{{- list | toJson }}
{{- else }}
{{- default (list .Release.Namespace) .Values.watch.namespaces | uniq | toJson }}
{{- end }}
{{- end }}

{{/*
What the operator does inside a watched namespace: one list, rendered into a Role per
namespace (namespaced mode) or into the ClusterRole (cluster-wide mode). Each rule is
a Kubernetes API request the operator makes; tests/chart/test_rbac.py pins this list.
Children are never deleted by the operator: ownerReferences let the garbage collector
remove them with their MiniCPMSpeech. The exceptions are a benchmark Job the operator
created, deleted when superseded or beyond the history limit, and the HorizontalPodAutoscaler
of a resource whose autoscaling was turned off.
*/}}
{{- define "minicpm-speech-operator.watchedNamespaceRules" -}}
# Kopf lists and watches the resources and patches its finalizer and annotations; the
# reconciler reads one by name and merge-patches its status through the subresource.
- apiGroups: ["serving.minicpm-speech.io"]
  resources: ["minicpmspeeches"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["serving.minicpm-speech.io"]
  resources: ["minicpmspeeches/status"]
  verbs: ["patch"]
# Children: the rendered deploy config, the serving Deployment and its Service.
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The HorizontalPodAutoscaler of a resource with spec.autoscaling: read by name before every
# write (and to find one left when autoscaling is off), deleted when it is turned off. Not
# watched: its status changes at every metrics sync, and the resync repairs an edited one.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "create", "patch", "delete"]
# Only to check that a referenced hub-token Secret exists; its value is never read by the
# operator (the serving pod gets it as an environment variable).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
# Kopf posts its events through the core v1 API (kopf/_cogs/clients/events.py).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Benchmark Jobs: looked up by name before creating (never a duplicate), listed and
# watched to follow them, and deleted when a newer config supersedes them or the history
# limit drops them; their pods and config ConfigMaps go with them (owner references).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
# A finished Job's pod is listed by its job-name label to read the termination message,
# which carries the result: the Job itself needs no API rights.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}
