//! A kubelet as far as device plugins see one, for the device plugin's tests and bench: the
//! Registration service on `<dir>/kubelet.sock`, served from a thread of its own, each
//! registration handed to the caller; its ListAndWatch stream; its checkpoint; and kubelet's
//! restart (every socket in the directory removed, then its own created again).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tonic::{Request, Response, Status};

use vramgate::deviceplugin::api;
use vramgate::deviceplugin::api::device_plugin_client::DevicePluginClient;
use vramgate::deviceplugin::api::registration_server::{Registration, RegistrationServer};

/// kubelet's side of ListAndWatch on the plugin's `socket`, kept open on a thread of its own
/// as kubelet keeps it: each list the plugin sends, with when it arrived. The channel ends
/// when the plugin goes.
pub fn list_and_watch(socket: &Path) -> mpsc::Receiver<(Instant, Vec<api::Device>)> {
    let socket = socket.to_path_buf();
    let (tx, lists) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let channel = vramgate::kubelet::connect(socket).await.unwrap();
            let mut stream = DevicePluginClient::new(channel)
                .list_and_watch(api::Empty {})
                .await
                .unwrap()
                .into_inner();
            while let Ok(Some(list)) = stream.message().await {
                if tx.send((Instant::now(), list.devices)).is_err() {
                    return;
                }
            }
        });
    });
    lists
}

/// kubelet's Registration service: each request it gets goes to the caller.
pub struct Registrar(std::sync::Mutex<mpsc::Sender<api::RegisterRequest>>);

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<api::RegisterRequest>) -> Result<Response<api::Empty>, Status> {
        let _ = self.0.lock().unwrap().send(request.into_inner());
        Ok(Response::new(api::Empty {}))
    }
}

/// A kubelet as far as device plugins see one: the Registration service on
/// `<dir>/kubelet.sock`, served from a thread of its own.
pub struct Kubelet {
    dir: PathBuf,
    registrations: mpsc::Receiver<api::RegisterRequest>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Kubelet {
    pub fn start(dir: &Path) -> Kubelet {
        std::fs::create_dir_all(dir).unwrap();
        let (tx, registrations) = mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let socket = dir.join("kubelet.sock");
        let (bound_tx, bound_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&socket)
                    .unwrap_or_else(|e| panic!("kubelet stand-in: cannot listen on {}: {e}", socket.display()));
                bound_tx.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(RegistrationServer::new(Registrar(std::sync::Mutex::new(tx))))
                    .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        bound_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Kubelet {
            dir: dir.to_path_buf(),
            registrations,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The next registration, within `limit`.
    pub fn registration(&self, limit: Duration) -> api::RegisterRequest {
        self.registrations
            .recv_timeout(limit)
            .unwrap_or_else(|e| panic!("no registration within {limit:?}: {e}"))
    }

    /// What kubelet's device manager does after a successful Allocate: records the
    /// container's devices in its checkpoint, `kubelet_internal_checkpoint` (the layout of
    /// Kubernetes 1.20 and later, NUMA node -1), replacing the file by a rename.
    pub fn checkpoint_allocation(&self, pod_uid: &str, container: &str, resource: &str, ids: &[String]) {
        use vramgate::deviceplugin::checkpoint::KUBELET_CHECKPOINT;
        let path = self.dir.join(KUBELET_CHECKPOINT);
        let mut checkpoint: serde_json::Value = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(
                || serde_json::json!({"Data": {"PodDeviceEntries": [], "RegisteredDevices": {}}, "Checksum": 0}),
            );
        checkpoint["Data"]["PodDeviceEntries"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({
                "PodUID": pod_uid,
                "ContainerName": container,
                "ResourceName": resource,
                "DeviceIDs": {"-1": ids},
                "AllocResp": "",
            }));
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, checkpoint.to_string()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }

    /// What a restarting kubelet does: stops serving, and removes every socket in its
    /// directory (the plugins' too) before it creates its own again. Its checkpoint stays.
    pub fn stop_and_clear(mut self) {
        self.shut_down();
        for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
            if entry.file_name() != vramgate::deviceplugin::checkpoint::KUBELET_CHECKPOINT {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shut_down();
    }
}
