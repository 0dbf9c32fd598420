//! What a replay measured, and how it is shown: a table, JSON, a timeline CSV, an SVG plot.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::{Job, Sharing};
use crate::config::StaticGpu;
use crate::ledger::GpuShare;

#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl Percentiles {
    fn of(mut values: Vec<f64>) -> Percentiles {
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
        Percentiles {
            p50: at(0.5),
            p95: at(0.95),
            max: values[values.len() - 1],
        }
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuUse {
    pub index: u32,
    pub total_bytes: u64,
    /// Reserved bytes over the GPU's size, averaged over the makespan.
    pub mean_share: f64,
    pub peak_share: f64,
}

/// One instant of the timeline: what each GPU held and how many waited.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Sample {
    pub t_s: f64,
    pub reserved_bytes: Vec<u64>,
    pub queued: usize,
}

/// A shared run against the exclusive baseline of the same `--compare`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct AgainstExclusive {
    pub makespan_s: f64,
    /// Jobs the exclusive run admitted: fewer than this run's when jobs that do not wait were
    /// refused a busy GPU, and then the two makespans are not of the same work.
    pub admitted: usize,
    pub mean_share: f64,
    /// How much shorter this run's makespan is, as a fraction of the exclusive one (0.35 is
    /// 35 % shorter; negative when it is longer).
    pub makespan_shorter_by: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Outcome {
    pub setting: String,
    pub sharing: Sharing,
    pub jobs: usize,
    /// From the first arrival to the last job's end.
    pub makespan_s: f64,
    /// Arrival to admission, over the admitted jobs.
    pub wait_s: Percentiles,
    pub admitted: usize,
    pub refused: usize,
    pub timed_out: usize,
    /// Admissions that passed a waiter which had waited the backfill bound on one of its GPUs:
    /// what the bound forbids (always 0; counted so that a replay shows it).
    pub passed_past_bound: usize,
    /// No schedule can end sooner: the work (bytes × seconds) over the GPUs' total size, and
    /// the latest arrival plus its job's duration.
    pub lower_bound_s: f64,
    /// Makespan over the lower bound.
    pub ratio: f64,
    /// Reserved bytes over all the GPUs' memory, averaged over the makespan. Under the
    /// exclusive baseline a job holds its GPU whole, and this counts what it asked.
    pub mean_share: f64,
    pub gpus: Vec<GpuUse>,
    /// Set on a shared run when the same `--compare` has an exclusive one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against_exclusive: Option<AgainstExclusive>,
    /// Job ids in the order they were admitted.
    pub admission_order: Vec<String>,
    #[serde(skip)]
    pub timeline: Vec<Sample>,
}

/// Collects what happens during a replay.
pub(super) struct Recorder {
    setting: String,
    sharing: Sharing,
    index: HashMap<String, usize>,
    totals: Vec<u64>,
    reserved: Vec<u64>,
    peak: Vec<u64>,
    /// Byte-milliseconds held on each GPU so far, and when it was last brought up to date.
    integral: Vec<u128>,
    last_ms: u64,
    holding: HashMap<usize, Vec<(usize, u64)>>,
    /// What each admitted job reserved over all its GPUs.
    job_bytes: HashMap<usize, u128>,
    waits_ms: Vec<u64>,
    admitted: usize,
    refused: usize,
    timed_out: usize,
    passed_past_bound: usize,
    end_ms: u64,
    order: Vec<usize>,
    timeline: Vec<Sample>,
}

impl Recorder {
    pub(super) fn new(gpus: &[StaticGpu], setting: &str, sharing: Sharing) -> Recorder {
        Recorder {
            setting: setting.to_string(),
            sharing,
            index: gpus.iter().enumerate().map(|(k, g)| (g.uuid.clone(), k)).collect(),
            totals: gpus.iter().map(|g| g.total).collect(),
            reserved: vec![0; gpus.len()],
            peak: vec![0; gpus.len()],
            integral: vec![0; gpus.len()],
            last_ms: 0,
            holding: HashMap::new(),
            job_bytes: HashMap::new(),
            waits_ms: Vec::new(),
            admitted: 0,
            refused: 0,
            timed_out: 0,
            passed_past_bound: 0,
            end_ms: 0,
            order: Vec::new(),
            timeline: Vec::new(),
        }
    }

