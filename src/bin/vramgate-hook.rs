//! The OCI hook binary: parse the arguments, run the stage, turn the outcome into an exit code.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use vramgate::cli::HookCli;
use vramgate::hook::{self, HookError, HookOptions, Outcome, Stage};

fn main() -> ExitCode {
    // First, before reading any input: a hook bug must not be able to use root's powers.
    // CAP_SYS_ADMIN stays permitted (never effective) until the hook knows whether it sets a
    // driver limit (`vramgate::privilege`). A failure is reported and the hook goes on, since
    // refusing every container start over hardening would take the host's containers down.
    if let Err(e) = vramgate::privilege::drop_for_hook_stage() {
        eprintln!("vramgate: warning: could not drop capabilities: {e}");
    }
    let cli = HookCli::parse();
    let Some(stage) = Stage::parse(&cli.stage) else {
        eprintln!(
            "vramgate-hook: unknown stage {:?}: use createRuntime, prestart, createContainer or poststop",
            cli.stage
        );
        return ExitCode::from(2);
    };
    let options = HookOptions {
        hook_timeout: cli.hook_timeout.map(Duration::from_secs),
        config_path: vramgate::config::path_from_env(),
    };
    match hook::run(stage, std::io::stdin().lock(), &options) {
        Ok(Outcome::FailedOpen(message)) => {
            eprintln!(
                "vramgate: warning: {message}; the container starts unaccounted because on_state_error = \"fail-open\""
            );
            ExitCode::SUCCESS
        }
        Ok(_) => ExitCode::SUCCESS,
        // A refusal already reads as a whole sentence starting with "vramgate:".
        Err(HookError::Refused(message)) => {
            eprintln!("{message}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("vramgate: {e}");
            ExitCode::from(1)
        }
    }
}
