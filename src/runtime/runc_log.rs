//! runc's `--log` file, where the wrapper's own messages go.
//!
//! containerd's shim reads the last error line of that file into the message Docker and `ctr`
//! show; stderr alone would be lost. Lines are in runc's own format (logrus), so the shim and
//! anyone reading the file see one format whoever wrote the line.

use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use serde_json::json;

use super::argv::Invocation;

/// The logrus levels the wrapper writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The wrapper refuses and the next runtime never runs.
    Error,
    /// The wrapper goes on (with the default runtimes), but an admin should know.
    Warning,
}

impl Level {
    /// The name logrus writes for the level.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warning => "warning",
        }
    }
}

/// RFC 3339 UTC time with seconds, as runc's logrus writes it, from the system clock.
pub fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(now.as_secs() as i64, now.subsec_nanos())
}

/// Days-to-civil conversion (Howard Hinnant's algorithm), so no date crate is needed.
pub fn rfc3339(unix_secs: i64, nanos: u32) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        nanos
    )
}

/// One line in runc's log format: JSON (`--log-format json`, what containerd passes) or
/// logrus text (runc's default).
pub fn log_line(level: Level, message: &str, format: Option<&OsStr>, time: &str) -> String {
    let level = level.as_str();
    if format == Some(OsStr::new("json")) {
        json!({ "level": level, "msg": message, "time": time }).to_string() + "\n"
    } else {
        format!("time=\"{time}\" level={level} msg={}\n", json!(message))
    }
}

/// Appends `message` at `level` to runc's `--log` file, in its `--log-format`; without
/// `--log`, does nothing (runc's default log is stderr, which the caller decides about).
pub fn append(inv: &Invocation, level: Level, message: &str) -> std::io::Result<()> {
    let Some(log) = &inv.log else {
        return Ok(());
    };
    let line = log_line(level, message, inv.log_format.as_deref(), &rfc3339_now());
    // One write of the whole line in append mode: runc and the shim may write the same file.
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(log)
        .and_then(|mut f| f.write_all(line.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn runc_log_lines() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.000000005Z");
        assert_eq!(rfc3339(1_735_689_599, 0), "2024-12-31T23:59:59.000000000Z");
        let json_line = log_line(Level::Error, "vramgate: \"x\" failed", Some(OsStr::new("json")), "T");
        let v: Value = serde_json::from_str(&json_line).unwrap();
        assert_eq!(
            v,
            json!({"level": "error", "msg": "vramgate: \"x\" failed", "time": "T"})
        );
        assert_eq!(
            log_line(Level::Error, "a \"b\"", None, "T"),
            "time=\"T\" level=error msg=\"a \\\"b\\\"\"\n"
        );
    }

    #[test]
    fn warnings_use_logrus_level_name() {
        let v: Value = serde_json::from_str(&log_line(
            Level::Warning,
            "an error in a warning",
            Some(OsStr::new("json")),
            "T",
        ))
        .unwrap();
        assert_eq!(
            v,
            json!({"level": "warning", "msg": "an error in a warning", "time": "T"})
        );
        assert_eq!(
            log_line(Level::Warning, "m", Some(OsStr::new("text")), "T"),
            "time=\"T\" level=warning msg=\"m\"\n"
        );
    }

    #[test]
    fn append_adds_a_line_and_keeps_earlier_ones() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log.json");
        std::fs::write(&log, "earlier\n").unwrap();
        let inv = Invocation {
            log: Some(log.clone()),
            log_format: Some("json".into()),
            ..Invocation::default()
        };
        append(&inv, Level::Warning, "w").unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "earlier");
        assert_eq!(serde_json::from_str::<Value>(lines[1]).unwrap()["level"], "warning");
        append(&Invocation::default(), Level::Error, "nowhere").unwrap();
    }
}
