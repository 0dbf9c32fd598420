//! What a replay runs: jobs, read from a host's event log or from a job file.
//!
//! A job file has one JSON object per line: `arrival` (seconds from the start), `memory` (a
//! vramgate quantity: `"6Gi"`, `"25%"`), `duration` (seconds), and optionally `gpus` (as the
//! `vramgate.dev/gpus` key: `"0"`, `"0,1"`, `"auto"`, `"auto:2"`; default `auto`), `limit` (as
//! `vramgate.dev/memory-limit`: what the job may use beside what it reserves), `policy`
//! (`wait` or `reject`), `timeout` (seconds, as `arrival` and `duration`, or `"90s"`),
//! `expected_duration` (what the job declares as `vramgate.dev/expected-duration`, which may
//! differ from `duration`, how long it really runs; seconds or `"90s"`) and `id`.
//!
//! An event log (`events.jsonl`) is turned into jobs container by container: arrival is its
//! first request event (`admit`, `enqueue`, `refuse`), its size and GPUs are those of its
//! admission, its limit beside it when one was logged (a placed admission asks `auto`, or
//! `auto:N`; a pinned one the GPUs' indices, in
//! the order the log first names them), its duration runs from admission to release (or
//! reclaim: a stop the hook never saw), and its policy is `wait` when it ever queued.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {reason}")]
    Line { path: PathBuf, line: usize, reason: String },
    #[error(
        "{path} holds no job: give a job file (JSON lines with arrival, memory, duration) or a host's events.jsonl"
    )]
    Empty { path: PathBuf },
}

/// One job to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: String,
    /// Milliseconds from the workload's start.
    pub arrival_ms: u64,
    /// As a container would say it (`vramgate.dev/memory`).
    pub memory: String,
    /// As a container would say it (`vramgate.dev/memory-limit`); `None`: limit = request.
    pub limit: Option<String>,
    pub duration_ms: u64,
    /// As a container would say it (`vramgate.dev/gpus`).
    pub gpus: String,
    pub policy: Option<String>,
    pub timeout: Option<String>,
    /// As a container would declare it (`vramgate.dev/expected-duration`).
    pub expected_duration: Option<String>,
    /// Where it came from, for messages: the line of the job file, or of its first event.
    pub line: usize,
}

/// Reads a workload, telling the two formats apart by the first line.
pub fn read(path: &Path) -> Result<Vec<Job>, WorkloadError> {
    let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let jobs = if first.contains("\"event\"") {
        from_events(&text, path)?
    } else {
        from_job_file(&text, path)?
    };
    if jobs.is_empty() {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(jobs)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobLine {
    arrival: f64,
    memory: String,
    duration: f64,
    #[serde(default)]
    limit: Option<String>,
    #[serde(default)]
    gpus: Option<String>,
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    timeout: Option<SecondsOrText>,
    #[serde(default)]
    expected_duration: Option<SecondsOrText>,
    #[serde(default)]
    id: Option<String>,
}

/// A job's `timeout` or `expected_duration`: seconds, as `arrival` and `duration` are, or a
/// duration such as `"90s"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum SecondsOrText {
    Seconds(f64),
    Text(String),
}

/// `field` as its `vramgate.dev/` key spells it; a number must lie within what that key
/// accepts (168 h), so that it is refused here, with the value the file gave.
fn duration_text(field: &str, value: SecondsOrText) -> Result<String, String> {
    match value {
        SecondsOrText::Text(text) => Ok(text),
        SecondsOrText::Seconds(s) => {
            let max = crate::quantity::MAX_DURATION.as_secs();
            if !s.is_finite() || s < 0.0 || s > max as f64 {
                return Err(format!(
                    "{field} must be a number of seconds from 0 to {max} (168h) or a duration such as \"90s\", not {s}"
                ));
            }
            Ok(format!("{}ms", (s * 1000.0).round() as u64))
        }
    }
}

fn seconds_to_ms(value: f64, what: &str) -> Result<u64, String> {
    if !value.is_finite() || value < 0.0 || value > 1e12 {
        return Err(format!(
            "{what} must be a number of seconds from 0 to 1e12, not {value}"
        ));
    }
    Ok((value * 1000.0).round() as u64)
}

pub fn from_job_file(text: &str, path: &Path) -> Result<Vec<Job>, WorkloadError> {
    let mut jobs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let bad = |reason: String| WorkloadError::Line {
            path: path.to_path_buf(),
            line: line_no,
            reason,
        };
        let job: JobLine = serde_json::from_str(line).map_err(|e| bad(format!("not a job ({e})")))?;
        let id = job.id.unwrap_or_else(|| format!("job-{line_no}"));
        let of_job = |reason: String| bad(format!("job {id}: {reason}"));
        jobs.push(Job {
            arrival_ms: seconds_to_ms(job.arrival, "arrival").map_err(of_job)?,
            memory: job.memory,
            limit: job.limit,
            duration_ms: seconds_to_ms(job.duration, "duration").map_err(of_job)?,
            gpus: job.gpus.unwrap_or_else(|| "auto".into()),
            policy: job.policy,
            timeout: job
                .timeout
                .map(|t| duration_text("timeout", t))
                .transpose()
                .map_err(of_job)?,
            expected_duration: job
                .expected_duration
                .map(|d| duration_text("expected_duration", d))
                .transpose()
                .map_err(&of_job)?,
            line: line_no,
            id,
        });
    }
    jobs.sort_by_key(|j| (j.arrival_ms, j.line));
    Ok(jobs)
}

