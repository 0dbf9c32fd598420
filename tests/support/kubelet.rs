//! A stand-in for kubelet's side of a DRA driver: the plugin watcher, which finds the
//! registration socket in `plugins_registry/`, calls `GetInfo`, checks the answer as kubelet
//! does and calls `NotifyRegistrationStatus`; and the DRA manager, which dials the endpoint
//! the driver named and calls `NodePrepareResources` / `NodeUnprepareResources` with kubelet's
//! 45 s deadline. It dials as kubelet 1.26 and later do: `unix://` target, `:authority`
//! `localhost` (tonic's server must take it; older kubelets sent the socket path).
//!
//! `crate::support::kubelet`, for the tests that play kubelet.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Uri};
use vramgate::dra::api::registration::registration_client::RegistrationClient;
use vramgate::dra::api::registration::{InfoRequest, RegistrationStatus};
use vramgate::dra::api::{v1, v1beta1};

/// kubelet's deadline on one DRA call (`defaultClientCallTimeout`).
pub const CALL_DEADLINE: Duration = Duration::from_secs(45);

/// A channel to the unix socket at `path`, with `:authority` `localhost` as kubelet sends it.
pub async fn dial(path: PathBuf) -> Channel {
    Endpoint::try_from("http://localhost")
        .expect("a static, valid URI")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .expect("the socket accepts")
}

fn deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_DEADLINE);
    request
}

/// What kubelet learned from a registration.
#[derive(Debug)]
pub struct Registered {
    pub endpoint: PathBuf,
    pub versions: Vec<String>,
}

/// Registers the driver whose registration socket is `socket`, checking its answer as
/// kubelet's `RegistrationHandler.ValidatePlugin` does for a DRA plugin: type `DRAPlugin`, the
/// expected name, an absolute endpoint that exists, and a service kubelet speaks.
pub async fn register(socket: &Path, driver: &str) -> Registered {
    let mut client = RegistrationClient::new(dial(socket.to_path_buf()).await);
    let info = client
        .get_info(deadline(InfoRequest {}))
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, driver);
    let endpoint = PathBuf::from(&info.endpoint);
    assert!(endpoint.is_absolute() && endpoint.exists(), "endpoint {endpoint:?}");
    assert!(
        info.supported_versions.iter().any(|v| v == "v1.DRAPlugin"),
        "{:?}",
        info.supported_versions
    );
    client
        .notify_registration_status(deadline(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }))
        .await
        .expect("NotifyRegistrationStatus");
    Registered {
        endpoint,
        versions: info.supported_versions,
    }
}

pub fn claim(namespace: &str, name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: namespace.into(),
        name: name.into(),
        uid: uid.into(),
    }
}

/// NodePrepareResources (v1). kubelet requires an answer for every claim it asked about.
pub async fn prepare(endpoint: &Path, claims: Vec<v1::Claim>) -> v1::NodePrepareResourcesResponse {
    let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(dial(endpoint.to_path_buf()).await);
    let answer = client
        .node_prepare_resources(deadline(v1::NodePrepareResourcesRequest { claims }))
        .await
        .expect("NodePrepareResources")
        .into_inner();
    for uid in uids {
        assert!(
            answer.claims.contains_key(&uid),
            "NodePrepareResources left out claim {uid}"
        );
    }
    answer
}

/// NodePrepareResources through the v1beta1 service (kubelet 1.32 and 1.33).
pub async fn prepare_v1beta1(endpoint: &Path, claims: Vec<v1::Claim>) -> v1beta1::NodePrepareResourcesResponse {
    let claims = claims
        .into_iter()
        .map(|c| v1beta1::Claim {
            namespace: c.namespace,
            name: c.name,
            uid: c.uid,
        })
        .collect();
    let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(dial(endpoint.to_path_buf()).await);
    client
        .node_prepare_resources(deadline(v1beta1::NodePrepareResourcesRequest { claims }))
        .await
        .expect("NodePrepareResources v1beta1")
        .into_inner()
}

/// NodeUnprepareResources (v1).
pub async fn unprepare(endpoint: &Path, claims: Vec<v1::Claim>) -> v1::NodeUnprepareResourcesResponse {
    let uids: Vec<String> = claims.iter().map(|c| c.uid.clone()).collect();
    let mut client = v1::dra_plugin_client::DraPluginClient::new(dial(endpoint.to_path_buf()).await);
    let answer = client
        .node_unprepare_resources(deadline(v1::NodeUnprepareResourcesRequest { claims }))
        .await
        .expect("NodeUnprepareResources")
        .into_inner();
    for uid in uids {
        assert!(
            answer.claims.contains_key(&uid),
            "NodeUnprepareResources left out claim {uid}"
        );
    }
    answer
}

/// vramgate's CDI ids of a prepared claim, every device's, as kubelet hands them to the runtime
/// for a container that names the claim.
pub fn vramgate_ids(prepared: &v1::NodePrepareResourceResponse) -> Vec<String> {
    prepared
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.clone())
        .filter(|id| id.starts_with("vramgate.dev/"))
        .collect()
}
