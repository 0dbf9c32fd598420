//! A line for a pod's events that only the node can write, and only the DRA driver can post.
//!
//! A pod's `vramgate.dev/memory` is copied into each of its containers, and it is a request
//! only in those Kubernetes gave a GPU ([`crate::request::has_request`]): a sidecar runs with
//! nothing reserved, as it should. A pod that forgot to ask for a GPU runs the same way, and
//! nothing told its author. Only the node knows which of its containers got no GPU (the hook and
//! the runtime wrapper read it from the spec), and neither has API access, by design. So they
//! leave a notice in the state directory ([`record`]), one small file per container, and the DRA
//! driver, which holds the node's API client, posts each as a Warning event on the pod and
//! removes it ([`take`], `crate::dra::notices`). Without the DRA driver (the device plugin alone)
//! a notice stays on the node, at most [`MAX_NOTICES`] of them, and `vramgate status` says how
//! many there are.
//!
//! What a notice says is read from annotations anyone who may create a pod can write: every
//! part is cleaned as a container's name is ([`crate::request::name::clean_part`]), the pod's
//! uid must look like one, and a notice never names another pod than the one whose spec it was
//! read from (the driver posts it in that pod's namespace, on that pod's uid).

use serde::{Deserialize, Serialize};

use crate::ledger::StateDir;
use crate::request::{self, name::clean_part};
use crate::spec::SpecView;

/// The file name prefix of a notice in the state directory.
pub const NOTICE_PREFIX: &str = "notice.";
/// The most notices kept on a node: a pod in a crash loop writes the same file again, so only
/// many distinct pods reach this; past it the hook writes no more (and says so in its log).
pub const MAX_NOTICES: usize = 256;
/// The event's reason, what `kubectl get events --field-selector reason=…` finds.
pub const REASON: &str = "GpuMemoryNotReserved";
/// The pod's uid under containerd's CRI keys, then CRI-O's (the same order as
/// [`crate::request::name::CRI_POD_NAME_ANNOTATIONS`]).
pub const CRI_POD_UID_ANNOTATIONS: [&str; 2] = ["io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"];
/// The longest notice file read back: a notice is a few hundred bytes.
const MAX_NOTICE_BYTES: u64 = 4096;

/// What a pod's events should show about one of its containers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodNotice {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub container: String,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum NoticeError {
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error("{count} notices already wait in {dir} for the DRA driver to post them: none added for pod {pod}")]
    Full { dir: String, count: usize, pod: String },
}

/// The notice for a pod's container whose pod asks for GPU memory (`vramgate.dev/memory`) but
/// which its engine gave no GPU, so that nothing was reserved for it: `None` for every other
/// container. Asked only where the hook or the wrapper found no request, so it costs nothing on
/// any other start.
pub fn unreserved_pod_request(spec: &SpecView, toolkit: request::NvidiaToolkit) -> Option<PodNotice> {
    let asked = request::pod_memory_annotation_not_taken(spec, toolkit)?;
    let (runtime, _) = request::pod_sandbox_by(spec)?;
    // The name the ledger and the metrics show: `namespace/pod/container` for a pod's container,
    // each part cleaned (no `/` of its own), read under the marking runtime's keys.
    let shown = request::name::container_name(spec)?;
    let [namespace, pod, container]: [&str; 3] = shown.split('/').collect::<Vec<_>>().try_into().ok()?;
    let (namespace, pod, container) = (namespace.to_string(), pod.to_string(), container.to_string());
    let uid = spec
        .annotations
        .get(CRI_POD_UID_ANNOTATIONS[runtime])
        .filter(|u| is_uid(u))?
        .clone();
    let asked = clean_part(&asked).unwrap_or_default();
    let message = format!(
        "container {container} was given no GPU, so the pod's {}={asked} reserves nothing for it: \
         ask for a GPU in its resources (a resource claim, or vramgate.dev/gpu-memory-gib), \
         or leave it as is if this container needs no GPU (a sidecar)",
        request::MEMORY_ANNOTATION,
    );
    Some(PodNotice {
        namespace,
        pod,
        uid,
        container,
        message,
    })
}

/// A Kubernetes uid as the API server writes them: 36 characters of hex digits and dashes.
fn is_uid(value: &str) -> bool {
    value.len() == 36 && value.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn file_name(notice: &PodNotice) -> String {
    format!("{NOTICE_PREFIX}{}.{}", notice.uid, notice.container)
}

/// The notice files in the state directory, by name.
fn notice_files(dir: &StateDir) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.path()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(NOTICE_PREFIX))
        .collect();
    names.sort();
    names
}

