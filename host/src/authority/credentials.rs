//! Credentials: references everywhere, plaintext only at the boundary.
//!
//! Owns credential specs (name, where the secret comes from, the destinations
//! it is bound to, how it is applied), reading the secret at the moment a
//! request leaves the host, and [`Secret`], whose `Debug` and `Display` never
//! show the value.
//!
//! Architecture invariant: configuration, journal, captured output, tracing
//! and everything a guest or the model sees hold a credential's *name*. The
//! plaintext exists only inside [`Secret`], created by
//! [`CredentialSpec::materialize`] for one outbound request to a destination
//! bound to it, and is used to write that request — or, through
//! [`CredentialSpec::read_to_check`], to check what comes back to a guest.
//!
//! Applying and watching differ in what they refuse. A secret is applied
//! only from an owner-only file or a UTF-8 environment variable, and only
//! when it is long enough to be checked for; but whatever the host *can*
//! read of it is watched for, refusals aside: a secret file left readable
//! by others (a Kubernetes secret volume's default 0644), a short secret
//! or one that is not UTF-8 is still a secret a guest must not get.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::authority::destination::Destination;

/// Where a secret comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An environment variable of the host process.
    Env(String),
    /// A file readable only by its owner (mode 0600 or stricter).
    File(PathBuf),
}

/// Opens every error of a secret's source in the config: the parser's
/// error for it must not quote the line it is on, which may hold the secret
/// itself (`source = "ghp_…"`): [`crate::config::Config::parse`] drops the
/// quoted source for an error that holds this.
pub const SOURCE_ERROR: &str = "a secret's source is `{ env = \"VAR\" }` or `{ file = \"PATH\" }`, never the secret";

/// The table form of [`Source`] as the config writes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
enum SourceTable {
    Env(String),
    File(PathBuf),
}

impl<'de> Deserialize<'de> for Source {
    /// A table naming where the secret is; anything else — a string, a
    /// number: the secret written in the config — is refused without its
    /// value, as is a table with other keys.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{self, Error as _};
        struct Table;
        fn refused<E: de::Error>() -> E {
            E::custom(format!("{SOURCE_ERROR} itself: the value here was not read and is not shown"))
        }
        impl<'de> de::Visitor<'de> for Table {
            type Value = Source;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(SOURCE_ERROR)
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Source, A::Error> {
                match SourceTable::deserialize(de::value::MapAccessDeserializer::new(map)) {
                    Ok(SourceTable::Env(var)) => Ok(Source::Env(var)),
                    Ok(SourceTable::File(path)) => Ok(Source::File(path)),
                    Err(e) => Err(A::Error::custom(format!("{SOURCE_ERROR}: {e}"))),
                }
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Source, E> {
                Err(refused())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Source, E> {
                Err(refused())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Source, E> {
                Err(refused())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Source, E> {
                Err(refused())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Source, E> {
                Err(refused())
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Source, A::Error> {
                Err(refused())
            }
        }
        d.deserialize_any(Table)
    }
}

impl Source {
    /// Refuse a source no process could ever read: an environment variable
    /// name that is empty or holds `=` or NUL (the environment cannot hold
    /// one), or an empty file path. The message names the key (`env`,
    /// `file`) and the fix; the caller names the field.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Source::Env(var) if var.is_empty() => {
                Err("`env` is empty; name the environment variable that holds the secret".into())
            }
            // Not quoted: a pasted `NAME=value` line puts the secret here.
            Source::Env(var) if var.contains(['=', '\0']) => {
                Err("`env` is not a variable name (it holds `=` or NUL; its value is not shown, as a pasted \
                 `NAME=value` puts the secret there); name the environment variable that holds the secret, e.g. \
                 `{ env = \"API_TOKEN\" }`"
                    .into())
            }
            Source::File(p) if p.as_os_str().is_empty() => {
                Err("`file` is empty; give the path of the file that holds the secret".into())
            }
            _ => Ok(()),
        }
    }
}

/// An environment variable's name as messages show it: quoted when it
/// reads as one (letters of one case, digits, `_`: `GITHUB_TOKEN`,
/// `http_proxy`); otherwise not shown — a token written where its
/// variable's name belongs (`env = "ghp_…"`) must not reach a log.
pub fn shown_var(var: &str) -> String {
    let name = |upper: bool| {
        var.chars().next().is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
            && var.chars().all(|c| {
                c == '_' || c.is_ascii_digit() || (if upper { c.is_ascii_uppercase() } else { c.is_ascii_lowercase() })
            })
    };
    if name(true) || name(false) {
        format!("environment variable `{var}`")
    } else {
        "the environment variable `source.env` names (not shown: mixed-case, it reads like a secret, not a \
         variable's name)"
            .to_owned()
    }
}

/// How a secret is applied to a request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub enum Apply {
    /// A header whose value is `format` with `{}` replaced by the secret.
    Header {
        /// Header name, e.g. `Authorization`.
        name: String,
        /// E.g. `Bearer {}`.
        #[serde(default = "plain")]
        format: String,
    },
    /// HTTP basic auth: `username` with the secret as password.
    Basic {
        /// The user name.
        username: String,
    },
    /// A query parameter.
    Query {
        /// Parameter name.
        param: String,
    },
}

fn plain() -> String {
    "{}".into()
}

/// One credential as configured.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    /// Where the secret comes from.
    pub source: Source,
    /// Destinations the secret may be sent to (`scheme://host:port`).
    pub destinations: Vec<String>,
    /// How it is applied.
    pub apply: Apply,
}

