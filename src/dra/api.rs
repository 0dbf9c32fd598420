//! kubelet's plugin registration API and DRA API: the Rust that build.rs generates from
//! proto/pluginregistration/v1 and proto/dra/{v1,v1beta1} (both sides of each service: the
//! driver serves `Registration` and `DRAPlugin`; the tests and the bench play kubelet).

#![allow(clippy::all)]

/// `pluginregistration.Registration`: kubelet's plugin watcher asks who we are.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` (kubelet 1.34 and later).
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin` (kubelet 1.32 and 1.33): the same messages
/// without `Device.share_id`.
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}
