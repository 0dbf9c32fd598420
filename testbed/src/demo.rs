//! `vramgate-demo`, which scripts/demo runs: the published failure, replayed on the simulated
//! 24,265 MiB card.
//!
//! In the paper, 25 TensorFlow containers of 1,205 MiB each started at once on an RTX 3090
//! and 15 of them died of out-of-memory. Here 25 real runc containers, each requesting
//! 1,205 MiB through the vramgate hook, start at once on a simulated card of the same size.
//! With `wait`, the ones that do not fit queue and start as others finish; with `reject`, they
//! are refused before they start. Either way no container starts and then dies.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::ValueEnum;
use serde::Serialize;
use vramgate::config::{Policy, SIMULATED_GPU_TOTAL};
use vramgate::ledger::StateDir;
use vramgate::quantity::{format_bytes, format_duration, parse_quantity};

use crate::Testbed;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoPolicy {
    /// Queue containers that do not fit until memory frees up
    Wait,
    /// Refuse containers that do not fit
    Reject,
    /// Run both, one after the other
    Both,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Which policy to demonstrate
    #[arg(long, value_enum, default_value_t = DemoPolicy::Both)]
    pub policy: DemoPolicy,
    /// How many containers start at once
    #[arg(long, default_value_t = 25)]
    pub containers: u32,
    /// What each container requests
    #[arg(long, default_value = "1205Mi")]
    pub memory: String,
    /// How long each container runs, in seconds
    #[arg(long, default_value_t = 3)]
    pub seconds: u32,
    /// The runc binary to use
    #[arg(long, default_value = "runc")]
    pub runc: String,
    /// Directory holding vramgate-hook (default: next to this binary)
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Print the summary as JSON (for tests and scripts)
    #[arg(long)]
    pub json: bool,
    /// Keep the demo's work directory instead of deleting it
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Serialize)]
pub struct DemoSummary {
    pub policy: &'static str,
    pub containers: u32,
    pub request_bytes: u64,
    pub capacity_bytes: u64,
    pub completed: u32,
    pub refused: u32,
    pub failed: u32,
    pub waited: u32,
    pub longest_wait_ms: u64,
    /// The largest sum of reservations seen in any ledger state sampled during the run.
    pub max_reserved_bytes: u64,
    pub max_running: usize,
    pub max_waiting: usize,
    pub samples: u32,
    /// Waiters were admitted in the order they joined the queue.
    pub fifo: bool,
    pub wall_ms: u64,
    pub first_refusal: Option<String>,
}

struct Running {
    name: String,
    child: Child,
    stderr_path: PathBuf,
}

pub fn run(args: &DemoArgs) -> Result<Vec<DemoSummary>> {
    let request = parse_quantity(&args.memory)
        .with_context(|| format!("--memory {}", args.memory))?
        .bytes_on(SIMULATED_GPU_TOTAL);
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("locating this binary's directory")?
            .to_path_buf(),
    };
    let hook = bin_dir.join("vramgate-hook");
    let work = tempfile_dir()?;
    let policies: &[Policy] = match args.policy {
        DemoPolicy::Wait => &[Policy::Wait],
        DemoPolicy::Reject => &[Policy::Reject],
        DemoPolicy::Both => &[Policy::Wait, Policy::Reject],
    };
    let mut summaries = Vec::new();
    let result = (|| -> Result<()> {
        for &policy in policies {
            let dir = work.join(policy.as_str());
            let config = Testbed::default_config(
                &dir,
                &format!(
                    "policy = {:?}\nwait_timeout = \"120s\"\nmax_wait_timeout = \"10m\"",
                    policy.as_str()
                ),
            );
            let bed = Testbed::create(&dir, &args.runc, &hook, &config)?;
            if !args.json {
                println!(
                    "\n== policy {}: {} containers start at once, each requesting {} of a simulated {} GPU ==",
                    policy.as_str(),
                    args.containers,
                    format_bytes(request),
                    format_bytes(SIMULATED_GPU_TOTAL)
                );
            }
            let summary = replay(&bed, policy, args, request);
            bed.cleanup_containers();
            let summary = summary?;
            if !args.json {
                print_summary(&summary);
            }
            summaries.push(summary);
        }
        Ok(())
    })();
    if args.keep {
        eprintln!("work directory kept: {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summaries)?);
    } else {
        println!(
            "\nWithout vramgate the paper saw 15 of 25 such containers (60%) die of out-of-memory after starting."
        );
    }
    Ok(summaries)
}

