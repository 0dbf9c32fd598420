//! The kubelet side: the `Registration` service kubelet's plugin watcher calls, and the
//! `DRAPlugin` service (v1, and v1beta1 for kubelets before 1.34) over the [`Preparer`], one
//! handler for both API versions.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use super::api::registration::registration_server::Registration;
use super::api::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use super::api::{v1, v1beta1};
use super::plugin::{ClaimRef, PreparedDevice, Preparer};
use super::DRIVER;

/// What kubelet's plugin watcher routes DRA drivers by.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The gRPC services the driver serves, as kubelet names them (`<package>.<service>`).
pub const SERVICES: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// The `DRAPlugin` services over a [`Preparer`].
#[derive(Clone)]
pub struct DraService(pub Arc<Preparer>);

/// One DRA API version's messages, as the one NodePrepare/NodeUnprepare handler
/// ([`DraService::node_prepare`], [`DraService::node_unprepare`]) reads and answers them:
/// v1 and v1beta1 differ only in `Device.share_id`, which kubelets before 1.34 do not know.
pub trait DraApi {
    type Claim;
    type PrepareResponse;
    type UnprepareResponse;
    fn claim_ref(claim: &Self::Claim) -> ClaimRef;
    fn prepared(answer: Result<Vec<PreparedDevice>, String>) -> Self::PrepareResponse;
    fn unprepared(error: String) -> Self::UnprepareResponse;
}

/// `k8s.io.kubelet.pkg.apis.dra.v1` (kubelet 1.34 and later).
pub enum V1 {}
/// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (kubelet 1.32 and 1.33).
pub enum V1beta1 {}

fn claim_ref(namespace: &str, name: &str, uid: &str) -> ClaimRef {
    ClaimRef {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.to_string(),
    }
}

impl DraApi for V1 {
    type Claim = v1::Claim;
    type PrepareResponse = v1::NodePrepareResourceResponse;
    type UnprepareResponse = v1::NodeUnprepareResourceResponse;

    fn claim_ref(c: &v1::Claim) -> ClaimRef {
        claim_ref(&c.namespace, &c.name, &c.uid)
    }

    fn prepared(answer: Result<Vec<PreparedDevice>, String>) -> v1::NodePrepareResourceResponse {
        match answer {
            Ok(devices) => v1::NodePrepareResourceResponse {
                devices: devices
                    .into_iter()
                    .map(|d| v1::Device {
                        request_names: vec![d.request],
                        pool_name: d.pool,
                        device_name: d.device,
                        cdi_device_ids: d.cdi_ids,
                        share_id: d.share_id,
                    })
                    .collect(),
                error: String::new(),
            },
            Err(error) => v1::NodePrepareResourceResponse {
                devices: Vec::new(),
                error,
            },
        }
    }

    fn unprepared(error: String) -> v1::NodeUnprepareResourceResponse {
        v1::NodeUnprepareResourceResponse { error }
    }
}

impl DraApi for V1beta1 {
    type Claim = v1beta1::Claim;
    type PrepareResponse = v1beta1::NodePrepareResourceResponse;
    type UnprepareResponse = v1beta1::NodeUnprepareResourceResponse;

    fn claim_ref(c: &v1beta1::Claim) -> ClaimRef {
        claim_ref(&c.namespace, &c.name, &c.uid)
    }

    /// Without the share ID.
    fn prepared(answer: Result<Vec<PreparedDevice>, String>) -> v1beta1::NodePrepareResourceResponse {
        match answer {
            Ok(devices) => v1beta1::NodePrepareResourceResponse {
                devices: devices
                    .into_iter()
                    .map(|d| v1beta1::Device {
                        request_names: vec![d.request],
                        pool_name: d.pool,
                        device_name: d.device,
                        cdi_device_ids: d.cdi_ids,
                    })
                    .collect(),
                error: String::new(),
            },
            Err(error) => v1beta1::NodePrepareResourceResponse {
                devices: Vec::new(),
                error,
            },
        }
    }

    fn unprepared(error: String) -> v1beta1::NodeUnprepareResourceResponse {
        v1beta1::NodeUnprepareResourceResponse { error }
    }
}

impl DraService {
    /// NodePrepareResources in API version `A`: each claim's answer, by claim uid.
    pub async fn node_prepare<A: DraApi>(&self, claims: &[A::Claim]) -> HashMap<String, A::PrepareResponse> {
        let claims: Vec<ClaimRef> = claims.iter().map(A::claim_ref).collect();
        self.0
            .prepare(&claims)
            .await
            .into_iter()
            .map(|(uid, answer)| (uid, A::prepared(answer)))
            .collect()
    }

    /// NodeUnprepareResources in API version `A`: each claim's error (empty when it went), by
    /// claim uid.
    pub async fn node_unprepare<A: DraApi>(&self, claims: &[A::Claim]) -> HashMap<String, A::UnprepareResponse> {
        let claims: Vec<ClaimRef> = claims.iter().map(A::claim_ref).collect();
        self.0
            .unprepare(&claims)
            .await
            .into_iter()
            .map(|(uid, answer)| (uid, A::unprepared(answer.err().unwrap_or_default())))
            .collect()
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = self.node_prepare::<V1>(&request.get_ref().claims).await;
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = self.node_unprepare::<V1>(&request.get_ref().claims).await;
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = self.node_prepare::<V1beta1>(&request.get_ref().claims).await;
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = self.node_unprepare::<V1beta1>(&request.get_ref().claims).await;
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse { claims }))
    }
}

/// The `Registration` service on the socket kubelet's plugin watcher finds.
#[derive(Clone)]
pub struct Registrar {
    /// The DRA service's socket, which kubelet then dials.
    pub endpoint: PathBuf,
    /// Told when kubelet confirms a registration: kubelet wipes a node's slices when it starts
    /// and when a driver goes away, so the publisher checks its slice again.
    pub registered: Arc<Notify>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER.to_string(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: SERVICES.map(String::from).to_vec(),
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            eprintln!("vramgate-dra: registered with kubelet as {DRIVER}");
            self.registered.notify_one();
        } else {
            eprintln!(
                "vramgate-dra: kubelet refused the registration of {DRIVER}: {}",
                crate::one_line(&status.error)
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