/// A checked credential: name, source, bound destinations, application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialSpec {
    /// The reference guests and config use.
    pub name: String,
    source: Source,
    destinations: Vec<Destination>,
    apply: Apply,
    /// One of the host's own secrets ([`CredentialSpec::watch_only`]):
    /// watched for, never applied.
    watch_only: bool,
}

/// Why a credential cannot be used. Messages name the credential, never the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Config problem.
    #[error("credential `{name}`: {problem}")]
    Invalid {
        /// The credential.
        name: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// The secret cannot be read now.
    #[error("credential `{name}`: {problem}")]
    Unavailable {
        /// The credential.
        name: String,
        /// Why.
        problem: String,
    },
}

impl CredentialSpec {
    /// Check a configured credential (not its secret, which is read only when used).
    pub fn new(name: &str, config: &CredentialConfig, base: &Path) -> Result<Self, CredentialError> {
        let invalid = |problem: String| CredentialError::Invalid { name: name.to_owned(), problem };
        if config.destinations.is_empty() {
            return Err(invalid("`destinations` is empty; bind it to where it may be sent".into()));
        }
        let destinations = config
            .destinations
            .iter()
            .map(|d| Destination::parse(d, false).map_err(|e| invalid(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        match &config.apply {
            Apply::Header { name: h, format } => {
                if h.parse::<http::HeaderName>().is_err() {
                    // Not quoted: `name = "Authorization: Bearer ghp_…"` puts the secret here.
                    return Err(invalid(
                        "`apply.header.name` is not a valid header name (a token's characters, no `:` or blank; \
                         it is not shown, as a pasted `Name: value` line puts the secret there): write the name \
                         alone, e.g. `Authorization`, and the value's form in `format`"
                            .into(),
                    ));
                }
                if format.matches("{}").count() != 1 {
                    return Err(invalid("`format` must contain `{}` exactly once".into()));
                }
                // What is sent must be a header value whatever the secret
                // (itself checked when read): a line break or other control
                // character in the format would fail every request.
                if http::HeaderValue::from_str(&format.replace("{}", "x")).is_err() {
                    return Err(invalid(format!(
                        "`apply.format` = {format:?} is not a valid header value (it holds a line break, another \
                         control character or a non-ASCII one); use printable ASCII around `{{}}`, e.g. `Bearer {{}}`"
                    )));
                }
            }
            Apply::Basic { username } if username.contains(':') => {
                return Err(invalid("a basic-auth username cannot contain `:`".into()));
            }
            Apply::Query { param } if param.is_empty() => return Err(invalid("`param` is empty".into())),
            _ => {}
        }
        config.source.check().map_err(|e| invalid(format!("`source`: {e}")))?;
        let source = match &config.source {
            Source::File(p) if p.is_relative() => Source::File(base.join(p)),
            s => s.clone(),
        };
        Ok(CredentialSpec {
            name: name.to_owned(),
            source,
            destinations,
            apply: config.apply.clone(),
            watch_only: false,
        })
    }

    /// One of the host's own secrets that the config names by reference —
    /// a `[[serve.auth]]` token, `serve.state_key`, `postgres.password` —
    /// named by its field (`serve.auth[0].token`): watched for in
    /// everything that comes back to a guest, exactly as a credential's
    /// secret is, but never applied to a request. It is bound to no
    /// destination and [`CredentialSpec::materialize`] refuses it; it is
    /// kept out of `[credentials]`, the only place a grant (and so a guest
    /// naming a credential) takes credentials from. `source` as the config
    /// holds it (a file's path absolute).
    pub fn watch_only(field: &str, source: Source) -> Self {
        CredentialSpec {
            name: field.to_owned(),
            source,
            destinations: Vec::new(),
            apply: Apply::Header { name: String::new(), format: plain() },
            watch_only: true,
        }
    }

    /// Whether this is one of the host's own secrets, watched only
    /// ([`CredentialSpec::watch_only`]).
    pub fn is_watch_only(&self) -> bool {
        self.watch_only
    }

    /// Whether the credential may be sent to this request's destination.
    pub fn bound_to(&self, scheme: &str, host: &str, port: u16) -> bool {
        !self.watch_only && self.destinations.iter().any(|d| d.matches(scheme, host, port))
    }

    /// How it is applied.
    pub fn apply(&self) -> &Apply {
        &self.apply
    }

    /// The file the secret is read from, if it comes from one (the host
    /// refuses directory grants that would expose it).
    pub fn source_file(&self) -> Option<&Path> {
        match &self.source {
            Source::File(p) => Some(p),
            Source::Env(_) => None,
        }
    }

    /// Which secret this is, whatever the credential is called: its
    /// variable, or its file's absolute path (`.` and repeated separators
    /// dropped; `..` kept, as a symlink may make it mean another file). Two
    /// configs in one process (an embedder's two runtimes) may give one
    /// name to different sources: what the process has read is kept by
    /// this, so a value read for one is never taken for the other's.
    pub fn source_id(&self) -> Source {
        match &self.source {
            Source::Env(var) => Source::Env(var.clone()),
            Source::File(path) => Source::File(std::path::absolute(path).unwrap_or_else(|_| path.clone())),
        }
    }

    /// Read the secret for one request to `scheme://host:port`. Refuses an
    /// unbound destination before reading anything.
    pub fn materialize(&self, scheme: &str, host: &str, port: u16) -> Result<Secret, CredentialError> {
        if self.watch_only {
            return Err(CredentialError::Invalid {
                name: self.name.clone(),
                problem: "is the host's own secret, watched for in what guests get and never sent".into(),
            });
        }
        if !self.bound_to(scheme, host, port) {
            return Err(CredentialError::Unavailable {
                name: self.name.clone(),
                problem: format!("not bound to {scheme}://{host}:{port}"),
            });
        }
        self.read()
    }

    /// Read the secret to check what comes back to a guest against it (the
    /// response check looks for every configured secret, bound or not). It
    /// never leaves the host this way. Whatever the host can read is
    /// returned, whether or not it would apply it: a file readable by
    /// others, a secret shorter than [`MIN_SECRET`], an environment value
    /// that is not UTF-8 — each refused by [`CredentialSpec::materialize`],
    /// none of them less of a secret.
    pub fn read_to_check(&self) -> Result<WatchedSecret, CredentialError> {
        let unavailable = |problem: String| CredentialError::Unavailable { name: self.name.clone(), problem };
        let mut value = match &self.source {
            Source::Env(var) => {
                let value = std::env::var_os(var)
                    .ok_or_else(|| unavailable(format!("{} is not set in the host process", shown_var(var))))?;
                os_bytes(value)
            }
            Source::File(path) => crate::files::read_bounded(path, MAX_SECRET_FILE).map_err(|e| {
                let field = if self.watch_only { self.name.as_str() } else { "source.file" };
                unavailable(format!(
                    "cannot read {}: {e}; point `{field}` at the secret's own regular file",
                    path.display()
                ))
            })?,
        };
        while value.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
            value.pop();
        }
        if value.starts_with(BOM.as_bytes()) {
            value.drain(..BOM.len());
        }
        // Blank is no value to look for: the real secret is elsewhere, and
        // the host cannot check for it (a client passing `GITHUB_TOKEN=""`).
        if value.trim_ascii().is_empty() {
            return Err(unavailable(match &self.source {
                Source::Env(var) => format!("{} is empty in the host process", shown_var(var)),
                Source::File(path) => format!("{} is empty", path.display()),
            }));
        }
        Ok(WatchedSecret(value))
    }

    /// What to do so the host can read this credential's secret, for a
    /// record or warning that says it cannot.
    pub fn read_fix(&self) -> String {
        match &self.source {
            Source::Env(var) => format!(
                "set {} in the environment the host runs in (for `toolgate serve` started by an MCP client, in the \
                 `env` the client's config gives the server; clients do not pass on the user's shell)",
                shown_var(var).trim_start_matches("environment variable ")
            ),
            Source::File(_) if self.watch_only => {
                format!("fix the file, or `{}`: the host's user must be able to read it", self.name)
            }
            Source::File(_) => "fix the file, or `source.file`: the host's user must be able to read it".into(),
        }
    }

    /// Why the host cannot read this credential's secret now, with the fix;
    /// `None` when it can. Reads the source (for a warning at start: until
    /// it can be read, the host refuses what it cannot check for it).
    pub fn unreadable(&self) -> Option<String> {
        let e = self.read_to_check().err()?;
        Some(format!("{e}; {}", self.read_fix()))
    }

    fn read(&self) -> Result<Secret, CredentialError> {
        let unavailable = |problem: String| CredentialError::Unavailable { name: self.name.clone(), problem };
        let value = match &self.source {
            Source::Env(var) => std::env::var(var).map_err(|e| {
                unavailable(match e {
                    std::env::VarError::NotPresent => {
                        format!("{} is not set in the host process", shown_var(var))
                    }
                    std::env::VarError::NotUnicode(_) => {
                        format!("{} is not UTF-8, which a request cannot carry", shown_var(var))
                    }
                })
            })?,
            Source::File(path) => read_owner_only(path).map_err(unavailable)?,
        };
        let value = without_bom(value.trim_end_matches(['\n', '\r'])).to_owned();
        // Counted without the blanks around it: a server reads a header or
        // form value without them (`\t\tabc1234` is 7 bytes to it), and
        // a blank is nothing a response could be checked for.
        let real = value.trim_ascii().len();
        if real < MIN_SECRET {
            // Too short to tell apart from ordinary response text: it could not be checked.
            let blanks = if real < value.len() {
                format!(" without the blanks around it ({} with them)", value.len())
            } else {
                String::new()
            };
            return Err(unavailable(format!(
                "the secret is {real} bytes{blanks}; at least {MIN_SECRET} are needed so responses can be \
                 checked for it: put the whole secret the service issued in {}",
                match &self.source {
                    Source::Env(var) => shown_var(var),
                    Source::File(path) => path.display().to_string(),
                }
            )));
        }
        Ok(Secret(value))
    }
}

/// Read a secret from `source` at this moment (an HTTP serving token, say):
/// an environment variable, or an owner-only file. Errors name the source,
/// never the value.
pub fn read_source(source: &Source) -> Result<String, String> {
    let value = match source {
        Source::Env(var) => {
            std::env::var(var).map_err(|_| format!("{} is not set in the host process", shown_var(var)))?
        }
        Source::File(path) => read_owner_only(path)?,
    };
    Ok(without_bom(value.trim_end_matches(['\n', '\r'])).to_owned())
}

/// A UTF-8 byte order mark, which Notepad and PowerShell (`Out-File`,
/// `Set-Content -Encoding utf8` before 6.0) put at the start of a file.
const BOM: &str = "\u{feff}";

/// `value` without a byte order mark at its start: it is no part of the
/// secret, and is dropped alike where a secret is read to be sent
/// ([`CredentialSpec::materialize`], [`read_source`]) and to be watched for
/// ([`CredentialSpec::read_to_check`]), so what is sent is what is watched.
fn without_bom(value: &str) -> &str {
    value.strip_prefix(BOM).unwrap_or(value)
}

/// The shortest secret toolgate applies: shorter ones cannot be told apart
/// from ordinary response text, so responses could not be checked for them.
pub const MIN_SECRET: usize = 8;

/// Largest secret file read.
const MAX_SECRET_FILE: u64 = 64 << 10;

fn read_owner_only(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
            return Err(format!("{} is readable by others; run `chmod 600 {}`", path.display(), path.display()));
        }
    }
    let _ = meta;
    crate::files::read_text(path, MAX_SECRET_FILE).map_err(|e| {
        format!("cannot read {}: {e}; point `source.file` at the secret's own regular file", path.display())
    })
}

