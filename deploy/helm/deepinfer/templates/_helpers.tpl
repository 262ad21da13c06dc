{{/*
Names and labels.
*/}}
{{- define "deepinfer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "deepinfer.fullname" -}}
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

{{/*
The LeaderWorkerSet's name. LWS creates a headless Service of that name for its pods' DNS names, so it must differ
from the chart's Service; kept short, as pod names append the group and worker indices.
*/}}
{{- define "deepinfer.lwsName" -}}
{{- printf "%s-lws" (include "deepinfer.fullname" . | trunc 48 | trimSuffix "-") -}}
{{- end -}}

{{- define "deepinfer.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "deepinfer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "deepinfer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "deepinfer.labels" -}}
helm.sh/chart: {{ include "deepinfer.chart" . }}
{{ include "deepinfer.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The component label of the pods that serve HTTP: the Deployment's, or the LeaderWorkerSet's leaders. */}}
{{- define "deepinfer.servingComponent" -}}
{{- if .Values.multiNode.enabled -}}leader{{- else -}}server{{- end -}}
{{- end -}}

{{- define "deepinfer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "deepinfer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "deepinfer.image" -}}
{{- printf "%s:%s" .Values.image.repository (toString (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}

{{/* The API key's Secret: an existing one, or the one this chart creates. */}}
{{- define "deepinfer.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "deepinfer.fullname" .)) .Values.apiKey.existingSecret -}}
{{- end -}}

{{/* HTTP, or HTTPS when the server is given a certificate. */}}
{{- define "deepinfer.scheme" -}}
{{- if .Values.engine.sslCertfile -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/*
A value as one command-line word. Numbers from a values file arrive as float64: whole ones are written without a
fraction or an exponent (8, 131072), so that the server's integer flags read them.
*/}}
{{- define "deepinfer.word" -}}
{{- if kindIs "float64" . -}}
{{- if eq (floor .) . -}}{{- printf "%d" (int64 .) -}}{{- else -}}{{- . -}}{{- end -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/*
The `engine` keys and the `deepinfer serve` flag each one renders, in the order they appear on the command line. A
key here must have a flag in the server's CLI (python/deepinfer/server/cli.py, the EngineConfig fields' flags of
python/deepinfer/engine_args.py); tests/python/test_helm_chart.py checks that, and that values.schema.json knows
the same keys.
*/}}
{{- define "deepinfer.engineOptions" -}}
model --model
revision --revision
downloadDir --download-dir
tokenizer --tokenizer
servedModelName --served-model-name
tensorParallelSize --tensor-parallel-size
dataParallelSize --data-parallel-size
enableExpertParallel --enable-expert-parallel
enableDpAttention --enable-dp-attention
distributedExecutorBackend --distributed-executor-backend
collectiveTimeoutS --collective-timeout-s
maxModelLen --max-model-len
gpuMemoryUtilization --gpu-memory-utilization
maxNumSeqs --max-num-seqs
maxNumBatchedTokens --max-num-batched-tokens
pageSize --page-size
numCachePages --num-cache-pages
quantization --quantization
quantizationConfig --quantization-config
kvCacheDtype --kv-cache-dtype
dtype --dtype
loadFormat --load-format
enablePrefixCaching --enable-prefix-caching
enforceEager --enforce-eager
speculativeConfig --speculative-config
numSpeculativeTokens --num-speculative-tokens
generationConfig --generation-config
seed --seed
toolCallParser --tool-call-parser
reasoningParser --reasoning-parser
chatTemplate --chat-template
maxQueueSize --max-queue-size
maxLogprobs --max-logprobs
shutdownTimeout --shutdown-timeout
logLevel --log-level
accessLog --access-log
enableLogRequests --enable-log-requests
rootPath --root-path
allowedOrigins --allowed-origins
allowCredentials --allow-credentials
sslCertfile --ssl-certfile
sslKeyfile --ssl-keyfile
sslCaCerts --ssl-ca-certs
sslCertReqs --ssl-cert-reqs
{{- end -}}

{{/*
The container's args (the image's entrypoint is `deepinfer serve`), as a YAML list. Called with (dict "root" $
"role" ROLE), ROLE being server (the Deployment), leader or worker (the LeaderWorkerSet).
null and "" leave a flag out; true/false render --flag/--no-flag; a map is passed as JSON; a list (allowedOrigins)
as the flag followed by its items.
*/}}
{{- define "deepinfer.args" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $args := list "--host" (toString $v.listenAddress) "--port" (include "deepinfer.word" $v.containerPort) -}}
{{- range $line := splitList "\n" (include "deepinfer.engineOptions" $root) -}}
{{- $parts := splitList " " (trim $line) -}}
{{- $key := index $parts 0 -}}
{{- $flag := index $parts 1 -}}
{{- $val := index $v.engine $key -}}
{{- if kindIs "invalid" $val -}}
{{- else if kindIs "bool" $val -}}
{{- if $val -}}
{{- $args = append $args $flag -}}
{{- else -}}
{{- $args = append $args (printf "--no-%s" (trimPrefix "--" $flag)) -}}
{{- end -}}
{{- else if kindIs "map" $val -}}
{{- $args = concat $args (list $flag (toJson $val)) -}}
{{- else if kindIs "slice" $val -}}
{{- if $val -}}
{{- $args = append $args $flag -}}
{{- range $item := $val -}}
{{- $args = append $args (include "deepinfer.word" $item) -}}
{{- end -}}
{{- end -}}
{{- else if and (kindIs "string" $val) (eq $val "") -}}
{{- else -}}
{{- $args = concat $args (list $flag (include "deepinfer.word" $val)) -}}
{{- end -}}
{{- end -}}
{{- if ne .role "server" -}}
{{/* The SGLang-style multi-node launch flags, from the variables LWS sets in every pod of a group (expanded by the
kubelet): node 0, the leader, serves; the others run its steps. */}}
{{- $rendezvous := printf "$(LWS_LEADER_ADDRESS):%s" (include "deepinfer.word" $v.multiNode.distInitPort) -}}
{{- $args = concat $args (list "--nnodes" "$(LWS_GROUP_SIZE)" "--node-rank" "$(LWS_WORKER_INDEX)" "--dist-init-addr" $rendezvous) -}}
{{- end -}}
{{- range $item := $v.extraArgs -}}
{{- $args = append $args (include "deepinfer.word" $item) -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/*
GPUs a pod asks for: gpu.count, else the tensor-parallel size (split over the group's pods in multi-node mode).
*/}}
{{- define "deepinfer.gpuCount" -}}
{{- $v := .Values -}}
{{- $tp := int (default 1 $v.engine.tensorParallelSize) -}}
{{- $perPod := $tp -}}
{{- if $v.multiNode.enabled -}}
{{- $nodes := int $v.multiNode.size -}}
{{- if ne (mod $tp $nodes) 0 -}}
{{- fail (printf "engine.tensorParallelSize %d is not a multiple of multiNode.size %d: each node must hold the same number of tensor-parallel ranks" $tp $nodes) -}}
{{- end -}}
{{- $perPod = div $tp $nodes -}}
{{- end -}}
{{- if kindIs "invalid" $v.gpu.count -}}
{{- $perPod -}}
{{- else -}}
{{- $count := int $v.gpu.count -}}
{{- if and (gt $count 0) (lt $count $perPod) -}}
{{- fail (printf "gpu.count %d is fewer GPUs than the %d tensor-parallel ranks a pod runs (engine.tensorParallelSize)" $count $perPod) -}}
{{- end -}}
{{- $count -}}
{{- end -}}
{{- end -}}

{{/*
Checks that no template can express as a schema rule; every workload template includes this first.
*/}}
{{- define "deepinfer.validate" -}}
{{- $v := .Values -}}
{{- if and $v.apiKey.enabled (not $v.apiKey.existingSecret) (not $v.apiKey.value) -}}
{{- fail "apiKey.enabled needs apiKey.existingSecret (a Secret holding the key) or apiKey.value (the chart creates the Secret)" -}}
{{- end -}}
{{- range $name, $s := dict "modelStorage" $v.modelStorage "hfCache" $v.hfCache -}}
{{- if and (eq $s.type "pvc") (not $s.claimName) -}}
{{- fail (printf "%s.type pvc needs %s.claimName" $name $name) -}}
{{- end -}}
{{- if and (eq $s.type "hostPath") (not $s.hostPath) -}}
{{- fail (printf "%s.type hostPath needs %s.hostPath" $name $name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A volume's source from a modelStorage/hfCache block, as YAML. */}}
{{- define "deepinfer.volumeSource" -}}
{{- if eq .type "pvc" -}}
{{- $claim := dict "claimName" .claimName -}}
{{- if .readOnly -}}
{{- $_ := set $claim "readOnly" true -}}
{{- end -}}
{{- toYaml (dict "persistentVolumeClaim" $claim) -}}
{{- else if eq .type "hostPath" -}}
{{- $host := dict "path" .hostPath -}}
{{- with .hostPathType -}}
{{- $_ := set $host "type" . -}}
{{- end -}}
{{- toYaml (dict "hostPath" $host) -}}
{{- else -}}
{{- $empty := dict -}}
{{- with .sizeLimit -}}
{{- $_ := set $empty "sizeLimit" . -}}
{{- end -}}
{{- toYaml (dict "emptyDir" $empty) -}}
{{- end -}}
{{- end -}}

{{/* Whether /dev/shm is mounted: shm.enabled, or (null) whether the pod has more than one GPU. */}}
{{- define "deepinfer.shmEnabled" -}}
{{- if kindIs "invalid" .Values.shm.enabled -}}
{{- if gt (int (include "deepinfer.gpuCount" .)) 1 -}}true{{- end -}}
{{- else if .Values.shm.enabled -}}true{{- end -}}
{{- end -}}

{{/*
A pod's spec, for the Deployment (role server) and for the LeaderWorkerSet's leaders and workers. Called with
(dict "root" $ "role" ROLE).
*/}}
{{- define "deepinfer.podSpec" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $gpus := int (include "deepinfer.gpuCount" $root) -}}
{{- $scheme := include "deepinfer.scheme" $root -}}
serviceAccountName: {{ include "deepinfer.serviceAccountName" $root }}
automountServiceAccountToken: {{ $v.serviceAccount.automountToken }}
terminationGracePeriodSeconds: {{ $v.terminationGracePeriodSeconds }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: deepinfer
    image: {{ include "deepinfer.image" $root | quote }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    {{- with $v.command }}
    command:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    args:
      {{- include "deepinfer.args" . | nindent 6 }}
    ports:
      - name: http
        containerPort: {{ $v.containerPort }}
        protocol: TCP
      {{- if ne .role "server" }}
      - name: dist-init
        containerPort: {{ $v.multiNode.distInitPort }}
        protocol: TCP
      {{- end }}
    {{- $env := list }}
    {{- if $v.hfCache.enabled }}
    {{- $env = append $env (dict "name" "HF_HOME" "value" (toString $v.hfCache.mountPath)) }}
    {{- end }}
    {{- if $v.apiKey.enabled }}
    {{- $ref := dict "name" (include "deepinfer.apiKeySecretName" $root) "key" $v.apiKey.secretKey }}
    {{- $env = append $env (dict "name" "DEEPINFER_API_KEY" "valueFrom" (dict "secretKeyRef" $ref)) }}
    {{- end }}
    {{- range $name, $value := $v.env }}
    {{- $env = append $env (dict "name" $name "value" (include "deepinfer.word" $value)) }}
    {{- end }}
    {{- $env = concat $env $v.extraEnv }}
    {{- with $env }}
    env:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- if ne .role "worker" }}
    {{- with $v.probes.startup }}
    {{- if .enabled }}
    startupProbe:
      httpGet:
        path: /health
        port: http
        scheme: {{ $scheme }}
      initialDelaySeconds: {{ .initialDelaySeconds }}
      periodSeconds: {{ .periodSeconds }}
      timeoutSeconds: {{ .timeoutSeconds }}
      failureThreshold: {{ .failureThreshold }}
    {{- end }}
    {{- end }}
    {{- with $v.probes.readiness }}
    {{- if .enabled }}
    readinessProbe:
      httpGet:
        path: /health
        port: http
        scheme: {{ $scheme }}
      periodSeconds: {{ .periodSeconds }}
      timeoutSeconds: {{ .timeoutSeconds }}
      failureThreshold: {{ .failureThreshold }}
      successThreshold: {{ .successThreshold }}
    {{- end }}
    {{- end }}
    {{- with $v.probes.liveness }}
    {{- if .enabled }}
    livenessProbe:
      httpGet:
        path: /health
        port: http
        scheme: {{ $scheme }}
      periodSeconds: {{ .periodSeconds }}
      timeoutSeconds: {{ .timeoutSeconds }}
      failureThreshold: {{ .failureThreshold }}
    {{- end }}
    {{- end }}
    {{- end }}
    {{- $resources := deepCopy (default dict $v.resources) }}
    {{- if gt $gpus 0 }}
    {{- $requests := default dict (get $resources "requests") }}
    {{- $limits := default dict (get $resources "limits") }}
    {{- $_ := set $requests $v.gpu.resourceName $gpus }}
    {{- $_ := set $limits $v.gpu.resourceName $gpus }}
    {{- $_ := set $resources "requests" $requests }}
    {{- $_ := set $resources "limits" $limits }}
    {{- end }}
    {{- with $resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $v.securityContext }}
    securityContext:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- $mounts := list }}
    {{- $volumes := list }}
    {{- if ne $v.modelStorage.type "none" }}
    {{- $mount := dict "name" "model" "mountPath" $v.modelStorage.mountPath "readOnly" $v.modelStorage.readOnly }}
    {{- with $v.modelStorage.subPath }}
    {{- $_ := set $mount "subPath" . }}
    {{- end }}
    {{- $mounts = append $mounts $mount }}
    {{- $volumes = append $volumes (merge (dict "name" "model") (include "deepinfer.volumeSource" $v.modelStorage | fromYaml)) }}
    {{- end }}
    {{- if $v.hfCache.enabled }}
    {{- $mounts = append $mounts (dict "name" "hf-cache" "mountPath" $v.hfCache.mountPath) }}
    {{- $volumes = append $volumes (merge (dict "name" "hf-cache") (include "deepinfer.volumeSource" $v.hfCache | fromYaml)) }}
    {{- end }}
    {{- if include "deepinfer.shmEnabled" $root }}
    {{- $mounts = append $mounts (dict "name" "dshm" "mountPath" "/dev/shm") }}
    {{- $shm := dict "medium" "Memory" }}
    {{- with $v.shm.sizeLimit }}
    {{- $_ := set $shm "sizeLimit" . }}
    {{- end }}
    {{- $volumes = append $volumes (dict "name" "dshm" "emptyDir" $shm) }}
    {{- end }}
    {{- $mounts = concat $mounts $v.extraVolumeMounts }}
    {{- $volumes = concat $volumes $v.extraVolumes }}
    {{- with $mounts }}
    volumeMounts:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- with $volumes }}
volumes:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The pods' labels and annotations (Prometheus scrape annotations when metrics are on without a ServiceMonitor). */}}
{{- define "deepinfer.podMetadata" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
labels:
  {{- include "deepinfer.selectorLabels" $root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  {{- with $v.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $annotations := deepCopy (default dict $v.podAnnotations) }}
{{- if and $v.metrics.enabled (not $v.metrics.serviceMonitor.enabled) (ne .component "worker") }}
{{- $_ := set $annotations "prometheus.io/scrape" "true" }}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" }}
{{- $_ := set $annotations "prometheus.io/port" (include "deepinfer.word" $v.containerPort) }}
{{- $_ := set $annotations "prometheus.io/scheme" (lower (include "deepinfer.scheme" $root)) }}
{{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