/// How many notices wait on this node.
pub fn count(dir: &StateDir) -> usize {
    notice_files(dir).len()
}

/// Leaves `notice` for the DRA driver: one atomic write of a file named by the pod's uid and
/// the container's name, so a container started again writes the same file, not another.
pub fn record(dir: &StateDir, notice: &PodNotice) -> Result<(), NoticeError> {
    let name = file_name(notice);
    let files = notice_files(dir);
    if files.len() >= MAX_NOTICES && !files.contains(&name) {
        return Err(NoticeError::Full {
            dir: dir.path().display().to_string(),
            count: files.len(),
            pod: format!("{}/{}", notice.namespace, notice.pod),
        });
    }
    let bytes = serde_json::to_vec(notice).expect("a notice serializes");
    dir.write_file(&name, &bytes)?;
    Ok(())
}

/// What the hook and the runtime wrapper do with a pod's container in which they found no
/// request: leave the notice where [`unreserved_pod_request`] finds one (`Ok(false)`: none to
/// leave). Never a reason to stop the start: the caller logs an error and goes on.
pub fn leave_if_unreserved(spec: &SpecView, config: &crate::config::Config) -> Result<bool, NoticeError> {
    let Some(notice) = unreserved_pod_request(spec, config.runtime.nvidia_toolkit()) else {
        return Ok(false);
    };
    let dir = StateDir::open_or_create(&config.state_dir)?;
    record(&dir, &notice)?;
    Ok(true)
}

/// Every notice waiting, with its file name for [`remove`]. A file that is not one (unreadable,
/// too large, not a notice, or one whose parts are not what [`unreserved_pod_request`] would
/// have written) is removed: nothing from it reaches the API server.
pub fn take(dir: &StateDir) -> Vec<(String, PodNotice)> {
    use std::io::Read;
    let mut found = Vec::new();
    for name in notice_files(dir) {
        let read = dir.open_file(&name, crate::ledger::Access::Read).ok().and_then(|file| {
            let mut bytes = Vec::new();
            file.take(MAX_NOTICE_BYTES + 1).read_to_end(&mut bytes).ok()?;
            (bytes.len() as u64 <= MAX_NOTICE_BYTES).then_some(bytes)
        });
        let notice = read
            .and_then(|bytes| serde_json::from_slice::<PodNotice>(&bytes).ok())
            .filter(|n| well_formed(n) && file_name(n) == name);
        match notice {
            Some(notice) => found.push((name, notice)),
            None => {
                let _ = dir.remove_file(&name);
            }
        }
    }
    found
}

fn well_formed(n: &PodNotice) -> bool {
    let clean = |part: &str| clean_part(part).as_deref() == Some(part);
    clean(&n.namespace)
        && clean(&n.pod)
        && clean(&n.container)
        && is_uid(&n.uid)
        && !n.message.is_empty()
        && n.message.len() < 1024
        && !n.message.contains('\n')
}

