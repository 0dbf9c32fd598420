//! Running the driver: a thread that recomputes the view when the ledger changes and every
//! poll interval, a task that keeps the node's ResourceSlice equal to it, and the two sockets
//! kubelet talks to (registration and the DRA service), served again if they are removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use super::api::registration::registration_server::RegistrationServer;
use super::api::{v1, v1beta1};
use super::kube::{ApiClient, ApiError};
use super::plugin::Preparer;
use super::server::{DraService, Registrar};
use super::slice_view::{held_by_claims, used_by_claims, DraView, Markers, ProductNames, RequestPolicy};
use super::{cdi_spec, slice, DRIVER};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::inventory::Inventory;
use crate::kubelet::socket::{self, inode, Signals};
use crate::kubelet::view_thread::{self, Change, Refresh, StartError};
use crate::kubelet::watchdog::StaleView;
use crate::kubelet::{FileWatch, WatchError};
use crate::ledger::StateDir;
use crate::procfs::ProcLiveness;
use crate::service::Service;

/// How often the publisher reads its slice back even when nothing changed here: kubelet
/// deletes a node's slices when it starts and when a driver deregisters, and an admin may.
pub const RESYNC_EVERY: Duration = Duration::from_secs(30);
/// How soon a failed publish is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often the sockets are checked for removal.
const CHECK_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct Options {
    pub config_path: PathBuf,
    /// This node's name: the pool's and the slice's `nodeName`.
    pub node: String,
    /// kubelet's plugin registration directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The driver's own directory, for the DRA socket (`/var/lib/kubelet/plugins/<driver>`).
    pub plugin_dir: PathBuf,
    /// Where the runtime reads CDI specs (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Where the GPUs' device nodes are (`/dev`).
    pub dev_dir: PathBuf,
    pub kubeconfig: Option<PathBuf>,
    /// vramgate's hook on the host, which each claim's CDI device runs.
    pub hook_path: PathBuf,
    pub policy: RequestPolicy,
    /// Whether the slice's devices carry binding conditions (`--binding-conditions`): the
    /// scheduler then binds a pod only once the driver has reserved its claim here.
    pub binding_conditions: bool,
    pub poll_interval: Duration,
    /// How long to wait for the first view before ending (`--startup-timeout`).
    pub startup_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    #[error(transparent)]
    Api(#[from] ApiError),
    #[error(transparent)]
    Service(#[from] crate::service::ServiceError),
    #[error(transparent)]
    CgroupView(#[from] crate::attribution::ForeignCgroupView),
    #[error("state directory {path} does not exist: run the driver where vramgate's hook keeps its ledger (the package creates /run/vramgate at boot; a DaemonSet must mount the host's state_dir at the same path)")]
    NoStateDir { path: PathBuf },
    #[error(transparent)]
    Watch(#[from] WatchError),
    #[error("cannot serve on {socket}: {message}")]
    Serve { socket: PathBuf, message: String },
    #[error("cannot start the driver's threads: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    FirstView(#[from] crate::kubelet::watchdog::FirstViewError),
    #[error("--cdi-dir {cdi_dir} is not among [enforce] cdi_spec_dirs ({dirs}) of {config}: vramgate's hook and runtime check each claim container's devices against the specs the driver writes there, and would refuse every claim's container; add {cdi_dir} to cdi_spec_dirs, or run the driver with one of those directories")]
    CdiDirUnchecked {
        cdi_dir: PathBuf,
        dirs: String,
        config: PathBuf,
    },
}

type Result<T> = std::result::Result<T, DriverError>;

impl From<StartError<DriverError>> for DriverError {
    fn from(e: StartError<DriverError>) -> Self {
        match e {
            StartError::Open(e) => e,
            StartError::Thread(e) => DriverError::Runtime(e),
            StartError::FirstView(e) => DriverError::FirstView(e),
        }
    }
}

/// Refuses a `--cdi-dir` the hook and the runtime wrapper would not look in: each claim's
/// container is checked against the spec the driver writes there
/// ([`crate::request::prepared_claims::verified_claim_devices`]), so a driver writing elsewhere
/// would see every pod placed and none started. Compared as written and as resolved (a link).
fn checked_cdi_dir(cdi_dir: &Path, config: &Config, config_path: &Path) -> Result<()> {
    let resolved = |p: &Path| std::fs::canonicalize(p).ok();
    let dirs = &config.enforce.cdi_spec_dirs;
    let listed = dirs
        .iter()
        .any(|d| d == cdi_dir || resolved(d).is_some_and(|d| Some(d) == resolved(cdi_dir)));
    if listed {
        return Ok(());
    }
    Err(DriverError::CdiDirUnchecked {
        cdi_dir: cdi_dir.to_path_buf(),
        dirs: crate::cdi_files::dirs_named(dirs),
        config: config_path.to_path_buf(),
    })
}

/// Recomputes the view from the service snapshot.
struct Refresher {
    config_path: PathBuf,
    cdi_dir: PathBuf,
    policy: RequestPolicy,
    binding_conditions: bool,
    inventory: Box<dyn Inventory>,
    products: ProductNames,
    /// The GPUs the product names were last asked for.
    named: std::collections::BTreeSet<String>,
    dir: StateDir,
    markers: Markers,
    earlier: Option<DraView>,
}

impl Refresher {
    fn open(options: &Options) -> Result<(Refresher, FileWatch, ())> {
        let config = Config::load_from(&options.config_path)?;
        checked_cdi_dir(&options.cdi_dir, &config, &options.config_path)?;
        let inventory = crate::inventory::open(&config)?;
        // Where this process cannot tell which container holds which GPU memory, what
        // containers allocated would count twice and the slice would offer less than there is.
        crate::attribution::check_cgroup_namespace(inventory.as_ref())?;
        // Never created here: a directory the driver made itself would hold an empty ledger,
        // and every GPU would look free.
        let dir = StateDir::open_existing(&config.state_dir)?.ok_or_else(|| DriverError::NoStateDir {
            path: config.state_dir.clone(),
        })?;
        let watch = FileWatch::new(dir.path(), &options.config_path)?;
        let products = inventory.product_names();
        let named = products.keys().cloned().collect();
        Ok((
            Refresher {
                config_path: options.config_path.clone(),
                cdi_dir: options.cdi_dir.clone(),
                policy: options.policy,
                binding_conditions: options.binding_conditions,
                inventory,
                products,
                named,
                dir,
                markers: Markers::default(),
                earlier: None,
            },
            watch,
            (),
        ))
    }

    /// The view now; what cannot be read leaves every device without capacity, with the reason.
    fn view(&mut self) -> DraView {
        let view = match self.try_view() {
            Ok(view) => view,
            Err(e) => {
                let earlier = self.earlier.clone().unwrap_or(DraView {
                    devices: Vec::new(),
                    policy: self.policy,
                    error: None,
                    used: Default::default(),
                    enforce: Default::default(),
                    binding_conditions: self.binding_conditions,
                });
                DraView::failed(&earlier, crate::one_line(&e.to_string()))
            }
        };
        self.earlier = Some(view.clone());
        view
    }

    fn try_view(&mut self) -> Result<DraView> {
        // Re-read each time, like every hook: a changed headroom shows at once.
        let config = Config::load_from(&self.config_path)?;
        // The node as the device plugin, `vramgate status` and the metrics measure it.
        let service = Service::new(
            self.dir.clone(),
            self.inventory.as_ref(),
            &SystemClock,
            &ProcLiveness,
            &config,
        );
        let (ledger, report) = service.schedulable()?;
        let prepared = cdi_spec::prepared(&self.cdi_dir);
        let held = held_by_claims(&ledger, &prepared, &mut self.markers, &super::slice_view::read_marker);
        let used = used_by_claims(
            &ledger,
            &report,
            &prepared,
            &mut self.markers,
            &super::slice_view::read_marker,
        );
        let uuids: std::collections::BTreeSet<String> = report.gpus.iter().map(|g| g.gpu.uuid.clone()).collect();
        if !uuids.is_subset(&self.named) {
            // A GPU that appeared since (a MIG device made): ask for the names again, once
            // for this set of GPUs (a GPU the driver cannot name is not asked about again).
            self.products = self.inventory.product_names();
            self.named = uuids;
        }
        let mut view = DraView::compute(&report, &held, self.policy, &self.products);
        view.used = used;
        view.enforce = config.enforce;
        view.binding_conditions = self.binding_conditions;
        Ok(view)
    }
}

/// Runs the driver until SIGTERM or SIGINT.
pub fn run(options: Options) -> Result<()> {
    let config = Config::load_from(&options.config_path)?;
    let hook = super::cdi_spec::HookSpec {
        path: options.hook_path.clone(),
        config: options.config_path.clone(),
        timeout_secs: crate::runtime::hook_timeout_secs(&config),
    };
    let (views, wake) = start_refresher(&options)?;
    // The refresher has checked that the state directory is there: the pods' notices are in it.
    let notice_dir = StateDir::open_existing(&config.state_dir)?;
    let presence_dir = StateDir::open_existing(&config.state_dir)?;
    // The claims' reservations at allocation, on a thread of their own (super::claim_watch).
    let keeper = super::claim_watch::Keeper::start(config.clone())?;
    let claim_views = views.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(DriverError::Runtime)?;
    runtime.block_on(async move {
        let api = ApiClient::connect(options.kubeconfig.as_deref()).await?;
        let notice_api = api.clone();
        let claim_api = api.clone();
        let registered = Arc::new(Notify::new());
        let publisher = tokio::spawn(publish(
            api.clone(),
            options.node.clone(),
            views.clone(),
            registered.clone(),
        ));
        let preparer = Arc::new(Preparer::new(
            api,
            views,
            options.node.clone(),
            options.cdi_dir.clone(),
            options.dev_dir.clone(),
            hook,
        ));
        let statuses = tokio::spawn(super::plugin::refresh_statuses(preparer.clone()));
        let notices =
            notice_dir.map(|dir| tokio::spawn(super::notices::post_notices(notice_api, options.node.clone(), dir)));
        // Its sign of life for the node's ledger: the claims' own reservations outlive a driver
        // gone for good by crate::ledger::DRA_ABSENT_LIMIT only.
        let presence = presence_dir.map(|dir| tokio::spawn(beat_presence(dir)));
        let claims = tokio::spawn(super::claim_watch::keep_claims(
            claim_api,
            options.node.clone(),
            claim_views,
            keeper,
        ));
        let served = serve(&options, preparer, registered).await;
        publisher.abort();
        statuses.abort();
        if let Some(notices) = notices {
            notices.abort();
        }
        claims.abort();
        if let Some(presence) = presence {
            presence.abort();
        }
        drop(wake);
        served
    })
}

/// Writes the driver's heartbeat in the state directory every [`crate::ledger::DRA_BEAT`].
async fn beat_presence(dir: StateDir) {
    loop {
        if let Err(e) = crate::service::beat_dra(&dir, &crate::clock::SystemClock) {
            eprintln!("vramgate-dra: {e}");
        }
        tokio::time::sleep(crate::ledger::DRA_BEAT).await;
    }
}

/// Starts the view thread; returns once the first view is there (or what stopped it).
fn start_refresher(options: &Options) -> Result<(watch::Receiver<Arc<DraView>>, view_thread::Stop)> {
    let opened = options.clone();
    let (views, (), stop) = view_thread::start(
        move || Refresher::open(&opened),
        options.poll_interval,
        options.startup_timeout,
        "vramgate-dra",
    )?;
    Ok((views, stop))
}

impl Refresh for Refresher {
    type View = DraView;

    fn view(&mut self) -> DraView {
        Refresher::view(self)
    }

    /// A change of the slice is logged; what the claims' status says changed too: the status
    /// writer is told (the publisher waits for a change of its own: see `publishable_change`).
    fn change(current: &DraView, next: &DraView) -> Change {
        if !current.publishes_as(next) || current.error != next.error {
            Change::Shown
        } else if current.used != next.used || current.enforce != next.enforce {
            Change::Quiet
        } else {
            Change::Silent
        }
    }
}

impl StaleView for DraView {
    fn is_failed(&self) -> bool {
        self.error.is_some()
    }

    /// Every device without capacity, so none is published.
    fn failed_because(&self, reason: String) -> DraView {
        DraView::failed(self, reason)
    }

    fn log(&self) {
        eprintln!("vramgate-dra: {}", self.describe());
    }
}

/// What the publisher last wrote: the slice it built and the version the API server gave it.
struct Written {
    desired: serde_json::Value,
    resource_version: Option<String>,
}

/// Keeps the node's slice equal to the latest view: after each change, after each
/// registration, and every [`RESYNC_EVERY`]; a failed write is tried again after
/// [`RETRY_AFTER`].
async fn publish(api: ApiClient, node: String, mut views: watch::Receiver<Arc<DraView>>, registered: Arc<Notify>) {
    let mut node_uid: Option<String> = None;
    let mut generation: i64 = 0;
    let mut written: Option<Written> = None;
    loop {
        if node_uid.is_none() {
            match api.node_uid(&node).await {
                Ok(uid) => node_uid = uid,
                Err(e) => eprintln!("vramgate-dra: {e} (the slice is published without an owner until it can be read)"),
            }
        }
        let view = views.borrow_and_update().clone();
        let started = Instant::now();
        let wait = match publish_once(&api, &node, node_uid.as_deref(), &view, &mut generation, &mut written).await {
            Ok(true) => {
                eprintln!(
                    "vramgate-dra: published ResourceSlice {} at pool generation {generation} in {} ms",
                    slice::slice_name(&node),
                    started.elapsed().as_millis()
                );
                RESYNC_EVERY
            }
            Ok(false) => RESYNC_EVERY,
            Err(e) => {
                eprintln!("vramgate-dra: {e}: trying again in {}s", RETRY_AFTER.as_secs());
                written = None;
                RETRY_AFTER
            }
        };
        tokio::select! {
            changed = publishable_change(&mut views, &view) => if changed.is_err() { return },
            _ = registered.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Waits for a view whose slice differs from `published`'s: a view that changed only what
/// the claims' status reports (usage, the tier) is not the publisher's business.
async fn publishable_change(
    views: &mut watch::Receiver<Arc<DraView>>,
    published: &DraView,
) -> std::result::Result<(), watch::error::RecvError> {
    loop {
        views.changed().await?;
        let view = views.borrow().clone();
        if !view.publishes_as(published) || view.error != published.error {
            return Ok(());
        }
    }
}

/// Makes the node's slice that of `view`; `Ok(true)` when it wrote. Slices of this driver
/// and node under another name (an earlier version's) are deleted.
async fn publish_once(
    api: &ApiClient,
    node: &str,
    node_uid: Option<&str>,
    view: &DraView,
    generation: &mut i64,
    written: &mut Option<Written>,
) -> std::result::Result<bool, ApiError> {
    let name = slice::slice_name(node);
    let existing = api.slices(node).await?;
    // Continue from the highest generation there: consumers use only the newest, so a
    // restarted driver must not start again from 1 while its old slice is there.
    let highest = existing
        .iter()
        .filter(|s| s.spec.pool.name == node)
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0);
    for stray in existing
        .iter()
        .filter(|s| s.metadata.name.as_deref() != Some(name.as_str()))
    {
        if let Some(stray) = stray.metadata.name.as_deref() {
            api.delete_slice(stray).await?;
        }
    }
    let ours = existing
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name.as_str()));
    let desired = serde_json::to_value(slice::build(view, node, node_uid, 0)).unwrap_or_default();
    if let (Some(ours), Some(w)) = (ours, written.as_ref()) {
        if w.desired == desired && ours.metadata.resource_version == w.resource_version {
            return Ok(false);
        }
    }
    *generation = (*generation).max(highest) + 1;
    let mut slice = slice::build(view, node, node_uid, *generation);
    let stored = match ours {
        Some(ours) => {
            slice.metadata.resource_version = ours.metadata.resource_version.clone();
            api.replace_slice(&slice).await?
        }
        None => api.create_slice(&slice).await?,
    };
    *written = Some(Written {
        desired,
        resource_version: stored.metadata.resource_version,
    });
    Ok(true)
}

/// The path of the registration socket kubelet's plugin watcher finds.
pub fn registration_socket(registry_dir: &Path) -> PathBuf {
    registry_dir.join(format!("{DRIVER}-reg.sock"))
}

/// The DRA service's socket.
pub fn dra_socket(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join("dra.sock")
}

fn bind(path: &Path) -> Result<tokio::net::UnixListener> {
    let serve_err = |e: std::io::Error| DriverError::Serve {
        socket: path.to_path_buf(),
        message: e.to_string(),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(serve_err)?;
    }
    socket::remove_stale(path).map_err(serve_err)?;
    tokio::net::UnixListener::bind(path).map_err(serve_err)
}

/// Serves the DRA service, then registration (kubelet dials the DRA socket as soon as it has
/// registered the driver), until a signal; both again when either socket is removed.
async fn serve(options: &Options, preparer: Arc<Preparer>, registered: Arc<Notify>) -> Result<()> {
    let mut signals = Signals::new().map_err(DriverError::Runtime)?;
    let dra_path = dra_socket(&options.plugin_dir);
    let reg_path = registration_socket(&options.registry_dir);
    let service = DraService(preparer);
    loop {
        let dra = bind(&dra_path)?;
        let dra_inode = inode(&dra_path);
        let dra_server = socket::serve(
            tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(service.clone()))
                .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(service.clone())),
            dra,
        );
        let reg = bind(&reg_path)?;
        let reg_inode = inode(&reg_path);
        let registrar = Registrar {
            endpoint: dra_path.clone(),
            registered: registered.clone(),
        };
        // kubelet's plugin watcher dials this socket with its path as :authority, which h2
        // refuses (kubelet's DRA client dials dra.sock as `unix:`, so grpc-go sends
        // `localhost` there): the front rewrites it.
        let reg_server = socket::serve_fronted(
            tonic::transport::Server::builder().add_service(RegistrationServer::new(registrar)),
            reg,
        );
        eprintln!(
            "vramgate-dra: serving {DRIVER} on {} (registration {})",
            dra_path.display(),
            reg_path.display()
        );
        let stop = loop {
            tokio::select! {
                _ = signals.recv() => break true,
                _ = tokio::time::sleep(CHECK_EVERY) => {
                    if inode(&dra_path) != dra_inode || inode(&reg_path) != reg_inode {
                        eprintln!("vramgate-dra: a socket was removed: serving again");
                        break false;
                    }
                }
            }
        };
        reg_server.stop().await;
        dra_server.stop().await;
        if stop {
            // Removing the registration socket deregisters the driver; kubelet removes the
            // node's slices if it does not come back.
            for (path, identity) in [(&reg_path, reg_inode), (&dra_path, dra_inode)] {
                socket::remove_if_ours(path, identity);
            }
            eprintln!("vramgate-dra: stopped");
            return Ok(());
        }
    }
}
