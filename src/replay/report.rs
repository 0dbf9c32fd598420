//! What a replay measured, and how it is shown: a table, JSON, a timeline CSV, an SVG plot.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::Job;
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

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Outcome {
    pub setting: String,
    pub jobs: usize,
    /// From the first arrival to the last job's end.
    pub makespan_s: f64,
    /// Arrival to admission, over the admitted jobs.
    pub wait_s: Percentiles,
    pub admitted: usize,
    pub refused: usize,
    pub timed_out: usize,
    /// No schedule can end sooner: the work (bytes × seconds) over the GPUs' total size, and
    /// the latest arrival plus its job's duration.
    pub lower_bound_s: f64,
    /// Makespan over the lower bound.
    pub ratio: f64,
    pub gpus: Vec<GpuUse>,
    /// Job ids in the order they were admitted.
    pub admission_order: Vec<String>,
    #[serde(skip)]
    pub timeline: Vec<Sample>,
}

/// Collects what happens during a replay.
pub(super) struct Recorder {
    setting: String,
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
    end_ms: u64,
    order: Vec<usize>,
    timeline: Vec<Sample>,
}

impl Recorder {
    pub(super) fn new(gpus: &[StaticGpu], setting: &str) -> Recorder {
        Recorder {
            setting: setting.to_string(),
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
        Outcome {
            setting: self.setting,
            jobs: jobs.len(),
            makespan_s: makespan_ms as f64 / 1000.0,
            wait_s: Percentiles::of(self.waits_ms.iter().map(|w| *w as f64 / 1000.0).collect()),
            admitted: self.admitted,
            refused: self.refused,
            timed_out: self.timed_out,
            lower_bound_s: lower_ms / 1000.0,
            ratio: if lower_ms > 0.0 {
                makespan_ms as f64 / lower_ms
            } else {
                1.0
            },
            gpus,
            admission_order: self.order.iter().map(|i| jobs[*i].id.clone()).collect(),
            timeline: self.timeline,
        }
    }
}

/// The side-by-side table `vramgate replay` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:>10} {:>9} {:>9} {:>9} {:>8} {:>7} {:>9} {:>11} {:>6}  per GPU: mean/peak reserved",
        "setting",
        "makespan",
        "wait p50",
        "wait p95",
        "wait max",
        "admitted",
        "refused",
        "timed out",
        "lower bound",
        "ratio"
    );
    for o in outcomes {
        let gpus: Vec<String> = o
            .gpus
            .iter()
            .map(|g| format!("{}: {:.0}%/{:.0}%", g.index, g.mean_share * 100.0, g.peak_share * 100.0))
            .collect();
        let _ = writeln!(
            out,
            "{:<28} {:>9.1}s {:>8.1}s {:>8.1}s {:>8.1}s {:>8} {:>7} {:>9} {:>10.1}s {:>6.2}  {}",
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
            gpus.join("  ")
        );
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
