//! The hand-off to the NVIDIA container toolkit (`[enforce] limit = "toolkit"`).
//!
//! nvidia-container-toolkit's CDI hook `nvidia-cdi-hook apply-cuda-memory-limits`
//! (NVIDIA/nvidia-container-toolkit pull request 2075, cmd/nvidia-cdi-hook/apply-cuda-memory-limits)
//! reads `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT` from the container spec, both
//! whole MiB and both required, and calls `nvmlDeviceSetMemoryLimits_v1` with soft = request,
//! hard = limit on every GPU of the container, on the cgroup of its init. It applies one pair
//! to all of the container's GPUs, does nothing when either variable is missing, and fails the
//! start when request > limit.
//!
//! The hook reads the spec, not the running process, so a container cannot lift the limit
//! from inside: vramgate's values replace any the container set. The hook reads the plural
//! spellings `NVIDIA_GPU_MEMORY_REQUESTS` and `NVIDIA_GPU_MEMORY_LIMITS` first, and the
//! singular ones only when those are absent: a container's own plural variable would win over
//! vramgate's singular one, so the wrapper removes the plural ones ([`PLURAL_VARS`]).
//!
//! Whether the node's toolkit has the hook at all is in its CDI spec: `nvidia-ctk cdi
//! generate` (pkg/nvcdi, `newCudaMemoryLimits`) adds to each GPU's `containerEdits` a
//! `createContainer` hook `nvidia-cdi-hook apply-cuda-memory-limits --driver-root <root>
//! --gpu-id <uuid>`; a toolkit without it writes no such hook, and then nothing reads the two
//! variables. [`hook_on_node`] looks for it in the spec files of `[enforce] cdi_spec_dirs`, so
//! that the tier the wrapper records claims a limit only where something applies one. What it
//! cannot see: whether the container's devices come from that spec (a GPU given without CDI
//! gets no hook), so the tier is the node's, as for the driver limit's availability.

use std::path::PathBuf;

use super::{driver_limit::SOFT_LIMIT, EnforceConfig, PlacedShare, SpecEdits, Tier, MIB};

pub const LIMIT_VAR: &str = crate::request::NVIDIA_LIMIT_ENV;
pub const REQUEST_VAR: &str = crate::request::NVIDIA_REQUEST_ENV;
/// The spellings the toolkit's hook reads before [`REQUEST_VAR`] and [`LIMIT_VAR`]
/// (`fs.LookupEnv("NVIDIA_GPU_MEMORY_REQUESTS")`, then the singular).
pub const PLURAL_VARS: [&str; 2] = ["NVIDIA_GPU_MEMORY_REQUESTS", "NVIDIA_GPU_MEMORY_LIMITS"];
/// Every variable the toolkit's hook reads: what no container may bring past vramgate.
pub const ALL_VARS: [&str; 4] = [REQUEST_VAR, LIMIT_VAR, PLURAL_VARS[0], PLURAL_VARS[1]];
/// The argument that names the memory-limit hook among `nvidia-cdi-hook`'s (and `nvidia-ctk
/// hook`'s) subcommands.
pub const HOOK_COMMAND: &str = "apply-cuda-memory-limits";

/// The first spec file in `dirs` ([`crate::cdi_files::spec_files`] order) whose top-level or
/// per-device `containerEdits.hooks` run [`HOOK_COMMAND`], of any kind (the toolkit's
/// `nvidia.com/gpu`, the device plugin's `k8s.device-plugin.nvidia.com/gpu`). Files that are
/// not regular, too large, or do not parse are passed over: the runtime refuses those.
pub fn hook_on_node(dirs: &[PathBuf]) -> Option<PathBuf> {
    crate::cdi_files::spec_files(dirs)
        .into_iter()
        .find(|file| crate::cdi_files::read_node_spec(file).is_some_and(|spec| carries_hook(&spec)))
}

/// Whether a parsed CDI spec runs [`HOOK_COMMAND`] in its own or a device's edits.
fn carries_hook(spec: &serde_json::Value) -> bool {
    let devices = spec["devices"].as_array().into_iter().flatten();
    std::iter::once(&spec["containerEdits"])
        .chain(devices.map(|d| &d["containerEdits"]))
        .flat_map(|edits| edits["hooks"].as_array().into_iter().flatten())
        .any(|hook| {
            hook["args"]
                .as_array()
                .is_some_and(|args| args.iter().any(|a| a == HOOK_COMMAND))
        })
}

pub use crate::cdi_files::dirs_named;

/// The toolkit variables a container's own env sets (`None` when neither), named for a
/// message. They are a request ([`crate::request::nvidia_memory`]) and the container is
/// admitted on them; but under `limit = "driver"` vramgate sets the driver limit itself, and
/// the toolkit's hook, finding them, would set a second one on the same cgroup after it: the
/// wrapper removes them once it has admitted the container ([`super::spec_edits`]; it writes
/// the amount into the spec as `vramgate.dev/memory` for the hook), the hook alone, which
/// cannot edit the spec, refuses the container. Either variable counts, in either spelling
/// ([`ALL_VARS`]): a later toolkit may need only one.
pub fn conflicting_request(existing_env: &[String]) -> Option<String> {
    let set: Vec<&str> = ALL_VARS
        .into_iter()
        .filter(|v| super::env_has(existing_env, v))
        .collect();
    (!set.is_empty()).then(|| set.join(" and "))
}

