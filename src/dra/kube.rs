//! The few API server calls the driver makes, through kube's client: read a claim and the
//! node, write this driver's entries of a claim's `status.devices`, and list, create, replace
//! and delete the node's slices. Every call has a deadline.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, ObjectList, PostParams, WatchEvent, WatchParams};

use super::DRIVER;

/// The deadline on one API call: prepare waits for it with kubelet waiting on prepare (kubelet
/// gives a call 45 s), and the publisher retries after it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times a claim's status update is tried when others keep writing it (409).
const STATUS_ATTEMPTS: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot find the API server's address and credentials ({0}): run in a pod with a service account, or pass --kubeconfig")]
    Config(String),
    #[error("{what}: the API server answered {code}: {message}")]
    Status { what: String, code: u16, message: String },
    #[error("{what}: {message}")]
    Call { what: String, message: String },
    #[error("{what}: no answer within {}s", CALL_TIMEOUT.as_secs())]
    Timeout { what: String },
}

impl ApiError {
    /// The HTTP status the API server answered, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// A client of one API server.
#[derive(Clone)]
pub struct ApiClient {
    client: kube::Client,
}

async fn bounded<T>(
    what: impl Fn() -> String,
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Err(_) => Err(ApiError::Timeout { what: what() }),
        Ok(Ok(value)) => Ok(value),
        Ok(Err(kube::Error::Api(status))) => Err(ApiError::Status {
            what: what(),
            code: status.code,
            message: crate::one_line(&status.message),
        }),
        Ok(Err(e)) => Err(ApiError::Call {
            what: what(),
            message: crate::one_line(&e.to_string()),
        }),
    }
}

