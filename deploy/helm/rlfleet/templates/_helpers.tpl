{{- /* The services' ports, defined once for the chart: the numbers of rlfleet.defaults
     (libs/rlfleet/defaults.py; tests/unit/test_defaults.py checks they agree). Env and
     reward pods share the env port, so a swapped reward service keeps its address. */}}
{{- define "rlfleet.port.env" -}}50051{{- end -}}
{{- define "rlfleet.port.rollout" -}}50052{{- end -}}
{{- define "rlfleet.port.ckptsync" -}}50053{{- end -}}
{{- define "rlfleet.port.envMetrics" -}}9101{{- end -}}
{{- define "rlfleet.port.rolloutMetrics" -}}9102{{- end -}}
{{- define "rlfleet.port.ckptsyncMetrics" -}}9103{{- end -}}
{{- define "rlfleet.port.learnerMetrics" -}}9104{{- end -}}
{{- /* Where runs live on the shared volume (rlfleet.defaults.RUNS_ROOT). */}}
{{- define "rlfleet.runsRoot" -}}/shared/runs{{- end -}}

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
{{- define "rlfleet.rewardAddress" -}}{{ include "rlfleet.fullname" . }}-reward:{{ include "rlfleet.port.env" . }}{{- end -}}
{{- define "rlfleet.envAddress" -}}{{ include "rlfleet.fullname" . }}-env:{{ include "rlfleet.port.env" . }}{{- end -}}
{{- define "rlfleet.ckptsyncAddress" -}}{{ include "rlfleet.fullname" . }}-ckptsync:{{ include "rlfleet.port.ckptsync" . }}{{- end -}}
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
  value: {{ include "rlfleet.runsRoot" . }}
- name: RLFLEET_RUN
  value: {{ .Values.run | quote }}
- name: RLFLEET_ENV_ADDRESS
  value: {{ include "rlfleet.envAddress" . | quote }}
- name: RLFLEET_REWARD_ADDRESS
  value: {{ include "rlfleet.rewardAddress" . | quote }}
- name: RLFLEET_SYNC_ADDRESS
  value: {{ include "rlfleet.ckptsyncAddress" . | quote }}
- name: HOME
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- if .Values.tls.enabled }}
{{ include "rlfleet.tlsEnv" . }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "rlfleet.sharedVolume" -}}
- name: shared
  {{- if .Values.shared.hostPath }}
  hostPath:
    path: {{ .Values.shared.hostPath | quote }}
    type: DirectoryOrCreate
  {{- else }}
  persistentVolumeClaim:
    claimName: {{ include "rlfleet.sharedClaimName" . }}
  {{- end }}
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "rlfleet.sharedMounts" -}}
- name: shared
  mountPath: /shared
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* The init container that puts the tiny policy at .Values.model (modelInit.enabled),
     from the learner's image (it has torch). Several pods may run it at once: the model is
     built aside and renamed into place. */}}
{{- define "rlfleet.modelInit" -}}
{{- if .Values.modelInit.enabled }}
- name: model-init
  image: {{ include "rlfleet.image" (dict "root" $ "image" .Values.learner.image) | quote }}
  imagePullPolicy: {{ include "rlfleet.pullPolicy" (dict "root" $ "image" .Values.learner.image) }}
  command: ["rlfleet", "model", "init-tiny", {{ .Values.model | quote }}]
  env:
    - name: HOME
      value: /tmp
  resources:
    requests: {cpu: 100m, memory: 256Mi}
    limits: {cpu: "1", memory: 1Gi}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  volumeMounts:
    {{- include "rlfleet.sharedMounts" . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* exec probe through `rlfleet health`: works on every Kubernetes version (native gRPC
     probes need 1.24+, and cannot present a client certificate). With TLS it uses the
     pod's own certificate (RLFLEET_TLS_*) and checks the server's certificate names the
     service. dict "root" $ "port" (include "rlfleet.port.rollout" .) "service" NAME */}}
{{- define "rlfleet.healthProbe" -}}
exec:
  {{- if .root.Values.tls.enabled }}
  command: ["rlfleet", "health", "127.0.0.1:{{ .port }}", "--tls-server-name", {{ .service | quote }}]
  {{- else }}
  command: ["rlfleet", "health", "127.0.0.1:{{ .port }}"]
  {{- end }}
{{- end -}}

{{/* TLS (tls.enabled) ------------------------------------------------------------ */}}

{{- define "rlfleet.tlsDir" -}}/etc/rlfleet/tls{{- end -}}

{{/* Whether cert-manager makes the certificates: "true" or "". */}}
{{- define "rlfleet.tlsCertManager" -}}
{{- $m := toString .Values.tls.certManager -}}
{{- if eq $m "true" -}}true
{{- else if and (eq $m "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1") -}}true
{{- end -}}
{{- end -}}

