//! Posts the node's pod notices ([`crate::pod_notice`]) as Warning events on their pods: the
//! one line a pod's author sees (`kubectl describe pod`, `kubectl get events`) when the pod asks
//! for GPU memory but a container of it was given no GPU. The driver is the node's one
//! component with an API client; the hook and the runtime wrapper that find such a container
//! have none, and leave the notice in the state directory for it.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::kube::ApiClient;
use crate::ledger::StateDir;
use crate::pod_notice::{self, PodNotice};

/// How often the state directory is looked at for notices: a notice waits at most this long
/// (plus the API call) before it shows in the pod's events. A directory listing, cheap.
pub const NOTICE_POLL: Duration = Duration::from_secs(2);

/// The event for `notice`, as kubelet writes its own: on the pod (by uid, so that
/// `kubectl describe pod` shows it), from this driver on `node`.
pub fn event_of(notice: &PodNotice, node: &str) -> Event {
    let now = k8s_openapi::jiff::Timestamp::now();
    Event {
        metadata: ObjectMeta {
            // client-go's form: the object's name and the time in hex nanoseconds.
            name: Some(format!("{}.{:x}", notice.pod, now.as_nanosecond())),
            namespace: Some(notice.namespace.clone()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(notice.namespace.clone()),
            name: Some(notice.pod.clone()),
            uid: Some(notice.uid.clone()),
            field_path: Some(format!("spec.containers{{{}}}", notice.container)),
            ..ObjectReference::default()
        },
        reason: Some(pod_notice::REASON.into()),
        message: Some(notice.message.clone()),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some(super::DRIVER.into()),
            host: Some(node.into()),
        }),
        reporting_component: Some(super::DRIVER.into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        count: Some(1),
        ..Event::default()
    }
}

/// Posts every notice waiting, for as long as the driver runs. A notice the API server took,
/// or refused for good (a 4xx: its namespace is gone, or the policy refused it), is removed; one
/// that met no answer or a server error stays for the next round.
pub async fn post_notices(api: ApiClient, node: String, dir: StateDir) {
    let mut ticks = tokio::time::interval(NOTICE_POLL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        for (file, notice) in pod_notice::take(&dir) {
            match api.create_event(&event_of(&notice, &node)).await {
                Ok(()) => pod_notice::remove(&dir, &file),
                Err(e) if e.code().is_some_and(|c| (400..500).contains(&c) && c != 429) => {
                    eprintln!(
                        "vramgate-dra: the notice for pod {}/{} was refused, dropped: {e}",
                        notice.namespace, notice.pod
                    );
                    pod_notice::remove(&dir, &file);
                }
                Err(e) => eprintln!(
                    "vramgate-dra: the notice for pod {}/{} is kept for the next try: {e}",
                    notice.namespace, notice.pod
                ),
            }
        }
    }
}