impl ApiClient {
    /// The client of the kubeconfig at `kubeconfig`, else the one kube infers: `$KUBECONFIG` or
    /// `~/.kube/config`, else the pod's service account.
    pub async fn connect(kubeconfig: Option<&Path>) -> Result<ApiClient, ApiError> {
        let mut config = match kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                    ApiError::Config(format!("{}: {}", path.display(), crate::one_line(&e.to_string())))
                })?;
                kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|e| ApiError::Config(format!("{}: {}", path.display(), crate::one_line(&e.to_string()))))?
            }
            None => kube::Config::infer()
                .await
                .map_err(|e| ApiError::Config(crate::one_line(&e.to_string())))?,
        };
        config.connect_timeout = Some(CALL_TIMEOUT);
        config.read_timeout = Some(CALL_TIMEOUT);
        config.write_timeout = Some(CALL_TIMEOUT);
        let client = kube::Client::try_from(config).map_err(|e| ApiError::Config(crate::one_line(&e.to_string())))?;
        Ok(ApiClient { client })
    }

    /// The ResourceClaim `namespace`/`name` as the API server's JSON, for
    /// [`super::resource_claim::shares`].
    pub async fn claim_json(&self, namespace: &str, name: &str) -> Result<Vec<u8>, ApiError> {
        let what = || format!("reading ResourceClaim {namespace}/{name}");
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}");
        let request = http::Request::get(path).body(Vec::new()).map_err(|e| ApiError::Call {
            what: what(),
            message: e.to_string(),
        })?;
        bounded(what, self.client.request_text(request))
            .await
            .map(String::into_bytes)
    }

    /// Makes this driver's entries of claim `namespace`/`name`'s `status.devices` `entries`,
    /// keeping every other driver's, through the status subresource (an update with the
    /// claim's resourceVersion, read just before; tried again on a conflict, as a concurrent
    /// writer of the status, the scheduler or another driver, makes one). `Ok(false)`: the
    /// claim is gone or is another one of that name now (not `uid`), nothing to write.
    pub async fn write_device_status(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        entries: &[serde_json::Value],
    ) -> Result<bool, ApiError> {
        let what = || format!("updating the status of ResourceClaim {namespace}/{name}");
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let json = match self.claim_json(namespace, name).await {
                Ok(json) => json,
                Err(e) if e.code() == Some(404) => return Ok(false),
                Err(e) => return Err(e),
            };
            let mut claim: serde_json::Value = serde_json::from_slice(&json).map_err(|e| ApiError::Call {
                what: what(),
                message: format!("the claim read back is not JSON: {}", crate::one_line(&e.to_string())),
            })?;
            if claim["metadata"]["uid"] != uid {
                return Ok(false);
            }
            let Some(status) = claim.get_mut("status").and_then(|s| s.as_object_mut()) else {
                // Not allocated (any more): the API server takes no device status then.
                return Ok(false);
            };
            let before: Vec<serde_json::Value> = status
                .get("devices")
                .and_then(|d| d.as_array())
                .cloned()
                .unwrap_or_default();
            let (ours, mut devices): (Vec<_>, Vec<_>) = before.into_iter().partition(|d| d["driver"] == DRIVER);
            // An entry keeps what this driver wrote of it before and does not write now: the
            // binding conditions set at allocation (super::claim_watch) stay beside the data
            // prepare writes later, and the reverse.
            devices.extend(entries.iter().map(|entry| {
                let mut entry = entry.clone();
                let same = |d: &&serde_json::Value| {
                    d["pool"] == entry["pool"] && d["device"] == entry["device"] && d["shareID"] == entry["shareID"]
                };
                if let (Some(old), Some(fields)) = (ours.iter().find(same), entry.as_object_mut()) {
                    for key in ["conditions", "data"] {
                        if !fields.contains_key(key) {
                            if let Some(value) = old.get(key) {
                                fields.insert(key.to_string(), value.clone());
                            }
                        }
                    }
                }
                entry
            }));
            status.insert("devices".into(), serde_json::Value::Array(devices));
            let body = serde_json::to_vec(&claim).expect("JSON serializes");
            let request = http::Request::put(path.as_str())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(body)
                .map_err(|e| ApiError::Call {
                    what: what(),
                    message: e.to_string(),
                })?;
            match bounded(what, self.client.request_text(request)).await {
                Ok(_) => return Ok(true),
                Err(e) if e.code() == Some(409) && attempt < STATUS_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Every resource claim (RBAC cannot narrow a list to the claims of one node's pool; the
    /// driver keeps those allocated here, [`super::claim_watch`]).
    pub async fn list_claims(&self, params: &ListParams) -> Result<ObjectList<ResourceClaim>, ApiError> {
        let api: Api<ResourceClaim> = Api::all(self.client.clone());
        bounded(|| "listing the resource claims".to_string(), api.list(params)).await
    }

    /// A watch of every resource claim from `version`: the stream ends when the API server
    /// closes it (`params`' timeout, under the client's read timeout).
    pub async fn watch_claims(
        &self,
        params: &WatchParams,
        version: &str,
    ) -> Result<impl tokio_stream::Stream<Item = kube::Result<WatchEvent<ResourceClaim>>> + use<>, ApiError> {
        let api: Api<ResourceClaim> = Api::all(self.client.clone());
        bounded(
            || "watching the resource claims".to_string(),
            api.watch(params, version),
        )
        .await
    }

    /// Creates `event` in its namespace (a pod's notice, [`super::notices`]).
    pub async fn create_event(&self, event: &Event) -> Result<(), ApiError> {
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let on = event.involved_object.name.clone().unwrap_or_default();
        bounded(
            || format!("creating an event on pod {namespace}/{on}"),
            api.create(&PostParams::default(), event),
        )
        .await
        .map(|_| ())
    }

    /// The UID of Node `node`, which the slice's owner reference names.
    pub async fn node_uid(&self, node: &str) -> Result<Option<String>, ApiError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let found = bounded(|| format!("reading Node {node}"), api.get(node)).await?;
        Ok(found.metadata.uid)
    }

    /// This driver's slices of `node`.
    pub async fn slices(&self, node: &str) -> Result<Vec<ResourceSlice>, ApiError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!("spec.driver={DRIVER},spec.nodeName={node}"));
        let list = bounded(
            || format!("listing the ResourceSlices of node {node}"),
            api.list(&params),
        )
        .await?;
        Ok(list.items)
    }

    pub async fn create_slice(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let name = slice.metadata.name.clone().unwrap_or_default();
        bounded(
            || format!("creating ResourceSlice {name}"),
            api.create(&PostParams::default(), slice),
        )
        .await
    }

    /// Replaces the slice; `slice.metadata.resourceVersion` must be the stored one (409 if
    /// someone wrote it since).
    pub async fn replace_slice(&self, slice: &ResourceSlice) -> Result<ResourceSlice, ApiError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let name = slice.metadata.name.clone().unwrap_or_default();
        bounded(
            || format!("replacing ResourceSlice {name}"),
            api.replace(&name, &PostParams::default(), slice),
        )
        .await
    }

    pub async fn delete_slice(&self, name: &str) -> Result<(), ApiError> {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        match bounded(
            || format!("deleting ResourceSlice {name}"),
            api.delete(name, &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
