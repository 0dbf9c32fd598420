//! A kubelet as far as device plugins see one, for the device plugin's tests and bench: the
//! Registration service on `<dir>/kubelet.sock`, served from a thread of its own, each
//! registration handed to the caller; and kubelet's restart (every socket in the directory
//! removed, then its own created again).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::deviceplugin::api;
use crate::deviceplugin::api::registration_server::{Registration, RegistrationServer};

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

    /// What a restarting kubelet does: stops serving, and removes every socket in its
    /// directory (the plugins' too) before it creates its own again.
    pub fn stop_and_clear(mut self) {
        self.shut_down();
        for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
            let _ = std::fs::remove_file(entry.path());
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
