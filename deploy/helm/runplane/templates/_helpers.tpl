{{- define "runplane.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "runplane.labels" -}}
app.kubernetes.io/name: runplane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: runplane
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "runplane.selector" -}}
app.kubernetes.io/name: runplane
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "runplane.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "runplane.urlsSecret" -}}
{{ .Values.urls.existingSecret | default (printf "%s-urls" (include "runplane.fullname" .)) }}
{{- end -}}

{{- define "runplane.gracePeriod" -}}
{{ add (int .Values.config.drainSeconds) (int .Values.config.terminationGraceMarginSeconds) }}
{{- end -}}

{{/*
One control-plane Deployment. Arguments (a dict): root, component, name, replicas, args, resources,
env (list), probes (dict with readinessProbe/livenessProbe), serviceAccount, ports (list),
volumes/volumeMounts (lists).
*/}}
{{- define "runplane.deployment" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
  labels:
    {{- include "runplane.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  replicas: {{ .replicas }}
  selector:
    matchLabels:
      {{- include "runplane.selector" . | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "runplane.labels" $root | nindent 8 }}
        {{- include "runplane.selector" . | nindent 8 }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/config.yaml") $root | sha256sum }}
    spec:
      serviceAccountName: {{ .serviceAccount }}
      automountServiceAccountToken: {{ .automountToken | default false }}
      terminationGracePeriodSeconds: {{ include "runplane.gracePeriod" $root }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- range . }}
        - name: {{ . }}
        {{- end }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "runplane.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- toYaml .args | nindent 12 }}
          envFrom:
            - configMapRef:
                name: {{ include "runplane.fullname" $root }}-config
            - secretRef:
                name: {{ include "runplane.urlsSecret" $root }}
          {{- with .env }}
          env:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $root.Values.config.metricsPort }}
              protocol: TCP
            {{- with .ports }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- toYaml .probes | nindent 10 }}
          resources:
            {{- toYaml .resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- with .volumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end -}}

{{/* Liveness and readiness on the metrics port: the service is up when it serves /metrics. */}}
{{- define "runplane.metricsProbes" -}}
readinessProbe:
  tcpSocket:
    port: metrics
  periodSeconds: 10
livenessProbe:
  tcpSocket:
    port: metrics
  initialDelaySeconds: 10
  periodSeconds: 20
  failureThreshold: 3
{{- end -}}

{{- define "runplane.pdb" -}}
{{- /* policy/v1 from Kubernetes 1.21; policy/v1beta1 before (removed in 1.25). */}}
apiVersion: {{ .root.Capabilities.APIVersions.Has "policy/v1" | ternary "policy/v1" "policy/v1beta1" }}
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  labels:
    {{- include "runplane.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "runplane.selector" . | nindent 6 }}
{{- end -}}

{{/* Egress rules of a NetworkPolicy in the runs namespace: the cluster's DNS and the runner API. */}}
{{- define "runplane.egressToDnsAndRunnerApi" -}}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: kube-system
      podSelector:
        matchLabels:
          k8s-app: kube-dns
  ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Release.Namespace }}
      podSelector:
        matchLabels:
          {{- include "runplane.selector" (dict "root" . "component" "api") | nindent 10 }}
  ports:
    - {protocol: TCP, port: {{ .Values.api.runnerPort }}}
{{- end -}}