fn tempfile_dir() -> Result<PathBuf> {
    let base = std::env::temp_dir().join(format!("vramgate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    Ok(base)
}

fn replay(bed: &Testbed, policy: Policy, args: &DemoArgs, request: u64) -> Result<DemoSummary> {
    let seconds = args.seconds.to_string();
    let memory = args.memory.clone();
    let mut running = Vec::new();
    let started = Instant::now();
    for n in 0..args.containers {
        let name = format!("vramgate-demo-{}-{n:02}", policy.as_str());
        let bundle = bed.bundle(
            &name,
            &["sleep", &seconds],
            &[("vramgate.dev/memory", &memory), ("vramgate.dev/gpus", "0")],
            &[],
            true,
        )?;
        let stderr_path = bed.dir.join(format!("{name}.stderr"));
        let stderr = std::fs::File::create(&stderr_path)?;
        let child = bed
            .runc_run(&bundle, &name)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting runc")?;
        running.push(Running {
            name,
            child,
            stderr_path,
        });
    }

    let state = loop {
        // The first hook creates the state dir; until then nothing is reserved.
        if let Some(s) = StateDir::open_existing(&bed.state_dir)? {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
        if started.elapsed() > Duration::from_secs(30) {
            anyhow::bail!("no hook ran within 30s: is {} executable?", bed.hook.display());
        }
    };
    let tty = std::io::stdout().is_terminal() && !args.json;
    let mut exit: HashMap<String, bool> = HashMap::new();
    let (mut max_reserved, mut max_running, mut max_waiting, mut samples) = (0u64, 0usize, 0usize, 0u32);
    let mut last_line = Instant::now() - Duration::from_secs(10);
    let mut first_refusal = None;
    loop {
        for r in running.iter_mut() {
            if exit.contains_key(&r.name) {
                continue;
            }
            if let Some(status) = r.child.try_wait()? {
                exit.insert(r.name.clone(), status.success());
                if !status.success() && first_refusal.is_none() {
                    let text = std::fs::read_to_string(&r.stderr_path).unwrap_or_default();
                    first_refusal = text.find("vramgate: refused").map(|at| {
                        let line = &text[at..];
                        // runc quotes the hook's stderr, escaping its newline as `\n`.
                        let line = line.split(['\n', '"']).next().unwrap_or(line);
                        line.trim_end_matches("\\n").to_string()
                    });
                }
            }
        }
        let ledger = state.read()?;
        samples += 1;
        let reserved = ledger.reserved_total();
        max_reserved = max_reserved.max(reserved);
        max_running = max_running.max(ledger.reservations.len());
        max_waiting = max_waiting.max(ledger.queue.len());
        let done = exit.values().filter(|ok| **ok).count();
        let refused = exit.values().filter(|ok| !**ok).count();
        let line = format!(
            "{:>5.1}s  running {:>2}  waiting {:>2}  done {:>2}  refused {:>2}  reserved {} of {}",
            started.elapsed().as_secs_f64(),
            ledger.reservations.len(),
            ledger.queue.len(),
            done,
            refused,
            format_bytes(reserved),
            format_bytes(SIMULATED_GPU_TOTAL)
        );
        if tty {
            print!("\r{line}");
            let _ = std::io::stdout().flush();
        } else if !args.json && last_line.elapsed() >= Duration::from_secs(1) {
            println!("{line}");
            last_line = Instant::now();
        }
        if exit.len() == running.len() {
            if tty {
                println!();
            }
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            anyhow::bail!("the demo did not finish within 5 minutes");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let wall = started.elapsed();

    let (waited, longest_wait_ms, fifo) = queue_order(&state.path().join(vramgate::events::EVENTS_FILE))?;
    let refused = running
        .iter()
        .filter(|r| exit.get(&r.name) == Some(&false))
        .filter(|r| {
            std::fs::read_to_string(&r.stderr_path)
                .unwrap_or_default()
                .contains("vramgate: refused")
        })
        .count() as u32;
    let completed = exit.values().filter(|ok| **ok).count() as u32;
    Ok(DemoSummary {
        policy: policy.as_str(),
        containers: args.containers,
        request_bytes: request,
        capacity_bytes: SIMULATED_GPU_TOTAL,
        completed,
        refused,
        failed: args.containers - completed - refused,
        waited,
        longest_wait_ms,
        max_reserved_bytes: max_reserved,
        max_running,
        max_waiting,
        samples,
        fifo,
        wall_ms: wall.as_millis() as u64,
        first_refusal,
    })
}

/// From the event log: how many waited, the longest wait, and whether waiters were admitted
/// in the order they were queued.
fn queue_order(events_path: &std::path::Path) -> Result<(u32, u64, bool)> {
    let text = std::fs::read_to_string(events_path).with_context(|| format!("reading {}", events_path.display()))?;
    let mut enqueued = Vec::new();
    let mut admitted = Vec::new();
    let mut longest = 0u64;
    let mut enqueue_time = HashMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let container = event["container"].as_str().unwrap_or_default().to_string();
        let time = event["time_unix_ms"].as_u64().unwrap_or(0);
        match event["event"].as_str() {
            Some("enqueue") => {
                enqueue_time.insert(container.clone(), time);
                enqueued.push(container);
            }
            Some("admit_after_wait") => {
                longest = longest.max(time.saturating_sub(enqueue_time.get(&container).copied().unwrap_or(time)));
                admitted.push(container);
            }
            _ => {}
        }
    }
    let fifo = enqueued.iter().filter(|c| admitted.contains(c)).eq(admitted.iter());
    Ok((admitted.len() as u32, longest, fifo))
}

fn print_summary(s: &DemoSummary) {
    let over = s.max_reserved_bytes > s.capacity_bytes;
    println!(
        "policy {}: {} of {} completed, {} refused before starting, {} failed; took {}",
        s.policy,
        s.completed,
        s.containers,
        s.refused,
        s.failed,
        format_duration(Duration::from_millis(s.wall_ms))
    );
    if s.waited > 0 {
        println!(
            "  {} waited in the queue (longest {}) and started {} as memory freed",
            s.waited,
            format_duration(Duration::from_millis(s.longest_wait_ms)),
            if s.fifo { "in arrival order" } else { "OUT OF ORDER" }
        );
    }
    println!(
        "  most reserved at any moment: {} of {} ({}; {} ledger samples)",
        format_bytes(s.max_reserved_bytes),
        format_bytes(s.capacity_bytes),
        if over { "OVER CAPACITY" } else { "never over" },
        s.samples
    );
    if let Some(msg) = &s.first_refusal {
        println!("  a refused container was told: {msg}");
    }
}
