//! Log: the one sink every log record goes through on its way to stderr —
//! toolgate's own and those of the libraries it runs (rmcp, hyper), whose
//! fields carry what a remote server or an MCP client sent (a JSON-RPC id,
//! an SSE event id, a URL with its query).
//!
//! Owns what reaches the operator's terminal and CI logs from `tracing`.
//! Must never write a control or invisible character a record holds (a
//! server's id with `ESC [2K`, `\r`, U+202E would erase and rewrite the
//! lines around it, or set the clipboard through OSC 52) nor a record
//! holding a secret the config names (rmcp logs a failed request's URL,
//! which for `mcp import` holds a query credential).

use std::io::Write as _;
use std::sync::{Arc, RwLock};

use toolgate::Config;
use toolgate::display::{Lines, escape_unseen};
use toolgate::sandbox::scan::SecretScanner;

/// The secrets of the config this process runs with, once it is loaded.
static WATCHED: RwLock<Option<Arc<SecretScanner>>> = RwLock::new(None);

/// Watch every secret `config` names (credentials and the host's own) in
/// what is logged from now on. One that cannot be read is not watched;
/// the command that needs it says so itself.
pub(crate) fn watch(config: &Config) {
    let watched = config.watched();
    let secrets = toolgate_author::mcp_import::ConfiguredSecrets::read(watched.iter().map(|s| s.as_ref()));
    let scanner = Arc::new(secrets.scanner());
    if let Ok(mut slot) = WATCHED.write() {
        *slot = Some(scanner);
    }
}

/// The stderr sink for `tracing_subscriber::fmt`: it formats each event
/// into one buffer and writes it through one [`Record`].
pub(crate) struct Sink;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = Record;

    fn make_writer(&'a self) -> Record {
        Record(Vec::new())
    }
}

/// One formatted record, written to stderr as [`shown`] when dropped.
pub(crate) struct Record(Vec<u8>);

impl std::io::Write for Record {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let scanner = WATCHED.read().ok().and_then(|s| s.clone());
        let line = shown(&self.0, scanner.as_deref());
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

/// `record` as it may be shown: one line, every unseen character escaped
/// (line breaks inside it too), or a note instead of a record that holds a
/// watched secret in any form the host's scanner reads.
fn shown(record: &[u8], watched: Option<&SecretScanner>) -> String {
    let text = String::from_utf8_lossy(record);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    if let Some(found) = watched.and_then(|s| s.find(text.as_bytes())) {
        return format!("[a log record was withheld: it held {found}]");
    }
    escape_unseen(text, Lines::Escape).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a remote or a client puts in a field rmcp logs unescaped (a
    /// JSON-RPC id) reaches the terminal as visible escapes, on one line.
    #[test]
    fn a_record_is_shown_on_one_line_with_every_unseen_character_escaped() {
        let id = "\u{1b}[1A\u{1b}[2K\rgrant it\nwith\u{202e}txt.exe\u{1b}]52;c;aGk=\u{7}";
        let record = format!("WARN response error id={id}\n");
        let line = shown(record.as_bytes(), None);
        assert!(!line.chars().any(|c| c.is_control() || c == '\u{202e}'), "{line:?}");
        for escaped in ["\\u{1b}[2K", "\\r", "\\n", "\\u{202e}", "\\u{7}"] {
            assert!(line.contains(escaped), "{line:?} lacks {escaped}");
        }
        assert_eq!(shown(b"WARN plain words\n", None), "WARN plain words");
    }

    /// A record holding a watched secret — also percent-encoded in a URL's
    /// query, as rmcp logs a failed request — is withheld whole.
    #[test]
    fn a_record_holding_a_watched_secret_is_withheld() {
        let secret = "sk-live-4f9a8b7c6d5e4f3a2b1c";
        let scanner = SecretScanner::new(&[("remote".to_owned(), secret.as_bytes().to_vec())]);
        for record in [
            format!("ERROR worker quit with fatal: url: \"https://h/mcp?api_key={secret}\"\n"),
            "ERROR url: https://h/mcp?api_key=sk%2Dlive%2D4f9a8b7c6d5e4f3a2b1c\n".to_owned(),
        ] {
            let line = shown(record.as_bytes(), Some(&scanner));
            assert!(line.starts_with("[a log record was withheld: it held") && line.contains("remote"), "{line}");
            assert!(!line.contains("4f9a8b7c6d5e"), "{line}");
        }
        assert_eq!(shown(b"INFO nothing secret\n", Some(&scanner)), "INFO nothing secret");
    }
}