    fn advance(&mut self, now: u64) {
        let dt = u128::from(now.saturating_sub(self.last_ms));
        for (sum, held) in self.integral.iter_mut().zip(&self.reserved) {
            *sum += u128::from(*held) * dt;
        }
        self.last_ms = self.last_ms.max(now);
    }

    pub(super) fn admitted(&mut self, job: usize, now: u64, arrival: u64, shares: &[GpuShare]) {
        self.advance(now);
        let held: Vec<(usize, u64)> = shares
            .iter()
            .filter_map(|s| Some((*self.index.get(&s.uuid)?, s.bytes)))
            .collect();
        for (g, bytes) in &held {
            self.reserved[*g] = self.reserved[*g].saturating_add(*bytes);
            self.peak[*g] = self.peak[*g].max(self.reserved[*g]);
        }
        self.job_bytes
            .insert(job, held.iter().map(|(_, b)| u128::from(*b)).sum());
        self.holding.insert(job, held);
        self.waits_ms.push(now.saturating_sub(arrival));
        self.admitted += 1;
        self.order.push(job);
        self.end_ms = self.end_ms.max(now);
    }

    pub(super) fn released(&mut self, job: usize, now: u64) {
        self.advance(now);
        for (g, bytes) in self.holding.remove(&job).unwrap_or_default() {
            self.reserved[g] = self.reserved[g].saturating_sub(bytes);
        }
        self.end_ms = self.end_ms.max(now);
    }

    pub(super) fn refused(&mut self, _job: usize) {
        self.refused += 1;
    }

    pub(super) fn passed_past_bound(&mut self) {
        self.passed_past_bound += 1;
    }

    pub(super) fn timed_out(&mut self, _job: usize) {
        self.timed_out += 1;
    }

    pub(super) fn sample(&mut self, now: u64, queued: usize) {
        self.end_ms = self.end_ms.max(now);
        let sample = Sample {
            t_s: now as f64 / 1000.0,
            reserved_bytes: self.reserved.clone(),
            queued,
        };
        match self.timeline.last_mut() {
            Some(last) if last.t_s == sample.t_s => *last = sample,
            _ => self.timeline.push(sample),
        }
    }

    pub(super) fn finish(mut self, jobs: &[Job]) -> Outcome {
        let start = jobs.iter().map(|j| j.arrival_ms).min().unwrap_or(0);
        let end = self.end_ms;
        self.advance(end);
        let makespan_ms = end.saturating_sub(start);
        let capacity: u128 = self.totals.iter().map(|t| u128::from(*t)).sum();
        let ran: Vec<&Job> = self.order.iter().map(|i| &jobs[*i]).collect();
        let work: u128 = self
            .order
            .iter()
            .map(|i| self.job_bytes.get(i).copied().unwrap_or(0) * u128::from(jobs[*i].duration_ms))
            .sum();
        let by_work = if capacity == 0 { 0.0 } else { (work / capacity) as f64 };
        let by_latest = ran
            .iter()
            .map(|j| (j.arrival_ms - start + j.duration_ms) as f64)
            .fold(0.0, f64::max);
        let lower_ms = by_work.max(by_latest);
        let gpus = self
            .totals
            .iter()
            .enumerate()
            .map(|(g, total)| GpuUse {
                index: g as u32,
                total_bytes: *total,
                mean_share: if makespan_ms == 0 || *total == 0 {
                    0.0
                } else {
                    self.integral[g] as f64 / (*total as f64 * makespan_ms as f64)
                },
                peak_share: if *total == 0 {
                    0.0
                } else {
                    self.peak[g] as f64 / *total as f64
                },
            })
            .collect();
        let held: u128 = self.integral.iter().sum();
        let mean_share = if makespan_ms == 0 || capacity == 0 {
            0.0
        } else {
            held as f64 / (capacity as f64 * makespan_ms as f64)
        };
        Outcome {
            setting: self.setting,
            sharing: self.sharing,
            jobs: jobs.len(),
            makespan_s: makespan_ms as f64 / 1000.0,
            wait_s: Percentiles::of(self.waits_ms.iter().map(|w| *w as f64 / 1000.0).collect()),
            admitted: self.admitted,
            refused: self.refused,
            timed_out: self.timed_out,
            passed_past_bound: self.passed_past_bound,
            lower_bound_s: lower_ms / 1000.0,
            ratio: if lower_ms > 0.0 {
                makespan_ms as f64 / lower_ms
            } else {
                1.0
            },
            mean_share,
            gpus,
            against_exclusive: None,
            admission_order: self.order.iter().map(|i| jobs[*i].id.clone()).collect(),
            timeline: self.timeline,
        }
    }
}

