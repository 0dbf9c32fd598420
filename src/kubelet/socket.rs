//! The unix sockets a kubelet plugin serves on and dials, and the gRPC servers on them:
//! replacing a socket an earlier run left, telling our socket from one that replaced it,
//! serving until told to stop, and the signals that stop a plugin.

use std::io;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_stream::wrappers::UnixListenerStream;

/// Removes the socket at `path` that an earlier run left (or that kubelet already removed):
/// it is ours to replace.
pub fn remove_stale(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The socket file's inode, to tell our socket from one that replaced it.
pub fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| m.ino())
}

/// Removes the socket at `path` when it is still the one bound as `identity` ([`inode`]): a
/// socket another process put there since is not ours to remove.
pub fn remove_if_ours(path: &Path, identity: Option<u64>) {
    if inode(path) == identity {
        let _ = std::fs::remove_file(path);
    }
}

/// A gRPC channel over the unix socket at `path`.
pub async fn connect(path: PathBuf) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::try_from("http://[::]:0")
        .expect("a static, valid URI")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
}

/// A gRPC server on a unix socket, served on a task of its own until [`Served::stop`].
pub struct Served(tokio::task::JoinHandle<Result<(), tonic::transport::Error>>);

/// Serves `router`'s services on `listener`.
pub fn serve(router: tonic::transport::server::Router, listener: UnixListener) -> Served {
    Served(tokio::spawn(
        router.serve_with_incoming(UnixListenerStream::new(listener)),
    ))
}

/// Serves `router`'s services on `listener` behind [`super::authority::front`]: each accepted
/// connection is passed through it to the server over an in-process pipe, so a client that
/// sends a socket path as `:authority` (kubelet's plugin watcher) is served, and nothing but
/// the front reaches the server (there is no second socket).
#[cfg(feature = "dra")]
pub fn serve_fronted(router: tonic::transport::server::Router, listener: UnixListener) -> Served {
    use tokio_stream::wrappers::ReceiverStream;
    // A connection's pipe buffer: gRPC messages of the registration API are a few hundred
    // bytes; a bigger one only waits for the server to read.
    const PIPE: usize = 64 * 1024;
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<tokio::io::DuplexStream>>(16);
    let accept = async move {
        loop {
            let client = match listener.accept().await {
                Ok((client, _)) => client,
                Err(e) => {
                    // Out of descriptors, say: the next accept may succeed; a pause keeps it
                    // from spinning.
                    eprintln!("vramgate: accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (outer, inner) = tokio::io::duplex(PIPE);
            if tx.send(Ok(inner)).await.is_err() {
                return;
            }
            tokio::spawn(async move {
                if let Err(e) = super::authority::front(client, outer).await {
                    eprintln!("vramgate: a connection closed at a malformed frame: {e}");
                }
            });
        }
    };
    Served(tokio::spawn(async move {
        tokio::select! {
            served = router.serve_with_incoming(ReceiverStream::new(rx)) => served,
            () = accept => Ok(()),
        }
    }))
}

impl Served {
    /// Stops serving (connections in flight end with it) and waits until the task is gone.
    pub async fn stop(self) {
        self.0.abort();
        let _ = self.0.await;
    }
}

/// SIGTERM and SIGINT, which end a plugin.
pub struct Signals {
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    pub fn new() -> io::Result<Signals> {
        Ok(Signals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for either.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
