//! The runc-compatible wrapper: edit the spec on `create`, then become the next runtime.
//!
//! `exec` (not spawn-and-wait) because the engine talks to the runtime as its own child: it
//! waits on this pid, sends it signals, and passes it the console socket and other inherited
//! file descriptors. Replacing this process keeps all of that exactly as the engine set it up,
//! and adds no process that could outlive or hide the real runtime's exit status. (A create
//! that queues starts one helper, the queue guard, which the engine never waits on and which
//! ends when this process execs or dies: `vramgate::runtime::queue_guard`.)

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    // Edit the spec with no effective capabilities: it is input from whoever made the bundle.
    // The runtime exec'd at the end gets root's full set back from the kernel.
    if let Err(e) = vramgate::privilege::drop_for_runtime_wrapper() {
        eprintln!("vramgate-runtime: warning: {e}; continuing with full privileges");
    }
    let config_path = vramgate::config::path_from_env();
    if args
        .first()
        .is_some_and(|a| a == vramgate::runtime::queue_guard::GUARD_FLAG)
    {
        return queue_guard(&args[1..], &config_path);
    }
    // Returns only when it could not exec; the error is already on stderr and in runc's log.
    let _error = vramgate::runtime::run(&args, &config_path);
    ExitCode::from(1)
}

/// The guard a waiting create starts (see `vramgate::runtime::queue_guard`); its stderr is
/// /dev/null there, so the line is for someone who runs it by hand.
fn queue_guard(args: &[std::ffi::OsString], config_path: &std::path::Path) -> ExitCode {
    // It execs nothing and needs no capability (the runtime wrapper's full permitted set,
    // which it inherited, is for runc): all of them go before it reads anything.
    if let Err(e) = vramgate::privilege::drop_for_queue_guard() {
        eprintln!("vramgate-runtime: {e}");
        return ExitCode::from(2);
    }
    match vramgate::runtime::queue_guard::run(args, config_path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vramgate-runtime: {e}");
            ExitCode::from(2)
        }
    }
}