/// Sets each shared run's comparison with the (first) exclusive run beside it, if any.
pub fn compare_with_exclusive(outcomes: &mut [Outcome]) {
    let Some(base) = outcomes.iter().find(|o| o.sharing == Sharing::Exclusive).cloned() else {
        return;
    };
    for o in outcomes.iter_mut().filter(|o| o.sharing == Sharing::Shared) {
        o.against_exclusive = Some(AgainstExclusive {
            makespan_s: base.makespan_s,
            admitted: base.admitted,
            mean_share: base.mean_share,
            makespan_shorter_by: if base.makespan_s > 0.0 {
                1.0 - o.makespan_s / base.makespan_s
            } else {
                0.0
            },
        });
    }
}

/// The side-by-side table `vramgate replay` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:>10} {:>9} {:>9} {:>9} {:>8} {:>7} {:>9} {:>11} {:>6} {:>8}  per GPU: mean/peak reserved",
        "setting",
        "makespan",
        "wait p50",
        "wait p95",
        "wait max",
        "admitted",
        "refused",
        "timed out",
        "lower bound",
        "ratio",
        "reserved"
    );
    for o in outcomes {
        let gpus: Vec<String> = o
            .gpus
            .iter()
            .map(|g| format!("{}: {:.0}%/{:.0}%", g.index, g.mean_share * 100.0, g.peak_share * 100.0))
            .collect();
        let _ = writeln!(
            out,
            "{:<28} {:>9.1}s {:>8.1}s {:>8.1}s {:>8.1}s {:>8} {:>7} {:>9} {:>10.1}s {:>6.2} {:>7.0}%  {}",
            o.setting,
            o.makespan_s,
            o.wait_s.p50,
            o.wait_s.p95,
            o.wait_s.max,
            o.admitted,
            o.refused,
            o.timed_out,
            o.lower_bound_s,
            o.ratio,
            o.mean_share * 100.0,
            gpus.join("  ")
        );
    }
    for o in outcomes {
        if let Some(x) = &o.against_exclusive {
            let pct = x.makespan_shorter_by * 100.0;
            let _ = writeln!(
                out,
                "{}: makespan {:.0} % {} than exclusive GPUs ({:.1}s against {:.1}s), {:.0} % of the memory reserved against {:.0} %",
                o.setting,
                pct.abs(),
                if pct >= 0.0 { "shorter" } else { "longer" },
                o.makespan_s,
                x.makespan_s,
                o.mean_share * 100.0,
                x.mean_share * 100.0
            );
            if x.admitted < o.admitted {
                let _ = writeln!(
                    out,
                    "  but exclusive GPUs ran {} of the {} jobs this run ran: the others were refused or timed out, so the makespans are not of the same work (--policy wait, with a timeout, compares like with like)",
                    x.admitted, o.admitted
                );
            }
        }
    }
    out
}

