//! The README's demo (scripts/demo runs it): parse, run, set the exit code. It was
//! `vramgate demo` until the scratch hosts left the library; it prints what that printed.

use std::process::ExitCode;

use clap::Parser;
use vramgate_testbed::demo::{self, DemoArgs};

/// Replay the published failure on a simulated GPU with real runc containers
#[derive(Debug, Parser)]
#[command(name = "vramgate-demo", version)]
struct Cli {
    #[command(flatten)]
    args: DemoArgs,
}

fn main() -> ExitCode {
    use nix::sys::signal::{signal, SigHandler, Signal};
    let cli = Cli::parse();
    // Printed into `head` or a closed pipe, it ends quietly by SIGPIPE, as `vramgate` does.
    // SAFETY: called before any thread starts; SIG_DFL installs no handler code.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    match demo::run(&cli.args) {
        Ok(summaries) => {
            let ok = summaries
                .iter()
                .all(|s| s.failed == 0 && s.max_reserved_bytes <= s.capacity_bytes);
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("vramgate: {}", vramgate::cli::error_line(&e));
            ExitCode::from(1)
        }
    }
}
