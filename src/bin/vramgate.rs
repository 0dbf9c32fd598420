//! The administrator's CLI: parse, dispatch, set the exit code.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use vramgate::cli::{Cli, Command, LedgerCommand};
use vramgate::clock::SystemClock;
use vramgate::config::{self, Config};
use vramgate::inventory::NotNeeded;
use vramgate::ledger::StateDir;
use vramgate::procfs::ProcLiveness;
use vramgate::quantity::format_bytes;
use vramgate::service::Service;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Exporter { .. } | Command::Watch) {
        quiet_on_closed_stdout();
    }
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("vramgate: {}", vramgate::cli::error_line(&e));
            ExitCode::from(1)
        }
    }
}

/// A command that prints and ends (`status`, `replay --json`, `ledger show`...) piped into
/// `head` ends as every Unix tool does when the reader goes: by SIGPIPE, quietly. Rust ignores
/// SIGPIPE, so `println!` would panic on the closed pipe instead. The long-running commands
/// (the exporter, `watch`) keep it ignored: a client that hangs up is an error to handle, not
/// the end of the process.
fn quiet_on_closed_stdout() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: called first thing in main, before any thread starts; SIG_DFL installs no
    // handler code.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

fn run(cli: Cli) -> Result<ExitCode> {
    // `--config` wins over $VRAMGATE_CONFIG; every command below gets the path from here.
    let config_path = cli.config.clone().unwrap_or_else(config::path_from_env);
    let config_path = config_path.as_path();
    match cli.command {
        Command::Status {
            container,
            json,
            watch,
            interval,
            record,
            note,
        } => match (watch || interval.is_some(), record) {
            (true, Some(_)) => anyhow::bail!("--record takes one snapshot: leave out --watch and -n"),
            (true, None) => watch_status(
                config_path,
                container.as_deref(),
                json,
                interval.unwrap_or(vramgate::cli::WATCH_INTERVAL),
            ),
            (false, record) => status(config_path, container.as_deref(), json, record.as_deref(), &note),
        },
        Command::Doctor { json } => {
            let report = vramgate::doctor::run(&vramgate::doctor::Paths::host(config_path.to_path_buf()));
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", vramgate::doctor::render(&report));
            }
            Ok(if report.problems() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Release { container_id } => release(config_path, &container_id),
        Command::Gc => gc(config_path),
        Command::Metrics { textfile_dir } => metrics(config_path, textfile_dir.as_deref()),
        Command::Exporter { listen } => exporter(config_path, &listen),
        Command::Watch => {
            // Keeps what attribution and stopping a container need, nothing else.
            vramgate::privilege::drop_for_watch()?;
            eprintln!("vramgate watch: watching {}", config_path.display());
            // It returns only where it cannot judge at all, with the line that says why.
            Err(vramgate::over_use::run(config_path, |line| eprintln!("{line}")).into())
        }
        Command::Ledger {
            command: LedgerCommand::Show,
        } => {
            let config = Config::load_from(config_path)?;
            let ledger = match StateDir::open_existing(&config.state_dir)? {
                Some(dir) => dir.read()?,
                None => Default::default(),
            };
            println!("{}", serde_json::to_string_pretty(&ledger)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Ledger {
            command: LedgerCommand::Repair,
        } => {
            let config = Config::load_from(config_path)?;
            let dir = StateDir::open_or_create(&config.state_dir)?;
            match dir.read() {
                Ok(_) => println!("ledger {} is readable; nothing to repair", dir.ledger_path().display()),
                Err(e) => {
                    println!("ledger problem: {e}");
                    match dir.repair()? {
                        Some(aside) => println!("set the old ledger aside as {} and started an empty one; reservations of running containers are lost: restart them or release by hand", aside.display()),
                        None => println!("started an empty ledger"),
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Setup(args) => setup(config_path, &args),
        Command::SetupNode(args) => setup_node(config_path, &args),
        Command::Replay(args) => replay(config_path, &args),
    }
}

fn status(
    config_path: &Path,
    container: Option<&str>,
    json: bool,
    record: Option<&Path>,
    note: &str,
) -> Result<ExitCode> {
    let config = Config::load_from(config_path)?;
    let inventory = attributing_inventory(&config)?;
    let ledger = read_ledger(&config)?;
    if let Some(path) = record {
        let host = vramgate::inventory::RecordedHost::capture(inventory.as_ref(), &ledger, note)?;
        std::fs::write(path, serde_json::to_vec_pretty(&host)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    match status_text(&config, inventory.as_ref(), &ledger, container, json)? {
        Ok(text) => {
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            eprintln!("vramgate: {why}");
            Ok(ExitCode::from(1))
        }
    }
}

/// The inventory of a command that shows who holds what (status, metrics), refused where this
/// process cannot tell which container a GPU process is
/// ([`vramgate::attribution::check_cgroup_namespace`]): it would show all of it as used
/// outside vramgate.
fn attributing_inventory(config: &Config) -> Result<Box<dyn vramgate::inventory::Inventory>> {
    let inventory = vramgate::inventory::open(config)?;
    vramgate::attribution::check_cgroup_namespace(inventory.as_ref())?;
    Ok(inventory)
}

/// The ledger as it stands (an empty one when nothing was ever reserved on this host).
fn read_ledger(config: &Config) -> Result<vramgate::ledger::Ledger> {
    Ok(match StateDir::open_existing(&config.state_dir)? {
        Some(dir) => dir.read()?,
        None => Default::default(),
    })
}

/// What `vramgate status [NAME|ID] [--json]` prints for `ledger`, or the one line saying why
/// the container asked for cannot be shown (the matches of an ambiguous name come before it).
fn status_text(
    config: &Config,
    inventory: &dyn vramgate::inventory::Inventory,
    ledger: &vramgate::ledger::Ledger,
    container: Option<&str>,
    json: bool,
) -> Result<std::result::Result<String, String>> {
    // The report the service's snapshot builds, on the ledger just read.
    let mut report = vramgate::status::build(config, inventory, ledger)?;
    if let Some(who) = container {
        match found(ledger, who) {
            Ok(id) => vramgate::status::only(&mut report, &id),
            Err(why) => return Ok(Err(why)),
        }
    }
    Ok(Ok(if json {
        format!("{}\n", serde_json::to_string_pretty(&report)?)
    } else {
        vramgate::status::render(&report)
    }))
}

/// The container id `who` names in `ledger`, or the line that says why there is none; an
/// ambiguous name's matches are printed first, one a line.
fn found(ledger: &vramgate::ledger::Ledger, who: &str) -> std::result::Result<String, String> {
    use vramgate::ledger::Found;
    match ledger.find_container(who) {
        Found::Id(id) => Ok(id),
        Found::Nothing => Err(format!(
            "no container named or numbered {who:?} holds a reservation or waits; `vramgate status` lists them"
        )),
        Found::Ambiguous(matches) => {
            for (id, name) in &matches {
                println!("{id}  {name}");
            }
            Err(format!(
                "{} containers are named {who:?} (listed above): give the container id instead",
                matches.len()
            ))
        }
    }
}

/// `vramgate status --watch`: the table again every `interval` until Ctrl-C, drawn over the
/// last one on a terminal, one after another elsewhere. A snapshot that fails is shown in its
/// frame and the watch goes on: the next one may succeed (a GPU back, a ledger repaired).
fn watch_status(
    config_path: &Path,
    container: Option<&str>,
    json: bool,
    interval: std::time::Duration,
) -> Result<ExitCode> {
    use std::io::{IsTerminal, Write};
    let config = Config::load_from(config_path)?;
    let inventory = attributing_inventory(&config)?;
    let terminal = std::io::stdout().is_terminal();
    let mut what = String::from("vramgate status");
    if let Some(who) = container {
        what = format!("{what} {who}");
    }
    loop {
        let body = read_ledger(&config)
            .and_then(|ledger| status_text(&config, inventory.as_ref(), &ledger, container, json))
            .map(|text| text.unwrap_or_else(|why| format!("vramgate: {why}\n")))
            .unwrap_or_else(|e| format!("vramgate: {}\n", vramgate::cli::error_line(&e)));
        let now = vramgate::runtime::runc_log::rfc3339_now();
        let header = format!("Every {:.1}s: {what}    {}Z", interval.as_secs_f64(), &now[..19]);
        let mut out = std::io::stdout().lock();
        out.write_all(vramgate::status::watch_frame(&header, &body, terminal).as_bytes())?;
        out.flush()?;
        drop(out);
        std::thread::sleep(interval);
    }
}

/// The service for commands that change the ledger but never read the GPUs.
fn ledger_service<'a>(config: &'a Config, dir: StateDir) -> Service<'a> {
    Service::new(dir, &NotNeeded, &SystemClock, &ProcLiveness, config)
}

fn metrics(config_path: &Path, textfile_dir: Option<&Path>) -> Result<ExitCode> {
    let config = Config::load_from(config_path)?;
    let inventory = attributing_inventory(&config)?;
    // On failure nothing is written: node_exporter keeps the last file, and its
    // vramgate_snapshot_timestamp_seconds stops advancing, which the shipped alerts watch.
    let text = vramgate::metrics::snapshot(&config, inventory.as_ref())?;
    match textfile_dir {
        Some(dir) => {
            vramgate::metrics::write_textfile(dir, &text)?;
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn exporter(config_path: &Path, listen: &str) -> Result<ExitCode> {
    // A long-running network-facing daemon keeps only what a snapshot needs, the hook's one
    // capability (reading containers' pid namespaces for attribution). Capabilities are per
    // thread, so this comes before the HTTP server starts its threads.
    vramgate::privilege::drop_for_hook()?;
    let exporter = vramgate::exporter::Exporter::bind(listen, config_path.to_path_buf())?;
    eprintln!(
        "vramgate exporter: serving http://{}{}",
        exporter.local_addr(),
        vramgate::exporter::METRICS_PATH
    );
    exporter.serve()?;
    Ok(ExitCode::SUCCESS)
}

fn release(config_path: &Path, who: &str) -> Result<ExitCode> {
    vramgate::spec::validate_container_id(who)?;
    let config = Config::load_from(config_path)?;
    let Some(dir) = StateDir::open_existing(&config.state_dir)? else {
        eprintln!(
            "vramgate: no reservation for container {who:?} (no state directory {})",
            config.state_dir.display()
        );
        return Ok(ExitCode::from(1));
    };
    // A name leads to an id here, read without the lock; the release itself is by id, so a
    // container that left meanwhile is reported as not found, never another released.
    let ledger = dir.read()?;
    let container_id = match ledger.find_container(who) {
        // Released by the word given, whose "no reservation" the release below reports.
        vramgate::ledger::Found::Nothing => who.to_string(),
        _ => match found(&ledger, who) {
            Ok(id) => id,
            Err(why) => {
                eprintln!("vramgate: {why}");
                return Ok(ExitCode::from(1));
            }
        },
    };
    let container_id = container_id.as_str();
    let released = ledger_service(&config, dir)
        .release(container_id, None, "vramgate release")
        .context("releasing")?;
    for t in &released.cancelled {
        println!(
            "cancelled the wait of {container_id} (queue ticket {}): its start is refused",
            t.ticket
        );
    }
    match released.reservation {
        Some(r) => {
            let gpus: Vec<String> = r
                .gpus
                .iter()
                .map(|g| format!("{} on {}", format_bytes(g.bytes), g.uuid))
                .collect();
            println!("released {container_id}: {}", gpus.join(", "));
            Ok(ExitCode::SUCCESS)
        }
        None if !released.cancelled.is_empty() => Ok(ExitCode::SUCCESS),
        None => {
            eprintln!("vramgate: no reservation for container {container_id:?}; `vramgate status` lists them");
            Ok(ExitCode::from(1))
        }
    }
}

fn gc(config_path: &Path) -> Result<ExitCode> {
    let config = Config::load_from(config_path)?;
    let Some(dir) = StateDir::open_existing(&config.state_dir)? else {
        println!("nothing to reclaim (no state directory {})", config.state_dir.display());
        return Ok(ExitCode::SUCCESS);
    };
    let reclaimed = ledger_service(&config, dir).gc()?;
    for r in &reclaimed.reservations {
        println!(
            "reclaimed {} from container {} (init pid {} is gone)",
            format_bytes(r.bytes()),
            r.container_id,
            r.init.pid
        );
    }
    for t in &reclaimed.tickets {
        println!(
            "dropped queue ticket {} of container {} (waiting hook pid {} is gone)",
            t.ticket, t.container_id, t.waiter.pid
        );
    }
    for r in &reclaimed.undecided {
        println!(
            "kept container {}: cannot tell whether init pid {} still runs (/proc unreadable)",
            r.container_id, r.init.pid
        );
    }
    if reclaimed.is_empty() {
        println!("nothing to reclaim");
    }
    Ok(ExitCode::SUCCESS)
}

fn setup(config_path: &Path, args: &vramgate::cli::SetupArgs) -> Result<ExitCode> {
    use vramgate::setup::{self, SetupOptions};
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let config = Config::load_from(config_path)?;
    let options =
        SetupOptions {
            engine: args.engine,
            remove: args.remove,
            set_as_default: args.set_as_default,
            config_path: args.config_path.as_deref().map(absolute),
            containerd_config: Some(absolute(&args.containerd_config)),
            containerd_import: None,
            crio_drop_in: Some(absolute(&args.crio_drop_in)),
            runtime_path: args
                .runtime_path
                .as_deref()
                .map(absolute)
                .unwrap_or_else(|| setup::sibling_or(setup::RUNTIME_BINARY, setup::DEFAULT_RUNTIME_PATH)),
            hook_path: args.hook_path.as_deref().map(absolute).unwrap_or_else(|| {
                setup::sibling_or(vramgate::runtime::HOOK_BINARY, vramgate::runtime::DEFAULT_HOOK_PATH)
            }),
            hook_timeout_secs: vramgate::runtime::hook_timeout_secs(&config),
            engine_view: None,
        };
    let plan = setup::plan(&options)?;
    if !args.dry_run {
        setup::apply(&plan)?;
    }
    print!("{}", setup::describe(&plan, args.dry_run));
    Ok(ExitCode::SUCCESS)
}

fn setup_node(config_path: &Path, args: &vramgate::cli::SetupNodeArgs) -> Result<ExitCode> {
    use nix::sys::signal::{SigSet, Signal};
    use vramgate::setup::{self, NodeOptions, NodeSetup};
    // Blocked before anything changes, so a SIGTERM that comes during the set-up waits for
    // it to finish and is then answered with the undo, never by dying halfway.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block()?;
    // The config the host's hook will read: the one installed, else the host's own (the
    // chart points VRAMGATE_CONFIG at it through the host root).
    let config = Config::load_from(args.install_config.as_deref().unwrap_or(config_path))?;
    let vramgate::cli::NodeEngine::Containerd = args.engine;
    let binaries = setup::NODE_BINARIES
        .iter()
        .map(|name| setup::sibling_or(name, &format!("/usr/bin/{name}")))
        .collect();
    let options = NodeOptions {
        host_root: args.host_root.clone(),
        engine_root: args.engine_root.clone(),
        engine_config: args.engine_config.clone(),
        engine_socket: args.engine_socket.clone(),
        engine_tasks: args.engine_tasks.clone(),
        install_dir: args.install_dir.clone(),
        state_dir: config.state_dir.clone(),
        restart: args.restart,
        binaries,
        set_as_default: args.set_as_default,
        install_config: args
            .install_config
            .clone()
            .map(|source| (source, args.host_config.clone())),
        hook_timeout_secs: vramgate::runtime::hook_timeout_secs(&config),
        wait: std::time::Duration::from_secs(args.wait),
    };
    let node = NodeSetup::install(options)?;
    for line in &node.report {
        println!("{line}");
    }
    println!("node set up; waiting for SIGTERM to undo it");
    let signal = signals.wait()?;
    println!("{signal}: undoing the node set-up");
    let undone = node.undo();
    for line in &undone.report {
        println!("{line}");
    }
    if undone.left.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    // Every other step was done; what could not be is named, and recorded for the next run.
    anyhow::bail!("the undo left: {}", undone.left.join("; "))
}

fn replay(config_path: &Path, args: &vramgate::cli::ReplayArgs) -> Result<ExitCode> {
    use vramgate::replay;
    let mut setting = replay::Setting::new(Config::load_from(config_path)?);
    let overrides = [
        ("gpus", &args.gpus),
        ("strategy", &args.strategy),
        ("backfill", &args.backfill),
        ("backfill-bound", &args.backfill_bound),
        ("backfill-order", &args.backfill_order),
        ("policy", &args.policy),
        ("headroom", &args.headroom),
        ("sharing", &args.sharing),
        ("declared", &args.declared),
    ];
    for (key, value) in overrides {
        if let Some(value) = value {
            replay::apply_setting(&mut setting, key, value)?;
        }
    }
    let compares_gpus = args.compare.as_deref().is_some_and(|c| c.starts_with("gpus="));
    if setting.config.inventory.gpus.is_empty() && !compares_gpus {
        anyhow::bail!(
            "replay needs the GPUs to replay on: give --gpus COUNTxSIZE (e.g. 1x80Gi), or a config with [[inventory.gpus]]"
        );
    }
    let jobs = replay::workload::read(&args.workload)?;
    let settings = replay::settings_for(&setting, args.compare.as_deref())?;
    let mut outcomes = Vec::new();
    for (name, setting) in &settings {
        let mut progress =
            |done: f64| eprintln!("vramgate replay: {name}: {:.0}% of {} jobs", done * 100.0, jobs.len());
        outcomes.push(replay::run(&jobs, setting, name, &mut progress)?);
    }
    replay::report::compare_with_exclusive(&mut outcomes);
    if let Some(path) = &args.timeline {
        std::fs::write(path, replay::report::timeline_csv(&outcomes))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, replay::report::plot_svg(&outcomes[0]))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&outcomes)?);
    } else {
        print!("{}", replay::report::table(&outcomes));
    }
    Ok(ExitCode::SUCCESS)
}
