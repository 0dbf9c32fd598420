//! Keeping the view current: a thread that owns the inventory, recomputes the view when the
//! ledger is replaced or the config file changes (inotify) and at every poll interval, and
//! hands each view to the server.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::checkpoint;
use super::origin::Origins;
use super::unit_view::{Facts, GpuUnits, NodeView};
use super::{DeviceId, DevicePluginError, Grants, Options, Result, GRANT_GRACE};
use crate::admission::Rules;
use crate::clock::SystemClock;
use crate::config::Config;
use crate::inventory::Inventory;
use crate::kubelet::view_thread::{Change, Refresh};
use crate::ledger::StateDir;
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
}

impl Refresher {
    /// Loads the config, opens the inventory (once: NVML's start is most of a query's cost)
    /// and the state directory, and starts watching it: everything that can fail for good
    /// fails here, at start, where the binary reports it and exits. The caller starts
    /// watching the state directory ([`crate::kubelet::FileWatch`]) right after.
    pub fn open(options: &Options, grants: Arc<Mutex<Grants>>) -> Result<Refresher> {
        let config = Config::load_from(&options.config_path)?;
        let inventory = crate::inventory::open(&config)?;
        // Where this process cannot tell which container holds which GPU memory, what
        // containers allocated would count twice, and as many units show unhealthy.
        crate::attribution::check_cgroup_namespace(inventory.as_ref())?;
        // Never created here: a directory the plugin made itself (a DaemonSet that mounts
        // another path than the config's state_dir) would hold an empty ledger, and every
        // unit would look free.
        let dir = StateDir::open_existing(&config.state_dir)?.ok_or_else(|| DevicePluginError::NoStateDir {
            path: config.state_dir.clone(),
        })?;
        Ok(Refresher {
            config_path: options.config_path.clone(),
            options: options.clone(),
            inventory,
            dir,
            origins: Origins::default(),
            grants,
            earlier: Vec::new(),
            rules: Rules::from_config(&config),
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
}

impl Refresh for Refresher {
    type View = NodeView;

    fn view(&mut self) -> NodeView {
        Refresher::view(self)
    }

    /// Only a change of what kubelet sees wakes the ListAndWatch streams; the rest (the
    /// inventory's numbers for placement) is replaced silently.
    fn change(current: &NodeView, next: &NodeView) -> Change {
        if current.devices != next.devices || current.error != next.error {
            Change::Shown
        } else {
            Change::Silent
        }
    }
}
