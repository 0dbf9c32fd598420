use super::*;
use crate::inventory::GpuMemory;
use std::path::Path;

pub(super) fn spec(json: &str) -> SpecView {
    SpecView::parse(json.as_bytes(), Path::new("/b/config.json")).unwrap()
}

#[test]
fn a_claims_container_takes_the_claims_amount_or_is_refused() {
    let one = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
        "VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0"]}}"#;
    let request = Request::from_spec(&spec(one)).unwrap().expect("a request");
    assert_eq!(request.memory, Quantity::Bytes(6 << 30));
    let two = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
        "VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0:5ecret1","VRAMGATE_DRA_DEVICE_u2_gpu_1=u2-gpu-1:5ecret2"]}}"#;
    let err = Request::from_spec(&spec(two)).unwrap_err();
    assert!(
        matches!(err, RequestError::SeveralClaimDevices { count: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("u1-gpu-0, u2-gpu-1"), "{err}");
    assert!(
        !err.to_string().contains("5ecret"),
        "a marker's secret never goes into a message: {err}"
    );
    let annotated = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
        "VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0"]},"annotations":{"vramgate.dev/memory":"1Gi"}}"#;
    let err = Request::from_spec(&spec(annotated)).unwrap_err();
    assert!(matches!(err, RequestError::ClaimAndAnnotation { .. }), "{err}");
    assert!(err.to_string().contains("remove the annotation"), "{err}");
    // A limit of its own beside the claim: by annotation refused; by env (before the
    // claim's, as CDI appends its edits) the claim's wins.
    let widened = r#"{"process":{"env":["VRAMGATE_MEMORY=6Gi","VRAMGATE_GPUS=GPU-aaaa",
        "VRAMGATE_MEMORY_LIMIT=6Gi","VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0"]},
        "annotations":{"vramgate.dev/memory-limit":"60Gi"}}"#;
    let err = Request::from_spec(&spec(widened)).unwrap_err();
    assert!(
        matches!(&err, RequestError::ClaimAndAnnotation { annotation, .. } if annotation == MEMORY_LIMIT_ANNOTATION),
        "{err}"
    );
    let own_env = r#"{"process":{"env":["VRAMGATE_MEMORY_LIMIT=60Gi","VRAMGATE_MEMORY=6Gi",
        "VRAMGATE_GPUS=GPU-aaaa","VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0","VRAMGATE_MEMORY_LIMIT=6442450944"]}}"#;
    let request = Request::from_spec(&spec(own_env)).unwrap().expect("a request");
    // The claim's limit, equal to its request, is no limit above it: not the 60Gi.
    assert_eq!(request.limit.unwrap_or(request.memory), Quantity::Bytes(6 << 30));
}

pub(super) fn gpu(index: u32, mig: Option<u32>, uuid: &str) -> GpuMemory {
    GpuMemory::for_test(index, mig, uuid)
}

pub(super) fn host() -> Snapshot {
    Snapshot {
        gpus: vec![gpu(0, None, "GPU-aaaa"), gpu(1, None, "GPU-bbbb")],
        ..Snapshot::default()
    }
}

