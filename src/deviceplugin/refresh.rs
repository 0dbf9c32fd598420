//! Keeping the view current: a thread that owns the inventory, recomputes the view when the
//! ledger is replaced or the config file changes (inotify) and at every poll interval, and
//! hands each view to the server.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use super::checkpoint;
use super::origin::Origins;
use super::view::{Facts, GpuUnits, NodeView};
use super::{DeviceId, DevicePluginError, Grants, Options, Result, GRANT_GRACE};
use crate::admission::Rules;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::inventory::Inventory;
use crate::ledger::{StateDir, LEDGER_FILE};
use crate::procfs::ProcLiveness;
use crate::service::Service;

/// Computes views; lives on its own thread (the inventory is not shared between threads).
pub struct Refresher {
    config_path: PathBuf,
    options: Options,
    inventory: Box<dyn Inventory>,
    dir: StateDir,
    origins: Origins,
    grants: Arc<Mutex<Grants>>,
    earlier: Vec<GpuUnits>,
    rules: Rules,
    watch: FileWatch,
}

impl Refresher {
    /// Loads the config, opens the inventory (once: NVML's start is most of a query's cost)
    /// and the state directory, and starts watching it: everything that can fail for good
    /// fails here, at start, where the binary reports it and exits.
    pub fn open(options: &Options, grants: Arc<Mutex<Grants>>) -> Result<Refresher> {
        let config = Config::load_from(&options.config_path)?;
        let inventory = crate::inventory::open(&config)?;
        // Never created here: a directory the plugin made itself (a DaemonSet that mounts
        // another path than the config's state_dir) would hold an empty ledger, and every
        // unit would look free.
        let dir = StateDir::open_existing(&config.state_dir)?.ok_or_else(|| DevicePluginError::NoStateDir {
            path: config.state_dir.clone(),
        })?;
        let watch = FileWatch::new(dir.path(), &options.config_path)?;
        Ok(Refresher {
            config_path: options.config_path.clone(),
            options: options.clone(),
            inventory,
            dir,
            origins: Origins::default(),
            grants,
            earlier: Vec::new(),
            rules: Rules::from_config(&config),
            watch,
        })
    }

    pub fn state_dir(&self) -> &StateDir {
        &self.dir
    }

    /// The view now. What cannot be read makes every unit unhealthy, with the reason.
    pub fn view(&mut self) -> NodeView {
        let view = match self.try_view() {
            Ok(view) => view,
            Err(e) => NodeView::failed(&self.earlier, self.rules, crate::one_line(&e.to_string())),
        };
        self.earlier = view.gpus.clone();
        view
    }

    fn try_view(&mut self) -> Result<NodeView> {
        // Re-read each time, like every hook: a changed headroom shows at once.
        let config = Config::load_from(&self.config_path)?;
        self.rules = Rules::from_config(&config);
        // Measured as `vramgate status`, the metrics and the DRA driver measure: one service
        // snapshot, one accounting (crate::admission::account, on the same attribution).
        let service = Service::new(
            self.dir.clone(),
            self.inventory.as_ref(),
            &SystemClock,
            &ProcLiveness,
            &config,
        );
        let (ledger, report) = service.schedulable()?;
        self.origins.retain(&ledger);
        let (snapshot, allocated) = (report.snapshot, report.allocated);
        let unit = self.options.unit.clone();
        // The units a container's marker may name: those kubelet's checkpoint lists as
        // allocated, and those this plugin granted and has not seen reserved yet.
        let mut vouched = checkpoint::allocated_ids(&self.options.plugin_dir, unit.resource_name());
        vouched.extend(self.grants.lock().unwrap_or_else(|e| e.into_inner()).ids().cloned());
        let vouched = |id: &DeviceId| vouched.contains(id);
        let plugin_held: Vec<Vec<DeviceId>> = ledger
            .reservations
            .iter()
            .filter_map(|r| self.origins.held(r, &unit, &vouched))
            .collect();
        let reserved: BTreeSet<DeviceId> = plugin_held.iter().flatten().cloned().collect();
        let granted =
            self.grants
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pending(Instant::now(), GRANT_GRACE, &reserved);
        let facts = Facts {
            snapshot: &snapshot,
            ledger: &ledger,
            allocated: &allocated,
            rules: &self.rules,
            unit: &unit,
            granted: &granted,
            plugin_held: &plugin_held,
        };
        Ok(NodeView::compute(&facts, &self.earlier))
    }

    /// Recomputes the view after every change of the ledger or the config file, and at least
    /// every poll interval, handing each to `publish`; returns only when `publish` says stop.
    pub fn run(mut self, mut publish: impl FnMut(NodeView) -> bool) {
        loop {
            self.watch.wait(self.options.poll_interval);
            if !publish(self.view()) {
                return;
            }
        }
    }
}

/// inotify on the state directory (the ledger is replaced by a rename) and on the config
/// file's directory (editors and tests replace or rewrite it). The DRA driver's view waits on
/// the same watch.
pub(crate) struct FileWatch {
    inotify: Inotify,
    config_name: Option<OsString>,
}

impl FileWatch {
    pub(crate) fn new(state_dir: &Path, config: &Path) -> Result<FileWatch> {
        let watch_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| DevicePluginError::Watch { path, source }
        };
        // The same events on both: when the config sits in the state directory, the second
        // watch replaces the first.
        let events = AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE;
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC).map_err(watch_err(state_dir))?;
        inotify.add_watch(state_dir, events).map_err(watch_err(state_dir))?;
        // A config in a directory that does not exist (defaults apply) has nothing to watch.
        let config_dir = config.parent().filter(|d| d.is_dir());
        if let Some(dir) = config_dir {
            inotify.add_watch(dir, events).map_err(watch_err(dir))?;
        }
        Ok(FileWatch {
            inotify,
            config_name: config_dir.and(config.file_name().map(OsString::from)),
        })
    }

    /// Waits up to `timeout` for the ledger or the config file to change.
    pub(crate) fn wait(&mut self, timeout: Duration) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let millis = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(millis)) {
                Ok(0) => return,
                Ok(_) => {}
                // A signal: look again. Any other failure: the poll interval alone paces us.
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => {
                    std::thread::sleep(left);
                    return;
                }
            }
            let Ok(events) = self.inotify.read_events() else { return };
            let ledger = std::ffi::OsStr::new(LEDGER_FILE);
            if events
                .iter()
                .any(|e| e.name.as_deref() == Some(ledger) || e.name.as_deref() == self.config_name.as_deref())
            {
                return;
            }
        }
    }
}
