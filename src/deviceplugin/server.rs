//! The gRPC side: the `DevicePlugin` service kubelet calls, registration with kubelet's
//! `Registration` service, and serving again when kubelet restarts.

use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use super::api::registration_client::RegistrationClient;
use super::refresh::Refresher;
use super::unit_view::NodeView;
use super::{allocate, api, DevicePluginError, Grants, Options, Result, API_VERSION, KUBELET_SOCKET};
use crate::kubelet::socket::{self, connect, inode, Signals};
use crate::kubelet::watchdog::StaleView;
use crate::kubelet::{view_thread, FileWatch, WatchError};
use crate::ledger::StateDir;

/// How often the plugin checks that its socket is still there (a restarting kubelet removes
/// it) and retries a registration that found no kubelet.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The deadline on one registration call.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// The `DevicePlugin` service: answers from the latest view.
#[derive(Clone)]
pub struct Plugin {
    views: watch::Receiver<Arc<NodeView>>,
    grants: Arc<Mutex<Grants>>,
    options: Arc<Options>,
    dir: StateDir,
}

impl Plugin {
    pub fn new(
        views: watch::Receiver<Arc<NodeView>>,
        grants: Arc<Mutex<Grants>>,
        options: Options,
        dir: StateDir,
    ) -> Plugin {
        Plugin {
            views,
            grants,
            options: Arc::new(options),
            dir,
        }
    }

    fn view(&self) -> Arc<NodeView> {
        self.views.borrow().clone()
    }
}

fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

