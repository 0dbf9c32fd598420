use super::*;
use crate::request::tests::{gpu, host, spec};

#[test]
fn device_lists() {
    let p = |v| GpuSelector::parse_list(VISIBLE_DEVICES_ENV, v).map(|s| s.selection);
    assert_eq!(p("all"), Ok(GpuSelection::All));
    assert_eq!(p("void"), Ok(GpuSelection::Nothing));
    assert_eq!(p(""), Ok(GpuSelection::Nothing));
    assert_eq!(
        p("0, 1,0"),
        Ok(GpuSelection::Devices(vec![DeviceRef::Index(0), DeviceRef::Index(1)]))
    );
    assert_eq!(p("0:2"), Ok(GpuSelection::Devices(vec![DeviceRef::MigIndex(0, 2)])));
    assert_eq!(
        p("GPU-1a2b,MIG-GPU-1a2b/1/0"),
        Ok(GpuSelection::Devices(vec![
            DeviceRef::Uuid("GPU-1a2b".into()),
            DeviceRef::Uuid("MIG-GPU-1a2b/1/0".into())
        ]))
    );
    for bad in ["0,", "-1", "GPU-", "gpu0", "0:x", "99999999999", "GPU-../../etc", "1 2"] {
        assert!(p(bad).is_err(), "{bad}");
    }
    assert!(p(&"0,".repeat(5000)).is_err());
}

#[test]
fn resolution_against_the_host() {
    let sel = |v| GpuSelector::parse_list(GPUS_ANNOTATION, v).unwrap();
    assert_eq!(sel("all").resolve(&host()).unwrap(), ["GPU-aaaa", "GPU-bbbb"]);
    assert_eq!(sel("1,GPU-AAAA").resolve(&host()).unwrap(), ["GPU-bbbb", "GPU-aaaa"]);
    let err = sel("2").resolve(&host()).unwrap_err().to_string();
    assert!(
        err.contains("GPU \"2\"") && err.contains("0 GPU-aaaa, 1 GPU-bbbb"),
        "{err}"
    );
}

#[test]
fn linux_devices_and_override() {
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"linux":{"devices":[{"path":"/dev/nvidiactl"},{"path":"/dev/nvidia-uvm"},{"path":"/dev/nvidia1"}]}}"#,
    );
    let r = Request::from_spec(&s).unwrap().unwrap();
    assert_eq!(r.gpus.source_name, "linux.devices");
    assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
    // vramgate's own word narrows what the engine gave, and never names another GPU.
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"1"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=0,1"]}}"#,
    );
    assert_eq!(
        Request::from_spec(&s).unwrap().unwrap().gpus.resolve(&host()).unwrap(),
        ["GPU-bbbb"]
    );
}