/// The two variables for the toolkit's hook, or a note when they cannot apply. Returns the
/// tier it gives: [`Tier::ToolkitLimit`] only when `hook_found` ([`hook_on_node`]'s answer,
/// asked by the caller) says the node's CDI spec carries the hook.
pub fn edits(
    config: &EnforceConfig,
    existing_env: &[String],
    placed: &[PlacedShare],
    hook_found: bool,
    edits: &mut SpecEdits,
) -> Option<Tier> {
    // The hook prefers these to vramgate's singular values: a container must not pick its own.
    let plural: Vec<&str> = PLURAL_VARS
        .into_iter()
        .filter(|v| super::env_has(existing_env, v))
        .collect();
    if !plural.is_empty() {
        edits.unset = PLURAL_VARS.iter().map(|v| v.to_string()).collect();
        edits.notes.push(format!(
            "vramgate: removed {} from the container's env: nvidia-container-toolkit's hook reads it before vramgate's {REQUEST_VAR} and {LIMIT_VAR}",
            plural.join(" and ")
        ));
    }
    // The driver refuses MIG handles, and the toolkit's hook fails the container's start when
    // the driver refuses: a MIG container gets no variables rather than no start.
    if let Some(mig) = placed.iter().find(|s| s.mig_index.is_some()) {
        edits.notes.push(format!(
            "vramgate: no toolkit memory limit for this container: {} is a MIG device, which the driver's memory limits do not support",
            mig.uuid
        ));
        return None;
    }
    // One value for all GPUs: the smallest limit, rounded down to whole MiB, so that no GPU's
    // limit exceeds what was allowed on it; the request likewise, none (0) where no limit is
    // above it, as the driver tier sets it (PlacedShare::soft).
    let limit_mib = placed.iter().map(|s| s.hard() / MIB).min()?;
    let request_mib = placed.iter().map(|s| s.soft() / MIB).min().unwrap_or(SOFT_LIMIT / MIB);
    edits.env.push((REQUEST_VAR.to_string(), request_mib.to_string()));
    edits.env.push((LIMIT_VAR.to_string(), limit_mib.to_string()));
    // Written even so: a hook in a directory vramgate was not told of still gets vramgate's
    // values, not the container's. But the tier claims no limit that nothing here applies.
    if !hook_found {
        edits.notes.push(format!(
            "vramgate: no toolkit memory limit for this container: no CDI spec in {} carries nvidia-container-toolkit's {HOOK_COMMAND} hook, so nothing applies {REQUEST_VAR} and {LIMIT_VAR} (install a toolkit that has it and regenerate the spec, or set [enforce] limit = \"driver\" or \"mps\")",
            dirs_named(&config.cdi_spec_dirs)
        ));
        return None;
    }
    Some(Tier::ToolkitLimit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::{spec_edits, EnforceConfig, LimitMechanism};

    fn share(index: u32, bytes: u64) -> PlacedShare {
        PlacedShare {
            uuid: format!("GPU-{index}"),
            index,
            mig_index: None,
            bytes,
            limit: bytes,
            total: 80 << 30,
        }
    }

    fn toolkit() -> EnforceConfig {
        EnforceConfig {
            limit: LimitMechanism::Toolkit,
            ..EnforceConfig::default()
        }
    }

    #[test]
    fn limit_in_whole_mib_the_smallest_share_and_the_containers_value_replaced() {
        let existing = ["NVIDIA_GPU_MEMORY_LIMIT=999999".to_string()];
        let edits = spec_edits(
            &toolkit(),
            &existing,
            &[share(0, (6 << 30) + 5), share(1, (4 << 30) + MIB - 1)],
            false,
            true,
        );
        assert_eq!(edits.tier, Tier::ToolkitLimit);
        let get = |k: &str| edits.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get(LIMIT_VAR), Some("4096"));
        assert_eq!(get(REQUEST_VAR), Some("0"));
        assert!(edits.mounts.is_empty());
    }

    /// A limit above the request: the toolkit's hook gets the request as its soft value and
    /// the limit as its hard one, in whole MiB rounded down.
    #[test]
    fn a_limit_above_the_request_is_the_hard_value_and_the_request_the_soft() {
        let mut placed = share(0, 2 << 30);
        placed.limit = (6 << 30) + MIB - 1;
        let edits = spec_edits(&toolkit(), &[], &[placed], false, true);
        let get = |k: &str| edits.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!((get(REQUEST_VAR), get(LIMIT_VAR)), (Some("2048"), Some("6144")));
    }

    #[test]
    fn mig_devices_get_no_toolkit_limit() {
        let mut mig = share(0, 1 << 30);
        mig.mig_index = Some(1);
        mig.uuid = "MIG-abc".into();
        let edits = spec_edits(&toolkit(), &[], &[mig], false, true);
        assert_eq!(edits.tier, Tier::Guardrails);
        assert!(edits.env.iter().all(|(k, _)| k != LIMIT_VAR && k != REQUEST_VAR));
        assert_eq!(edits.notes.len(), 1);
        assert!(edits.notes[0].contains("MIG-abc"), "{:?}", edits.notes);
    }

    #[test]
    fn without_the_hook_on_the_node_the_tier_claims_no_limit_and_a_note_says_why() {
        let edits = spec_edits(&toolkit(), &[], &[share(0, 4 << 30)], false, false);
        assert_eq!(edits.tier, Tier::Guardrails);
        // Still written: a hook vramgate was not told of gets vramgate's values.
        assert!(edits.env.iter().any(|(k, v)| k == LIMIT_VAR && v == "4096"));
        assert_eq!(edits.notes.len(), 1, "{:?}", edits.notes);
        assert!(
            edits.notes[0].contains("no CDI spec in /etc/cdi, /var/run/cdi carries")
                && edits.notes[0].contains(HOOK_COMMAND),
            "{:?}",
            edits.notes
        );
    }

    #[test]
    fn the_plural_spellings_the_hook_prefers_are_removed() {
        let existing = [
            "NVIDIA_GPU_MEMORY_LIMITS=999999".to_string(),
            "NVIDIA_GPU_MEMORY_REQUESTS=0".to_string(),
        ];
        let edits = spec_edits(&toolkit(), &existing, &[share(0, 4 << 30)], false, true);
        assert_eq!(edits.tier, Tier::ToolkitLimit);
        assert_eq!(edits.unset, PLURAL_VARS);
        assert!(edits.notes[0].contains("NVIDIA_GPU_MEMORY_REQUESTS and NVIDIA_GPU_MEMORY_LIMITS"));
        let mut spec = serde_json::json!({"process": {"env": existing}});
        assert!(crate::enforce::apply_spec_edits(&mut spec, &edits).unwrap());
        let env = spec["process"]["env"].to_string();
        assert!(!env.contains("LIMITS") && !env.contains("REQUESTS"), "{env}");
        assert!(env.contains("NVIDIA_GPU_MEMORY_LIMIT=4096"), "{env}");
    }

    /// `nvidia-ctk cdi generate`'s shape, cut to one GPU: the hook in the device's edits.
    const GENERATED: &str = r#"---
cdiVersion: 0.5.0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    hooks:
    - hookName: createContainer
      path: /usr/bin/nvidia-cdi-hook
      args:
      - nvidia-cdi-hook
      - apply-cuda-memory-limits
      - --driver-root
      - /
      - --gpu-id
      - GPU-4b1a3c1e-0000-0000-0000-000000000000
      env:
      - NVIDIA_CTK_DEBUG=false
  name: "0"
kind: nvidia.com/gpu
"#;

    #[test]
    fn the_hook_is_found_in_a_generated_yaml_spec_or_json_and_not_in_one_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [dir.path().join("etc-cdi"), dir.path().join("run-cdi")];
        for d in &dirs {
            std::fs::create_dir(d).unwrap();
        }
        assert_eq!(hook_on_node(&dirs), None);
        // A toolkit without the hook: other hooks only.
        let without = GENERATED.replace(HOOK_COMMAND, "update-ldcache");
        std::fs::write(dirs[0].join("nvidia.yaml"), &without).unwrap();
        assert_eq!(hook_on_node(&dirs), None);
        // A file of another extension is not a spec the runtime reads.
        std::fs::write(dirs[1].join("nvidia.yaml.bak"), GENERATED).unwrap();
        assert_eq!(hook_on_node(&dirs), None);
        std::fs::write(dirs[1].join("nvidia.yaml"), GENERATED).unwrap();
        assert_eq!(hook_on_node(&dirs), Some(dirs[1].join("nvidia.yaml")));
        // JSON, with the hook at the top level and `nvidia-ctk hook`'s spelling.
        std::fs::remove_file(dirs[1].join("nvidia.yaml")).unwrap();
        let json = serde_json::json!({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "all", "containerEdits": {}}],
            "containerEdits": {"hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", HOOK_COMMAND, "--gpu-id", "GPU-x"]}]}});
        std::fs::write(dirs[0].join("nvidia.json"), json.to_string()).unwrap();
        assert_eq!(hook_on_node(&dirs), Some(dirs[0].join("nvidia.json")));
        // A FIFO under a spec's name is passed over at once, not waited on.
        std::fs::remove_file(dirs[0].join("nvidia.json")).unwrap();
        nix::unistd::mkfifo(&dirs[0].join("a.yaml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(hook_on_node(&dirs), None);
    }
}