/// The timeline as CSV: one row per instant something happened, per setting.
pub fn timeline_csv(outcomes: &[Outcome]) -> String {
    let gpus = outcomes.iter().map(|o| o.gpus.len()).max().unwrap_or(0);
    let mut out = String::from("setting,t_s,queued");
    for g in 0..gpus {
        let _ = write!(out, ",gpu{g}_reserved_bytes");
    }
    out.push('\n');
    for o in outcomes {
        for s in &o.timeline {
            let _ = write!(out, "{},{:.3},{}", o.setting.replace(',', ";"), s.t_s, s.queued);
            for b in &s.reserved_bytes {
                let _ = write!(out, ",{b}");
            }
            out.push('\n');
        }
    }
    out
}

/// A plot of the first setting's timeline: reserved share per GPU (lines, left axis 0-100 %)
/// and the queue length (grey steps, right axis), as an SVG a browser opens.
pub fn plot_svg(outcome: &Outcome) -> String {
    const W: f64 = 900.0;
    const H: f64 = 360.0;
    const PAD: f64 = 50.0;
    let end = outcome.timeline.last().map_or(1.0, |s| s.t_s).max(1e-3);
    let start = outcome.timeline.first().map_or(0.0, |s| s.t_s);
    let span = (end - start).max(1e-3);
    let max_queue = outcome.timeline.iter().map(|s| s.queued).max().unwrap_or(0).max(1) as f64;
    let x = |t: f64| PAD + (t - start) / span * (W - 2.0 * PAD);
    let y = |share: f64| H - PAD - share * (H - 2.0 * PAD);
    let colors = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    ];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{PAD}\" y=\"20\">{}: reserved share per GPU (lines, left) and queue length (grey, right, max {})</text>\n\
         <line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{PAD}\" y1=\"{PAD}\" x2=\"{PAD}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <text x=\"5\" y=\"{t}\">100%</text><text x=\"15\" y=\"{b}\">0%</text>\n\
         <text x=\"{PAD}\" y=\"{l}\">{start:.0} s</text><text x=\"{r2}\" y=\"{l}\">{end:.0} s</text>\n",
        escape(&outcome.setting),
        max_queue,
        b = H - PAD,
        r = W - PAD,
        t = PAD + 4.0,
        l = H - PAD + 18.0,
        r2 = W - PAD - 40.0,
    );
    let mut queue = String::new();
    let mut prev: Option<(f64, f64)> = None;
    for s in &outcome.timeline {
        let q = y(s.queued as f64 / max_queue);
        if let Some((_, pq)) = prev {
            let _ = write!(queue, "{:.1},{:.1} ", x(s.t_s), pq);
        }
        let _ = write!(queue, "{:.1},{:.1} ", x(s.t_s), q);
        prev = Some((s.t_s, q));
    }
    let _ = writeln!(out, "<polyline fill=\"none\" stroke=\"#999\" points=\"{queue}\"/>");
    for (g, gpu) in outcome.gpus.iter().enumerate() {
        let mut points = String::new();
        let mut prev: Option<f64> = None;
        for s in &outcome.timeline {
            let share = s.reserved_bytes.get(g).copied().unwrap_or(0) as f64 / gpu.total_bytes.max(1) as f64;
            if let Some(p) = prev {
                let _ = write!(points, "{:.1},{:.1} ", x(s.t_s), y(p));
            }
            let _ = write!(points, "{:.1},{:.1} ", x(s.t_s), y(share));
            prev = Some(share);
        }
        let color = colors[g % colors.len()];
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" points=\"{points}\"/>\n<text x=\"{:.0}\" y=\"{:.0}\" fill=\"{color}\">GPU {}</text>",
            W - PAD + 5.0,
            PAD + 14.0 * g as f64,
            gpu.index
        );
    }
    out.push_str("</svg>\n");
    out
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