/// Given GPU 0 by its engine (the NVIDIA device plugin's UUID, Docker's `--gpus device=0`,
/// a CDI annotation, an injected `/dev/nvidia0`), a container that names GPU 1 is refused
/// with one line naming both; given all or none, it may name any.
#[test]
fn named_gpus_must_be_among_those_the_engine_gave() {
    for (given, source) in [
        (
            r#""process":{"env":["NVIDIA_VISIBLE_DEVICES=GPU-aaaa"]}"#,
            "NVIDIA_VISIBLE_DEVICES = \"GPU-aaaa\"",
        ),
        (
            r#""process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}"#,
            "NVIDIA_VISIBLE_DEVICES = \"0\"",
        ),
        (
            r#""annotations":{"cdi.k8s.io/nvidia-device-plugin_x":"nvidia.com/gpu=0"}"#,
            "cdi.k8s.io annotations = \"nvidia.com/gpu=0\"",
        ),
        (
            r#""linux":{"devices":[{"path":"/dev/nvidia0"}]}"#,
            "linux.devices = \"/dev/nvidia0\"",
        ),
    ] {
        for own in [
            r#""VRAMGATE_GPUS=1""#,
            r#""VRAMGATE_GPUS=GPU-bbbb""#,
            r#""VRAMGATE_GPUS=0,1""#,
            r#""VRAMGATE_GPUS=all""#,
        ] {
            // The engine's word and the container's in one spec (annotations merged).
            let text = format!(r#"{{{given},"x":{{"env":[{own}]}}}}"#);
            let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
            let own_env = json["x"]["env"][0].clone();
            json.as_object_mut().unwrap().remove("x");
            let env = json["process"]["env"].as_array().cloned().unwrap_or_default();
            json["process"]["env"] =
                serde_json::Value::Array(env.into_iter().chain([own_env, "VRAMGATE_MEMORY=1Gi".into()]).collect());
            let s = spec(&json.to_string());
            let err = Request::from_spec(&s)
                .unwrap()
                .unwrap()
                .gpus
                .resolve(&host())
                .unwrap_err();
            assert!(matches!(err, RequestError::OutsideGiven { .. }), "{given} {own}: {err}");
            let line = err.to_string();
            assert!(
                line.contains("GPU 1 (GPU-bbbb), which the container's engine did not give it")
                    && line.contains(source)
                    && !line.contains('\n'),
                "{line}"
            );
        }
        // Naming what was given, in any form, is a narrowing.
        let text = format!(r#"{{{given}}}"#);
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let env = json["process"]["env"].as_array().cloned().unwrap_or_default();
        json["process"]["env"] = serde_json::Value::Array(
            env.into_iter()
                .chain(["VRAMGATE_GPUS=GPU-aaaa".into(), "VRAMGATE_MEMORY=1Gi".into()])
                .collect(),
        );
        let r = Request::from_spec(&spec(&json.to_string())).unwrap().unwrap();
        assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-aaaa"], "{given}");
    }
    for given in ["all", "none", "void", "nvidia.com/gpu=all"] {
        let s = spec(&format!(
            r#"{{"process":{{"env":["NVIDIA_VISIBLE_DEVICES={given}","VRAMGATE_GPUS=1","VRAMGATE_MEMORY=1Gi"]}}}}"#
        ));
        assert_eq!(
            Request::from_spec(&s).unwrap().unwrap().gpus.resolve(&host()).unwrap(),
            ["GPU-bbbb"],
            "{given}"
        );
    }
}

/// GPU 0 in MIG mode with two MIG devices beside a whole GPU 1.
fn mig_host() -> Snapshot {
    Snapshot {
        gpus: vec![
            gpu(0, Some(0), "MIG-x0"),
            gpu(0, Some(1), "MIG-x1"),
            gpu(1, None, "GPU-bbbb"),
        ],
        mig_parents: vec![0],
        processes: vec![],
    }
}

#[test]
fn mig() {
    let snap = mig_host();
    let sel = |v| GpuSelector::parse_list(VISIBLE_DEVICES_ENV, v).unwrap();
    assert_eq!(sel("0:1").resolve(&snap).unwrap(), ["MIG-x1"]);
    assert_eq!(sel("MIG-x0").resolve(&snap).unwrap(), ["MIG-x0"]);
    assert!(sel("0").resolve(&snap).unwrap_err().to_string().contains("MIG mode"));
}

#[test]
fn auto_and_its_candidates() {
    let p = |v| GpuSelector::parse_list(GPUS_ANNOTATION, v).map(|s| s.selection);
    assert_eq!(p("auto"), Ok(GpuSelection::Auto { count: 1, among: None }));
    assert_eq!(p("auto:2"), Ok(GpuSelection::Auto { count: 2, among: None }));
    for bad in ["auto:0", "auto:65", "auto:x", "auto:", "autox"] {
        assert!(p(bad).is_err(), "{bad}");
    }
    // Only vramgate's own keys may say auto.
    let err = GpuSelector::parse_list(VISIBLE_DEVICES_ENV, "auto")
        .unwrap_err()
        .to_string();
    assert!(err.contains("vramgate.dev/gpus or VRAMGATE_GPUS"), "{err}");
    // The env form, and candidates from what the engine gave.
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"process":{"env":["VRAMGATE_GPUS=auto","NVIDIA_VISIBLE_DEVICES=1,GPU-aaaa"]}}"#,
    );
    let r = Request::from_spec(&s).unwrap().unwrap();
    assert_eq!(r.gpus.source_name, GPUS_ENV);
    let (count, uuids) = r.gpus.candidates(&host()).unwrap().unwrap();
    assert_eq!(
        (count, uuids),
        (1, vec!["GPU-bbbb".to_string(), "GPU-aaaa".to_string()])
    );
    assert!(r
        .gpus
        .resolve(&host())
        .unwrap_err()
        .to_string()
        .contains("vramgate-runtime"));
    let three = GpuSelector::parse_list(GPUS_ANNOTATION, "auto:3").unwrap();
    let err = three.candidates(&host()).unwrap().unwrap_err().to_string();
    assert!(err.contains("asks for 3 GPUs, but only 2 can take it"), "{err}");
}

