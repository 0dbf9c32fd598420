//! The Kubernetes DRA driver binary: parse the flags, run `vramgate::dra::driver`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use vramgate::cli::DraCli;
use vramgate::dra::driver::{self, Options};
use vramgate::dra::slice_view::RequestPolicy;
use vramgate::quantity::{parse_quantity, Quantity};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vramgate-dra: {}", vramgate::cli::error_line(&e));
            ExitCode::from(1)
        }
    }
}

fn bytes(flag: &str, value: &str) -> Result<u64> {
    match parse_quantity(value).with_context(|| format!("{flag} {value:?}"))? {
        Quantity::Bytes(b) => Ok(b),
        _ => bail!("{flag} {value:?}: must be an amount of memory (256Mi, 1Gi), not a share of a GPU"),
    }
}

fn run() -> Result<()> {
    let cli = DraCli::parse();
    let policy = RequestPolicy::new(
        bytes("--step", &cli.step)?,
        bytes("--default-request", &cli.default_request)?,
    )
    .map_err(|e| anyhow::anyhow!("--step {:?} --default-request {:?}: {e}", cli.step, cli.default_request))?;
    let (poll_interval, startup_timeout) = vramgate::cli::plugin_timings(&cli.poll_interval, &cli.startup_timeout)?;
    if cli.node_name.is_empty() {
        bail!("--node-name (or NODE_NAME) is empty: set it to this node's name");
    }
    // A long-running daemon keeps only what a view needs, the hook's one capability (reading
    // containers' pid namespaces for attribution); before any thread starts, since
    // capabilities are per thread. Sockets, CDI specs and bundles are root's own files.
    vramgate::privilege::drop_for_hook().context("dropping capabilities")?;
    let options = Options {
        config_path: cli.config.unwrap_or_else(vramgate::config::path_from_env),
        node: cli.node_name,
        registry_dir: cli.registry_dir,
        plugin_dir: cli.plugin_dir,
        cdi_dir: cli.cdi_dir,
        dev_dir: PathBuf::from("/dev"),
        kubeconfig: cli.kubeconfig,
        hook_path: cli.hook,
        policy,
        binding_conditions: cli.binding_conditions,
        poll_interval,
        startup_timeout,
    };
    driver::run(options).map_err(|e| anyhow::anyhow!("{e}"))
}
