//! What a container is called, for the people who read `vramgate status`, the metrics and the
//! event log: a Kubernetes container as `namespace/pod/container`, any other by the name its
//! owner wrote into the spec, `None` where the spec says none (the id is shown then).
//!
//! What each engine writes into the OCI spec (checked against the engines the suite runs, see
//! docs/src/cli.md "Names"):
//! - containerd's CRI plugin: `io.kubernetes.cri.sandbox-namespace`,
//!   `io.kubernetes.cri.sandbox-name`, `io.kubernetes.cri.container-name`;
//! - CRI-O: `io.kubernetes.pod.namespace`, `io.kubernetes.pod.name`,
//!   `io.kubernetes.container.name`;
//! - podman 4.3, Docker 26 and 28, containerd's `ctr`: no name at all (podman's hostname and
//!   Docker's are the short id), so such a container is named only by `vramgate.dev/name`
//!   (`--annotation vramgate.dev/name=…`), else shown by its id.
//!
//! A name is something shown, never a key: whoever may start a container may write any of these
//! annotations, and two containers may claim one name. So it is read under the keys of the CRI
//! runtime that marked the container as a pod's (the same rule [`super::pod_container`] keeps),
//! each part bounded to [`MAX_NAME_PART`] characters, and every character outside a small
//! printable set (letters, digits, `-._:@+=~`) replaced by `_`: no control character, newline,
//! quote, backslash, space or `/` of its own reaches a table, a metric label or a log line.

use crate::spec::SpecView;

/// The container's own name for itself, where its engine writes none (podman, Docker, `ctr`).
pub const NAME_ANNOTATION: &str = "vramgate.dev/name";
/// Where containerd's CRI plugin, then CRI-O, write the pod's namespace and name (the
/// container's name is [`super::CRI_CONTAINER_NAME_ANNOTATIONS`]).
pub const CRI_POD_NAMESPACE_ANNOTATIONS: [&str; 2] =
    ["io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"];
pub const CRI_POD_NAME_ANNOTATIONS: [&str; 2] = ["io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"];
/// The most characters kept of each part of a name (a Kubernetes pod name may have 253; its
/// namespace and container names 63). A longer part is cut, not refused: a name only shows.
pub const MAX_NAME_PART: usize = 100;

/// The name the spec gives the container: `namespace/pod/container` for a pod's container (all
/// three under the keys of the runtime that marked it one), else [`NAME_ANNOTATION`]; `None`
/// where neither is there.
pub fn container_name(spec: &SpecView) -> Option<String> {
    if let Some((runtime, _)) = super::pod_sandbox_by(spec) {
        let part = |keys: &[&str; 2]| spec.annotations.get(keys[runtime]).and_then(|v| clean_part(v));
        let parts = [
            part(&CRI_POD_NAMESPACE_ANNOTATIONS),
            part(&CRI_POD_NAME_ANNOTATIONS),
            part(&super::CRI_CONTAINER_NAME_ANNOTATIONS),
        ];
        if let [Some(namespace), Some(pod), Some(container)] = parts {
            return Some(format!("{namespace}/{pod}/{container}"));
        }
    }
    spec.annotations.get(NAME_ANNOTATION).and_then(|v| clean_part(v))
}

/// `value` made fit to show: cut to [`MAX_NAME_PART`] characters, every character outside the
/// printable set replaced by `_`; `None` when nothing but blanks is left.
pub fn clean_part(value: &str) -> Option<String> {
    let kept: String = value
        .trim()
        .chars()
        .take(MAX_NAME_PART)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-._:@+=~".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    (!kept.is_empty()).then_some(kept)
}