/// Removes a notice once posted (or refused for good by the API server).
pub fn remove(dir: &StateDir, name: &str) {
    let _ = dir.remove_file(name);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreserved_pod_request_default(spec: &SpecView) -> Option<PodNotice> {
        unreserved_pod_request(spec, request::NvidiaToolkit::default())
    }

    const UID: &str = "0b7c8c1e-4a53-4f0c-9d39-1f6a2d0c9e21";

    fn pod_container(env: &[&str], extra: &[(&str, &str)]) -> SpecView {
        let mut annotations = serde_json::Map::new();
        for (k, v) in [
            ("io.kubernetes.cri.container-type", "container"),
            ("io.kubernetes.cri.sandbox-id", "abc123"),
            ("io.kubernetes.cri.sandbox-namespace", "team-a"),
            ("io.kubernetes.cri.sandbox-name", "trainer"),
            ("io.kubernetes.cri.container-name", "main"),
            ("io.kubernetes.cri.sandbox-uid", UID),
        ]
        .iter()
        .chain(extra)
        {
            annotations.insert(k.to_string(), serde_json::Value::String(v.to_string()));
        }
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {"env": env, "args": ["sh"], "cwd": "/"},
            "root": {"path": "rootfs"},
            "annotations": annotations,
        });
        SpecView::parse(spec.to_string().as_bytes(), std::path::Path::new("config.json")).unwrap()
    }

    #[test]
    fn a_pod_container_given_no_gpu_under_the_pods_annotation_gets_a_notice_naming_it() {
        let spec = pod_container(&["PATH=/bin"], &[("vramgate.dev/memory", "20Gi")]);
        assert!(!request::has_request(&spec));
        let notice = unreserved_pod_request_default(&spec).expect("a notice");
        assert_eq!(
            (
                notice.namespace.as_str(),
                notice.pod.as_str(),
                notice.container.as_str(),
                notice.uid.as_str()
            ),
            ("team-a", "trainer", "main", UID)
        );
        assert!(
            notice.message.contains("vramgate.dev/memory=20Gi"),
            "{}",
            notice.message
        );
        assert!(
            notice.message.contains("container main was given no GPU"),
            "{}",
            notice.message
        );
    }

    #[test]
    fn no_notice_where_the_container_has_a_gpu_or_no_pod_annotation_or_is_no_pods() {
        let given = pod_container(&["NVIDIA_VISIBLE_DEVICES=0"], &[("vramgate.dev/memory", "20Gi")]);
        assert!(unreserved_pod_request_default(&given).is_none());
        let plain = pod_container(&["PATH=/bin"], &[]);
        assert!(unreserved_pod_request_default(&plain).is_none());
        // Outside a pod, a request without a GPU is refused (NoGpu), never left to a notice.
        let spec = serde_json::json!({
            "ociVersion": "1.0.2", "process": {"env": [], "args": ["sh"], "cwd": "/"},
            "root": {"path": "rootfs"}, "annotations": {"vramgate.dev/memory": "1Gi"},
        });
        let outside = SpecView::parse(spec.to_string().as_bytes(), std::path::Path::new("c.json")).unwrap();
        assert!(unreserved_pod_request_default(&outside).is_none());
    }

    #[test]
    fn a_notice_from_hostile_annotations_is_cleaned_or_not_written() {
        // A uid that is not one: no notice (the event could not name the pod).
        let spec = pod_container(
            &[],
            &[
                ("vramgate.dev/memory", "1Gi"),
                ("io.kubernetes.cri.sandbox-uid", "../../etc"),
            ],
        );
        assert!(unreserved_pod_request_default(&spec).is_none());
        // A newline and a slash in the amount: cleaned, one line.
        let spec = pod_container(&[], &[("vramgate.dev/memory", "1Gi\nkubectl/x")]);
        let notice = unreserved_pod_request_default(&spec).unwrap();
        assert!(!notice.message.contains('\n') && notice.message.contains("1Gi_kubectl_x"));
    }

    #[test]
    fn notices_are_recorded_once_per_container_bounded_and_taken_back_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = StateDir::open_or_create(&tmp.path().join("state")).unwrap();
        let notice = unreserved_pod_request_default(&pod_container(&[], &[("vramgate.dev/memory", "1Gi")])).unwrap();
        record(&dir, &notice).unwrap();
        record(&dir, &notice).unwrap();
        assert_eq!(count(&dir), 1);
        // A forged file (another pod's parts under this name, or not JSON) is dropped, unposted.
        std::fs::write(dir.path().join(format!("{NOTICE_PREFIX}x")), b"{}").unwrap();
        let mut other = notice.clone();
        other.pod = "someone/else".into();
        std::fs::write(
            dir.path().join(format!("{NOTICE_PREFIX}{UID}.side")),
            serde_json::to_vec(&other).unwrap(),
        )
        .unwrap();
        let taken = take(&dir);
        assert_eq!(taken, vec![(file_name(&notice), notice.clone())]);
        assert_eq!(count(&dir), 1);
        remove(&dir, &taken[0].0);
        assert_eq!(count(&dir), 0);
        for i in 0..MAX_NOTICES {
            let mut n = notice.clone();
            n.container = format!("c{i}");
            record(&dir, &n).unwrap();
        }
        let mut one_more = notice.clone();
        one_more.container = "late".into();
        assert!(matches!(record(&dir, &one_more), Err(NoticeError::Full { .. })));
        // The same container again still rewrites its own.
        let mut again = notice.clone();
        again.container = "c0".into();
        record(&dir, &again).unwrap();
    }
}
