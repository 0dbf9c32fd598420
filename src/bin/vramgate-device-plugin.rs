//! The Kubernetes device plugin binary: parse the flags, run `vramgate::deviceplugin`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use vramgate::cli::DevicePluginCli;
use vramgate::deviceplugin::{self, Options, Unit};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vramgate-device-plugin: {}", vramgate::cli::error_line(&e));
            ExitCode::from(1)
        }
    }
}

fn run() -> Result<()> {
    let cli = DevicePluginCli::parse();
    let unit = Unit::parse(&cli.unit).context("--unit")?;
    let poll_interval = vramgate::quantity::parse_duration(&cli.poll_interval)
        .with_context(|| format!("--poll-interval {:?}", cli.poll_interval))?;
    // Below 10ms the plugin spends its time querying the driver; above 1s the scheduler
    // hears late of memory used outside vramgate.
    if poll_interval < Duration::from_millis(10) || poll_interval > Duration::from_secs(1) {
        bail!("--poll-interval {:?}: must be between 10ms and 1s", cli.poll_interval);
    }
    let startup_timeout = vramgate::quantity::parse_duration(&cli.startup_timeout)
        .with_context(|| format!("--startup-timeout {:?}", cli.startup_timeout))?;
    // Below a second even a static inventory's first read could miss it on a loaded node.
    if startup_timeout < Duration::from_secs(1) {
        bail!("--startup-timeout {:?}: must be at least 1s", cli.startup_timeout);
    }
    // A long-running daemon keeps only what a view needs, the hook's one capability (reading
    // containers' pid namespaces for attribution); before any thread starts, since
    // capabilities are per thread.
    vramgate::privilege::drop_for_hook().context("dropping capabilities")?;
    let options = Options {
        config_path: cli.config.unwrap_or_else(vramgate::config::path_from_env),
        plugin_dir: cli.plugin_dir,
        unit,
        poll_interval,
        startup_timeout,
    };
    // The error's own line already names the path and the cause: printed as it is, not as a
    // chain that would repeat the cause.
    deviceplugin::server::run(options).map_err(|e| anyhow::anyhow!("{e}"))
}
