{{/* Names ---------------------------------------------------------------------- */}}

{{- define "rlfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of every object; short enough that "<fullname>-reward-<name>" fits 63. */}}
{{- define "rlfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "rlfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rlfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rlfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels (Kubernetes recommended set) ------------------------------------------ */}}

{{/* Selector labels of a component: dict "root" $ "component" "rollout" */}}
{{- define "rlfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rlfleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rlfleet.labels" -}}
{{ include "rlfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rlfleet
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "rlfleet.chart" .root }}
{{- end -}}

{{/* Images ----------------------------------------------------------------------- */}}

{{/* dict "root" $ "image" .Values.rollout.image */}}
{{- define "rlfleet.image" -}}
{{- $g := .root.Values.global -}}
{{- $registry := default $g.imageRegistry .image.registry -}}
{{- $tag := default (default .root.Chart.AppVersion $g.imageTag) .image.tag -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "rlfleet.pullPolicy" -}}
{{- default .root.Values.global.imagePullPolicy .image.pullPolicy -}}
{{- end -}}

{{/* Addresses -------------------------------------------------------------------- */}}

{{- define "rlfleet.redisHost" -}}{{ include "rlfleet.fullname" . }}-redis{{- end -}}
{{- define "rlfleet.redisUrl" -}}redis://{{ include "rlfleet.redisHost" . }}:6379/0{{- end -}}
{{- define "rlfleet.rewardAddress" -}}{{ include "rlfleet.fullname" . }}-reward:50051{{- end -}}
{{- define "rlfleet.ckptsyncAddress" -}}{{ include "rlfleet.fullname" . }}-ckptsync:50053{{- end -}}
{{- define "rlfleet.rolloutService" -}}{{ include "rlfleet.fullname" . }}-rollout-headless{{- end -}}

{{- define "rlfleet.redisSecretName" -}}
{{- default (printf "%s-redis" (include "rlfleet.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}
{{- define "rlfleet.authSecretName" -}}
{{- default (printf "%s-auth" (include "rlfleet.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}
{{- define "rlfleet.sharedClaimName" -}}
{{- default (printf "%s-shared" (include "rlfleet.fullname" .)) .Values.shared.existingClaim -}}
{{- end -}}

{{/* A generated secret value that survives upgrades: the live Secret's value if the
     Secret exists (lookup), a new random one otherwise. dict "root" $ "name" N "key" K */}}
{{- define "rlfleet.persistentSecret" -}}
{{- $live := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if and $live $live.data (hasKey $live.data .key) -}}
{{- index $live.data .key -}}
{{- else -}}
{{- randAlphaNum 40 | b64enc -}}
{{- end -}}
{{- end -}}

{{/* Pod building blocks ----------------------------------------------------------- */}}

{{/* Environment every rlfleet container gets. */}}
{{- define "rlfleet.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "rlfleet.redisSecretName" . }}
      key: {{ .Values.redis.auth.existingSecretKey }}
- name: RLFLEET_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "rlfleet.authSecretName" . }}
      key: {{ .Values.auth.existingSecretKey }}
# Services bind 127.0.0.1 by default; in a pod they must listen on the pod address.
- name: RLFLEET_HOST
  value: {{ .Values.bindAddress | quote }}
- name: RLFLEET_REDIS_URL
  value: {{ include "rlfleet.redisUrl" . | quote }}
- name: RLFLEET_RUNS_ROOT
  value: /shared/runs
- name: RLFLEET_RUN
  value: {{ .Values.run | quote }}
- name: RLFLEET_ENV_ADDRESS
  value: {{ include "rlfleet.rewardAddress" . | quote }}
- name: RLFLEET_SYNC_ADDRESS
  value: {{ include "rlfleet.ckptsyncAddress" . | quote }}
- name: RLFLEET_ROLLOUT_SERVICE
  value: {{ include "rlfleet.rolloutService" . | quote }}
- name: HOME
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "rlfleet.sharedVolume" -}}
- name: shared
  persistentVolumeClaim:
    claimName: {{ include "rlfleet.sharedClaimName" . }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "rlfleet.sharedMounts" -}}
- name: shared
  mountPath: /shared
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* exec probe through `rlfleet health`: works on every Kubernetes version (native gRPC
     probes need 1.24+) and sends the fleet's auth token. dict "port" 50052 */}}
{{- define "rlfleet.healthProbe" -}}
exec:
  command: ["rlfleet", "health", "127.0.0.1:{{ .port }}"]
{{- end -}}

{{- define "rlfleet.metricsAnnotations" -}}
{{- if .root.Values.metrics.podAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}

{{/* Container resources with nvidia.com/gpu added, every quantity as a string (server-side
     apply's typed patches reject numbers there). dict "resources" R "gpus" N */}}
{{- define "rlfleet.resources" -}}
{{- $out := dict -}}
{{- range $section := list "requests" "limits" -}}
{{- $list := dict -}}
{{- range $k, $v := (index (default dict $.resources) $section | default dict) -}}
{{- $_ := set $list $k (toString $v) -}}
{{- end -}}
{{- if gt (int $.gpus) 0 -}}
{{- $_ := set $list "nvidia.com/gpu" (toString (int $.gpus)) -}}
{{- end -}}
{{- if $list -}}
{{- $_ := set $out $section $list -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* Stop rendering with a message. `helm lint` turns `fail` into a log line and renders
     on, so a lint run also calls a template named after the message, which does not exist:
     lint then reports `no template "invalid values: ..."` as an error. */}}
{{- define "rlfleet.die" -}}
{{- fail . -}}
{{- include (printf "invalid values: %s" .) dict -}}
{{- end -}}

{{/* Checks JSON Schema cannot express (cross-field). Called from every template that
     depends on them, so `helm lint`, `template` and `install` all fail the same way. */}}
{{- define "rlfleet.validate" -}}
{{- $names := list -}}
{{- range .Values.reward.services -}}
{{- if has .name $names -}}
{{- include "rlfleet.die" (printf "reward.services: the name '%s' is listed twice" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- if not (has .Values.reward.selected $names) -}}
{{- include "rlfleet.die" (printf "reward.selected: unknown reward service '%s'; reward.services lists: %s" .Values.reward.selected (join ", " $names)) -}}
{{- end -}}
{{- if .Values.rollout.autoscaling.enabled -}}
{{- if gt (int .Values.rollout.autoscaling.minReplicas) (int .Values.rollout.autoscaling.maxReplicas) -}}
{{- include "rlfleet.die" (printf "rollout.autoscaling: minReplicas (%d) is above maxReplicas (%d)" (int .Values.rollout.autoscaling.minReplicas) (int .Values.rollout.autoscaling.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- $w := .Values.learner.workers -}}
{{- if or (lt (int $w.replicas) (int $w.minReplicas)) (gt (int $w.replicas) (int $w.maxReplicas)) -}}
{{- include "rlfleet.die" (printf "learner.workers: replicas (%d) must lie within minReplicas..maxReplicas (%d..%d)" (int $w.replicas) (int $w.minReplicas) (int $w.maxReplicas)) -}}
{{- end -}}
{{- end -}}

{{/* Rollout replica count. Values decide at install and whenever rollout.replicas (or
     autoscaling.minReplicas) changes; otherwise the live count is kept, so a count set by
     `rlfleet scale rollout` or the HPA survives unrelated upgrades (e.g. a reward swap),
     and server-side apply sees no conflicting change to spec.replicas. */}}
{{- define "rlfleet.rollout.wantReplicas" -}}
{{- if .Values.rollout.autoscaling.enabled -}}{{ int .Values.rollout.autoscaling.minReplicas }}{{- else -}}{{ int .Values.rollout.replicas }}{{- end -}}
{{- end -}}

{{- define "rlfleet.rollout.replicas" -}}
{{- $want := include "rlfleet.rollout.wantReplicas" . -}}
{{- $live := lookup "apps/v1" "Deployment" .Release.Namespace (printf "%s-rollout" (include "rlfleet.fullname" .)) -}}
{{- $prev := "" -}}
{{- if and $live $live.metadata.annotations -}}
{{- $prev = get $live.metadata.annotations "rlfleet.io/values-replicas" -}}
{{- end -}}
{{- if and $live (eq $prev $want) -}}
{{- int $live.spec.replicas -}}
{{- else -}}
{{- $want -}}
{{- end -}}
{{- end -}}

{{/* NetworkPolicy peer: the pods of one component of this release. */}}
{{- define "rlfleet.peer" -}}
- podSelector:
    matchLabels:
      app.kubernetes.io/name: {{ include "rlfleet.name" .root }}
      app.kubernetes.io/instance: {{ .root.Release.Name }}
      app.kubernetes.io/component: {{ .component }}
{{- end -}}
