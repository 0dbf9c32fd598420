//! The client side of the supervisor's control socket: one line in, one line out.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One request to the node's supervisor over its control socket, answered within `limit`.
pub fn control(socket: &Path, request: &str, limit: Duration) -> Result<String, String> {
    let stream = UnixStream::connect(socket).map_err(|e| format!("{}: {e} (is the node up?)", socket.display()))?;
    stream.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    (&stream)
        .write_all(format!("{request}\n").as_bytes())
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| format!("{request}: no answer within {limit:?}: {e}"))?;
    let reply = reply.trim().to_string();
    match reply.strip_prefix("error: ") {
        Some(e) => Err(format!("{request}: {e}")),
        None if reply.is_empty() => Err(format!("{request}: the supervisor closed the socket")),
        None => Ok(reply),
    }
}
