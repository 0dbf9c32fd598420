{{/*
The names of everything the chart makes: the release's name when it says vramgate already
(`helm install vramgate`: vramgate-dra, as k8s/*.yaml name them), else <release>-vramgate.
*/}}
{{- define "vramgate.fullname" -}}
{{- if contains "vramgate" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-vramgate" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vramgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The labels of one component's objects and pods (its selector too). */}}
{{- define "vramgate.labels" -}}
{{- $name := printf "%s-%s" (include "vramgate.fullname" .root) .component -}}
{app.kubernetes.io/name: {{ $name }}}
{{- end -}}

{{/*
What every node pod shares: where it runs, and the host's view the hook has. The pod spec's
common head (indented for a DaemonSet's template.spec).
*/}}
{{- define "vramgate.podPlacement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
# Scheduled before anything that asks for GPU memory, and never evicted for it.
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
hostPID: true
{{- if .Values.hostNetwork }}
# On the node's network: the API server is reached at apiServer.host, not through a Service.
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end -}}

{{/*
The DRA driver's flags for the host paths that are not its defaults (the defaults are
hostPaths' own, so that k8s/dra.yaml carries none), each a ", "-led list item.
*/}}
{{- define "vramgate.draPathArgs" -}}
{{- $p := .Values.hostPaths -}}
{{- if ne $p.kubeletPluginsRegistry "/var/lib/kubelet/plugins_registry" }}, "--registry-dir", {{ $p.kubeletPluginsRegistry | quote }}{{ end -}}
{{- if ne $p.kubeletPlugins "/var/lib/kubelet/plugins" }}, "--plugin-dir", {{ printf "%s/gpu-memory.vramgate.dev" $p.kubeletPlugins | quote }}{{ end -}}
{{- if ne $p.cdi "/var/run/cdi" }}, "--cdi-dir", {{ $p.cdi | quote }}{{ end -}}
{{- $hook := include "vramgate.hookPath" . -}}
{{- if ne $hook "/usr/bin/vramgate-hook" }}, "--hook", {{ $hook | quote }}{{ end -}}
{{- end -}}

{{/*
vramgate-hook on the host, which each claim's CDI spec names: where the node set-up copies it
when it is on, else the package's (hostPaths.hook).
*/}}
{{- define "vramgate.hookPath" -}}
{{- if .Values.nodeSetup.enabled -}}
{{ printf "%s/vramgate-hook" .Values.nodeSetup.installDir }}
{{- else -}}
{{ .Values.hostPaths.hook }}
{{- end -}}
{{- end -}}

{{/*
The API server's address for a pod that cannot reach it through the kubernetes Service
(a cluster without kube-proxy): what kube clients read in a pod, set over kubelet's.
*/}}
{{- define "vramgate.apiServerEnv" -}}
{{- with .Values.apiServer.host }}
- {name: KUBERNETES_SERVICE_HOST, value: {{ . | quote }}}
- {name: KUBERNETES_SERVICE_PORT, value: {{ $.Values.apiServer.port | quote }}}
{{- end }}
{{- end -}}

{{/* The container's image, security context and resources. */}}
{{- define "vramgate.containerCommon" -}}
image: {{ include "vramgate.image" . }}   # scripts/build-image, pushed to your registry
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- if .Values.privileged }}
securityContext:
  privileged: true   # NVML needs the GPU device nodes; drop on a static inventory
{{- end }}
{{- with .Values.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The config's mount and volume: the host's /etc/vramgate, or the chart's ConfigMap. */}}
{{- define "vramgate.configMount" -}}
- {name: config, mountPath: {{ .Values.hostPaths.config }}, readOnly: true}
{{- end -}}
{{- define "vramgate.configVolume" -}}
{{- if .Values.config.fromChart }}
- {name: config, configMap: {name: {{ include "vramgate.fullname" . }}-config}}
{{- else }}
- {name: config, hostPath: {path: {{ .Values.hostPaths.config }}, type: Directory}}
{{- end }}
{{- end -}}

{{/* The ledger: the host's state directory. */}}
{{- define "vramgate.stateVolume" -}}
# Directory, not DirectoryOrCreate: the package makes it at boot (tmpfiles), and one
# made here would hold an empty ledger, every GPU free.
- {name: state, hostPath: {path: {{ .Values.hostPaths.state }}, type: Directory}}
{{- end -}}

{{- define "vramgate.tasksVolume" -}}
- {name: containerd-tasks, hostPath: {path: {{ .Values.hostPaths.containerdTasks }}, type: DirectoryOrCreate}}
{{- end -}}

{{- define "vramgate.nvmlMount" -}}
{{- with .Values.nvmlLibrary }}
- {name: nvml, mountPath: {{ . }}, readOnly: true}
{{- end }}
{{- end -}}
{{- define "vramgate.nvmlVolume" -}}
{{- with .Values.nvmlLibrary }}
# Where the host's driver put NVML (`ldconfig -p | grep libnvidia-ml`); FileOrCreate
# would hide a wrong path, so it must exist.
- {name: nvml, hostPath: {path: {{ . }}, type: File}}
{{- end }}
{{- end -}}

{{/*
Pod annotations: with the config from the chart, its checksum, so that `helm upgrade` with
other settings rolls every pod onto them.
*/}}
{{- define "vramgate.podAnnotations" -}}
{{- if .Values.config.fromChart }}
annotations:
  vramgate.dev/config-sha256: {{ include "vramgate.configToml" . | sha256sum }}
{{- end }}
{{- end -}}

{{/*
config.toml from config.settings: the top-level keys, then one table per section, then
[[inventory.gpus]]; values as JSON, which TOML reads alike (strings, booleans, numbers,
arrays). values.schema.json holds the keys to config.toml's.
*/}}
{{- define "vramgate.configToml" -}}
# /etc/vramgate/config.toml, rendered by the vramgate chart from its values (config.settings).
{{- $s := .Values.config.settings }}
{{- /* The ledger where the pods mount it: hostPaths.state, which settings cannot name. */}}
{{- if ne .Values.hostPaths.state "/run/vramgate" }}
state_dir = {{ toJson .Values.hostPaths.state }}
{{- end }}
{{- range $k, $v := $s }}
{{- if not (kindIs "map" $v) }}
{{ $k }} = {{ toJson $v }}
{{- end }}
{{- end }}
{{- range $table, $keys := $s }}
{{- if kindIs "map" $keys }}

[{{ $table }}]
{{- range $k, $v := $keys }}
{{- if not (and (kindIs "slice" $v) (gt (len $v) 0) (kindIs "map" (first $v))) }}
{{ $k }} = {{ toJson $v }}
{{- end }}
{{- end }}
{{- range $k, $v := $keys }}
{{- if and (kindIs "slice" $v) (gt (len $v) 0) (kindIs "map" (first $v)) }}
{{- range $v }}

[[{{ $table }}.{{ $k }}]]
{{- range $ik, $iv := . }}
{{ $ik }} = {{ toJson $iv }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
