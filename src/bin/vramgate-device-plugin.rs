//! The Kubernetes device plugin binary: parse the flags, run `vramgate::deviceplugin`.

use std::process::ExitCode;

use anyhow::{Context, Result};
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
    let (poll_interval, startup_timeout) = vramgate::cli::plugin_timings(&cli.poll_interval, &cli.startup_timeout)?;
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
        dev_dir: std::path::PathBuf::from("/dev"),
    };
    // The error's own line already names the path and the cause: printed as it is, not as a
    // chain that would repeat the cause.
    deviceplugin::server::run(options).map_err(|e| anyhow::anyhow!("{e}"))
}
