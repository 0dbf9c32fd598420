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
- {name: config, mountPath: /etc/vramgate, readOnly: true}
{{- end -}}
{{- define "vramgate.configVolume" -}}
{{- if .Values.config.fromChart }}
- {name: config, configMap: {name: {{ include "vramgate.fullname" . }}-config}}
{{- else }}
- {name: config, hostPath: {path: /etc/vramgate, type: Directory}}
{{- end }}
{{- end -}}

{{/* The ledger: the host's state directory. */}}
{{- define "vramgate.stateVolume" -}}
# Directory, not DirectoryOrCreate: the package makes it at boot (tmpfiles), and one
# made here would hold an empty ledger, every GPU free.
- {name: state, hostPath: {path: /run/vramgate, type: Directory}}
{{- end -}}

{{- define "vramgate.tasksVolume" -}}
- {name: containerd-tasks, hostPath: {path: /run/containerd/io.containerd.runtime.v2.task, type: DirectoryOrCreate}}
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
