{{/* Pod template of a Ray node (head or worker) of the learner.
     dict "root" $ "group" .Values.learner.head "node" "head" "gpus" 0 */}}
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
  {{- with include "rlfleet.modelInit" $ }}
  initContainers:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ ternary "learner" (printf "ray-%s" .node) (default false .job) }}
      image: {{ include "rlfleet.image" (dict "root" $ "image" $l.image) | quote }}
      imagePullPolicy: {{ include "rlfleet.pullPolicy" (dict "root" $ "image" $l.image) }}
      {{- if .job }}
      command: ["rlfleet", "learner", "run", "--config", "/etc/rlfleet/learner.yaml", "--resume", "auto"]
      {{- end }}
      env:
        {{- include "rlfleet.commonEnv" $ | nindent 8 }}
        - name: RLFLEET_MODEL
          value: {{ $.Values.model | quote }}
        - name: RLFLEET_METRICS_PORT
          value: "{{ include "rlfleet.port.learnerMetrics" . }}"
        - name: HF_HOME
          value: /tmp/hf
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
        - name: learner-config
          mountPath: /etc/rlfleet
          readOnly: true
        {{- if $g.shmSize }}
        - name: dshm
          mountPath: /dev/shm
        {{- end }}
  volumes:
    {{- include "rlfleet.sharedVolume" $ | nindent 4 }}
    - name: learner-config
      configMap:
        name: {{ include "rlfleet.fullname" $ }}-learner
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