#[derive(Deserialize)]
struct LoggedEvent {
    time_unix_ms: u64,
    event: String,
    container: String,
    /// What the container was called, where it had a name ([`crate::events::Event::name`]).
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    gpus: Vec<crate::ledger::GpuShare>,
    #[serde(default)]
    placement: Option<crate::placement::Placement>,
}

#[derive(Default)]
struct Seen {
    first_ms: Option<u64>,
    first_line: usize,
    admitted_ms: Option<u64>,
    ended_ms: Option<u64>,
    bytes: u64,
    limit: Option<u64>,
    gpus: Option<String>,
    queued: bool,
    name: Option<String>,
}

pub fn from_events(text: &str, path: &Path) -> Result<Vec<Job>, WorkloadError> {
    let mut seen: HashMap<String, Seen> = HashMap::new();
    let mut order: Vec<String> = Vec::new();
    // Host GPUs by UUID, numbered in the order the log names them (a placement's candidates
    // carry the host's own index, which wins).
    let mut index_of: HashMap<String, u32> = HashMap::new();
    let mut last_ms = 0;
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| WorkloadError::Line {
            path: path.to_path_buf(),
            line: line_no,
            reason,
        };
        let e: LoggedEvent = serde_json::from_str(line)
            .map_err(|err| bad(format!("not a vramgate event ({err}); is the log truncated?")))?;
        // The events vramgate writes ([`crate::events::Kind`]); anything else is not a vramgate log.
        if crate::events::Kind::from_name(&e.event).is_none() {
            return Err(bad(format!("unknown event {:?}", e.event)));
        }
        last_ms = last_ms.max(e.time_unix_ms);
        if let Some(p) = &e.placement {
            for c in &p.candidates {
                index_of.entry(c.uuid.clone()).or_insert(c.index);
            }
        }
        for g in &e.gpus {
            let next = index_of.len() as u32;
            index_of.entry(g.uuid.clone()).or_insert(next);
        }
        let s = seen.entry(e.container.clone()).or_insert_with(|| {
            order.push(e.container.clone());
            Seen::default()
        });
        if let Some(name) = e.name.as_deref().and_then(crate::request::checked_name) {
            s.name.get_or_insert_with(|| name.to_string());
        }
        match e.event.as_str() {
            "admit" | "admit_after_wait" | "enqueue" | "refuse" | "timeout" => {
                if s.first_ms.is_none() {
                    s.first_ms = Some(e.time_unix_ms);
                    s.first_line = line_no;
                }
                if e.event == "enqueue" || e.event == "admit_after_wait" || e.event == "timeout" {
                    s.queued = true;
                }
                if let Some(share) = e.gpus.first() {
                    s.bytes = share.bytes;
                    s.limit = share.limit;
                }
                if e.event.starts_with("admit") {
                    s.admitted_ms.get_or_insert(e.time_unix_ms);
                    s.gpus = Some(match &e.placement {
                        Some(p) if p.chosen.len() > 1 => format!("auto:{}", p.chosen.len()),
                        Some(_) => "auto".into(),
                        None => e
                            .gpus
                            .iter()
                            .map(|g| index_of[&g.uuid].to_string())
                            .collect::<Vec<_>>()
                            .join(","),
                    });
                }
            }
            "release" | "reclaim" if s.admitted_ms.is_some() && s.ended_ms.is_none() => {
                s.ended_ms = Some(e.time_unix_ms);
            }
            _ => {}
        }
    }
    let start = seen.values().filter_map(|s| s.first_ms).min().unwrap_or(0);
    // A job is named as its container was where no other container of the log had that name
    // (a job's id keys it in the replay, as the container id keyed it on the host); by the
    // container's id otherwise.
    let mut named: HashMap<&str, usize> = HashMap::new();
    for s in seen.values() {
        if let Some(name) = &s.name {
            *named.entry(name.as_str()).or_default() += 1;
        }
    }
    let unique_name = |s: &Seen| {
        s.name
            .clone()
            .filter(|n| named[n.as_str()] == 1 && !seen.contains_key(n.as_str()))
    };
    let mut jobs = Vec::new();
    for id in order {
        let s = &seen[&id];
        let Some(first) = s.first_ms else { continue };
        // A request that was refused, or ran out its wait, ran for no time: it is replayed to
        // be refused or to wait again.
        let duration = match (s.admitted_ms, s.ended_ms) {
            (Some(a), Some(e)) => e.saturating_sub(a),
            // Still running when the log ends.
            (Some(a), None) => last_ms.saturating_sub(a),
            _ => 0,
        };
        if s.bytes == 0 {
            continue;
        }
        jobs.push(Job {
            id: unique_name(s).unwrap_or_else(|| id.clone()),
            arrival_ms: first - start,
            memory: s.bytes.to_string(),
            limit: s.limit.map(|l| l.to_string()),
            duration_ms: duration,
            gpus: s.gpus.clone().unwrap_or_else(|| "auto".into()),
            policy: s.queued.then(|| "wait".to_string()),
            timeout: None,
            expected_duration: None,
            line: s.first_line,
        });
    }
    jobs.sort_by_key(|j| (j.arrival_ms, j.line));
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_files_and_their_errors() {
        let p = Path::new("jobs.jsonl");
        let jobs = from_job_file(
            "{\"arrival\":1.5,\"memory\":\"6Gi\",\"duration\":10,\"id\":\"a\"}\n\n# note\n{\"arrival\":0,\"memory\":\"1Gi\",\"duration\":2,\"gpus\":\"0\",\"policy\":\"reject\"}\n",
            p,
        )
        .unwrap();
        assert_eq!(jobs[0].id, "job-4");
        assert_eq!(jobs[1].limit, None);
        let limited = from_job_file(
            "{\"arrival\":0,\"memory\":\"2Gi\",\"limit\":\"6Gi\",\"duration\":1}\n",
            p,
        )
        .unwrap();
        assert_eq!(limited[0].limit.as_deref(), Some("6Gi"));
        assert_eq!(
            (jobs[1].arrival_ms, jobs[1].duration_ms, jobs[1].gpus.as_str()),
            (1500, 10_000, "auto")
        );
        let err = from_job_file("{\"arrival\":0,\"memory\":\"1Gi\"}\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("jobs.jsonl:1: not a job (missing field `duration`"),
            "{err}"
        );
        let err = from_job_file("{\"arrival\":-1,\"memory\":\"1Gi\",\"duration\":1}", p)
            .unwrap_err()
            .to_string();
        assert!(err.contains("arrival must be"), "{err}");
    }

    #[test]
    fn a_timeout_is_seconds_or_a_duration() {
        let p = Path::new("jobs.jsonl");
        let line =
            |t: &str| format!("{{\"arrival\":0,\"memory\":\"1Gi\",\"duration\":1,\"id\":\"t\",\"timeout\":{t}}}");
        let timeout = |t: &str| from_job_file(&line(t), p).map(|j| j[0].timeout.clone());
        assert_eq!(timeout("90").unwrap().as_deref(), Some("90000ms"));
        assert_eq!(timeout("1.5").unwrap().as_deref(), Some("1500ms"));
        assert_eq!(timeout("0").unwrap().as_deref(), Some("0ms"));
        assert_eq!(timeout("\"10m\"").unwrap().as_deref(), Some("10m"));
        assert_eq!(timeout("604800").unwrap().as_deref(), Some("604800000ms"));
        for bad in ["-1", "604801", "1e300"] {
            let err = timeout(bad).unwrap_err().to_string();
            assert!(
                err.starts_with("jobs.jsonl:1: job t: timeout must be a number of seconds from 0 to 604800"),
                "{bad}: {err}"
            );
        }
        // Neither a number nor a string.
        let err = timeout("true").unwrap_err().to_string();
        assert!(err.starts_with("jobs.jsonl:1: not a job"), "{err}");
    }

    #[test]
    fn event_logs_become_jobs_and_bad_lines_are_named() {
        let p = Path::new("events.jsonl");
        let log = r#"{"time_unix_ms":1000,"event":"admit","container":"a","name":"ns/pod/a","gpus":[{"uuid":"GPU-x","bytes":5}]}
{"time_unix_ms":1500,"event":"enqueue","container":"b","gpus":[{"uuid":"GPU-x","bytes":7}]}
{"time_unix_ms":4000,"event":"release","container":"a","gpus":[{"uuid":"GPU-x","bytes":5}]}
{"time_unix_ms":4000,"event":"admit_after_wait","container":"b","gpus":[{"uuid":"GPU-x","bytes":7,"limit":9}]}
{"time_unix_ms":9000,"event":"reclaim","container":"b","gpus":[{"uuid":"GPU-x","bytes":7}]}
"#;
        let jobs = from_events(log, p).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(
            (jobs[0].arrival_ms, jobs[0].duration_ms, jobs[0].gpus.as_str()),
            (0, 3000, "0")
        );
        assert_eq!((jobs[1].arrival_ms, jobs[1].duration_ms), (500, 5000));
        assert_eq!(jobs[1].policy.as_deref(), Some("wait"));
        assert_eq!(jobs[1].memory, "7");
        assert_eq!((jobs[0].limit.as_deref(), jobs[1].limit.as_deref()), (None, Some("9")));
        let err = from_events(&log.replace("\"reclaim\"", "\"teleport\""), p)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "events.jsonl:5: unknown event \"teleport\"");
        let err = from_events(&log[..log.len() - 30], p).unwrap_err().to_string();
        assert!(err.starts_with("events.jsonl:5: not a vramgate event"), "{err}");
    }

    #[test]
    fn a_job_is_named_as_its_container_was_where_the_name_was_its_alone() {
        let p = Path::new("events.jsonl");
        let log = r#"{"time_unix_ms":1000,"event":"admit","container":"c1","name":"ns/train/worker","gpus":[{"uuid":"GPU-x","bytes":5}]}
{"time_unix_ms":1100,"event":"admit","container":"c2","name":"twin","gpus":[{"uuid":"GPU-x","bytes":5}]}
{"time_unix_ms":1200,"event":"admit","container":"c3","name":"twin","gpus":[{"uuid":"GPU-x","bytes":5}]}
{"time_unix_ms":1300,"event":"admit","container":"c4","gpus":[{"uuid":"GPU-x","bytes":5}]}
{"time_unix_ms":1400,"event":"admit","container":"c5","name":"bad\nname","gpus":[{"uuid":"GPU-x","bytes":5}]}
"#;
        let ids: Vec<String> = from_events(log, p).unwrap().into_iter().map(|j| j.id).collect();
        assert_eq!(ids, ["ns/train/worker", "c2", "c3", "c4", "c5"]);
    }
}