type DeviceStream = Pin<Box<dyn Stream<Item = std::result::Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> std::result::Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    /// The devices now, then again each time their health changes, for as long as kubelet
    /// listens.
    // The stream's items are tonic's `Result<_, Status>`: its size is tonic's to choose.
    #[allow(clippy::result_large_err)]
    async fn list_and_watch(&self, _: Request<api::Empty>) -> std::result::Result<Response<DeviceStream>, Status> {
        let stream = tokio_stream::wrappers::WatchStream::new(self.views.clone()).map(|view| {
            Ok(api::ListAndWatchResponse {
                devices: view.devices.clone(),
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> std::result::Result<Response<api::PreferredAllocationResponse>, Status> {
        let view = self.view();
        // The live ledger, as the runtime wrapper would see it now; the view's own copy is up
        // to a poll interval old only for the inventory.
        let ledger = self
            .dir
            .read()
            .map_err(|e| Status::unavailable(format!("vramgate: {e}")))?;
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| api::ContainerPreferredAllocationResponse {
                device_i_ds: allocate::preferred(
                    &view,
                    &ledger,
                    &self.options.unit,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                ),
            })
            .collect();
        Ok(Response::new(api::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> std::result::Result<Response<api::AllocateResponse>, Status> {
        let view = self.view();
        let mut container_responses = Vec::new();
        let mut granted = Vec::new();
        for c in &request.get_ref().container_requests {
            let (response, ids) = allocate::allocate(&view, &self.options.unit, &c.devices_ids, &self.options.dev_dir)
                .map_err(|e| Status::invalid_argument(format!("vramgate: {e}")))?;
            container_responses.push(response);
            granted.extend(ids);
        }
        self.grants
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(&granted, Instant::now());
        Ok(Response::new(api::AllocateResponse { container_responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> std::result::Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// Runs the plugin until SIGTERM or SIGINT: computes views on a thread of its own, serves
/// them on a socket in kubelet's directory, registers, and serves and registers again each
/// time kubelet restarts.
pub fn run(options: Options) -> Result<()> {
    let grants = Arc::new(Mutex::new(Grants::default()));
    let (views, dir, _stop) = start_refresher(&options, grants.clone())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DevicePluginError::Runtime)?;
    let plugin = Plugin::new(views, grants, options.clone(), dir);
    runtime.block_on(serve_and_register(plugin, options))
}

/// Starts the thread that computes views; returns once the first one is there (or what
/// stopped it from starting), with the state directory it reads.
fn start_refresher(
    options: &Options,
    grants: Arc<Mutex<Grants>>,
) -> Result<(watch::Receiver<Arc<NodeView>>, StateDir, view_thread::Stop)> {
    let opened = options.clone();
    let open = move || -> Result<(Refresher, FileWatch, StateDir)> {
        let refresher = Refresher::open(&opened, grants)?;
        let watch = FileWatch::new(refresher.state_dir().path(), &opened.config_path)?;
        let dir = refresher.state_dir().clone();
        Ok((refresher, watch, dir))
    };
    Ok(view_thread::start(
        open,
        options.poll_interval,
        options.startup_timeout,
        "vramgate-device-plugin",
    )?)
}

impl StaleView for NodeView {
    fn is_failed(&self) -> bool {
        self.error.is_some()
    }

    /// Every unit unhealthy.
    fn failed_because(&self, reason: String) -> NodeView {
        NodeView::failed(&self.gpus, self.rules, reason)
    }

    fn log(&self) {
        for line in &self.left_out {
            eprintln!("vramgate-device-plugin: left out {line}");
        }
        eprintln!(
            "vramgate-device-plugin: {} healthy units: {}",
            self.healthy_units(),
            self.describe()
        );
    }
}

/// What ends one round of serving.
enum Next {
    /// kubelet (re)started, or our socket was removed: serve on a new socket and register.
    Again,
    Stop,
}

async fn serve_and_register(plugin: Plugin, options: Options) -> Result<()> {
    let dir_err = |source| DevicePluginError::PluginDir {
        path: options.plugin_dir.clone(),
        source,
    };
    let mut signals = Signals::new().map_err(DevicePluginError::Runtime)?;
    let mut kubelet_started = watch_for_kubelet(&options.plugin_dir)?;
    let socket = options.plugin_dir.join(options.unit.socket_name());
    loop {
        socket::remove_stale(&socket).map_err(dir_err)?;
        let listener = tokio::net::UnixListener::bind(&socket).map_err(|e| DevicePluginError::Serve {
            socket: socket.clone(),
            message: e.to_string(),
        })?;
        let identity = inode(&socket);
        let server = socket::serve(
            tonic::transport::Server::builder().add_service(DevicePluginServer::new(plugin.clone())),
            listener,
        );
        eprintln!(
            "vramgate-device-plugin: serving {} on {}",
            options.unit.resource_name(),
            socket.display()
        );
        let mut registered = false;
        let next = loop {
            if !registered {
                // Bounded: a kubelet.sock whose owner accepts but never answers must not keep
                // the plugin from its signals and from kubelet's next start.
                registered = match tokio::time::timeout(REGISTER_TIMEOUT, register(&options)).await {
                    Ok(result) => result?,
                    Err(_) => {
                        eprintln!(
                            "vramgate-device-plugin: kubelet at {} did not answer the registration within {REGISTER_TIMEOUT:?}: trying again",
                            options.plugin_dir.join(KUBELET_SOCKET).display()
                        );
                        false
                    }
                };
            }
            tokio::select! {
                _ = signals.recv() => break Next::Stop,
                Some(()) = kubelet_started.recv() => {
                    eprintln!("vramgate-device-plugin: kubelet's socket was created: registering again");
                    break Next::Again;
                }
                _ = tokio::time::sleep(CHECK_EVERY) => {
                    if inode(&socket) != identity {
                        eprintln!("vramgate-device-plugin: {} was removed (kubelet restarting?): serving again", socket.display());
                        break Next::Again;
                    }
                }
            }
        };
        server.stop().await;
        if let Next::Stop = next {
            socket::remove_if_ours(&socket, identity);
            eprintln!("vramgate-device-plugin: stopped");
            return Ok(());
        }
    }
}

/// Registers with kubelet. `Ok(false)`: no kubelet answers yet (it registers when kubelet's
/// socket appears); `Err`: kubelet refused, and a plugin kubelet refuses must stop.
async fn register(options: &Options) -> Result<bool> {
    let kubelet = options.plugin_dir.join(KUBELET_SOCKET);
    let channel = match connect(kubelet.clone()).await {
        Ok(channel) => channel,
        Err(_) => return Ok(false),
    };
    let mut request = Request::new(api::RegisterRequest {
        version: API_VERSION.to_string(),
        endpoint: options.unit.socket_name(),
        resource_name: options.unit.resource_name().to_string(),
        options: Some(options_for_kubelet()),
    });
    request.set_timeout(REGISTER_TIMEOUT);
    match RegistrationClient::new(channel).register(request).await {
        Ok(_) => {
            eprintln!(
                "vramgate-device-plugin: registered {} with kubelet at {}",
                options.unit.resource_name(),
                kubelet.display()
            );
            Ok(true)
        }
        // The socket is there but nobody answers on it (a stale file of a stopped kubelet).
        Err(status) if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) => Ok(false),
        Err(status) => Err(DevicePluginError::Register {
            socket: kubelet,
            resource: options.unit.resource_name().to_string(),
            message: crate::one_line(status.message()),
        }),
    }
}

fn options_for_kubelet() -> api::DevicePluginOptions {
    options()
}

/// Reports each creation of kubelet's socket in `dir` (kubelet starting or restarting), from
/// a thread blocked on inotify.
fn watch_for_kubelet(dir: &Path) -> Result<mpsc::UnboundedReceiver<()>> {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let watch_err = |source| WatchError {
        path: dir.to_path_buf(),
        source,
    };
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(watch_err)?;
    inotify
        .add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
        .map_err(watch_err)?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("kubelet-watch".into())
        .spawn(move || loop {
            let Ok(events) = inotify.read_events() else { return };
            let kubelet = events
                .iter()
                .any(|e| e.name.as_deref() == Some(std::ffi::OsStr::new(KUBELET_SOCKET)));
            if kubelet && tx.send(()).is_err() {
                return;
            }
        })
        .map_err(DevicePluginError::Runtime)?;
    Ok(rx)
}