{{/* The Secret of a role's certificate (env, reward, ckptsync, rollout, client). dict "root" $ "role" R */}}
{{- define "rlfleet.tlsSecretName" -}}{{ include "rlfleet.fullname" .root }}-tls-{{ .role }}{{- end -}}

{{/* The Services a role's certificate names, comma-separated (short names). */}}
{{- define "rlfleet.tlsServices" -}}
{{- $fullname := include "rlfleet.fullname" .root -}}
{{- $names := list -}}
{{- if has .role (list "env" "reward") -}}
{{- $names = append $names (printf "%s-%s" $fullname .role) -}}
{{- range (index .root.Values .role).services -}}
{{- $names = append $names (printf "%s-%s-%s" $fullname $.role .name) -}}
{{- end -}}
{{- else if eq .role "rollout" -}}
{{- $names = list (printf "%s-rollout" $fullname) (include "rlfleet.rolloutService" .root) -}}
{{- else -}}
{{- $names = list (printf "%s-%s" $fullname .role) -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* Every DNS name of a role's Services: name, name.ns, name.ns.svc, name.ns.svc.<domain>. */}}
{{- define "rlfleet.tlsDnsNames" -}}
{{- $ns := .root.Release.Namespace -}}
{{- $domain := .root.Values.tls.clusterDomain -}}
{{- $out := list -}}
{{- range splitList "," (include "rlfleet.tlsServices" .) -}}
{{- $out = concat $out (list . (printf "%s.%s" . $ns) (printf "%s.%s.svc" . $ns) (printf "%s.%s.svc.%s" . $ns $domain)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The TLS environment of every pod: its certificate (the mounted Secret), the fleet's
     CA, and the name replicas' certificates carry (the learner calls replicas at their
     pod addresses). */}}
{{- define "rlfleet.tlsEnv" -}}
- name: RLFLEET_TLS_CERT
  value: {{ include "rlfleet.tlsDir" . }}/tls.crt
- name: RLFLEET_TLS_KEY
  value: {{ include "rlfleet.tlsDir" . }}/tls.key
- name: RLFLEET_TLS_CLIENT_CA
  value: {{ include "rlfleet.tlsDir" . }}/ca.crt
- name: RLFLEET_TLS_IP_SERVER_NAME
  value: {{ include "rlfleet.fullname" . }}-rollout
{{- end -}}

{{/* The pod's certificate volume. dict "root" $ "role" R */}}
{{- define "rlfleet.tlsVolume" -}}
{{- if .root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "rlfleet.tlsSecretName" . }}
{{- end }}
{{- end -}}

{{- define "rlfleet.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: {{ include "rlfleet.tlsDir" . }}
  readOnly: true
{{- end }}
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
{{- range $role := list "env" "reward" -}}
{{- $v := index $.Values $role -}}
{{- $names := list -}}
{{- range $v.services -}}
{{- if has .name $names -}}
{{- include "rlfleet.die" (printf "%s.services: the name '%s' is listed twice" $role .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- if not (has $v.selected $names) -}}
{{- include "rlfleet.die" (printf "%s.selected: unknown %s service '%s'; %s.services lists: %s" $role $role $v.selected $role (join ", " $names)) -}}
{{- end -}}
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


{{/* The services of one contract, "env" or "reward": dict "root" $ "role" "env". Each entry
     of <role>.services that is enabled or selected gets a Deployment and a Service
     <release>-<role>-<name>; the stable Service <release>-<role> selects <role>.selected.
     An entry runs `rlfleet env serve --role <role>` with its args, or its own command
     (a reward service in a package of its own, e.g. examples/path-efficiency-reward);
     either way it listens on the env port (gRPC) and the env metrics port. */}}
{{- define "rlfleet.contractServices" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $v := index $root.Values $role -}}
{{- $fullname := include "rlfleet.fullname" $root -}}
{{- $sel := dict "root" $root "component" $role -}}
{{- $label := printf "rlfleet.io/%s" $role -}}
{{- range $svc := $v.services }}
{{- if or $svc.enabled (eq $svc.name $v.selected) }}
{{- $name := printf "%s-%s-%s" $fullname $role $svc.name }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "rlfleet.labels" $sel | nindent 4 }}
    {{ $label }}: {{ $svc.name }}
spec:
  replicas: {{ $svc.replicas | default 1 }}
  selector:
    matchLabels:
      {{- include "rlfleet.selectorLabels" $sel | nindent 6 }}
      {{ $label }}: {{ $svc.name }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 1
      maxUnavailable: 0
  template:
    metadata:
      labels:
        {{- include "rlfleet.labels" $sel | nindent 8 }}
        {{ $label }}: {{ $svc.name }}
      {{- with include "rlfleet.metricsAnnotations" (dict "root" $root "port" (include "rlfleet.port.envMetrics" .)) }}
      annotations:
        {{- . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "rlfleet.serviceAccountName" $root }}
      automountServiceAccountToken: false
      {{- with $root.Values.global.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: {{ $role }}
          image: {{ include "rlfleet.image" (dict "root" $root "image" $svc.image) | quote }}
          imagePullPolicy: {{ include "rlfleet.pullPolicy" (dict "root" $root "image" $svc.image) }}
          {{- if $svc.command }}
          command:
            {{- toYaml $svc.command | nindent 12 }}
          {{- else }}
          command: ["rlfleet", "env", "serve", "--role", {{ $role | quote }}, "--port", "{{ include "rlfleet.port.env" . }}", "--metrics-port", "{{ include "rlfleet.port.envMetrics" . }}"]
          {{- end }}
          args:
            {{- toYaml ($svc.args | default list) | nindent 12 }}
          env:
            {{- include "rlfleet.commonEnv" $root | nindent 12 }}
            - name: {{ printf "RLFLEET_%s_SERVICE" (upper $role) }}
              value: {{ $svc.name | quote }}
          ports:
            - name: grpc
              containerPort: {{ include "rlfleet.port.env" . }}
              protocol: TCP
            - name: metrics
              containerPort: {{ include "rlfleet.port.envMetrics" . }}
              protocol: TCP
          readinessProbe:
            {{- include "rlfleet.healthProbe" (dict "root" $root "port" (include "rlfleet.port.env" .) "service" (printf "%s-%s" $fullname $role)) | nindent 12 }}
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 3
          livenessProbe:
            tcpSocket:
              port: grpc
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 6
          startupProbe:
            tcpSocket:
              port: grpc
            periodSeconds: 5
            failureThreshold: 60
          resources:
            {{- include "rlfleet.resources" (dict "resources" ($svc.resources | default dict) "gpus" 0) | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            {{- include "rlfleet.sharedMounts" $root | nindent 12 }}
            {{- include "rlfleet.tlsMount" $root | nindent 12 }}
      volumes:
        {{- include "rlfleet.sharedVolume" $root | nindent 8 }}
        {{- include "rlfleet.tlsVolume" (dict "root" $root "role" $role) | nindent 8 }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
---
# Per-service address (metrics scraping, direct calls); the fleet uses {{ $fullname }}-{{ $role }}.
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "rlfleet.labels" $sel | nindent 4 }}
    {{ $label }}: {{ $svc.name }}
    rlfleet.io/scrape: "true"
spec:
  type: ClusterIP
  selector:
    {{- include "rlfleet.selectorLabels" $sel | nindent 4 }}
    {{ $label }}: {{ $svc.name }}
  ports:
    - name: grpc
      port: {{ include "rlfleet.port.env" . }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
    - name: metrics
      port: {{ include "rlfleet.port.envMetrics" . }}
      targetPort: metrics
      protocol: TCP
      appProtocol: http
{{- end }}
{{- end }}
---
# The stable address of the selected {{ $role }} service ({{ printf "RLFLEET_%s_ADDRESS" (upper $role) }} in every pod).
# Selecting another {{ $role }} service changes only this selector.
apiVersion: v1
kind: Service
metadata:
  name: {{ $fullname }}-{{ $role }}
  labels:
    {{- include "rlfleet.labels" $sel | nindent 4 }}
  annotations:
    {{ printf "rlfleet.io/selected-%s" $role }}: {{ $v.selected | quote }}
spec:
  type: ClusterIP
  selector:
    {{- include "rlfleet.selectorLabels" $sel | nindent 4 }}
    {{ $label }}: {{ $v.selected }}
  ports:
    - name: grpc
      port: {{ include "rlfleet.port.env" . }}
      targetPort: grpc
      protocol: TCP
      appProtocol: grpc
{{- end -}}


{{/* Prometheus (prometheus.enabled) ------------------------------------------------ */}}

{{- define "rlfleet.prometheus" -}}{{ include "rlfleet.fullname" . }}-prometheus{{- end -}}

{{/* Its prometheus.yml: the targets files/prometheus-discover.py finds (Debian's
     Prometheus has no Kubernetes discovery of its own): the release's pods with the
     prometheus.io/* annotations, each series labelled with its namespace and pod (what
     the dashboard's queries select on), component, Ray node, env and reward service. */}}
{{- define "rlfleet.prometheusConfig" -}}
global:
  scrape_interval: {{ .Values.prometheus.scrapeInterval }}
  evaluation_interval: {{ .Values.prometheus.scrapeInterval }}
scrape_configs:
  - job_name: {{ include "rlfleet.fullname" . }}-pods
    file_sd_configs:
      - files: [/discovered/targets.json]
        refresh_interval: {{ .Values.prometheus.scrapeInterval }}
{{- end -}}