/// A name read back from a ledger or an event log, which someone may have edited: kept only
/// where it is one [`container_name`] could have made (at most three clean parts).
pub fn checked(name: &str) -> Option<&str> {
    let parts: Vec<&str> = name.split('/').collect();
    let clean = parts.len() <= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && clean_part(p).as_deref() == Some(*p));
    clean.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(annotations: &[(&str, &str)]) -> SpecView {
        let annotations: serde_json::Map<String, serde_json::Value> =
            annotations.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
        serde_json::from_value(serde_json::json!({ "annotations": annotations })).unwrap()
    }

    const CONTAINERD_POD: [(&str, &str); 5] = [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-id", "0123abcd"),
        ("io.kubernetes.cri.sandbox-namespace", "team-a"),
        ("io.kubernetes.cri.sandbox-name", "train-7f9c"),
        ("io.kubernetes.cri.container-name", "trainer"),
    ];

    #[test]
    fn a_pods_container_is_namespace_pod_container_under_its_runtimes_keys() {
        assert_eq!(
            container_name(&spec(&CONTAINERD_POD)).as_deref(),
            Some("team-a/train-7f9c/trainer")
        );
        let crio = spec(&[
            ("io.kubernetes.cri-o.ContainerType", "container"),
            ("io.kubernetes.cri-o.SandboxID", "0123abcd"),
            ("io.kubernetes.pod.namespace", "team-b"),
            ("io.kubernetes.pod.name", "infer"),
            ("io.kubernetes.container.name", "server"),
        ]);
        assert_eq!(container_name(&crio).as_deref(), Some("team-b/infer/server"));
        // CRI-O's keys carried into a containerd pod's spec (a pod annotation) name nothing.
        let mut mixed = CONTAINERD_POD.to_vec();
        mixed.retain(|(k, _)| *k != "io.kubernetes.cri.sandbox-namespace");
        mixed.push(("io.kubernetes.pod.namespace", "kube-system"));
        assert_eq!(container_name(&spec(&mixed)), None);
    }

    #[test]
    fn outside_a_pod_only_vramgates_own_annotation_names_it() {
        assert_eq!(container_name(&spec(&[])), None);
        assert_eq!(
            container_name(&spec(&[(NAME_ANNOTATION, "nightly-eval")])).as_deref(),
            Some("nightly-eval")
        );
        // The pod keys alone, without a runtime marking a pod's container, are not trusted.
        assert_eq!(container_name(&spec(&CONTAINERD_POD[2..])), None);
        // A pod's container with no namespace falls back to its own annotation.
        let mut no_ns = CONTAINERD_POD.to_vec();
        no_ns.remove(2);
        no_ns.push((NAME_ANNOTATION, "mine"));
        assert_eq!(container_name(&spec(&no_ns)).as_deref(), Some("mine"));
    }

    #[test]
    fn hostile_values_cannot_break_a_table_a_label_or_a_log_line() {
        for hostile in [
            "a\nvramgate_container_reserved_bytes{container_id=\"x\"} 1",
            "evil\"} 99\n# HELP",
            "tab\there\rcr\u{1b}[2Jclear",
            "back\\slash",
            "../../etc/passwd",
            "wide\u{200b}zero\u{202e}rtl",
        ] {
            let name = container_name(&spec(&[(NAME_ANNOTATION, hostile)])).unwrap();
            assert!(
                name.chars().all(|c| c.is_ascii_graphic() && !"\"\\/{}".contains(c)),
                "{hostile:?} gave {name:?}"
            );
            assert_eq!(checked(&name), Some(name.as_str()));
        }
        let long = "x".repeat(10_000);
        assert_eq!(
            container_name(&spec(&[(NAME_ANNOTATION, &long)])).unwrap().len(),
            MAX_NAME_PART
        );
        let mut pod = CONTAINERD_POD.to_vec();
        pod[3] = ("io.kubernetes.cri.sandbox-name", &long);
        assert_eq!(
            container_name(&spec(&pod)).unwrap().len(),
            "team-a//trainer".len() + MAX_NAME_PART
        );
        for blank in ["", "   ", "\n"] {
            assert_eq!(container_name(&spec(&[(NAME_ANNOTATION, blank)])), None, "{blank:?}");
        }
    }

    #[test]
    fn a_name_read_back_is_kept_only_where_admission_could_have_written_it() {
        assert_eq!(checked("ns/pod/c"), Some("ns/pod/c"));
        for edited in ["a\nb", "a/b/c/d", "a//b", "x\"y", "", &"y".repeat(MAX_NAME_PART + 1)] {
            assert_eq!(checked(edited), None, "{edited:?}");
        }
    }
}