#[test]
fn engine_all_is_placed_by_the_wrapper_but_vramgate_all_spans() {
    let env_all = spec(r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=all"]}}"#);
    let r = Request::from_spec(&env_all).unwrap().unwrap();
    assert_eq!(
        r.gpus.to_place().unwrap().selection,
        GpuSelection::Auto { count: 1, among: None }
    );
    let own_all = spec(r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"all"}}"#);
    let r = Request::from_spec(&own_all).unwrap().unwrap();
    assert_eq!(r.gpus.to_place(), None);
    assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-aaaa", "GPU-bbbb"]);
    let list = spec(r#"{"process":{"env":["VRAMGATE_MEMORY=1Gi","NVIDIA_VISIBLE_DEVICES=0,1"]}}"#);
    assert_eq!(Request::from_spec(&list).unwrap().unwrap().gpus.to_place(), None);
}

#[test]
fn cdi_names_and_device_nodes_as_the_truth() {
    let p = |v| GpuSelector::parse_list(VISIBLE_DEVICES_ENV, v).map(|s| s.selection);
    assert_eq!(p("nvidia.com/gpu=all"), Ok(GpuSelection::All));
    assert_eq!(
        p("nvidia.com/gpu=1,nvidia.com/gpu=GPU-aaaa,nvidia.com/gpu=0:2"),
        Ok(GpuSelection::Devices(vec![
            DeviceRef::Index(1),
            DeviceRef::Uuid("GPU-aaaa".into()),
            DeviceRef::MigIndex(0, 2)
        ]))
    );
    assert!(p("vendor.com/gpu=0").is_err());
    // A CUDA image's ENV NVIDIA_VISIBLE_DEVICES=all beside one injected GPU: that GPU.
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"process":{"env":["NVIDIA_VISIBLE_DEVICES=all"]},"linux":{"devices":[{"path":"/dev/nvidiactl"},{"path":"/dev/nvidia1"}]}}"#,
    );
    let r = Request::from_spec(&s).unwrap().unwrap();
    assert_eq!(r.gpus.to_place(), None);
    assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
    // CDI requests in annotations, as device plugins write them.
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi","cdi.k8s.io/nvidia-device-plugin_abc":"nvidia.com/gpu=GPU-bbbb,vendor.com/nic=0"}}"#,
    );
    let r = Request::from_spec(&s).unwrap().unwrap();
    assert_eq!(r.gpus.source_name, CDI_SOURCE);
    assert_eq!(r.gpus.resolve(&host()).unwrap(), ["GPU-bbbb"]);
}

#[test]
fn a_mig_device_through_cdi_is_placed_among_its_parents_mig_devices() {
    let snap = mig_host();
    // CDI injects the parent's /dev/nvidia0 (and nvidia-caps nodes) for a MIG device.
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"auto"},"linux":{"devices":[{"path":"/dev/nvidia0"},{"path":"/dev/nvidia-caps/nvidia-cap21"}]}}"#,
    );
    let r = Request::from_spec(&s).unwrap().unwrap();
    let (_, uuids) = r.gpus.candidates(&snap).unwrap().unwrap();
    assert_eq!(uuids, ["MIG-x0", "MIG-x1"]);
    // Named as a whole, it is still refused.
    let whole = spec(r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"linux":{"devices":[{"path":"/dev/nvidia0"}]}}"#);
    let r = Request::from_spec(&whole).unwrap().unwrap();
    assert!(r.gpus.resolve(&snap).unwrap_err().to_string().contains("MIG mode"));
}

#[test]
fn a_mig_device_given_through_cdi_is_admitted_on_that_mig_device() {
    let mig = |m: u32, uuid: &str, caps: [u32; 2]| GpuMemory {
        mig_caps: caps.to_vec(),
        ..gpu(0, Some(m), uuid)
    };
    let snap = Snapshot {
        gpus: vec![
            mig(0, "MIG-x0", [12, 13]),
            mig(1, "MIG-x1", [21, 22]),
            gpu(1, None, "GPU-bbbb"),
        ],
        mig_parents: vec![0],
        processes: vec![],
    };
    // What nvidia-ctk's CDI spec injects for MIG device 0:1: the parent and its two caps.
    let s = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi"},"linux":{"devices":[{"path":"/dev/nvidiactl"},{"path":"/dev/nvidia0"},{"path":"/dev/nvidia-caps/nvidia-cap21"},{"path":"/dev/nvidia-caps/nvidia-cap22"}]}}"#,
    );
    let r = Request::from_spec(&s).unwrap().unwrap();
    assert_eq!(r.gpus.resolve(&snap).unwrap(), ["MIG-x1"]);
    // Placing among what was given: only that MIG device.
    let auto = spec(
        r#"{"annotations":{"vramgate.dev/memory":"1Gi","vramgate.dev/gpus":"auto"},"linux":{"devices":[{"path":"/dev/nvidia0"},{"path":"/dev/nvidia-caps/nvidia-cap12"},{"path":"/dev/nvidia-caps/nvidia-cap13"}]}}"#,
    );
    let r = Request::from_spec(&auto).unwrap().unwrap();
    assert_eq!(r.gpus.candidates(&snap).unwrap().unwrap().1, ["MIG-x0"]);
}