#[test]
fn no_request_is_none() {
    assert_eq!(
        Request::from_spec(&spec(r#"{"process":{"env":["PATH=/bin"]}}"#)),
        Ok(None)
    );
    assert!(!has_request(&spec("{}")));
}

#[test]
fn annotation_wins_over_env_with_a_note() {
    let r = Request::from_spec(&spec(
        r#"{"annotations":{"vramgate.dev/memory":"2Gi"},"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=0"]}}"#,
    ))
    .unwrap()
    .unwrap();
    assert_eq!(r.memory, Quantity::Bytes(2 << 30));
    assert_eq!(r.memory_source, MEMORY_ANNOTATION);
    assert_eq!(r.notes.len(), 1);
    assert!(r.notes[0].contains("overrides"));
}

#[test]
fn env_only_request_with_policy_and_timeout() {
    let r = Request::from_spec(&spec(
        r#"{"process":{"env":["VRAMGATE_MEMORY=1205Mi","VRAMGATE_POLICY=wait","VRAMGATE_TIMEOUT=90s","NVIDIA_VISIBLE_DEVICES=all"]}}"#,
    ))
    .unwrap()
    .unwrap();
    assert_eq!(r.policy, Some(Policy::Wait));
    assert_eq!(r.timeout, Some(Duration::from_secs(90)));
    assert_eq!(r.gpus.selection, GpuSelection::All);
}

#[test]
fn bad_values_name_their_source() {
    let cases = [
        (
            r#"{"annotations":{"vramgate.dev/memory":"lots"}}"#,
            "vramgate.dev/memory",
        ),
        (
            r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/policy":"maybe","vramgate.dev/gpus":"0"}}"#,
            "vramgate.dev/policy",
        ),
        (
            r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","VRAMGATE_TIMEOUT=soon","NVIDIA_VISIBLE_DEVICES=0"]}}"#,
            "VRAMGATE_TIMEOUT",
        ),
        (
            r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=0,gpu7"]}}"#,
            "NVIDIA_VISIBLE_DEVICES",
        ),
        (
            r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=none"]}}"#,
            "names no GPU",
        ),
        (r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi"]}}"#, "names no GPU"),
    ];
    for (json, needle) in cases {
        let err = Request::from_spec(&spec(json)).expect_err(json).to_string();
        assert!(err.contains(needle), "{json}: {err}");
    }
}

#[test]
fn a_pod_sandbox_never_has_a_request() {
    // What containerd's CRI plugin and CRI-O write into a sandbox's spec: the pod's
    // annotations and the marker.
    for marker in CRI_CONTAINER_TYPE_ANNOTATIONS {
        let s = spec(&format!(
            r#"{{"annotations":{{"vramgate.dev/memory":"1205Mi","vramgate.dev/gpus":"0","{marker}":"sandbox"}},"process":{{"env":["VRAMGATE_MEMORY=1Gi"]}}}}"#
        ));
        assert_eq!(pod_role(&s), PodRole::Sandbox, "{marker}");
        assert!(!has_request(&s), "{marker}");
        assert_eq!(Request::from_spec(&s), Ok(None), "{marker}");
    }
}

#[test]
fn a_pod_annotation_applies_to_the_containers_that_name_a_gpu() {
    let container = |extra: &str, env: &str| {
        spec(&format!(
            r#"{{"annotations":{{"vramgate.dev/memory":"1205Mi","io.kubernetes.cri.container-type":"container"{extra}}},"process":{{"env":["PATH=/bin"{env}]}}}}"#
        ))
    };
    // The device plugin gives one container a GPU; the pod's own word only chooses among the
    // GPUs a container was given.
    for s in [
        container(r#","vramgate.dev/gpus":"0""#, r#","NVIDIA_VISIBLE_DEVICES=0,1""#),
        container("", r#","NVIDIA_VISIBLE_DEVICES=0""#),
    ] {
        assert_eq!(pod_role(&s), PodRole::Container);
        let r = Request::from_spec(&s).unwrap().unwrap();
        assert_eq!(r.memory, Quantity::Bytes(1205 << 20));
        assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-aaaa"]);
    }
    // A sidecar with no GPU: no request, where outside a pod the same spec is refused.
    for env in ["", r#","NVIDIA_VISIBLE_DEVICES=none""#] {
        let sidecar = container("", env);
        assert!(!has_request(&sidecar));
        assert_eq!(Request::from_spec(&sidecar), Ok(None));
    }
    let outside = spec(r#"{"annotations":{"vramgate.dev/memory":"1205Mi"}}"#);
    assert_eq!(pod_role(&outside), PodRole::NotInPod);
    assert!(matches!(Request::from_spec(&outside), Err(RequestError::NoGpu { .. })));
    // A bad device list is still reported, and a container's own env request keeps the rule.
    let bad = container("", r#","NVIDIA_VISIBLE_DEVICES=gpu7""#);
    assert!(matches!(Request::from_spec(&bad), Err(RequestError::Invalid { .. })));
    let own = container("", r#","VRAMGATE_MEMORY=1Gi""#);
    assert!(matches!(
        Request::from_spec(&own),
        Err(RequestError::PodGivenNoGpu { .. })
    ));
}

/// In a pod, `NVIDIA_VISIBLE_DEVICES=all` is the image's (every CUDA image sets it), never the
/// device plugin's: it gives no GPU. Where NVIDIA's toolkit accepts the env from unprivileged
/// containers (its default), that container would get every GPU unaccounted, so a pod that asks
/// for memory is refused with one line; where the toolkit does not (the GPU Operator's
/// volume-mounts set-up), it gets none, and the pod's annotation is not its request.
#[test]
fn in_a_pod_nvidia_visible_devices_all_gives_no_gpu() {
    let container = |annotations: &str, env: &str| {
        spec(&format!(
            r#"{{"annotations":{{"io.kubernetes.cri.container-type":"container"{annotations}}},"process":{{"env":["PATH=/bin"{env}]}}}}"#
        ))
    };
    let trusted = NvidiaToolkit::default();
    let operator = NvidiaToolkit {
        envvar_when_unprivileged: false,
    };
    for (annotations, env) in [
        (r#","vramgate.dev/memory":"20Gi""#, r#","NVIDIA_VISIBLE_DEVICES=all""#),
        (
            r#","vramgate.dev/memory":"100%""#,
            r#","NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all""#,
        ),
        (
            r#","vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"0""#,
            r#","NVIDIA_VISIBLE_DEVICES=all""#,
        ),
    ] {
        let s = container(annotations, env);
        assert!(has_request(&s), "{annotations} {env}");
        let err = Request::from_spec_with(&s, trusted).unwrap_err();
        assert!(matches!(err, RequestError::PodAsksForEveryGpu { .. }), "{err}");
        assert!(
            err.to_string().contains("Kubernetes gave this container no GPU"),
            "{err}"
        );
        assert_eq!(Request::from_spec_with(&s, operator), Ok(None), "{annotations} {env}");
    }
    // Outside a pod, `all` is the engine's user's word (`docker run --gpus all`): one GPU,
    // placed by the wrapper.
    let outside =
        spec(r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]}}"#);
    let r = Request::from_spec_with(&outside, trusted).unwrap().unwrap();
    assert_eq!(r.gpus.selection, GpuSelection::All);
    // A privileged container's env is read whatever the setting, as the toolkit reads it.
    let privileged = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=1"],"capabilities":{"bounding":["CAP_SYS_ADMIN"]}}}"#,
    );
    let r = Request::from_spec_with(&privileged, operator).unwrap().unwrap();
    assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
    // An unprivileged one's is not: refused with the line that says why.
    let unprivileged =
        spec(r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=1"]}}"#);
    let err = Request::from_spec_with(&unprivileged, operator).unwrap_err();
    assert!(matches!(err, RequestError::EnvNotAccepted { .. }), "{err}");
}

/// NVIDIA's device plugin's volume-mounts strategy: `NVIDIA_VISIBLE_DEVICES` is the mount root,
/// and each GPU given is a mount of /dev/null under it; read as NVIDIA's toolkit reads them.
#[test]
fn the_device_plugins_volume_mounts_are_the_gpus_given() {
    let with_mounts = |mounts: &str| {
        spec(&format!(
            r#"{{"annotations":{{"io.kubernetes.cri.container-type":"container","vramgate.dev/memory":"1Gi"}},"process":{{"env":["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"]}},"mounts":[{mounts}]}}"#
        ))
    };
    let operator = NvidiaToolkit {
        envvar_when_unprivileged: false,
    };
    let one = with_mounts(
        r#"{"source":"/dev/null","destination":"/var/run/nvidia-container-devices/GPU-bbbb"},{"source":"/proc","destination":"/var/run/nvidia-container-devices/GPU-aaaa"},{"source":"/dev/null","destination":"/var/run/nvidia-container-devices/imex/channel0"}"#,
    );
    for toolkit in [operator, NvidiaToolkit::default()] {
        let r = Request::from_spec_with(&one, toolkit).unwrap().unwrap();
        assert_eq!(r.gpus.source_name, VOLUME_MOUNTS_SOURCE);
        assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
    }
    let cdi = with_mounts(
        r#"{"source":"/dev/./null","destination":"/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/1"},{"source":"/dev/null","destination":"/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=0"}"#,
    );
    let r = Request::from_spec_with(&cdi, operator).unwrap().unwrap();
    assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb", "GPU-aaaa"]);
    // None mounted (or `void`): the strategy's env names no GPU; the pod's annotation is not
    // this container's request.
    for mounts in [
        "",
        r#"{"source":"/dev/null","destination":"/var/run/nvidia-container-devices/void"}"#,
    ] {
        let none = with_mounts(mounts);
        assert!(!has_request(&none), "{mounts}");
        assert_eq!(Request::from_spec_with(&none, operator), Ok(None));
    }
}

/// A pod's containers get GPUs from the scheduler alone: one its engine gave none reserves
/// nothing and is placed on none, whatever the pod's annotation or its own env names.
#[test]
fn a_pods_container_given_no_gpu_names_none() {
    let container = |annotations: &str, env: &str| {
        spec(&format!(
            r#"{{"annotations":{{"io.kubernetes.cri-o.ContainerType":"container"{annotations}}},"process":{{"env":["PATH=/bin"{env}]}}}}"#
        ))
    };
    for gpus in ["all", "0", "GPU-bbbb", "auto", "auto:2", "0,1"] {
        // The pod's annotations: no request at all, so the container starts as a sidecar.
        let pod = container(
            &format!(r#","vramgate.dev/memory":"100%","vramgate.dev/gpus":"{gpus}""#),
            "",
        );
        assert!(!has_request(&pod), "{gpus}");
        assert_eq!(Request::from_spec(&pod), Ok(None), "{gpus}");
        // Its own env: refused with the line that says where a pod's GPUs come from.
        let own = container("", &format!(r#","VRAMGATE_MEMORY=1Gi","VRAMGATE_GPUS={gpus}""#));
        let err = Request::from_spec(&own).unwrap_err();
        assert!(matches!(err, RequestError::PodGivenNoGpu { .. }), "{gpus}: {err}");
        assert!(err.to_string().contains("Kubernetes gave it no GPU"), "{err}");
    }
    // Given GPU 1, `auto` chooses among GPU 1 alone, and a name outside it is refused.
    let given = container(
        r#","vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"auto""#,
        r#","NVIDIA_VISIBLE_DEVICES=1""#,
    );
    let r = Request::from_spec(&given).unwrap().unwrap();
    assert_eq!(
        r.gpus.candidates(&host()).unwrap().unwrap(),
        (1, vec!["GPU-bbbb".to_string()])
    );
    let outside = container(
        r#","vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"all""#,
        r#","NVIDIA_VISIBLE_DEVICES=1""#,
    );
    let r = Request::from_spec(&outside).unwrap().unwrap();
    assert!(matches!(
        r.gpus.resolve(&host()),
        Err(RequestError::OutsideGiven { .. })
    ));
    // Outside a pod the engine's user may add any device anyway: `all` still spans the host.
    let docker = spec(r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"all"}}"#);
    let r = Request::from_spec(&docker).unwrap().unwrap();
    assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-aaaa", "GPU-bbbb"]);
}

/// A pod author's annotation under the other runtime's key never makes a container a sandbox:
/// CRI-O copies every pod annotation but its own keys into each container's spec.
#[test]
fn a_pod_annotation_cannot_make_its_container_a_sandbox() {
    let with = |keys: &str| {
        spec(&format!(
            r#"{{"annotations":{{"vramgate.dev/memory":"2Gi"{keys}}},"process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}}}"#
        ))
    };
    for keys in [
        r#","io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri-o.ContainerType":"container""#,
        r#","io.kubernetes.cri-o.ContainerType":"sandbox","io.kubernetes.cri.container-type":"container""#,
    ] {
        let s = with(keys);
        assert_eq!(pod_role(&s), PodRole::Container, "{keys}");
        let r = Request::from_spec(&s).unwrap().expect("the GPU container reserves");
        assert_eq!(r.memory, Quantity::Bytes(2 << 30));
    }
    for keys in [
        r#","io.kubernetes.cri.container-type":"sandbox""#,
        r#","io.kubernetes.cri-o.ContainerType":"sandbox""#,
        r#","io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri-o.ContainerType":"sandbox""#,
    ] {
        assert_eq!(pod_role(&with(keys)), PodRole::Sandbox, "{keys}");
    }
}

/// NVIDIA's variables and KAI's annotations are a request: the request with the limit beside
/// it (either alone stands for both), parsed as strictly as the toolkit's hook, and refused
/// where vramgate's word disagrees.
#[test]
fn nvidia_vocabulary_is_a_request() {
    let env = |vars: &str| {
        spec(&format!(
            r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"{vars}]}}}}"#
        ))
    };
    let memory = |s: &SpecView| Request::from_spec(s).map(|r| r.map(|r| (r.memory, r.from_nvidia)));
    assert!(has_request(&env(r#","NVIDIA_GPU_MEMORY_LIMIT=2048""#)));
    assert_eq!(
        memory(&env(r#","NVIDIA_GPU_MEMORY_LIMIT=2048""#)),
        Ok(Some((Quantity::Bytes(2 << 30), true)))
    );
    assert_eq!(
        memory(&env(r#","NVIDIA_GPU_MEMORY_REQUEST=1024""#)),
        Ok(Some((Quantity::Bytes(1 << 30), true)))
    );
    // Both: the request is reserved, the limit kept beside it.
    let both = Request::from_spec(&env(
        r#","NVIDIA_GPU_MEMORY_REQUEST=0512","NVIDIA_GPU_MEMORY_LIMIT=3072""#,
    ))
    .unwrap()
    .unwrap();
    assert_eq!(
        (both.memory, both.from_nvidia, both.limit, both.limit_from_nvidia),
        (Quantity::Bytes(512 << 20), true, Some(Quantity::Bytes(3 << 30)), true)
    );
    // vramgate's word beside the same amount: one request, vramgate's.
    assert_eq!(
        memory(&env(r#","VRAMGATE_MEMORY=3Gi","NVIDIA_GPU_MEMORY_LIMIT=3072""#)),
        Ok(Some((Quantity::Bytes(3 << 30), false)))
    );
    // Disagreeing: one line naming both.
    for vars in [
        r#","VRAMGATE_MEMORY=2Gi","NVIDIA_GPU_MEMORY_LIMIT=3072""#,
        r#","VRAMGATE_MEMORY=25%","NVIDIA_GPU_MEMORY_LIMIT=3072""#,
    ] {
        let err = Request::from_spec(&env(vars)).unwrap_err();
        assert!(
            matches!(err, RequestError::VocabulariesDisagree { .. }),
            "{vars}: {err}"
        );
        let line = err.to_string();
        assert!(
            line.contains("VRAMGATE_MEMORY = ") && line.contains("NVIDIA_GPU_MEMORY_LIMIT = \"3072\""),
            "{line}"
        );
    }
    // As strict as Go's strconv.ParseUint(v, 10, 64), and the bytes must fit.
    for bad in [
        "",
        "1Gi",
        "1024Mi",
        "+5",
        "-1",
        " 5",
        "5 ",
        "1.5",
        "0x10",
        "1_000",
        "18446744073709551616",
        "17592186044416",
    ] {
        let err = Request::from_spec(&env(&format!(r#","NVIDIA_GPU_MEMORY_LIMIT={bad}""#))).unwrap_err();
        assert!(
            matches!(&err, RequestError::Invalid { source_name, .. } if source_name == NVIDIA_LIMIT_ENV),
            "{bad:?}: {err}"
        );
    }
    // Request above the limit, and zero, refused as the toolkit's hook and VRAMGATE_MEMORY do.
    let err = Request::from_spec(&env(
        r#","NVIDIA_GPU_MEMORY_REQUEST=4096","NVIDIA_GPU_MEMORY_LIMIT=1024""#,
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot exceed the limit"), "{err}");
    let err = Request::from_spec(&env(r#","NVIDIA_GPU_MEMORY_REQUEST=0""#))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is zero"), "{err}");
    // NVIDIA's variables with no GPU: refused like VRAMGATE_MEMORY.
    let s = spec(r#"{"process":{"env":["NVIDIA_GPU_MEMORY_LIMIT=1024"]}}"#);
    assert!(matches!(Request::from_spec(&s), Err(RequestError::NoGpu { .. })));
    // The variables vramgate-runtime wrote for the toolkit's hook are not read back.
    let written = spec(
        r#"{"annotations":{"vramgate.dev/enforcement":"toolkit_limit","vramgate.dev/memory":"3221225472"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_GPU_MEMORY_REQUEST=0","NVIDIA_GPU_MEMORY_LIMIT=3071"]}}"#,
    );
    assert_eq!(memory(&written), Ok(Some((Quantity::Bytes(3 << 30), false))));
    // A container that brings the annotation itself, asking only in NVIDIA's words (the
    // hook's path: no wrapper wrote anything), is still a request: the annotation never
    // takes one away.
    let brought = spec(
        r#"{"annotations":{"vramgate.dev/enforcement":"toolkit_limit"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0","NVIDIA_GPU_MEMORY_LIMIT=40960"]}}"#,
    );
    assert_eq!(memory(&brought), Ok(Some((Quantity::Bytes(40 << 30), true))));
}

#[test]
fn a_limit_beside_the_request() {
    let with = |annotations: &str, env: &str| {
        Request::from_spec(&spec(&format!(
            r#"{{"annotations":{{{annotations}}},"process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"{env}]}}}}"#
        )))
    };
    let r = with(r#""vramgate.dev/memory":"2Gi","vramgate.dev/memory-limit":"6Gi""#, "")
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.memory, r.limit),
        (Quantity::Bytes(2 << 30), Some(Quantity::Bytes(6 << 30)))
    );
    assert_eq!(r.limit_source, MEMORY_LIMIT_ANNOTATION);
    assert_eq!(
        (r.limit_on(8 << 30), r.from_nvidia, r.limit_from_nvidia),
        (Ok(6 << 30), false, false)
    );
    // The env, and the annotation over it with a note.
    let r = with("", r#","VRAMGATE_MEMORY=1Gi","VRAMGATE_MEMORY_LIMIT=50%""#)
        .unwrap()
        .unwrap();
    assert_eq!(r.limit, Some(Quantity::PartsPerMillion(500_000)));
    assert_eq!(r.limit_on(8 << 30), Ok(4 << 30));
    let err = r.limit_on(1 << 30).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "VRAMGATE_MEMORY_LIMIT = \"50%\" (512 MiB) is less than the request VRAMGATE_MEMORY (1024 MiB)"
        ),
        "{err}"
    );
    let r = with(
        r#""vramgate.dev/memory-limit":"3Gi""#,
        r#","VRAMGATE_MEMORY=1Gi","VRAMGATE_MEMORY_LIMIT=2Gi""#,
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.limit, Some(Quantity::Bytes(3 << 30)));
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    // No limit, or one equal to the request: limit = request.
    let r = with(
        r#""vramgate.dev/memory":"2Gi","vramgate.dev/memory-limit":"2048Mi""#,
        "",
    )
    .unwrap()
    .unwrap();
    assert_eq!((r.limit, r.limit_on(8 << 30)), (None, Ok(2 << 30)));
    // Below the request: one line naming both.
    let err = with(r#""vramgate.dev/memory":"6Gi","vramgate.dev/memory-limit":"2Gi""#, "").unwrap_err();
    assert_eq!(
        err.to_string(),
        "vramgate.dev/memory-limit = \"2Gi\" (2048 MiB) is less than the request vramgate.dev/memory (6144 MiB): a limit is what the container may use at most, so it must be at least its request; raise the limit or leave it out (no limit means limit = request)"
    );
    // A bad quantity names its key.
    let err = with(r#""vramgate.dev/memory":"1Gi","vramgate.dev/memory-limit":"lots""#, "").unwrap_err();
    assert!(
        matches!(&err, RequestError::Invalid { source_name, .. } if source_name == MEMORY_LIMIT_ANNOTATION),
        "{err}"
    );
    // vramgate's limit and NVIDIA's disagreeing: refused; agreeing: one request and limit.
    let err = with(
        r#""vramgate.dev/memory":"1Gi","vramgate.dev/memory-limit":"4Gi""#,
        r#","NVIDIA_GPU_MEMORY_REQUEST=1024","NVIDIA_GPU_MEMORY_LIMIT=2048""#,
    )
    .unwrap_err();
    assert!(matches!(err, RequestError::VocabulariesDisagree { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("(request 1024 MiB, limit 4096 MiB and request 1024 MiB, limit 2048 MiB)"),
        "{err}"
    );
    let err = with("", r#","VRAMGATE_MEMORY_LIMIT=4Gi","NVIDIA_GPU_MEMORY_LIMIT=2048""#).unwrap_err();
    assert!(matches!(err, RequestError::VocabulariesDisagree { .. }), "{err}");
    let r = with(
        r#""vramgate.dev/memory":"1Gi","vramgate.dev/memory-limit":"2Gi""#,
        r#","NVIDIA_GPU_MEMORY_REQUEST=1024","NVIDIA_GPU_MEMORY_LIMIT=2048""#,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (r.memory, r.limit, r.from_nvidia),
        (Quantity::Bytes(1 << 30), Some(Quantity::Bytes(2 << 30)), false)
    );
    // NVIDIA's request beside vramgate's limit: the limit is vramgate's.
    let r = with(
        "",
        r#","VRAMGATE_MEMORY_LIMIT=2Gi","NVIDIA_GPU_MEMORY_REQUEST=1024","NVIDIA_GPU_MEMORY_LIMIT=2048""#,
    )
    .unwrap()
    .unwrap();
    assert_eq!((r.from_nvidia, r.limit_from_nvidia), (true, false));
}

#[test]
fn kai_annotations_name_one_container_of_the_pod() {
    let pod = |name: &str, env: &str| {
        spec(&format!(
            r#"{{"annotations":{{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.container-name":"{name}","nvidia.com/container.trainer.gpu-memory.request":"1024","nvidia.com/container.trainer.gpu-memory.limit":"2048"}},"process":{{"env":["NVIDIA_VISIBLE_DEVICES=0"{env}]}}}}"#
        ))
    };
    let r = Request::from_spec(&pod("trainer", "")).unwrap().unwrap();
    assert_eq!(
        (r.memory, r.from_nvidia, r.limit),
        (Quantity::Bytes(1 << 30), true, Some(Quantity::Bytes(2 << 30)))
    );
    assert!(
        r.memory_source
            .contains("nvidia.com/container.trainer.gpu-memory.limit = \"2048\""),
        "{}",
        r.memory_source
    );
    // Another container of the pod: not its request.
    assert!(!has_request(&pod("sidecar", "")));
    assert_eq!(Request::from_spec(&pod("sidecar", "")), Ok(None));
    // KAI's injected variables beside them, the same: no note; different: a note.
    let r = Request::from_spec(&pod("trainer", r#","NVIDIA_GPU_MEMORY_LIMIT=2048""#))
        .unwrap()
        .unwrap();
    assert!(r.notes.is_empty(), "{:?}", r.notes);
    let r = Request::from_spec(&pod("trainer", r#","NVIDIA_GPU_MEMORY_LIMIT=9999""#))
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.memory, r.limit),
        (Quantity::Bytes(1 << 30), Some(Quantity::Bytes(2 << 30)))
    );
    assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
    // The pod's vramgate.dev/memory disagreeing: refused.
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi","io.kubernetes.cri.container-type":"container","io.kubernetes.container.name":"trainer","nvidia.com/container.trainer.gpu-memory.limit":"2048"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#,
    );
    assert!(matches!(
        Request::from_spec(&s),
        Err(RequestError::VocabulariesDisagree { .. })
    ));
    // A DRA claim's container: NVIDIA's word may not override the claim's amount.
    let claim = spec(
        r#"{"process":{"env":["VRAMGATE_DRA_DEVICE_x=uid-gpu-0:s","VRAMGATE_MEMORY=1073741824","VRAMGATE_GPUS=GPU-aaaa","NVIDIA_GPU_MEMORY_LIMIT=2048"]}}"#,
    );
    assert!(matches!(
        Request::from_spec(&claim),
        Err(RequestError::VocabulariesDisagree { .. })
    ));
}

/// Several claim devices, each with its share (as the driver writes them since shares):
/// the amount on each of their GPUs, devices on one GPU added up, other amounts refused.
#[test]
fn several_claim_devices_reserve_their_amount_on_each_of_their_gpus() {
    // CDI applies each device's edits in turn: VRAMGATE_MEMORY and VRAMGATE_GPUS hold the
    // last device's, the shares and markers one each.
    let devices = |shares: &[(&str, &str)]| {
        let mut env = vec![r#""VRAMGATE_MEMORY_LIMIT=99Gi""#.to_string()];
        for (n, (device, share)) in shares.iter().enumerate() {
            let (uuid, bytes) = share.split_once(',').unwrap();
            env.push(format!(r#""VRAMGATE_MEMORY={bytes}""#));
            env.push(format!(r#""VRAMGATE_GPUS={uuid}""#));
            env.push(format!(
                r#""VRAMGATE_DRA_DEVICE_u1_{device}=u1-{}:5ecret{n}""#,
                device.replace('_', "-")
            ));
            env.push(format!(r#""VRAMGATE_DRA_SHARE_u1_{device}={share}""#));
            let limit = share.rsplit(',').next().unwrap();
            env.push(format!(r#""VRAMGATE_MEMORY_LIMIT={limit}""#));
        }
        spec(&format!(r#"{{"process":{{"env":[{}]}}}}"#, env.join(",")))
    };
    let gi = |n: u64| n << 30;
    let both = devices(&[
        ("gpu_0", &format!("GPU-aaaa,{},{}", gi(4), gi(4))),
        ("gpu_1", &format!("GPU-bbbb,{},{}", gi(4), gi(4))),
    ]);
    let request = Request::from_spec(&both).unwrap().expect("a request");
    assert_eq!(request.memory, Quantity::Bytes(gi(4)));
    assert_eq!(
        request.limit, None,
        "the claim's limit is its request, not the container's 99Gi"
    );
    assert_eq!(
        request.gpus.selection,
        GpuSelection::Devices(vec![
            DeviceRef::Uuid("GPU-aaaa".into()),
            DeviceRef::Uuid("GPU-bbbb".into())
        ])
    );
    assert_eq!(request.memory_source, CLAIM_SHARE_SOURCE);
    // Two devices on one GPU (two claims there) add up, limits too.
    let one_gpu = devices(&[
        ("gpu_0", &format!("GPU-aaaa,{},{}", gi(2), gi(3))),
        ("gpu_0_x", &format!("GPU-aaaa,{},{}", gi(4), gi(4))),
    ]);
    let request = Request::from_spec(&one_gpu).unwrap().expect("a request");
    assert_eq!(request.memory, Quantity::Bytes(gi(6)));
    assert_eq!(request.limit, Some(Quantity::Bytes(gi(7))));
    assert_eq!(
        request.gpus.selection,
        GpuSelection::Devices(vec![DeviceRef::Uuid("GPU-aaaa".into())])
    );
    // Different amounts on different GPUs: one line, the amounts said, no secret.
    let unequal = devices(&[
        ("gpu_0", &format!("GPU-aaaa,{},{}", gi(4), gi(4))),
        ("gpu_1", &format!("GPU-bbbb,{},{}", gi(6), gi(6))),
    ]);
    let err = Request::from_spec(&unequal).unwrap_err();
    assert!(matches!(err, RequestError::UnequalClaimShares { .. }), "{err}");
    assert!(
        err.to_string().contains("4096 MiB on GPU-aaaa, 6144 MiB on GPU-bbbb"),
        "{err}"
    );
    assert!(!err.to_string().contains("5ecret"), "{err}");
    assert_eq!(err.to_string().lines().count(), 1);
    // A share the driver did not write.
    let odd = devices(&[("gpu_0", "GPU-aaaa,4Gi,4Gi"), ("gpu_1", "GPU-bbbb,1,1")]);
    let err = Request::from_spec(&odd).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("VRAMGATE_DRA_SHARE_u1_gpu_0 = \"GPU-aaaa,4Gi,4Gi\""),
        "{err}"
    );
}

/// A marker variable the container wrote under the name CDI's edits then write again is one
/// variable (the last value wins, as for the process): one device, its amount once, never a
/// second device whose share would add the claim's amount (and limit) a second time.
#[test]
fn a_claim_marker_written_twice_under_one_name_is_one_device() {
    let gi4 = 4u64 << 30;
    let twice = spec(&format!(
        r#"{{"process":{{"env":["VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0:mine",
        "VRAMGATE_MEMORY=4Gi","VRAMGATE_GPUS=GPU-aaaa","VRAMGATE_DRA_DEVICE_u1_gpu_0=u1-gpu-0:5ecret",
        "VRAMGATE_DRA_SHARE_u1_gpu_0=GPU-aaaa,{gi4},{gi4}","VRAMGATE_MEMORY_LIMIT=4Gi"]}}}}"#
    ));
    assert_eq!(claim_markers(&twice).collect::<Vec<_>>(), ["u1-gpu-0:5ecret"]);
    assert_eq!(claim_shares(&twice).unwrap(), None);
    let request = Request::from_spec(&twice).unwrap().expect("a request");
    assert_eq!(request.memory, Quantity::Bytes(gi4));
    assert_eq!(request.limit.unwrap_or(request.memory), Quantity::Bytes(gi4));
}

/// The claim devices a container carries are taken only as the driver's spec files say them:
/// the marker under its own name with its secret, the share beside it. A forged secret, a real
/// marker copied under another name, a share of the container's own, or a driver whose spec is
/// in no directory the config names: refused with one line naming the device, never the secret.
#[test]
fn claim_devices_are_checked_against_the_drivers_spec_files() {
    use crate::dra::cdi_spec::{write_spec, ClaimDevice, HookSpec};
    let dir = tempfile::tempdir().unwrap();
    let hook = HookSpec {
        path: "/usr/bin/vramgate-hook".into(),
        config: "/etc/vramgate/config.toml".into(),
        timeout_secs: 60,
    };
    let uid = "0b6e2f5a-3c44-4a8e-9f1d-2a7c5e8b9d10";
    let device = |name: &str, uuid: &str| ClaimDevice {
        device: name.into(),
        bytes: 4 << 30,
        limit: None,
        uuid: uuid.into(),
        device_nodes: vec![],
    };
    write_spec(
        dir.path(),
        uid,
        &[device("gpu-0", "GPU-aaaa"), device("gpu-1", "GPU-bbbb")],
        &hook,
    )
    .unwrap();
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(format!("vramgate.dev-gpu-memory_{uid}.json"))).unwrap())
            .unwrap();
    // Each device's env in turn, a name written again replacing the first (as CDI merges).
    let mut env: Vec<String> = Vec::new();
    for d in written["devices"].as_array().unwrap() {
        for e in d["containerEdits"]["env"].as_array().unwrap() {
            let e = e.as_str().unwrap().to_string();
            let key = e.split_once('=').unwrap().0.to_string();
            env.retain(|known| known.split_once('=').unwrap().0 != key);
            env.push(e);
        }
    }
    let with = |extra: &[String]| {
        let all: Vec<String> = env.iter().chain(extra).cloned().collect();
        spec(&serde_json::json!({"process": {"env": all}}).to_string())
    };
    let secret_of = |name: &str| {
        env.iter()
            .find_map(|e| {
                e.split_once('=')
                    .filter(|(k, _)| k.ends_with(name))
                    .map(|(_, v)| v.to_string())
            })
            .unwrap()
            .split_once(':')
            .unwrap()
            .1
            .to_string()
    };
    let dirs = [dir.path().to_path_buf()];
    assert_eq!(
        verified_claim(&with(&[]), &dirs).unwrap(),
        [format!("{uid}-gpu-0"), format!("{uid}-gpu-1")]
    );
    let suffix = uid.replace('-', "_");
    let secret = secret_of("gpu_0");
    let refused = |extra: &[String], dirs: &[std::path::PathBuf]| {
        let err = verified_claim(&with(extra), dirs).unwrap_err();
        let said = err.to_string();
        assert!(!said.contains(&secret) && !said.contains(&secret_of("gpu_1")), "{said}");
        assert_eq!(said.lines().count(), 1);
        err
    };
    // A third device, forged: a name the driver never prepared, then a real name with a guess.
    let forged = refused(
        &[
            format!("VRAMGATE_DRA_DEVICE_{suffix}_gpu_2={uid}-gpu-2:{secret}"),
            format!("VRAMGATE_DRA_SHARE_{suffix}_gpu_2=GPU-cccc,1,99999999999"),
        ],
        &dirs,
    );
    assert!(
        matches!(forged, RequestError::ClaimDeviceNotPrepared { .. }),
        "{forged}"
    );
    assert!(forged.to_string().contains(&format!("{uid}-gpu-2")), "{forged}");
    let guessed = refused(
        &[format!(
            "VRAMGATE_DRA_DEVICE_{suffix}_gpu_0={uid}-gpu-0:{}",
            "0".repeat(32)
        )],
        &dirs,
    );
    assert!(
        matches!(guessed, RequestError::ClaimDeviceNotPrepared { .. }),
        "{guessed}"
    );
    // A real marker and share copied under another name: a second device of the same.
    let copied = refused(
        &[
            format!("VRAMGATE_DRA_DEVICE_copy={uid}-gpu-0:{secret}"),
            format!("VRAMGATE_DRA_SHARE_copy=GPU-aaaa,{},{}", 4u64 << 30, 4u64 << 30),
        ],
        &dirs,
    );
    assert!(
        matches!(copied, RequestError::ClaimDeviceNotPrepared { .. }),
        "{copied}"
    );
    // A share of the container's own after the driver's (the last one wins).
    let share = refused(
        &[format!(
            "VRAMGATE_DRA_SHARE_{suffix}_gpu_0=GPU-aaaa,{},{}",
            4u64 << 30,
            40u64 << 30
        )],
        &dirs,
    );
    assert!(matches!(share, RequestError::ClaimShareNotPrepared { .. }), "{share}");
    // The driver's spec where the config does not look.
    let elsewhere = refused(&[], &[dir.path().join("other")]);
    assert!(elsewhere.to_string().contains("cdi_spec_dirs"), "{elsewhere}");
    // No marker: nothing is read (a directory that cannot be listed is no error).
    let plain = spec(r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi"]}}"#);
    assert!(verified_claim(&plain, &[dir.path().join("missing")])
        .unwrap()
        .is_empty());
}

/// Issue 43 item 6: the marker scan was quadratic in the number of `VRAMGATE_DRA_*`
/// variables. Past [`claim_env::MAX_CLAIM_DEVICES`] markers, or shares, a container is refused
/// with one line naming the count, the limit and what to remove, before any spec file is read
/// (a directory holding the named claim's spec would otherwise refuse it as not prepared); up
/// to it, the markers are read as before.
#[test]
fn more_claim_markers_or_shares_than_any_container_is_given_are_refused_first() {
    let with = |markers: usize, shares: usize| {
        let mut env = vec!["VRAMGATE_MEMORY=1Gi".to_string(), "VRAMGATE_GPUS=GPU-aaaa".to_string()];
        env.extend((0..markers).map(|i| format!("VRAMGATE_DRA_DEVICE_u{i}_gpu_0=u{i}-gpu-0:5ecret")));
        env.extend((0..shares).map(|i| format!("VRAMGATE_DRA_SHARE_u{i}_gpu_0=GPU-aaaa,1,1")));
        spec(&serde_json::json!({"process": {"env": env}}).to_string())
    };
    let dir = tempfile::tempdir().unwrap();
    let dirs = [dir.path().to_path_buf()];
    for (markers, shares, prefix, count) in [
        (10_000, 0, "VRAMGATE_DRA_DEVICE_", 10_000),
        (65, 0, "VRAMGATE_DRA_DEVICE_", 65),
        (1, 65, "VRAMGATE_DRA_SHARE_", 65),
    ] {
        let spec = with(markers, shares);
        let want = format!(
            "the container's environment has {count} {prefix}* variables, more than the 64 Kubernetes resource claim devices vramgate reads (the DRA driver sets one per device): remove the container's own {prefix}* variables, or give it at most 64 claim devices"
        );
        for err in [
            Request::from_spec_on_node(&spec, &dirs, NvidiaToolkit::default()).unwrap_err(),
            Request::from_spec(&spec).unwrap_err(),
            verified_claim(&spec, &dirs).unwrap_err(),
        ] {
            assert!(
                matches!(err, RequestError::TooManyClaimVariables { .. }),
                "{markers}/{shares}: {err}"
            );
            assert_eq!(err.to_string(), want);
        }
    }
    // At the limit: read, and refused only for what the devices are (none was prepared).
    let at_limit = with(64, 64);
    assert_eq!(claim_markers(&at_limit).count(), 64);
    let err = Request::from_spec_on_node(&at_limit, &dirs, NvidiaToolkit::default()).unwrap_err();
    assert!(matches!(err, RequestError::ClaimDeviceNotPrepared { .. }), "{err}");
    // Past it, the markers the driver reads back from admitted containers' bundles are still
    // all read, in one pass, one per name, the last value winning.
    let mut many = (0..10_000)
        .map(|i| format!("\"VRAMGATE_DRA_DEVICE_u{i}=u{i}-gpu-0:a\""))
        .collect::<Vec<_>>();
    many.push("\"VRAMGATE_DRA_DEVICE_u0=u0-gpu-0:b\"".to_string());
    let many = spec(&format!(r#"{{"process":{{"env":[{}]}}}}"#, many.join(",")));
    let markers: Vec<&str> = claim_markers(&many).collect();
    assert_eq!(markers.len(), 10_000);
    assert_eq!((markers[0], markers[9_999]), ("u0-gpu-0:b", "u9999-gpu-0:a"));
}

fn verified_claim(spec: &SpecView, dirs: &[std::path::PathBuf]) -> Result<Vec<String>, RequestError> {
    prepared_claims::verified_claim_devices(spec, dirs)
}

/// The pod sandbox is read under the key of the runtime that marked the container: one
/// runtime's keys, both present; mixed or doubled keys (a pod annotation passed through under
/// the other runtime's name) make no sandbox, so no hold.
#[test]
fn the_pod_sandbox_is_read_from_one_runtimes_keys_only() {
    let with = |annotations: &str| {
        let text = format!(
            r#"{{"process":{{"env":["VRAMGATE_MEMORY=1Gi","VRAMGATE_GPUS=GPU-aaaa","NVIDIA_VISIBLE_DEVICES=0"]}},"annotations":{{{annotations}}}}}"#
        );
        Request::from_spec(&spec(&text)).unwrap().unwrap().pod_sandbox
    };
    let containerd = r#""io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"abc""#;
    let crio = r#""io.kubernetes.cri-o.ContainerType":"container","io.kubernetes.cri-o.SandboxID":"def""#;
    assert_eq!(with(containerd).as_deref(), Some("abc"));
    assert_eq!(with(crio).as_deref(), Some("def"));
    assert_eq!(with(&format!("{containerd},{crio}")), None);
    assert_eq!(
        with(r#""io.kubernetes.cri-o.ContainerType":"container","io.kubernetes.cri.sandbox-id":"abc""#),
        None
    );
    assert_eq!(with(r#""io.kubernetes.cri.sandbox-id":"abc""#), None, "not in a pod");
    assert_eq!(
        with(r#""io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"a\nb""#),
        None
    );
}

/// Which container of which pod a spec is (what a retry keeps its first attempt's place by) is
/// read under the keys of the runtime that marked it only: CRI-O copies a pod's annotations
/// into the spec whatever their keys, so a pod could otherwise name itself another pod's
/// container under containerd's keys.
#[test]
fn the_pod_container_is_read_from_one_runtimes_keys_only() {
    let with = |annotations: &str| {
        let text = format!(
            r#"{{"process":{{"env":["VRAMGATE_MEMORY=1Gi","VRAMGATE_GPUS=GPU-aaaa","NVIDIA_VISIBLE_DEVICES=0"]}},"annotations":{{{annotations}}}}}"#
        );
        Request::from_spec(&spec(&text))
            .unwrap()
            .unwrap()
            .pod_container
            .map(|c| (c.pod, c.name))
    };
    let containerd = r#""io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"abc","io.kubernetes.cri.container-name":"app""#;
    let crio = r#""io.kubernetes.cri-o.ContainerType":"container","io.kubernetes.cri-o.SandboxID":"def","io.kubernetes.container.name":"web""#;
    let pair = |p: &str, n: &str| Some((p.to_string(), n.to_string()));
    assert_eq!(with(containerd), pair("abc", "app"));
    assert_eq!(with(crio), pair("def", "web"));
    // CRI-O's marks with containerd's name key (a pod annotation): no name of its runtime.
    assert_eq!(
        with(
            r#""io.kubernetes.cri-o.ContainerType":"container","io.kubernetes.cri-o.SandboxID":"def","io.kubernetes.cri.container-name":"app""#
        ),
        None
    );
    assert_eq!(with(&format!("{containerd},{crio}")), None);
    assert_eq!(
        with(r#""io.kubernetes.cri.sandbox-id":"abc","io.kubernetes.cri.container-name":"app""#),
        None,
        "not in a pod"
    );
    assert_eq!(
        with(
            r#""io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"abc","io.kubernetes.cri.container-name":"""#
        ),
        None
    );
}
