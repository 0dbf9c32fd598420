//! The main config's `imports` line: reading it, adding the drop-in, taking it out again.

use super::*;

pub(super) fn parse_toml(text: &str, path: &Path) -> Result<toml::Table> {
    toml::from_str(text).map_err(|e| SetupError::Parse {
        path: path.to_path_buf(),
        format: "TOML",
        message: e.message().to_string(),
    })
}

pub(super) fn imports_of(text: &str, path: &Path) -> Result<Vec<String>> {
    let table = parse_toml(text, path)?;
    match table.get("imports") {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| SetupError::Shape {
                    path: path.to_path_buf(),
                    what: "\"imports\" holds something other than strings".into(),
                })
            })
            .collect(),
        Some(_) => Err(SetupError::Shape {
            path: path.to_path_buf(),
            what: "\"imports\" is not an array".into(),
        }),
    }
}

/// The comment setup writes above an `imports` line it adds: `--remove` takes the two lines
/// out only when it finds them, so an `imports = []` the file had before stays.
pub(super) const IMPORTS_MARK: &str =
    "# added by `vramgate setup containerd`; `--remove` takes this line and the next out";

/// The lines of `text` as byte ranges, each without its line ending (`\n` or `\r\n`), and the
/// offset where the next line starts.
pub(super) fn line_spans(text: &str) -> Vec<(std::ops::Range<usize>, usize)> {
    let mut spans = Vec::new();
    let mut at = 0;
    for piece in text.split_inclusive('\n') {
        let body = piece.strip_suffix('\n').unwrap_or(piece);
        let body = body.strip_suffix('\r').unwrap_or(body);
        spans.push((at..at + body.len(), at + piece.len()));
        at += piece.len();
    }
    spans
}

/// The line of the top-level `imports = [...]` (on one line), if any, as its range in `text`
/// (without the line ending) and the offset of the next line: the lines before the first
/// table header are the top level. The edits below change only bytes inside it (or add and
/// take out whole lines of their own), so setup followed by `--remove` gives the file back
/// byte for byte, whatever its layout or line endings.
pub(super) fn imports_line(text: &str) -> Option<(std::ops::Range<usize>, usize)> {
    line_spans(text)
        .into_iter()
        .take_while(|(r, _)| !text[r.clone()].trim_start().starts_with('['))
        .find(|(r, _)| {
            let l = text[r.clone()].trim_start();
            l.strip_prefix("imports")
                .is_some_and(|rest| rest.trim_start().starts_with('=') && l.trim_end().ends_with(']'))
        })
}

/// The main config text with `file` imported (text edit, so comments and layout survive; the
/// result is parsed again to check).
pub(super) fn with_import(text: &str, file: &str, path: &Path) -> Result<String> {
    let quoted = toml_string(file);
    let several_lines = || SetupError::Shape {
        path: path.to_path_buf(),
        what: format!("its \"imports\" spans several lines; add {quoted} to it"),
    };
    let mut out = text.to_string();
    match imports_line(text) {
        None if text.lines().any(|l| l.trim_start().starts_with("imports")) => return Err(several_lines()),
        Some((line, _)) => {
            let body = &text[line.clone()];
            let open = line.start + body.find('[').expect("the line holds '['");
            let close = line.start + body.rfind(']').expect("the line ends with ']'");
            let inner = &text[open + 1..close];
            if inner.trim().is_empty() {
                out.insert_str(open + 1, &quoted);
            } else {
                out.insert_str(open + 1 + inner.trim_end().len(), &format!(", {quoted}"));
            }
        }
        None if text.trim().is_empty() => {
            out = format!("version = 2\n{IMPORTS_MARK}\nimports = [{quoted}]\n");
        }
        None => {
            // After `version = N` when the file starts with it (and that line ends), else first.
            let spans = line_spans(text);
            let at = spans
                .iter()
                .find(|(r, _)| {
                    let l = text[r.clone()].trim();
                    !l.is_empty() && !l.starts_with('#')
                })
                .filter(|(r, next)| text[r.clone()].trim_start().starts_with("version") && *next > r.end)
                .map_or(0, |(_, next)| *next);
            out.insert_str(at, &format!("{IMPORTS_MARK}\nimports = [{quoted}]\n"));
        }
    }
    if !imports_of(&out, path)?.iter().any(|i| i == file) {
        return Err(several_lines());
    }
    Ok(out)
}

/// The main config text without `file` imported: the undo of [`with_import`].
pub(super) fn without_import(text: &str, file: &str) -> String {
    let quoted = toml_string(file);
    let Some((line, next)) = imports_line(text) else {
        return text.to_string();
    };
    let body = &text[line.clone()];
    let edited = [format!(", {quoted}"), format!("{quoted}, "), quoted.clone()]
        .iter()
        .find_map(|needle| {
            body.find(needle.as_str())
                .map(|i| body[..i].to_string() + &body[i + needle.len()..])
        })
        .unwrap_or_else(|| body.to_string());
    // The line setup added under its mark goes with the mark, once nothing else is imported.
    let mark = line_spans(text)
        .into_iter()
        .find(|(_, n)| *n == line.start)
        .filter(|(r, _)| &text[r.clone()] == IMPORTS_MARK);
    match mark {
        Some((mark, _)) if edited.replace(' ', "") == "imports=[]" => text[..mark.start].to_string() + &text[next..],
        _ => text[..line.start].to_string() + &edited + &text[line.end..],
    }
}
