module vramgate/tools/nvidia-toolkit

go 1.26.0

tool (
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime-hook
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.cdi
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.legacy
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer
)

require (
	cyphar.com/go-pathrs v0.2.6 // indirect
	github.com/Masterminds/semver/v3 v3.5.0 // indirect
	github.com/NVIDIA/go-nvlib v0.12.0 // indirect
	github.com/NVIDIA/go-nvml v0.13.4-1 // indirect
	github.com/NVIDIA/nvidia-container-toolkit v1.20.2 // indirect
	github.com/containerd/log v0.1.0 // indirect
	github.com/containerd/nri v0.12.5 // indirect
	github.com/containerd/ttrpc v1.2.7 // indirect
	github.com/cyphar/filepath-securejoin v0.7.0 // indirect
	github.com/fsnotify/fsnotify v1.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/knqyf263/go-plugin v0.9.0 // indirect
	github.com/moby/sys/devices v0.1.0 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
	github.com/moby/sys/reexec v0.1.0 // indirect
	github.com/moby/sys/symlink v0.3.0 // indirect
	github.com/opencontainers/cgroups v0.1.0 // indirect
	github.com/opencontainers/runc v1.5.2 // indirect
	github.com/opencontainers/runtime-spec v1.3.0 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	github.com/sirupsen/logrus v1.9.4 // indirect
	github.com/tetratelabs/wazero v1.11.0 // indirect
	github.com/urfave/cli-altsrc/v3 v3.1.0 // indirect
	github.com/urfave/cli/v3 v3.10.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261104224025-d1e00e9f33ab // indirect
	google.golang.org/grpc v1.83.2 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	tags.cncf.io/container-device-interface v1.1.1 // indirect
	tags.cncf.io/container-device-interface/specs-go v1.1.1 // indirect
)
