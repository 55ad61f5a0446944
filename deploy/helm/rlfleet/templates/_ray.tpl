{{/* Pod template of a Ray node (head or worker) of the learner.
     dict "root" $ "group" .Values.learner.head "node" "head" "gpus" 0
     optional: "job" true (the one pod of learner.mode job: it runs the learner itself);
     "command" LIST (learner.mode raycluster: the node's `ray start`, with Ray's token auth
     from the Secret <release>-ray) */}}
{{- define "rlfleet.rayPod" -}}
{{- $ := .root -}}
{{- $l := $.Values.learner -}}
{{- $g := .group -}}
metadata:
  labels:
    {{- include "rlfleet.labels" (dict "root" $ "component" "learner") | nindent 4 }}
    rlfleet.io/ray-node: {{ .node }}
  annotations:
    checksum/learner-config: {{ ternary $l.configFile (toYaml $l.config) (ne $l.configFile "") | sha256sum }}
    {{- include "rlfleet.metricsAnnotations" (dict "root" $ "port" (ternary (include "rlfleet.port.learnerMetrics" .) 8080 (eq .node "head"))) | nindent 4 }}
spec:
  serviceAccountName: {{ include "rlfleet.serviceAccountName" $ }}
  automountServiceAccountToken: false
  {{- with $.Values.global.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- toYaml $l.podSecurityContext | nindent 4 }}
  {{- if .job }}
  restartPolicy: Never
  # The learner checkpoints and stops on SIGTERM (it finishes or abandons the step).
  terminationGracePeriodSeconds: 120
  {{- end }}
  {{- $init := include "rlfleet.modelInit" $ }}
  {{- if and .command (eq .node "worker") }}
  {{- $init = printf "%s\n%s" $init (include "rlfleet.rayWaitForHead" $) }}
  {{- end }}
  {{- with trim $init }}
  initContainers:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ ternary "learner" (printf "ray-%s" .node) (default false .job) }}
      image: {{ include "rlfleet.image" (dict "root" $ "image" $l.image) | quote }}
      imagePullPolicy: {{ include "rlfleet.pullPolicy" (dict "root" $ "image" $l.image) }}
      {{- if .job }}
      command: ["rlfleet", "learner", "run", "--config", "/etc/rlfleet/learner.yaml", "--resume", "auto"]
      {{- else if .command }}
      command:
        {{- toYaml .command | nindent 8 }}
      {{- end }}
      env:
        {{- include "rlfleet.commonEnv" $ | nindent 8 }}
        {{- if .command }}
        {{- include "rlfleet.rayAuthEnv" $ | nindent 8 }}
        {{- end }}
        - name: RLFLEET_MODEL
          value: {{ $.Values.model | quote }}
        # the learner's console; a Ray job's driver inherits the head's environment
        - name: RLFLEET_CONSOLE
          value: {{ $l.console | quote }}
        - name: RLFLEET_METRICS_PORT
          value: "{{ include "rlfleet.port.learnerMetrics" . }}"
        - name: HF_HOME
          value: /tmp/hf
        {{- with $l.tracking }}
        {{- if .wandb.apiKeySecret.name }}
        - name: WANDB_API_KEY
          valueFrom:
            secretKeyRef:
              name: {{ .wandb.apiKeySecret.name | quote }}
              key: {{ .wandb.apiKeySecret.key | quote }}
        {{- end }}
        {{- if .mlflow.trackingUri }}
        - name: MLFLOW_TRACKING_URI
          value: {{ .mlflow.trackingUri | quote }}
        {{- end }}
        {{- end }}
      ports:
        {{- if .job }}
        - name: learner-metrics
          containerPort: {{ include "rlfleet.port.learnerMetrics" . }}
          protocol: TCP
        {{- else if eq .node "head" }}
        - name: gcs-server
          containerPort: 6379
          protocol: TCP
        - name: dashboard
          containerPort: 8265
          protocol: TCP
        - name: client
          containerPort: 10001
          protocol: TCP
        # rlfleet's own metrics (served by the learner driver, which runs on the head).
        - name: learner-metrics
          containerPort: {{ include "rlfleet.port.learnerMetrics" . }}
          protocol: TCP
        {{- end }}
        {{- if not .job }}
        # Ray's metrics (KubeRay's well-known port name).
        - name: metrics
          containerPort: 8080
          protocol: TCP
        {{- end }}
      {{- if and .command (eq .node "head") }}
      # Ready once the Jobs API (the dashboard's job server) listens.
      readinessProbe:
        tcpSocket:
          port: dashboard
        periodSeconds: 5
        failureThreshold: 3
      {{- end }}
      {{- if eq .node "worker" }}
      lifecycle:
        preStop:
          exec:
            command: ["/bin/sh", "-c", "ray stop"]
      {{- end }}
      resources:
        {{- include "rlfleet.resources" (dict "resources" $g.resources "gpus" .gpus) | nindent 8 }}
      securityContext:
        {{- toYaml $l.containerSecurityContext | nindent 8 }}
      volumeMounts:
        {{- include "rlfleet.sharedMounts" $ | nindent 8 }}
        {{- include "rlfleet.tlsMount" $ | nindent 8 }}
        - name: learner-config
          mountPath: /etc/rlfleet
          readOnly: true
        {{- if .command }}
        - name: ray-auth
          mountPath: /etc/ray-auth
          readOnly: true
        {{- end }}
        {{- if $g.shmSize }}
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
  volumes:
    {{- include "rlfleet.sharedVolume" $ | nindent 4 }}
    {{- include "rlfleet.tlsVolume" (dict "root" $ "role" "client") | nindent 4 }}
    - name: learner-config
      configMap:
        name: {{ include "rlfleet.fullname" $ }}-learner
    {{- if .command }}
    - name: ray-auth
      secret:
        secretName: {{ include "rlfleet.raySecretName" $ }}
    {{- end }}
    {{- if $g.shmSize }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $g.shmSize | quote }}
    {{- end }}
  {{- with $g.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}


{{/* learner.mode raycluster ---------------------------------------------------------- */}}

{{- define "rlfleet.rayHead" -}}{{ include "rlfleet.fullname" . }}-ray-head{{- end -}}
{{- define "rlfleet.raySecretName" -}}{{ include "rlfleet.fullname" . }}-ray{{- end -}}
{{/* The Jobs API of the chart's Ray head (the dashboard's job server). */}}
{{- define "rlfleet.rayJobsAddress" -}}http://{{ include "rlfleet.rayHead" . }}:8265{{- end -}}

{{/* Ray's token auth (Ray 2.60): every node, and every client of the Jobs API, presents
     the token of the Secret <release>-ray, mounted at /etc/ray-auth. */}}
{{- define "rlfleet.rayAuthEnv" -}}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN_PATH
  value: /etc/ray-auth/token
{{- end -}}

{{/* `ray start` of a node: dict "root" $ "node" "head"|"worker"; the group's
     rayStartParams come last (and win). A list for the container's command. */}}
{{- define "rlfleet.rayStart" -}}
{{- $l := .root.Values.learner -}}
{{- $argv := list "ray" "start" "--block" "--disable-usage-stats" "--log-style=record" "--log-color=false" "--node-ip-address=$(POD_IP)" "--metrics-export-port=8080" -}}
{{- $params := $l.workers.rayStartParams -}}
{{- if eq .node "head" -}}
{{- $argv = concat $argv (list "--head" "--port=6379" "--include-dashboard=true" "--dashboard-host=0.0.0.0" "--dashboard-port=8265" "--ray-client-server-port=10001" "--num-gpus=0") -}}
{{- $params = $l.head.rayStartParams -}}
{{- else -}}
{{- $argv = append $argv (printf "--address=%s:6379" (include "rlfleet.rayHead" .root)) -}}
{{- end -}}
{{- range $k, $v := $params -}}
{{- $argv = append $argv (printf "--%s=%v" $k $v) -}}
{{- end -}}
{{- toYaml $argv -}}
{{- end -}}

{{/* A worker's init container: waits until the head's GCS port answers (a worker that
     starts first would exit and be restarted with back-off). */}}
{{- define "rlfleet.rayWaitForHead" -}}
- name: wait-for-ray-head
  image: {{ include "rlfleet.image" (dict "root" $ "image" .Values.learner.image) | quote }}
  imagePullPolicy: {{ include "rlfleet.pullPolicy" (dict "root" $ "image" .Values.learner.image) }}
  command:
    - python3
    - -c
    - |
      import socket, time
      while True:
          try:
              socket.create_connection(({{ include "rlfleet.rayHead" . | quote }}, 6379), 3).close()
              break
          except OSError:
              time.sleep(2)
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {cpu: 100m, memory: 128Mi}
  securityContext:
    {{- toYaml .Values.learner.containerSecurityContext | nindent 4 }}
{{- end -}}