/// The bytes of an environment value (on Unix, whatever they are).
fn os_bytes(value: std::ffi::OsString) -> Vec<u8> {
    #[cfg(unix)]
    {
        std::os::unix::ffi::OsStringExt::into_vec(value)
    }
    #[cfg(not(unix))]
    {
        value.to_string_lossy().into_owned().into_bytes()
    }
}

/// A secret's bytes as the host can read them, to watch for in what comes
/// back to a guest ([`CredentialSpec::read_to_check`]). Never printed;
/// never applied to a request.
#[derive(Clone, PartialEq, Eq)]
pub struct WatchedSecret(Vec<u8>);

impl WatchedSecret {
    /// The bytes, for building the check's needles.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for WatchedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WatchedSecret([redacted])")
    }
}

impl Drop for WatchedSecret {
    fn drop(&mut self) {
        // Best effort, as for `Secret`.
        self.0.fill(0);
    }
}

/// A secret's plaintext. Never printed; compared and written only by the
/// outbound boundary.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The plaintext, for writing the outbound request and checking responses.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        // Best effort: overwrite the plaintext before the allocation is freed.
        // SAFETY: writing zero bytes keeps the string valid UTF-8.
        unsafe { self.0.as_bytes_mut().fill(0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(apply: Apply, source: Source) -> CredentialSpec {
        let cfg = CredentialConfig { source, destinations: vec!["http://127.0.0.1:8080".into()], apply };
        CredentialSpec::new("tracker", &cfg, Path::new("/")).unwrap()
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret("hunter2".into());
        assert_eq!(format!("{s:?} {s}"), "Secret([redacted]) [redacted]");
    }

    #[test]
    fn an_unbound_destination_is_refused_before_the_secret_is_read() {
        let c = spec(Apply::Query { param: "k".into() }, Source::Env("TOOLGATE_TEST_UNSET_VAR".into()));
        let e = c.materialize("http", "127.0.0.1", 9999).unwrap_err().to_string();
        assert!(e.contains("not bound"), "{e}");
        let e = c.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
        assert!(e.contains("TOOLGATE_TEST_UNSET_VAR") && e.contains("not set"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_file_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        std::fs::write(&f, "v3ry-s3cret\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = spec(Apply::Query { param: "k".into() }, Source::File(f.clone()));
        let e = c.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && !e.contains("v3ry"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(c.materialize("http", "127.0.0.1", 8080).unwrap().expose(), "v3ry-s3cret");
        // Too short to be checked for in responses: refused, length named, value not.
        std::fs::write(&f, "short\n").unwrap();
        let e = c.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
        assert!(e.contains("5 bytes") && e.contains("at least 8") && !e.contains("short\n"), "{e}");
        // Not a regular file (a directory, a FIFO): refused before reading.
        let c = spec(Apply::Query { param: "k".into() }, Source::File(dir.path().to_owned()));
        let e = c.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = c.read_to_check().unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "not read to be watched either: {e}");
    }

    /// A secret is long enough by its bytes besides the blanks around it:
    /// `\t\tabc1234` is 7 bytes to a server that reads the header without
    /// them, and is refused, naming the credential, both lengths and what
    /// to do (before, its 9 bytes passed and it was sent).
    #[cfg(unix)]
    #[test]
    fn blanks_around_a_secret_do_not_make_it_long_enough() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        let c =
            spec(Apply::Header { name: "Authorization".into(), format: "Bearer {}".into() }, Source::File(f.clone()));
        for content in ["\t\tabc1234", "abc1234   \n", " \x0cabc1234\r\n", "\u{feff} abc1234 "] {
            std::fs::write(&f, content).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            let e = c.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
            assert!(
                e.starts_with("credential `tracker`")
                    && e.contains("7 bytes without the blanks around it")
                    && e.contains("at least 8")
                    && e.contains("put the whole secret")
                    && e.contains(&f.display().to_string())
                    && !e.contains("abc1234"),
                "{content:?}: {e}"
            );
            assert!(c.read_to_check().is_ok(), "{content:?}: still watched");
        }
        let var = format!("TOOLGATE_CREDENTIALS_TEST_BLANKS_{}", std::process::id());
        let c = spec(Apply::Query { param: "k".into() }, Source::Env(var.clone()));
        // SAFETY (edition 2024): the variable is this test's own.
        unsafe { std::env::set_var(&var, "\t\tabc1234") };
        let e = c.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
        assert!(e.contains("7 bytes without the blanks around it (9 with them)") && e.contains(&var), "{e}");
        // Eight bytes besides the blanks: applied as it is, blanks and all.
        unsafe { std::env::set_var(&var, "\tabc12345") };
        assert_eq!(c.materialize("http", "127.0.0.1", 8080).unwrap().expose(), "\tabc12345");
    }

    /// What the host refuses to apply it still reads to watch for: a file
    /// readable by others, a short secret, an environment value that is not
    /// UTF-8 (each refused by `materialize`, as above).
    #[cfg(unix)]
    #[test]
    fn what_the_host_refuses_to_apply_it_still_reads_to_watch() {
        use std::os::unix::ffi::OsStrExt as _;
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        let c = spec(Apply::Query { param: "k".into() }, Source::File(f.clone()));
        for (mode, content, watched) in [
            (0o644, "v3ry-s3cret\r\n", "v3ry-s3cret"),
            (0o444, "v3ry-s3cret", "v3ry-s3cret"),
            (0o600, "short\n", "short"),
        ] {
            std::fs::write(&f, content).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert!(c.materialize("http", "127.0.0.1", 8080).is_err(), "{mode:o} {content:?}: refused for use");
            assert_eq!(c.read_to_check().unwrap().expose(), watched.as_bytes(), "{mode:o} {content:?}: watched");
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let var = format!("TOOLGATE_CREDENTIALS_TEST_NOT_UTF8_{}", std::process::id());
        // SAFETY (edition 2024): the variable is this test's own.
        unsafe { std::env::set_var(&var, std::ffi::OsStr::from_bytes(b"k3y-\xff-v4lue\n")) };
        let c = spec(Apply::Query { param: "k".into() }, Source::Env(var.clone()));
        let e = c.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
        assert!(e.contains("not UTF-8") && e.contains(&var), "{e}");
        assert_eq!(c.read_to_check().unwrap().expose(), b"k3y-\xff-v4lue");
        let c = spec(Apply::Query { param: "k".into() }, Source::Env("TOOLGATE_TEST_UNSET_VAR".into()));
        assert!(c.read_to_check().unwrap_err().to_string().contains("not set"));
    }

    /// A secret file saved with a UTF-8 byte order mark (Notepad,
    /// PowerShell's `Out-File`) is sent and watched without it, alike.
    #[cfg(unix)]
    #[test]
    fn a_byte_order_mark_is_no_part_of_the_secret_sent_or_watched() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s");
        for content in ["\u{feff}v3ry-s3cret", "\u{feff}v3ry-s3cret\r\n", "\u{feff}v3ry-s3cret\n"] {
            std::fs::write(&f, content).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
            for apply in [Apply::Query { param: "k".into() }, Apply::Basic { username: "u".into() }] {
                let c = spec(apply, Source::File(f.clone()));
                assert_eq!(c.materialize("http", "127.0.0.1", 8080).unwrap().expose(), "v3ry-s3cret", "{content:?}");
                assert_eq!(c.read_to_check().unwrap().expose(), b"v3ry-s3cret", "{content:?}");
            }
            assert_eq!(read_source(&Source::File(f.clone())).unwrap(), "v3ry-s3cret", "{content:?}");
        }
        // A mark alone is an empty file.
        std::fs::write(&f, "\u{feff}\n").unwrap();
        let c = spec(Apply::Query { param: "k".into() }, Source::File(f.clone()));
        assert!(c.read_to_check().unwrap_err().to_string().contains("is empty"));
        // A mark inside the secret is the secret's.
        std::fs::write(&f, "v3ry-\u{feff}s3cret").unwrap();
        assert_eq!(c.read_to_check().unwrap().expose(), "v3ry-\u{feff}s3cret".as_bytes());
    }

    /// A token written where its variable's name belongs (`env = "ghp_…"`)
    /// or a pasted `NAME=value` line is never quoted by the messages that
    /// name the variable (the warning at start, the records, a load error);
    /// an ordinary name is.
    #[test]
    fn a_secret_written_as_the_variables_name_is_not_shown() {
        const TOKEN: &str = "ghp_L1teralS3cretValue0123456789";
        let c = spec(Apply::Query { param: "k".into() }, Source::Env(TOKEN.into()));
        let why = c.unreadable().unwrap();
        assert!(!why.contains(TOKEN) && why.contains("source.env"), "{why}");
        let pasted = Source::Env(format!("GH_TOKEN={TOKEN}"));
        let e = pasted.check().unwrap_err();
        assert!(!e.contains(TOKEN) && e.contains("`env`"), "{e}");
        for ordinary in ["GITHUB_TOKEN", "http_proxy", "_X1"] {
            assert!(shown_var(ordinary).contains(&format!("`{ordinary}`")), "{ordinary}");
        }
    }

    /// A source that is unset, missing or blank has no value to watch for:
    /// `unreadable` names it and the fix (the warning at start), never a value.
    #[test]
    fn an_unreadable_or_blank_source_is_named_with_its_fix() {
        let var = format!("TOOLGATE_CREDENTIALS_TEST_BLANK_{}", std::process::id());
        let c = spec(Apply::Query { param: "k".into() }, Source::Env(var.clone()));
        let why = c.unreadable().unwrap();
        assert!(why.contains("not set") && why.contains(&format!("set `{var}` in the environment")), "{why}");
        // SAFETY (edition 2024): the variable is this test's own.
        unsafe { std::env::set_var(&var, " \r\n") };
        assert!(c.unreadable().unwrap().contains("is empty"));
        unsafe { std::env::set_var(&var, "r3adable-s3cret") };
        assert_eq!(c.unreadable(), None);
        let dir = tempfile::tempdir().unwrap();
        let c = spec(Apply::Query { param: "k".into() }, Source::File(dir.path().join("gone")));
        let why = c.unreadable().unwrap();
        assert!(why.contains("gone") && why.contains("`source.file`"), "{why}");
    }

    /// A source is one secret whatever the credential is called, and one
    /// name can stand for two secrets: the identity is the source's.
    #[test]
    fn a_source_is_identified_by_where_it_is_read_not_by_its_name() {
        let file = |p: &str| spec(Apply::Query { param: "k".into() }, Source::File(p.into())).source_id();
        assert_eq!(file("/run/secrets/./gh"), file("/run//secrets/gh"));
        assert_ne!(file("/run/secrets/gh"), file("/run/other/../secrets/gh"), "`..` may cross a symlink");
        let cfg = |source| CredentialConfig {
            source,
            destinations: vec!["http://127.0.0.1:8080".into()],
            apply: Apply::Query { param: "k".into() },
        };
        let relative =
            CredentialSpec::new("github", &cfg(Source::File("gh".into())), Path::new("/etc/toolgate")).unwrap();
        assert_eq!(relative.source_id(), Source::File("/etc/toolgate/gh".into()));
        let env = CredentialSpec::new("github", &cfg(Source::Env("GITHUB_TOKEN".into())), Path::new("/")).unwrap();
        assert_ne!(env.source_id(), relative.source_id(), "one name, two secrets");
        assert_eq!(env.source_id(), Source::Env("GITHUB_TOKEN".into()));
    }

    #[test]
    fn config_checks_name_the_credential() {
        let bad = [
            CredentialConfig {
                source: Source::Env("X".into()),
                destinations: vec![],
                apply: Apply::Query { param: "k".into() },
            },
            CredentialConfig {
                source: Source::Env("X".into()),
                destinations: vec!["http://h:*".into()],
                apply: Apply::Query { param: "k".into() },
            },
            CredentialConfig {
                source: Source::Env("X".into()),
                destinations: vec!["http://h:1".into()],
                apply: Apply::Header { name: "Authorization".into(), format: "Bearer".into() },
            },
            CredentialConfig {
                source: Source::Env("X".into()),
                destinations: vec!["http://h:1".into()],
                apply: Apply::Header { name: "bad header".into(), format: "{}".into() },
            },
            CredentialConfig {
                source: Source::Env("X".into()),
                destinations: vec!["http://h:1".into()],
                apply: Apply::Header { name: "Authorization".into(), format: "Bearer {}\r\nX-Evil: 1".into() },
            },
            CredentialConfig {
                source: Source::Env("".into()),
                destinations: vec!["http://h:1".into()],
                apply: Apply::Query { param: "k".into() },
            },
            CredentialConfig {
                source: Source::Env("A=B".into()),
                destinations: vec!["http://h:1".into()],
                apply: Apply::Query { param: "k".into() },
            },
            CredentialConfig {
                source: Source::Env("A\0B".into()),
                destinations: vec!["http://h:1".into()],
                apply: Apply::Query { param: "k".into() },
            },
        ];
        for b in bad {
            let e = CredentialSpec::new("tracker", &b, Path::new("/")).unwrap_err().to_string();
            assert!(e.starts_with("credential `tracker`"), "{e}");
        }
    }
}
