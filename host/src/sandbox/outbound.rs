//! Outbound: the only network a guest has — HTTP through `wasi:http`, mediated here.
//!
//! Owns the request hook, both directions of the boundary (DESIGN.md
//! invariants 7 and 13). On the way out, each request must go to a granted
//! destination (exact scheme, host, port; no userinfo in the URL); at most
//! one credential is attached *by reference* with the `toolgate-credential`
//! request header, which never leaves the host: the hook removes it, checks
//! the credential is granted to this call and bound to this destination,
//! and only then reads the secret and writes it into the request. A granted
//! *name* is resolved by the host, never by the HTTP client, through a
//! bounded [`Resolver`] (a lookup cannot be stopped, so it holds its call's,
//! its Tool's and the host's slot until it returns), and the request goes to the
//! addresses that were resolved ([`checked_addresses`], [`send_to`]; over
//! HTTPS the TLS handshake names the host and checks its certificate). Over
//! plain HTTP they must be public: nothing but a certificate binds a name
//! to its owner's servers, and over HTTP there is none — a name whose DNS
//! says 127.0.0.1 would reach the host's own services, and one that changes
//! its answer between the check and the connection would pass any check
//! made on the name alone. The guest
//! cannot negotiate what the host could not check: `Accept-Encoding` is
//! pinned to `identity`, `TE` is dropped and `Range` requests are refused.
//! On the way back, the response is buffered (bounded per request, per call
//! and in number in flight: per call, per Tool — its share of the host's,
//! [`HostPools`] — and per host); its head is checked first; the codings it
//! declares on every `Content-Encoding` line and in `Transfer-Encoding` are
//! undone if the host can (gzip, deflate; at most three), any other is
//! refused; the body is checked, and so is every gzip or zlib stream in it
//! that no header declared. Checked for every configured secret (not only
//! the one applied) as read at that response, and for the exact value each
//! request of the call carried, in the encodings of [`super::scan`]; a
//! response holding one is withheld from the guest. While a configured
//! credential has no value the host can look for ([`Watched::Unvouched`]),
//! no request is sent: the check could not vouch for its response, and
//! withholding only the response would leave its effects done upstream.
//! Redirects are not followed: a guest that follows one makes a new
//! request, decided anew.
//!
//! Architecture invariant: a denial is `HttpRequestDenied` (a withheld
//! response an error) to the guest and a line in the call's host records;
//! no secret appears in either, and the guest cannot write to those records.
//! A request failed before anything of it left the host is told so by its
//! code (DNS, prohibited address, connection refused, connect timeout, TLS
//! setup) or by an `internal-error` starting with [`NOT_SENT`]; any other
//! failure may have reached the destination (`toolgate_sdk::http`).

use std::io::Read as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Limited};
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::scan::SecretScanner;
use crate::authority::credentials::{Apply, CredentialSpec, Secret, Source};
use crate::authority::destination::{Destination, default_port};
use toolgate_sdk::http::NOT_SENT;

/// The request header a guest sets to ask for a credential by name.
pub const CREDENTIAL_HEADER: &str = "toolgate-credential";

/// Bounds on outbound HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Largest request body.
    pub request_bytes: usize,
    /// Largest response body (after decoding a content coding).
    pub response_bytes: usize,
    /// Connect, first byte and between bytes.
    pub timeout: Duration,
    /// Requests of one call in flight at once; more wait.
    pub in_flight_per_call: usize,
    /// Response bytes one call may hold buffered at once (until the guest
    /// has read them).
    pub response_bytes_per_call: usize,
}

/// What the host records about one call, kept apart from everything the
/// guest writes (stdout, stderr, log): a guest can neither erase these lines
/// by flooding its own output nor add to them.
#[derive(Debug, Default)]
pub(super) struct HostRecords(Mutex<(Vec<Record>, u64)>);

/// One line of a call's host records, and the same line without the
/// guest's text it quotes (a destination, a path, a name). While the host
/// cannot vouch for what a guest received ([`Watched::Unvouched`]), the
/// guest may hold a secret the host never read and write it into a path it
/// opens or a host it asks for: the executor then keeps the line without
/// the guest's text — the host's own words (which credential, which
/// setting) stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Record {
    line: String,
    /// `None`: the line is the host's words only.
    without_guest: Option<String>,
}

/// What stands for the guest's text in a record kept without it.
pub(super) const GUEST_TEXT_LEFT_OUT: &str = "[the guest's text, left out]";

/// How a record quotes one piece of the guest's text.
pub(super) type Quote<'a> = &'a dyn Fn(&str) -> String;

impl Record {
    /// A line of the host's words only.
    pub(super) fn host(line: String) -> Self {
        Record { line: bounded(line), without_guest: None }
    }

    /// A line quoting the guest's text: `line` puts each piece of it
    /// through the quote it is given (built twice: with the text, without).
    pub(super) fn quoting(line: impl Fn(Quote<'_>) -> String) -> Self {
        let with = line(&|guest| guest.to_owned());
        let without = line(&|_| GUEST_TEXT_LEFT_OUT.to_owned());
        Record { line: bounded(with), without_guest: Some(bounded(without)) }
    }

    /// The line as kept.
    pub(super) fn line(&self) -> &str {
        &self.line
    }

    /// Replace the line.
    pub(super) fn set_line(&mut self, line: String) {
        self.line = line;
        self.without_guest = None;
    }

    /// Keep the line without the guest's text it quotes.
    pub(super) fn leave_out_guest_text(&mut self) {
        if let Some(without) = self.without_guest.take() {
            self.line = without;
        }
    }

    /// The line as kept.
    pub(super) fn into_line(self) -> String {
        self.line
    }
}

/// Most host records kept per call; further ones are counted.
const MAX_RECORDS: usize = 64;

/// Longest host record kept, in bytes. Records quote what the guest sent (a
/// host, a scheme, a path), which has no length limit of its own: uncut, 64
/// records of a 4 MiB host name each were 256 MiB of host memory outside the
/// guest's limit, checked for secrets and written to the journal every call.
const MAX_RECORD_BYTES: usize = 1024;

/// Longest host name a request may give: a DNS name's 253 bytes.
const MAX_HOST_BYTES: usize = 253;

/// `line` cut at a character boundary to [`MAX_RECORD_BYTES`], saying how much was cut.
pub(super) fn bounded(line: String) -> String {
    if line.len() <= MAX_RECORD_BYTES {
        return line;
    }
    let end = line.floor_char_boundary(MAX_RECORD_BYTES);
    format!("{}… ({} more bytes not kept)", &line[..end], line.len() - end)
}

impl HostRecords {
    /// Record one line of the host's words (cut to [`MAX_RECORD_BYTES`]).
    pub(super) fn add(&self, line: String) {
        self.push(Record::host(line));
    }
    /// Record one line quoting the guest's text ([`Record::quoting`]).
    pub(super) fn quoting(&self, line: impl Fn(Quote<'_>) -> String) {
        self.push(Record::quoting(line));
    }
    fn push(&self, record: Record) {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if r.0.len() < MAX_RECORDS {
            r.0.push(record);
        } else {
            r.1 += 1;
        }
    }
    /// The lines kept, and how many more were dropped.
    pub(super) fn take(&self) -> (Vec<Record>, u64) {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut r.0), r.1)
    }
}

/// Every configured credential, watched for in what comes back to the
/// guest: all of them, not only the one a request carried (a trusted API
/// may store one request and return it to another). Each response is
/// checked against every value the call has seen — each secret as read at
/// that response, and the exact value applied to its request — so a
/// credential rewritten during the call (a token refresh) is watched in its
/// old and its new value. The same watch checks what a guest reads from its
/// files and what a call returns ([`super::withhold`]).
pub(super) struct SecretWatch {
    specs: Arc<[Arc<CredentialSpec>]>,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    /// (credential, value): every value read or applied during the call.
    values: Vec<(String, Vec<u8>)>,
    /// Built from the first `.1` of `values`; rebuilt when a new value shows up.
    scanner: Option<(Arc<SecretScanner>, usize)>,
    /// Credentials already reported unreadable (reported once per call).
    unreadable: Vec<String>,
}

impl SecretWatch {
    /// Watch for the secrets of `specs`.
    pub(super) fn new(specs: Arc<[Arc<CredentialSpec>]>) -> Self {
        SecretWatch { specs, seen: Mutex::default() }
    }

    /// A request of the call carries `secret`: watched from now on, for
    /// every response of the call (one still in flight, one checked before
    /// this request's own), whatever the source holds later.
    fn sent(&self, spec: &CredentialSpec, secret: &Secret) {
        let value = (spec.name.clone(), secret.expose().as_bytes().to_vec());
        history(vec![(spec.source_id(), value.0.clone(), value.1.clone())]);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if !seen.values.contains(&value) {
            seen.values.push(value);
        }
    }

    /// What a response (or file, or output) is checked with: the scanner
    /// of every value there is — the value its request carried is already
    /// in ([`SecretWatch::sent`] took it before the request left) — and
    /// whether that is every configured credential ([`Watched`]).
    pub(super) fn scanner(&self, records: &HostRecords) -> Watched {
        let mut current = Vec::with_capacity(self.specs.len() + 1);
        let mut unreadable = Vec::new();
        for spec in self.specs.iter() {
            // Whatever the host can read, also a value it would refuse to
            // apply (a file readable by others, a short or non-UTF-8 value).
            match spec.read_to_check() {
                Ok(s) => current.push((spec.source_id(), spec.name.clone(), s.expose().to_vec())),
                // Unreadable now: its earlier values are still in the history below.
                Err(e) => unreadable.push((spec, e.to_string())),
            }
        }
        // Every value the process has seen for these credentials: a value
        // refreshed away in an earlier call may still be valid, and come back.
        let kept = history(current);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for (_, name, value) in &kept {
            if !seen.values.iter().any(|(n, v)| n == name && v == value) {
                seen.values.push((name.clone(), value.clone()));
            }
        }
        let mut unvouched = Vec::new();
        for (spec, why) in unreadable {
            // By source, not name: another config's `github` may be another secret.
            let source = spec.source_id();
            if !kept.iter().any(|(s, ..)| *s == source) {
                // One of the host's own secrets this process never read (a
                // `[[serve.auth]]` token's variable, set only where `serve
                // --http` runs) is not looked for here: a `toolgate approve`
                // or `call` without it must not fail every Tool (and spend
                // an approval) for a secret it does not hold. The process
                // that reads it watches it; `host::open` warns (Known limits).
                if spec.is_watch_only() {
                    continue;
                }
                // Never read by this process: nothing to look for at all.
                unvouched.push((spec.name.clone(), format!("{why}; {}", spec.read_fix())));
            } else if !seen.unreadable.contains(&spec.name) {
                records.add(format!("response check: {why}"));
                seen.unreadable.push(spec.name.clone());
            }
        }
        let scanner = match &seen.scanner {
            Some((scanner, built_from)) if *built_from == seen.values.len() => scanner.clone(),
            _ => {
                let scanner = shared_scanner(&seen.values);
                seen.scanner = Some((scanner.clone(), seen.values.len()));
                scanner
            }
        };
        if unvouched.is_empty() {
            Watched::Complete(scanner)
        } else {
            Watched::Unvouched { scanner, credentials: Unreadable(unvouched.into()) }
        }
    }
}

/// What the host can check for, as a check must take it: the case that it
/// cannot vouch for its check is a variant, not an empty scanner to forget.
#[derive(Clone)]
pub(super) enum Watched {
    /// A value of every configured credential is looked for (as read now,
    /// or as the process read it before).
    Complete(Arc<SecretScanner>),
    /// Some configured credential has no value to look for: its source
    /// cannot be read now and this process never read it (an `env` source
    /// unset where `toolgate serve` runs). Bytes from outside the guest —
    /// a file, a response — may hold that secret unseen, so they are
    /// refused; `scanner` holds the values there are.
    Unvouched { scanner: Arc<SecretScanner>, credentials: Unreadable },
}

/// The configured credentials the host has no value of: (name, why it
/// cannot be read and the fix — the source, never a value).
#[derive(Debug, Clone)]
pub(super) struct Unreadable(Arc<[(String, String)]>);

impl Unreadable {
    /// The credentials, quoted (`` `a`, `b` ``): what the guest is told
    /// (the sources and their fixes are for the host's records).
    pub(super) fn names(&self) -> String {
        self.0.iter().map(|(name, _)| format!("`{name}`")).collect::<Vec<_>>().join(", ")
    }

    /// What the host cannot check for, for its records (after "cannot
    /// check it for"): each credential, why it cannot be read, the fix.
    pub(super) fn why(&self) -> String {
        let each: Vec<&str> = self.0.iter().map(|(_, why)| why.as_str()).collect();
        format!("credential {}, whose secret this host has never read: {}", self.names(), each.join("; "))
    }
}

/// Values of one source kept in [`history`] whatever their age.
const HISTORY: usize = 8;

/// How long [`history`] keeps a value after the process last read or sent
/// it, beyond the newest [`HISTORY`] of its source: a token rotated away is
/// often still valid for a while (an access token refreshed every few
/// minutes stays valid for an hour), and a count alone forgot it after
/// eight refreshes.
const HISTORY_RETAINED: Duration = Duration::from_secs(24 * 60 * 60);

/// Most values of one source kept in [`history`], however recent: each is
/// dozens of needles in every call's scanner, and a source rewritten
/// without end must not grow it without bound.
const HISTORY_MOST: usize = 64;

/// One value the process read or sent: the source it came from
/// ([`CredentialSpec::source_id`]), the credential's name (for findings),
/// the value, and when the process last read or sent it.
type Kept = (Source, String, Vec<u8>, std::time::Instant);

/// Add `values` to the process's history of secret values, and return the
/// whole history: what a response is checked against, so an old value that
/// is still valid is found in a later call too, and a source that cannot
/// be read right now is still checked for the values it had. Per source it
/// keeps the newest [`HISTORY`] values, and every other value read or sent
/// within [`HISTORY_RETAINED`], at most [`HISTORY_MOST`] in all. In this
/// process only: one that starts (every `toolgate call`) knows only what
/// its sources hold now (SECURITY.md, Known limits). Kept by source, not by
/// name: two configs in one process may name different secrets alike.
fn history(values: Vec<(Source, String, Vec<u8>)>) -> Vec<(Source, String, Vec<u8>)> {
    static KEPT: Mutex<Vec<Kept>> = Mutex::new(Vec::new());
    let now = std::time::Instant::now();
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    for (source, name, value) in values {
        if let Some(at) = kept.iter().position(|(s, _, v, _)| *s == source && *v == value) {
            // Seen again: the newest of its source (under the name it has now).
            kept.remove(at);
        }
        kept.push((source, name, value, now));
    }
    // Newest first, per source: the first HISTORY stay; older ones while
    // recent, up to HISTORY_MOST.
    let mut newer: Vec<(&Source, usize)> = Vec::new();
    let mut keep = vec![false; kept.len()];
    for (i, (source, _, _, seen)) in kept.iter().enumerate().rev() {
        let count = match newer.iter_mut().find(|(s, _)| *s == source) {
            Some((_, n)) => n,
            None => {
                newer.push((source, 0));
                &mut newer.last_mut().expect("just pushed").1
            }
        };
        keep[i] = *count < HISTORY || (*count < HISTORY_MOST && now.duration_since(*seen) <= HISTORY_RETAINED);
        *count += usize::from(keep[i]);
    }
    drop(newer);
    let mut i = 0;
    kept.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    kept.iter().map(|(s, n, v, _)| (s.clone(), n.clone(), v.clone())).collect()
}

/// The scanner for `values`, shared by every call that watches the same
/// values: building one takes milliseconds (dozens of needles per secret),
/// and secrets rarely change, so the last one built is kept, by the exact
/// values it holds.
/// (It is keyed by a SHA-256 of the values, not by the values: the
/// scanner's needles hold them, but no second plaintext copy is kept.)
fn shared_scanner(values: &[(String, Vec<u8>)]) -> Arc<SecretScanner> {
    use sha2::Digest as _;
    static LAST: Mutex<Option<([u8; 32], Arc<SecretScanner>)>> = Mutex::new(None);
    let mut sorted: Vec<&(String, Vec<u8>)> = values.iter().collect();
    sorted.sort();
    let mut hash = sha2::Sha256::new();
    for (name, value) in &sorted {
        // Length-prefixed, so no two sets hash the same bytes.
        for part in [name.as_bytes(), value.as_slice()] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
    }
    let key: [u8; 32] = hash.finalize().into();
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((k, scanner)) = last.as_ref()
        && *k == key
    {
        return scanner.clone();
    }
    let scanner = Arc::new(SecretScanner::new(values));
    *last = Some((key, scanner.clone()));
    scanner
}

/// What a call's requests share, in one allocation made at its first
/// request (most calls make none): its records, its last transport failure,
/// the watch on secrets, its in-flight slots and the response bytes it holds
/// buffered.
struct CallTraffic {
    records: HostRecords,
    transport: Mutex<Option<String>>,
    watch: SecretWatch,
    slots: Semaphore,
    buffered: std::sync::atomic::AtomicUsize,
    /// Name lookups of this call still running ([`Resolver`]), whether or
    /// not a request still waits for them.
    lookups: Arc<Semaphore>,
    /// Which full pools a request of this call was recorded waiting on
    /// ([`Pool`] bits): once a call each.
    waited: std::sync::atomic::AtomicU8,
}

/// The outbound authority of one call.
pub struct OutboundPolicy {
    hosts: Arc<[Destination]>,
    credentials: Arc<[Arc<CredentialSpec>]>,
    limits: HttpLimits,
    /// Requests in flight and name lookups in the whole host, and the
    /// call's Tool's share of each.
    pools: ToolPools,
    watched: Arc<[Arc<CredentialSpec>]>,
    call: OnceLock<Arc<CallTraffic>>,
}

/// What the hook decided about a request before it leaves.
struct Decided {
    dest: String,
    credential: Option<(Arc<CredentialSpec>, Secret)>,
    /// Where it goes: the host's own lookup of the name, never the HTTP client's.
    target: Target,
}

/// Where a granted request connects to.
struct Target {
    /// The host as the URL names it (lower case, an IPv6 literal without brackets).
    host: String,
    port: u16,
    /// The address the URL names, if it names one (nothing to resolve).
    literal: Option<std::net::IpAddr>,
    /// HTTPS: TLS to the name (SNI and the certificate check), whatever address it resolved to.
    tls: bool,
}

impl OutboundPolicy {
    /// Exactly `hosts` and `credentials`; responses checked for the secrets
    /// of `watched`; requests in flight and name lookups drawn from `pools`
    /// (the host's, as the call's Tool draws from them).
    pub fn new(
        hosts: Arc<[Destination]>,
        credentials: Arc<[Arc<CredentialSpec>]>,
        limits: HttpLimits,
        watched: Arc<[Arc<CredentialSpec>]>,
        pools: ToolPools,
    ) -> Self {
        OutboundPolicy { hosts, credentials, limits, pools, watched, call: OnceLock::new() }
    }

    /// The call's traffic, made at its first request.
    fn traffic(&self) -> &Arc<CallTraffic> {
        self.call.get_or_init(|| {
            Arc::new(CallTraffic {
                records: HostRecords::default(),
                transport: Mutex::default(),
                watch: SecretWatch::new(self.watched.clone()),
                slots: Semaphore::new(self.limits.in_flight_per_call.max(1)),
                buffered: Default::default(),
                lookups: Arc::new(Semaphore::new(LOOKUPS_PER_CALL)),
                waited: Default::default(),
            })
        })
    }

    /// The call's last transport failure of a granted request (connect,
    /// DNS, TLS, timeout, protocol), as `scheme://host:port: reason`.
    /// Denials and size limits are policy, not transport, and are not recorded.
    pub fn transport_failure(&self) -> Option<String> {
        self.call.get()?.transport.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What the host recorded about the call's requests (taken), and how many more lines were dropped.
    pub fn take_records(&self) -> (Vec<String>, u64) {
        let (records, dropped) = self.take_quoting_records();
        (records.into_iter().map(Record::into_line).collect(), dropped)
    }

    /// [`OutboundPolicy::take_records`], each line with what it quotes of the guest's text.
    pub(super) fn take_quoting_records(&self) -> (Vec<Record>, u64) {
        self.call.get().map(|c| c.records.take()).unwrap_or_default()
    }

    /// Deny a request: `what` is the record's sentence, the guest's text in it quoted ([`Record::quoting`]).
    fn deny(&self, what: impl Fn(Quote<'_>) -> String) -> HttpError {
        self.traffic().records.quoting(|quote| format!("outbound request denied: {}", what(quote)));
        HttpError::HttpRequestDenied
    }

    /// Decide a request: its destination (`scheme://host:port`) and the credential it asks for.
    fn authorize(&self, request: &mut http::Request<WasiBody>) -> Result<Decided, HttpError> {
        let uri = request.uri();
        let scheme = uri.scheme_str().unwrap_or("https").to_ascii_lowercase();
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(self
                .deny(|_| "a URL with user information (`user:pass@`) is refused; use a credential reference".into()));
        }
        let Some(host) = uri.host().map(str::to_ascii_lowercase) else {
            return Err(self.deny(|_| "the request names no host".into()));
        };
        // No granted host is longer than a DNS name (an IPv6 literal is
        // shorter): refused before the text goes anywhere.
        if host.len() > MAX_HOST_BYTES {
            return Err(
                self.deny(|_| format!("a host of {} bytes (a DNS name has at most 253) is refused", host.len()))
            );
        }
        let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
        let dest = format!("{scheme}://{host}:{port}");
        if !self.hosts.iter().any(|d| d.matches(&scheme, &host, port)) {
            return Err(self.deny(|q| format!("{} is not granted to this Tool", q(&dest))));
        }
        // An address the grant names is where the operator sent it; a name is resolved by the host.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let target = Target {
            literal: bare.parse().ok(),
            host: bare.to_owned(),
            port,
            tls: scheme.eq_ignore_ascii_case("https"),
        };
        let headers = request.headers_mut();
        // A partial response could carry a secret in pieces too short to recognize.
        if headers.contains_key(http::header::RANGE) || headers.contains_key(http::header::IF_RANGE) {
            return Err(
                self.deny(|q| format!("a `Range` request to {}: the host checks whole responses only", q(&dest)))
            );
        }
        // The guest cannot negotiate a coding the host would have to trust blindly.
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        headers.remove(http::header::TE);
        // Count before removing: `remove` drops every value of the header at once.
        let asked: Vec<HeaderValue> = headers.get_all(CREDENTIAL_HEADER).iter().cloned().collect();
        headers.remove(CREDENTIAL_HEADER);
        let name = match asked.as_slice() {
            [] => return Ok(Decided { dest, credential: None, target }),
            [one] => one.to_str().unwrap_or_default().trim().to_owned(),
            more => {
                return Err(self.deny(|q| {
                    format!("{} credentials requested for {}; one request carries one", more.len(), q(&dest))
                }));
            }
        };
        let Some(spec) = self.credentials.iter().find(|c| c.name == name) else {
            // The name is the guest's text: quoted and cut short, so it cannot pass for a record of its own.
            let shown: String = name.chars().take(64).collect();
            return Err(self.deny(|q| format!("credential {} is not granted to this Tool", q(&format!("{shown:?}")))));
        };
        if !spec.bound_to(&scheme, &host, port) {
            return Err(self.deny(|q| format!("credential `{name}` is not bound to {}", q(&dest))));
        }
        match spec.materialize(&scheme, &host, port) {
            Ok(secret) => Ok(Decided { dest, credential: Some((spec.clone(), secret)), target }),
            Err(e) => {
                self.traffic().records.add(e.to_string());
                Err(HttpError::InternalError(Some(format!(
                    "{NOT_SENT}: credential `{name}` is unavailable on this host"
                ))))
            }
        }
    }
}

/// Why a granted name cannot be reached.
enum Unreachable {
    /// It leads to an address a name may not lead to (the rest of the record's sentence).
    Prohibited(String),
    /// Name resolution failed or timed out.
    Dns(String),
}

/// Name lookups running at once in the whole host ([`Resolver`]).
pub const LOOKUPS_AT_ONCE: usize = 32;

/// Name lookups one call may have running at once, of the host's [`LOOKUPS_AT_ONCE`].
pub const LOOKUPS_PER_CALL: usize = 4;

/// How a name is looked up: the system's resolver (`getaddrinfo`) in the
/// host; a test's stand-in in tests. It blocks, and cannot be stopped.
pub type Lookup = dyn Fn(&str, u16) -> std::io::Result<Vec<std::net::SocketAddr>> + Send + Sync;

/// The host's name lookups, bounded. A lookup blocks a thread of the
/// blocking pool until the system's resolver answers, and nothing can stop
/// it: a request that gives up on it (its timeout, its call's deadline)
/// leaves it running. So a lookup holds one of the host's
/// [`LOOKUPS_AT_ONCE`] slots, one of its Tool's share of them
/// ([`HostPools`]) and one of its call's [`LOOKUPS_PER_CALL`] for its whole
/// life — all are moved into the blocking job and freed when the resolver
/// returns, not when the request stops waiting. A name whose DNS answers
/// slowly costs its call at most that many threads, its Tool at most its
/// share (so other Tools' lookups still start), and the host at most
/// [`LOOKUPS_AT_ONCE`], whatever the call retries; before, a Tool
/// looping request-and-timeout queued lookups without bound on the pool
/// every call's file opens, output check and compile wait on. A request
/// that cannot get a slot before its timeout fails, naming the host.
#[derive(Clone)]
pub struct Resolver {
    lookup: Arc<Lookup>,
    slots: Arc<Semaphore>,
    at_once: usize,
}

impl Resolver {
    /// The system's resolver, at most `at_once` lookups at a time.
    pub fn system(at_once: usize) -> Self {
        Resolver::with(
            Arc::new(|name: &str, port: u16| {
                use std::net::ToSocketAddrs as _;
                (name, port).to_socket_addrs().map(Iterator::collect)
            }),
            at_once,
        )
    }

    /// `lookup`, at most `at_once` lookups at a time.
    pub fn with(lookup: Arc<Lookup>, at_once: usize) -> Self {
        let at_once = at_once.max(1);
        Resolver { lookup, slots: Arc::new(Semaphore::new(at_once)), at_once }
    }

    /// The addresses of `name`, looked up holding a slot of `call` (one of
    /// its [`LOOKUPS_PER_CALL`]), one of its Tool's share `tool` and one of
    /// the host's, all held until the lookup returns; given up (the lookup
    /// left running) after `within`.
    async fn resolve(
        &self,
        call: &Arc<Semaphore>,
        tool: &Share,
        name: &str,
        port: u16,
        within: Duration,
    ) -> Result<Vec<std::net::SocketAddr>, String> {
        let deadline = tokio::time::Instant::now() + within;
        // The call's slot, then its Tool's, then the host's: a lookup
        // waiting for the host's pool holds its call's and its Tool's slots
        // only, so one Tool holds at most its share of the host's.
        let slots = tokio::time::timeout_at(deadline, async {
            let mine = call.clone().acquire_owned().await?;
            let tools = tool.slots.clone().acquire_owned().await?;
            let host = self.slots.clone().acquire_owned().await?;
            Ok::<_, tokio::sync::AcquireError>((mine, tools, host))
        })
        .await;
        let slots = match slots {
            Ok(Ok(slots)) => slots,
            Ok(Err(_)) => return Err(format!("cannot resolve {name}: the host is shutting down")),
            Err(_) => {
                let full = |s: &Semaphore| s.available_permits() == 0;
                let whose = if full(call) {
                    format!("this call's {LOOKUPS_PER_CALL}")
                } else if full(&tool.slots) {
                    format!("this Tool's {} (its share of the host's {})", tool.size, self.at_once)
                } else if full(&self.slots) {
                    format!("the host's {}", self.at_once)
                } else {
                    "the lookups".into()
                };
                return Err(format!(
                    "no lookup of {name} could start within {within:?}: {whose} name lookups at once are taken by \
                     earlier lookups still waiting for DNS (a lookup cannot be stopped once started)"
                ));
            }
        };
        let (lookup, owned) = (self.lookup.clone(), name.to_owned());
        let job = tokio::task::spawn_blocking(move || {
            let resolved = lookup(&owned, port);
            // Freed only now: the thread was busy until the resolver answered.
            drop(slots);
            resolved
        });
        match tokio::time::timeout_at(deadline, job).await {
            Ok(Ok(Ok(addresses))) => Ok(addresses),
            Ok(Ok(Err(e))) => Err(format!("cannot resolve {name}: {e}")),
            Ok(Err(_)) => Err(format!("cannot resolve {name}: the lookup failed")),
            Err(_) => Err(format!("resolving {name} took longer than {within:?}")),
        }
    }
}

/// One Tool's share of a host-wide pool: at most `size` of its slots.
#[derive(Clone)]
pub(super) struct Share {
    slots: Arc<Semaphore>,
    size: usize,
}

impl Share {
    fn new(size: usize) -> Self {
        Share { slots: Arc::new(Semaphore::new(size)), size }
    }

    /// A slot: at once if one is free, else `full` is told (before the
    /// wait) and the slot awaited. `None`: the host is shutting down.
    async fn take(&self, full: impl FnOnce()) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Some(slot);
        }
        full();
        self.slots.clone().acquire_owned().await.ok()
    }
}

/// The part of a host-wide pool of `pool` slots one Tool may hold: the
/// part of the host's instances (`limits.max_instances`) its calls may
/// hold (`limits.max_instances_per_tool`), at least 1, and less than the
/// whole pool when it has more than one slot — so no Tool holds all of it,
/// whatever the limits say.
pub fn tool_share(pool: usize, per_tool: usize, instances: usize) -> usize {
    let part = (pool as u128).saturating_mul(per_tool as u128) / (instances.max(1) as u128);
    usize::try_from(part).unwrap_or(usize::MAX).clamp(1, pool.saturating_sub(1).max(1))
}

/// The host-wide pools outbound requests draw from: requests in flight
/// (`limits.http_requests_in_flight_host`: a request holds its slot while
/// its credential is read, it is sent, and its response read and checked)
/// and name lookups ([`LOOKUPS_AT_ONCE`]). A request takes its call's slot,
/// then its Tool's, then the host's: each Tool holds at most its share of
/// each pool ([`tool_share`]). Before, one Tool whose granted server
/// accepts connections and never answers, called 8 times at once, held
/// all 64 requests in flight, and every other Tool's request waited until
/// its own call's deadline. A request that has to wait because its Tool's
/// share or the host's pool is full records so (once a call), naming the
/// setting; the wait is bounded by its call's deadline.
#[derive(Clone)]
pub struct HostPools(Arc<Pools>);

struct Pools {
    http: Arc<Semaphore>,
    http_at_once: usize,
    http_share: usize,
    resolver: Resolver,
    lookup_share: usize,
    /// Keys are installed Tool ids, one entry per Tool, as admission's.
    tools: std::sync::RwLock<std::collections::HashMap<String, ToolShares>>,
    /// The shares of a call granted no destination: none of anything.
    none: ToolShares,
}

/// One Tool's shares of the host's pools.
#[derive(Clone)]
struct ToolShares {
    http: Share,
    lookups: Share,
}

/// The host's pools as the calls of one Tool draw from them.
#[derive(Clone)]
pub struct ToolPools {
    pools: Arc<Pools>,
    tool: ToolShares,
}

impl HostPools {
    /// `http_at_once` requests in flight and the lookups of `resolver`, a
    /// Tool allowed `per_tool` of the host's `instances` instances getting
    /// that part of each ([`tool_share`]).
    pub fn new(http_at_once: usize, resolver: Resolver, per_tool: usize, instances: usize) -> Self {
        let http_at_once = http_at_once.max(1);
        HostPools(Arc::new(Pools {
            http: Arc::new(Semaphore::new(http_at_once)),
            http_at_once,
            http_share: tool_share(http_at_once, per_tool, instances),
            lookup_share: tool_share(resolver.at_once, per_tool, instances),
            resolver,
            tools: Default::default(),
            none: ToolShares { http: Share::new(0), lookups: Share::new(0) },
        }))
    }

    /// The pools as the calls of `tool` (its id) draw from them.
    pub fn for_tool(&self, tool: &str) -> ToolPools {
        let found = self.0.tools.read().unwrap_or_else(|p| p.into_inner()).get(tool).cloned();
        let shares = found.unwrap_or_else(|| {
            let mut tools = self.0.tools.write().unwrap_or_else(|p| p.into_inner());
            let made = || ToolShares { http: Share::new(self.0.http_share), lookups: Share::new(self.0.lookup_share) };
            tools.entry(tool.to_owned()).or_insert_with(made).clone()
        });
        ToolPools { pools: self.0.clone(), tool: shares }
    }

    /// The pools for a call granted no destination (its requests are all
    /// denied before they take a slot): no share of anything, and nothing
    /// looked up or made for it (most calls).
    pub fn no_network(&self) -> ToolPools {
        ToolPools { pools: self.0.clone(), tool: self.0.none.clone() }
    }
}

/// Which full pool a call's request was recorded waiting on ([`CallTraffic::waited`]).
const WAITED_TOOL: u8 = 1;
const WAITED_HOST: u8 = 2;

impl ToolPools {
    /// Slots for one request to `dest` of `call`: its Tool's, then the
    /// host's. A wait on either, because it is full, is recorded in the
    /// call's host records, once a call each, naming the setting; the wait
    /// itself ends with the call.
    async fn http_slots(
        &self,
        call: &CallTraffic,
        dest: &str,
    ) -> Option<(tokio::sync::OwnedSemaphorePermit, tokio::sync::OwnedSemaphorePermit)> {
        let pools = &self.pools;
        let once = |bit: u8| call.waited.fetch_or(bit, std::sync::atomic::Ordering::Relaxed) & bit == 0;
        let tool = self
            .tool
            .http
            .take(|| {
                if once(WAITED_TOOL) {
                    call.records.quoting(|q| {
                        format!(
                            "outbound request to {} waits for a slot: this Tool's {} requests in flight — its share \
                             of `limits.http_requests_in_flight_host` ({}), as `limits.max_instances_per_tool` is of \
                             `limits.max_instances` — are all held by its calls' requests; it waits until one ends or \
                             its call's deadline (raise those limits, or have the Tool send fewer requests at once)",
                            q(dest),
                            self.tool.http.size,
                            pools.http_at_once
                        )
                    });
                }
            })
            .await?;
        let http = Share { slots: pools.http.clone(), size: pools.http_at_once };
        let host = http
            .take(|| {
                if once(WAITED_HOST) {
                    call.records.quoting(|q| {
                        format!(
                            "outbound request to {} waits for a slot: all {} requests in flight of the host \
                             (`limits.http_requests_in_flight_host`) are held by calls of several Tools; it waits \
                             until one ends or its call's deadline (raise `limits.http_requests_in_flight_host` if \
                             this is the host's ordinary load)",
                            q(dest),
                            pools.http_at_once
                        )
                    });
                }
            })
            .await?;
        Some((tool, host))
    }
}

/// The addresses a request to `target` may connect to, in the order to try
/// them: the address the URL names, or the name resolved once by the host
/// ([`Resolver`]). Over plain HTTP every address of a name is checked — a
/// public one, or for `localhost` and `*.localhost` (which name this
/// machine wherever the host runs) a loopback one; over HTTPS the
/// certificate binds the name.
async fn checked_addresses(
    resolver: &Resolver,
    lookups: &Arc<Semaphore>,
    tool: &Share,
    target: &Target,
    within: Duration,
) -> Result<Vec<std::net::SocketAddr>, Unreachable> {
    let name = target.host.as_str();
    if let Some(ip) = target.literal {
        return Ok(vec![std::net::SocketAddr::new(ip, target.port)]);
    }
    let resolved = resolver.resolve(lookups, tool, name, target.port, within).await.map_err(Unreachable::Dns)?;
    let local = name == "localhost" || name.ends_with(".localhost");
    for a in resolved.iter().filter(|_| !target.tls) {
        let ip = a.ip().to_canonical();
        let refused = match not_public(ip) {
            Some("loopback") if local => None,
            Some(kind) => Some(kind),
            None if local => Some("public"),
            None => None,
        };
        if let Some(kind) = refused {
            return Err(Unreachable::Prohibited(format!(
                "resolved to {ip}, a {kind} address: over plain HTTP a granted name reaches public addresses only \
                 (localhost: loopback only); grant the address itself, or use https"
            )));
        }
    }
    if resolved.is_empty() {
        return Err(Unreachable::Dns(format!("{name} has no address")));
    }
    Ok(resolved)
}

/// What a sent request's response body is: the server's, each wait for its
/// next bytes bounded.
struct Incoming {
    body: hyper::body::Incoming,
    between_bytes: tokio::time::Interval,
}

impl http_body::Body for Incoming {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.between_bytes.reset();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) if e.is_timeout() => Poll::Ready(Some(Err(HttpError::HttpResponseTimeout))),
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(HttpError::from(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                std::task::ready!(self.between_bytes.poll_tick(cx));
                Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Most bytes of a response's head (status line and fields) the host
/// reads, and most fields: a larger head fails the request
/// (`HttpProtocolError`). Its bytes are also charged to the call's response
/// budget with its body ([`collect_charged`]).
const MAX_RESPONSE_HEAD: usize = 64 << 10;
const MAX_RESPONSE_FIELDS: usize = 100;

/// A connection a request goes over: TCP, or TLS over TCP.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// The TLS client of every HTTPS request: the web PKI's roots, as
/// wasmtime-wasi-http's default client has.
fn tls_client() -> tokio_rustls::TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.into() };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        // No session resumption: one config serves every call of every Tool,
        // and a ticket or session id one call got would be sent, in the clear,
        // in a later call's ClientHello — linking calls across Tools and
        // agents, state shared between calls. (Each request is its own
        // connection anyway.)
        config.resumption = rustls::client::Resumption::disabled();
        Arc::new(config)
    });
    tokio_rustls::TlsConnector::from(config.clone())
}

/// Send `request` over a connection to the first of `addresses` that
/// accepts one (each tried in turn within the connect timeout) — the
/// addresses the host resolved and checked: the HTTP client never looks a
/// name up itself. Over TLS (`target.tls`) the server is asked for, and its
/// certificate checked against, the name the guest asked for. The request
/// keeps its `Host` header. As wasmtime-wasi-http's default client: HTTP/1.1,
/// the connect timeout bounds connecting and the HTTP handshake, the
/// first-byte timeout the response's head, the between-bytes timeout each
/// wait for more of its body (the TLS handshake is bounded by the caller).
/// `handed` is set once the request is handed to the connection: from then
/// on the destination may have it, and a caller's deadline that ends the
/// wait is no connect timeout.
async fn send_to<B>(
    mut request: http::Request<B>,
    target: &Target,
    addresses: &[std::net::SocketAddr],
    options: RequestOptions,
    handed: &std::sync::atomic::AtomicBool,
) -> Result<(http::Response<Incoming>, Connection), HttpError>
where
    B: http_body::Body<Data = Bytes, Error = HttpError> + Send + 'static,
{
    let never = Duration::from_secs(600);
    let connect_timeout = options.connect_timeout.unwrap_or(never);
    let tcp = tokio::time::timeout(connect_timeout, async {
        let mut last = None;
        for address in addresses {
            match tokio::net::TcpStream::connect(address).await {
                Ok(tcp) => return Ok(tcp),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address to connect to")))
    })
    .await
    .map_err(|_| HttpError::ConnectionTimeout)?
    .map_err(HttpError::Connect)?;
    let stream: Box<dyn Stream> = if target.tls {
        let name = match target.literal {
            Some(ip) => rustls::pki_types::ServerName::from(ip),
            None => rustls::pki_types::ServerName::try_from(target.host.clone())?,
        };
        Box::new(tls_client().connect(name, tcp).await.map_err(HttpError::Tls)?)
    } else {
        Box::new(tcp)
    };
    // A response's head is bounded (hyper's default was ~408 KiB and 100
    // fields, held by wasmtime for as long as the guest keeps the response).
    let handshake = hyper::client::conn::http1::Builder::new()
        .max_header_size(MAX_RESPONSE_HEAD)
        .max_headers(MAX_RESPONSE_FIELDS)
        .handshake(wasmtime_wasi_http::io::TokioIo::new(stream));
    let (mut sender, conn) =
        tokio::time::timeout(connect_timeout, handshake).await.map_err(|_| HttpError::ConnectionTimeout)??;
    // The head names the host the guest asked for; the request line carries the path only.
    if !request.headers().contains_key(http::header::HOST)
        && let Some(authority) = request.uri().authority()
    {
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| HttpError::HttpRequestUriInvalid)?;
        request.headers_mut().insert(http::header::HOST, host);
    }
    // The path and query as wasi-http gave them (`?a=b` too: its text does
    // not parse as a URI on its own), as wasmtime-wasi-http's client sends them.
    let path = request.uri().path_and_query().cloned().unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    *request.uri_mut() =
        http::Uri::builder().path_and_query(path).build().map_err(|_| HttpError::HttpRequestUriInvalid)?;
    let first_byte = options.first_byte_timeout.unwrap_or(never);
    // tokio's interval panics on zero.
    let between_bytes = options.between_bytes_timeout.unwrap_or(never).max(Duration::from_nanos(1));
    handed.store(true, std::sync::atomic::Ordering::Relaxed);
    let send = async move {
        let response = tokio::time::timeout(first_byte, sender.send_request(request))
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)??;
        let mut between = tokio::time::interval(between_bytes);
        between.reset();
        Ok::<_, HttpError>(response.map(|body| Incoming { body, between_bytes: between }))
    };
    // Drive the connection while waiting for the response's head.
    let mut send = std::pin::pin!(send);
    let mut conn = Some(conn);
    let response = std::future::poll_fn(|cx| {
        use std::task::Poll;
        if let Poll::Ready(r) = send.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        let Some(c) = conn.as_mut() else { return Poll::Pending };
        let done = std::task::ready!(std::pin::Pin::new(c).poll(cx));
        conn = None;
        match done {
            Ok(()) => send.as_mut().poll(cx),
            Err(e) => Poll::Ready(Err(HttpError::from(e))),
        }
    })
    .await?;
    Ok((
        response,
        Box::pin(async move {
            match conn {
                None => Ok(()),
                Some(c) => c.await.map_err(|e| if e.is_timeout() { HttpError::HttpResponseTimeout } else { e.into() }),
            }
        }),
    ))
}

/// What carries a sent request's response to its end.
type Connection = std::pin::Pin<Box<dyn Future<Output = Result<(), HttpError>> + Send>>;

/// What kind of address `ip` is, if it is not a public one: the host's own
/// (loopback, unspecified), a private or link-local network's (cloud
/// metadata services live at 169.254.169.254), shared or reserved ranges,
/// and IPv6 forms that embed an IPv4 address of those.
fn not_public(ip: std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            if v4.is_loopback() {
                Some("loopback")
            } else if a == 0 {
                Some("unspecified")
            } else if v4.is_private() {
                Some("private")
            } else if v4.is_link_local() {
                Some("link-local")
            } else if a == 100 && (b & 0xc0) == 64 {
                Some("shared (carrier-grade NAT)")
            } else if (a == 192 && b == 0 && c == 0) || (a == 198 && (b & 0xfe) == 18) || v4.is_documentation() {
                Some("reserved")
            } else if v4.is_multicast() || a >= 240 {
                Some("multicast or reserved")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                let [a, b] = hi.to_be_bytes();
                let [c, d] = lo.to_be_bytes();
                not_public(IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d)))
            };
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if (s[0] & 0xfe00) == 0xfc00 {
                Some("private (unique local)")
            } else if (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0 {
                Some("link-local")
            } else if v6.is_multicast() || (s[0] == 0x2001 && s[1] == 0x0db8) {
                Some("multicast or reserved")
            } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || s[..6] == [0, 0, 0, 0, 0xffff, 0] {
                // NAT64 (RFC 6052), and SIIT's IPv4-translated addresses
                // (`::ffff:0:a.b.c.d`, RFC 2765): the IPv4 address it
                // translates to decides.
                embedded(s[6], s[7])
            } else if s[..3] == [0x64, 0xff9b, 1] {
                // Local-use NAT64 (RFC 8215): translated by the operator's
                // own gateway, into whatever it serves.
                Some("reserved (local-use NAT64)")
            } else if s[0] == 0x2002 {
                // 6to4: likewise.
                embedded(s[1], s[2])
            } else if s[..6] == [0; 6] {
                // IPv4-compatible (deprecated): never a public IPv6 address.
                Some("reserved")
            } else {
                None
            }
        }
    }
}

/// Write the secret into the request as configured. The one way a secret
/// enters a request: the hook uses it, and so does `toolgate mcp import`
/// (author side).
pub fn apply<B>(request: &mut http::Request<B>, spec: &CredentialSpec, secret: &Secret) -> Result<(), HttpError> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let value = secret.expose();
    let bad = || HttpError::InternalError(Some(format!("{NOT_SENT}: credential `{}` cannot be applied", spec.name)));
    match spec.apply() {
        Apply::Header { name, format } => {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            let v = HeaderValue::from_str(&format.replacen("{}", value, 1)).map_err(|_| bad())?;
            request.headers_mut().insert(header, v);
        }
        Apply::Basic { username } => {
            let token = b64.encode(format!("{username}:{value}"));
            let v = HeaderValue::from_str(&format!("Basic {token}")).map_err(|_| bad())?;
            request.headers_mut().insert(AUTHORIZATION, v);
        }
        Apply::Query { param } => {
            let encoded = percent_encode(value);
            let uri = request.uri().clone();
            let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let sep = if pq.contains('?') { '&' } else { '?' };
            let new_pq = format!("{pq}{sep}{}={encoded}", percent_encode(param));
            let mut parts = uri.into_parts();
            parts.path_and_query = Some(new_pq.parse().map_err(|_| bad())?);
            *request.uri_mut() = http::Uri::from_parts(parts).map_err(|_| bad())?;
        }
    }
    Ok(())
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A checked response body on its way to the guest, in 64 KiB frames. Its
/// bytes count against the call's buffer until the guest has read it (or
/// dropped it): a guest that piles up responses without reading them gets
/// errors once the buffer is full, instead of growing the host. (Holding the
/// in-flight slots until then instead would let a guest deadlock itself,
/// waiting on a response queued behind ones it has not read.)
struct HeldBody {
    data: Bytes,
    _charge: Charge,
}

/// A request body shared with the request's future, which closes it (by
/// dropping its handle) only once the host has recorded the outcome.
struct KeptOpen<B>(Arc<Mutex<B>>);

impl<B: http_body::Body + Unpin> http_body::Body for KeptOpen<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let mut body = self.0.lock().unwrap_or_else(|p| p.into_inner());
        std::pin::Pin::new(&mut *body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).size_hint()
    }
}

/// One of a call's in-flight slots, owned (it can outlive the request's
/// future: the check of its response keeps it).
struct CallSlot(Arc<CallTraffic>);

impl CallSlot {
    async fn acquire(call: &Arc<CallTraffic>) -> Result<Self, tokio::sync::AcquireError> {
        call.slots.acquire().await?.forget();
        Ok(CallSlot(call.clone()))
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        self.0.slots.add_permits(1);
    }
}

/// Response bytes a call holds (being checked, or waiting for the guest to
/// read them), counted against its budget until dropped.
struct Charge {
    call: Arc<CallTraffic>,
    size: usize,
}

impl Charge {
    /// Nothing charged yet.
    fn none(call: &Arc<CallTraffic>) -> Self {
        Charge { call: call.clone(), size: 0 }
    }

    /// Charge `more` bytes, if the call's `total` has room for them: the
    /// room is taken before the bytes are kept, so responses collected at
    /// once share the budget instead of each seeing all of it.
    fn grow(&mut self, more: usize, total: usize) -> bool {
        use std::sync::atomic::Ordering;
        let room = |held: usize| held.checked_add(more).filter(|&after| after <= total);
        if self.call.buffered.fetch_update(Ordering::AcqRel, Ordering::Acquire, room).is_err() {
            return false;
        }
        self.size += more;
        true
    }

    /// Count `size` bytes instead (the body decoded).
    /// Count `size` bytes instead (the body decoded), if `total` has room
    /// for what it grows by.
    fn resize(&mut self, size: usize, total: usize) -> bool {
        if size > self.size {
            return self.grow(size - self.size, total);
        }
        self.call.buffered.fetch_sub(self.size - size, std::sync::atomic::Ordering::AcqRel);
        self.size = size;
        true
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.call.buffered.fetch_sub(self.size, std::sync::atomic::Ordering::Relaxed);
    }
}

impl http_body::Body for HeldBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.data.is_empty() {
            return std::task::Poll::Ready(None);
        }
        let n = self.data.len().min(64 << 10);
        let chunk = self.data.split_to(n);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.len() as u64)
    }
}

/// The body with its content coding removed, at most `limit` bytes; `Err`
/// names a coding the host cannot check.
fn decode(coding: &str, data: Bytes, limit: usize) -> Result<Bytes, String> {
    // Errors name the coding as the host spells it, never as the server did.
    let coding = coding.trim().to_ascii_lowercase();
    let mut out = Vec::new();
    let take = |r: &mut dyn std::io::Read, out: &mut Vec<u8>| -> Result<(), String> {
        r.take(limit as u64 + 1).read_to_end(out).map_err(|e| format!("undecodable {coding} body: {e}"))?;
        if out.len() > limit {
            return Err(format!("the decoded body is over the {limit}-byte limit"));
        }
        Ok(())
    };
    match coding.as_str() {
        "" | "identity" => return Ok(data),
        // Nothing to decode (a HEAD, a 204 or 304 that still names its coding).
        _ if data.is_empty() => return Ok(data),
        "gzip" | "x-gzip" => take(&mut flate2::read::MultiGzDecoder::new(&data[..]), &mut out)?,
        // zlib as the RFC says; raw deflate as some servers send (browsers accept both).
        "deflate" if is_zlib(&data) => take(&mut flate2::read::ZlibDecoder::new(&data[..]), &mut out)?,
        "deflate" => take(&mut flate2::read::DeflateDecoder::new(&data[..]), &mut out)?,
        // The server's own bytes never go into the error (it reaches the
        // guest and the journal unchecked): a registered coding is named,
        // anything else is not.
        known @ ("br" | "zstd" | "compress" | "x-compress" | "dcb" | "dcz" | "exi" | "pack200-gzip" | "aes128gcm") => {
            return Err(format!("content coding `{known}` cannot be checked by the host"));
        }
        _ => return Err("a content coding the host does not know cannot be checked".to_owned()),
    }
    Ok(Bytes::from(out))
}

/// A transport failure as the host records it: `dest: reason`, unless the
/// reason's text (which can carry the server's bytes — a certificate's
/// names, a peer's message) holds a secret.
fn transport_line(dest: &str, error: &HttpError, scanner: &SecretScanner) -> String {
    let text = error.to_string();
    match scanner.find(text.as_bytes()) {
        None => format!("{dest}: {text}"),
        Some(f) => format!("{dest}: a transport error whose text held {f}; its text is withheld"),
    }
}

/// Most content codings a response may stack.
const MAX_CODINGS: usize = 3;

/// The content codings a response declares, in the order they were
/// applied, over every `Content-Encoding` line and any `Transfer-Encoding`
/// coding but `chunked` (which the HTTP client has already undone): each
/// line counts, not only the first, or a second layer would pass
/// unchecked.
fn codings(headers: &http::HeaderMap) -> Result<Vec<String>, String> {
    let mut codings = Vec::new();
    for header in [CONTENT_ENCODING, http::header::TRANSFER_ENCODING] {
        for value in headers.get_all(&header) {
            for token in String::from_utf8_lossy(value.as_bytes()).split(',') {
                let token = token.trim().to_ascii_lowercase();
                if !matches!(token.as_str(), "" | "identity" | "chunked") {
                    codings.push(token);
                }
            }
        }
    }
    if codings.len() > MAX_CODINGS {
        return Err(format!(
            "the response stacks {} content codings; the host decodes at most {MAX_CODINGS}",
            codings.len()
        ));
    }
    // Applied in the order listed, content codings before transfer codings: undone in reverse.
    codings.reverse();
    Ok(codings)
}

/// Why a response is withheld (no server bytes in it), for the host's
/// records, and whether it is for a content coding the host cannot undo,
/// or because it holds a secret (then the guest is told [`WITHHELD`] only).
#[derive(Debug)]
struct Withheld {
    why: String,
    coding: bool,
    secret: bool,
}

/// What a guest is told of a response withheld for holding a secret: that
/// it held *some* configured secret, never which credential, form or view
/// (the host's records name them). Naming them would tell a guest
/// probing with guessed values which secret its guess hit, and how.
pub(super) const WITHHELD: &str =
    "the host withheld the response: it held a configured secret (see the host's records)";

/// Check a response the way it will reach the guest: the head as the
/// server sent it, first (before decoding can end the exchange with an
/// error); then the declared codings undone and the body checked. On
/// success, the body to hand over (decoded; the head no longer names the
/// codings).
fn inspect(
    parts: &mut http::response::Parts,
    data: Bytes,
    scanner: &SecretScanner,
    limit: usize,
) -> Result<Bytes, Withheld> {
    let held = |f: super::scan::Finding, place: &str| Withheld {
        why: format!("{place} held {f}"),
        coding: false,
        secret: true,
    };
    let in_head = parts
        .headers
        .iter()
        .find_map(|(k, v)| scanner.find(k.as_str().as_bytes()).or_else(|| scanner.find(v.as_bytes())));
    if let Some(f) = in_head {
        return Err(held(f, "a header"));
    }
    let coding = |why| Withheld { why, coding: true, secret: false };
    let codings = codings(&parts.headers).map_err(coding)?;
    let data = codings.iter().try_fold(data, |d, c| decode(c, d, limit)).map_err(coding)?;
    if !codings.is_empty() {
        parts.headers.remove(CONTENT_ENCODING);
        parts.headers.remove(http::header::TRANSFER_ENCODING);
        parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(data.len()));
    }
    let mut inflate = Inflate {
        budget: limit.saturating_mul(INFLATE_FACTOR),
        attempts: MAX_STREAMS,
        members: MAX_MEMBERS,
        budget_is: "4× `limits.http_response_kib`",
    };
    match check_body(scanner, &data, &mut inflate, 0) {
        Ok(None) => Ok(data),
        Ok(Some(f)) => Err(held(f, "the body")),
        Err(why) => Err(Withheld { why, coding: false, secret: false }),
    }
}

/// Streams the check tries to inflate in one response, at every depth.
const MAX_STREAMS: usize = 64;
/// Gzip members, over all streams: a multi-member file (BGZF blocks of up
/// to 64 KiB, concatenated logs) has far fewer in a response of a few MiB.
const MAX_MEMBERS: usize = 4096;
/// How deep the check inflates streams inside streams.
const MAX_NESTING: usize = 3;
/// What all of a response's streams may inflate to, in multiples of the response limit.
const INFLATE_FACTOR: usize = 4;

/// What the check may still spend inflating one response.
struct Inflate {
    /// Bytes of output left, over every stream at every depth.
    budget: usize,
    /// What the budget was, as the refusal names it.
    budget_is: &'static str,
    /// Streams left to try.
    attempts: usize,
    /// Members (of any stream) left to inflate: each costs a decoder.
    members: usize,
}

/// Whether `data` starts with a zlib header (RFC 1950: deflate, a window
/// of at most 32 KiB, a header checksum).
fn is_zlib(data: &[u8]) -> bool {
    data.len() >= 2
        && data[0] & 0x0f == 8
        && data[0] >> 4 <= 7
        && u16::from_be_bytes([data[0], data[1]]).is_multiple_of(31)
}

/// [`check_body`] for a file a guest reads ([`super::withhold`]), which is
/// checked as a response body is: its compressed streams inflate to at most
/// `budget` bytes in all (`budget_is` names it in a refusal).
pub(super) fn check_compressed(
    scanner: &SecretScanner,
    data: &[u8],
    budget: usize,
    budget_is: &'static str,
) -> Result<Option<super::scan::Finding>, String> {
    let mut inflate = Inflate { budget, attempts: MAX_STREAMS, members: MAX_MEMBERS, budget_is };
    check_body(scanner, data, &mut inflate, 0)
}

/// Check a (decoded) body for secrets, and inside it every gzip stream and
/// a body that is a zlib stream — compressed bytes whatever the headers
/// said, which a guest could inflate itself — and the streams inside those,
/// down to [`MAX_NESTING`] levels. The members of a multi-member gzip file
/// are inflated as one stream. `Err` when the streams inflate past the
/// response's budget, are too many or nest too deep: the host cannot vouch
/// for what it did not see.
fn check_body(
    scanner: &SecretScanner,
    data: &[u8],
    inflate: &mut Inflate,
    depth: usize,
) -> Result<Option<super::scan::Finding>, String> {
    if let Some(f) = scanner.find(data) {
        return Ok(Some(f));
    }
    let zlib = is_zlib(data).then_some((0, false));
    let gzip = memchr::memmem::find_iter(data, &[0x1f, 0x8b, 0x08]).map(|at| (at, true));
    // What the stream being gathered inflated to so far (members that follow
    // each other are one stream, as a gzip reader reads them), its kind, and
    // where its input ends.
    let mut stream: Option<(Vec<u8>, bool)> = None;
    let mut inflated_to = 0;
    for (at, is_gzip) in zlib.into_iter().chain(gzip) {
        // Every start is tried, also one inside input a stream already took
        // (a gzip header's extra field, bytes read as a trailer): only a
        // member that begins where the last one ended continues its stream.
        if at != inflated_to
            && let Some((out, was_gzip)) = stream.take()
            && let Some(f) = check_stream(scanner, &out, was_gzip, inflate, depth)?
        {
            return Ok(Some(f));
        }
        let Some(members) = inflate.members.checked_sub(1) else {
            return Err(format!("it holds more than {MAX_MEMBERS} gzip members, more than the host checks"));
        };
        inflate.members = members;
        if stream.is_none() {
            let Some(left) = inflate.attempts.checked_sub(1) else {
                return Err(format!("it holds more than {MAX_STREAMS} compressed streams, more than the host checks"));
            };
            inflate.attempts = left;
        }
        let mut input = &data[at..];
        let mut out = Vec::new();
        {
            // One member at a time, so the input it took is exact.
            let reader: &mut dyn std::io::Read = if is_gzip {
                &mut flate2::bufread::GzDecoder::new(&mut input)
            } else {
                &mut flate2::bufread::ZlibDecoder::new(&mut input)
            };
            // Bytes that only look like a stream inflate to nothing; a
            // stream cut short yields what it held. What came out is checked either way.
            let _ = reader.take(inflate.budget as u64 + 1).read_to_end(&mut out);
        }
        if out.is_empty() {
            continue;
        }
        let Some(left) = inflate.budget.checked_sub(out.len()) else {
            return Err(format!(
                "its compressed streams inflate past {}, more than the host checks",
                inflate.budget_is
            ));
        };
        inflate.budget = left;
        inflated_to = data.len() - input.len();
        match &mut stream {
            Some((gathered, _)) => gathered.extend_from_slice(&out),
            None => stream = Some((out, is_gzip)),
        }
    }
    match stream {
        Some((out, is_gzip)) => check_stream(scanner, &out, is_gzip, inflate, depth),
        None => Ok(None),
    }
}

/// Check what one stream inflated to, with the streams inside it.
fn check_stream(
    scanner: &SecretScanner,
    out: &[u8],
    is_gzip: bool,
    inflate: &mut Inflate,
    depth: usize,
) -> Result<Option<super::scan::Finding>, String> {
    if depth == MAX_NESTING {
        return Err(format!("it nests compressed streams more than {MAX_NESTING} deep, more than the host checks"));
    }
    Ok(check_body(scanner, out, inflate, depth + 1)?.map(|f| super::scan::Finding {
        view: if is_gzip { "inflated from a gzip stream" } else { "inflated from a zlib stream" },
        ..f
    }))
}

/// Why a response body was not kept.
#[derive(Debug)]
enum Refused {
    /// It is larger than one response may be.
    TooLarge,
    /// The call's buffered responses leave no room for it.
    BudgetSpent,
    /// The transport failed while it came.
    Failed(HttpError),
}

impl Refused {
    fn into_error(self, limits: &HttpLimits) -> HttpError {
        match self {
            Refused::TooLarge => HttpError::HttpResponseBodySize(Some(limits.response_bytes as u64)),
            Refused::BudgetSpent => HttpError::HttpResponseBodySize(Some(limits.response_bytes_per_call as u64)),
            Refused::Failed(e) => e,
        }
    }
}

/// A response body, whole, and its charge against the call's buffered
/// bytes: each frame is charged before it is kept, and refused when the
/// response would pass `limits.response_bytes` or the call's buffered bytes
/// `limits.response_bytes_per_call` (with the other responses being
/// collected, checked or waiting for the guest).
async fn collect_charged<B>(
    call: &Arc<CallTraffic>,
    head: usize,
    body: B,
    limits: &HttpLimits,
) -> Result<(Bytes, Charge), Refused>
where
    B: http_body::Body<Data = Bytes, Error = HttpError>,
{
    let mut body = std::pin::pin!(body);
    let mut charge = Charge::none(call);
    // The head first: a server answering with large heads and empty bodies
    // held memory no budget counted.
    if !charge.grow(head, limits.response_bytes_per_call) {
        return Err(Refused::BudgetSpent);
    }
    let mut frames = Vec::new();
    // The per-response limit is the body's (`limits.response_bytes`); the head counts in the call's budget only.
    let mut size = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Refused::Failed)?;
        let Ok(data) = frame.into_data() else { continue };
        size += data.len();
        if size > limits.response_bytes {
            return Err(Refused::TooLarge);
        }
        if !charge.grow(data.len(), limits.response_bytes_per_call) {
            return Err(Refused::BudgetSpent);
        }
        frames.push(data);
    }
    let data = match frames.len() {
        1 => frames.pop().unwrap_or_default(),
        _ => Bytes::from(frames.concat()),
    };
    Ok((data, charge))
}

type Sent = Result<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), HttpError>> + Send>), HttpError>;

/// The wasi-http error codes for transport failures, as the defaults give
/// them, without their logging of the error's text: that text can carry
/// the server's bytes, and the host records it only after checking it.
type P2Code = wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;

/// Most a guest may write to a request or response body at once; a body's
/// channel holds two such writes (one buffered chunk, and the slot
/// wasmtime-wasi-http always adds): 128 KiB per body. wasmtime-wasi-http's
/// default, 1 MiB chunks, let every body a guest made, sent or not, hold
/// 2 MiB. What a call's bodies hold together is counted against
/// `limits.http_request_total_kib` ([`super::http_held`]).
pub(super) const BODY_CHUNK_BYTES: usize = 64 << 10;

impl WasiHttpHooks for OutboundPolicy {
    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        1
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        BODY_CHUNK_BYTES
    }

    fn p2_error_from_hyper(&mut self, _: &hyper::Error) -> P2Code {
        P2Code::HttpProtocolError
    }

    fn p2_error_from_connect(&mut self, _: &std::io::Error) -> P2Code {
        P2Code::ConnectionRefused
    }

    fn p2_error_from_tls(&mut self, _: &std::io::Error) -> P2Code {
        P2Code::TlsProtocolError
    }

    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        let decided = self.authorize(&mut request);
        let limits = self.limits;
        let (call, pools) = (self.traffic().clone(), self.pools.clone());
        Box::new(async move {
            let records = &call.records;
            let Decided { dest, credential, target } = decided?;
            // While the host cannot check what would come back, nothing
            // leaves: withholding only the response would let a POST, a
            // DELETE or an adapter's `tools/call` take effect while the
            // model is told it failed — and retries it. (Read on the
            // blocking pool: a source may be a file.)
            // In flight: at most so many of this call, of its Tool's share
            // and of the host; more wait their turn ([`HostPools`]). Taken
            // first: the read below is a blocking job that outlives a request
            // the guest drops, and holds them to its end.
            let closed = || HttpError::InternalError(Some(format!("{NOT_SENT}: the host is shutting down")));
            let call_slot = CallSlot::acquire(&call).await.map_err(|_| closed())?;
            let host_slot = pools.http_slots(&call, &dest).await.ok_or_else(closed)?;
            let watch = call.clone();
            let (watched, (call_slot, host_slot)) = if call.watch.specs.is_empty() {
                (None, (call_slot, host_slot))
            } else {
                let job = move || (Some(watch.watch.scanner(&watch.records)), (call_slot, host_slot));
                tokio::task::spawn_blocking(job).await.map_err(|_| {
                    HttpError::InternalError(Some(format!("{NOT_SENT}: the host could not check its secrets")))
                })?
            };
            match watched {
                None | Some(Watched::Complete(_)) => {}
                Some(Watched::Unvouched { credentials, .. }) => {
                    records.quoting(|q| {
                        format!(
                            "request to {} not sent: the host cannot check its response for {}",
                            q(&dest),
                            credentials.why()
                        )
                    });
                    return Err(HttpError::InternalError(Some(format!(
                        "{NOT_SENT}: it cannot check a response for credential {} (see the host's records)",
                        credentials.names()
                    ))));
                }
            }
            if let Some((spec, secret)) = &credential {
                apply(&mut request, spec, secret)?;
                // Watched for in every response of the call from now on, whatever the source holds by then.
                call.watch.sent(spec, secret);
            }
            drop(credential);
            let cap = |t: Option<Duration>| Some(t.map_or(limits.timeout, |t| t.min(limits.timeout)));
            // A timeout the guest set shorter than the host's: a request that
            // runs out of that very timeout ended by the Tool's choice, not
            // the destination's failure — not a transport failure, which would
            // make the Tool's own error an executor error the model never
            // reads (a Tool setting a 1 ms timeout turned any error of its
            // into one). Each error is tied to the limit that produced it: a
            // destination that fails otherwise (refused, reset, no such name,
            // the host's own limits) is still the call's transport failure.
            let shorter = |t: Option<Duration>| t.is_some_and(|t| t < limits.timeout);
            let guest_connect = shorter(options.and_then(|o| o.connect_timeout));
            let guest_first_byte = shorter(options.and_then(|o| o.first_byte_timeout));
            let options = RequestOptions {
                connect_timeout: cap(options.and_then(|o| o.connect_timeout)),
                first_byte_timeout: cap(options.and_then(|o| o.first_byte_timeout)),
                between_bytes_timeout: cap(options.and_then(|o| o.between_bytes_timeout)),
            };
            let connect_timeout = options.connect_timeout.unwrap_or(limits.timeout);
            // The name lookup, the TCP connect, the HTTP handshake and the
            // first byte are timed each, the TLS handshake between them is
            // not: a server that never finished it held the request and its
            // slots until the call's deadline. The whole — lookup included —
            // is bounded by two connect timeouts and the first-byte one.
            let within = [options.connect_timeout, options.connect_timeout, options.first_byte_timeout]
                .into_iter()
                .map(|t| t.unwrap_or(limits.timeout))
                .fold(Duration::ZERO, Duration::saturating_add);
            let deadline = tokio::time::Instant::now() + within;
            // Resolved by the host (bounded: [`Resolver`]), holding the
            // request's slots; the client connects to what was checked.
            let lookup =
                checked_addresses(&pools.pools.resolver, &call.lookups, &pools.tool.lookups, &target, connect_timeout);
            let mut lookup_ran_out = false;
            let looked_up = tokio::time::timeout_at(deadline, lookup).await.unwrap_or_else(|_| {
                lookup_ran_out = true;
                Err(Unreachable::Dns("the name lookup took longer than the request may".into()))
            });
            let addresses = match looked_up {
                Ok(addresses) => addresses,
                Err(Unreachable::Prohibited(why)) => {
                    records.quoting(|q| format!("outbound request denied: {} {why}", q(&dest)));
                    return Err(HttpError::DestinationIpProhibited);
                }
                Err(Unreachable::Dns(why)) if lookup_ran_out && guest_connect => {
                    records.quoting(|q| {
                        format!("outbound request to {} gave up within the Tool's own timeout: {why}", q(&dest))
                    });
                    return Err(HttpError::DnsError { rcode: Some(why), info_code: None });
                }
                Err(Unreachable::Dns(why)) => {
                    *call.transport.lock().unwrap_or_else(|p| p.into_inner()) = Some(bounded(format!("{dest}: {why}")));
                    return Err(HttpError::DnsError { rcode: Some(why), info_code: None });
                }
            };
            let (parts, body) = request.into_parts();
            let request_bytes = limits.request_bytes;
            // The client gets a copy of each chunk: the guest's bytes, counted
            // against the call's `limits.http_request_total_kib` while they
            // live, go as soon as the client takes them (what the client then
            // buffers is bounded per request in flight).
            let body = body.map_frame(|frame| frame.map_data(|data| Bytes::copy_from_slice(&data)));
            let body = Limited::new(body, request_bytes)
                .map_err(move |_| HttpError::HttpRequestBodySize(Some(request_bytes as u64)))
                .boxed_unsync();
            // The guest's body stays open until the host has recorded how
            // the request ended: a guest learns of a failed send when its
            // body stream closes, and returns; the call is classified by
            // the record, which must be there by then.
            let body = KeptOpen(Arc::new(Mutex::new(body)));
            let open_until_recorded = body.0.clone();
            let request = http::Request::from_parts(parts, body.boxed_unsync());
            let handed = std::sync::atomic::AtomicBool::new(false);
            let sent = tokio::time::timeout_at(deadline, send_to(request, &target, &addresses, options, &handed))
                .await
                // `connection-timeout` means not sent (the SDK's `NotSent`):
                // a deadline that ends the wait for a request already handed
                // over (a slow TLS handshake ate the time) is a read timeout.
                .unwrap_or_else(|_| {
                    Err(match handed.load(std::sync::atomic::Ordering::Relaxed) {
                        true => HttpError::ConnectionReadTimeout,
                        false => HttpError::ConnectionTimeout,
                    })
                });
            let (response, io) = match sent {
                Ok(sent) => sent,
                Err(e)
                    if matches!(
                        (&e, guest_connect, guest_first_byte),
                        (HttpError::ConnectionTimeout, true, _) | (HttpError::ConnectionReadTimeout, _, true)
                    ) =>
                {
                    records.quoting(|q| {
                        format!("outbound request to {} gave up within the Tool's own timeout: {e}", q(&dest))
                    });
                    drop(open_until_recorded);
                    return Err(e);
                }
                Err(e) => {
                    // Recorded at once: the guest may see its request fail
                    // (its body stream closed) before this future returns,
                    // and the call's outcome is classified by this record.
                    let set = |line| *call.transport.lock().unwrap_or_else(|p| p.into_inner()) = Some(bounded(line));
                    if matches!(e, HttpError::Tls(_)) {
                        // Its text can carry the server's bytes (a
                        // certificate's names): the full text only once checked.
                        set(format!("{dest}: TLS error"));
                        match call.watch.scanner(records) {
                            Watched::Complete(scanner) => set(transport_line(&dest, &e, &scanner)),
                            Watched::Unvouched { credentials, .. } => set(format!(
                                "{dest}: TLS error; its text is withheld: the host cannot check it for {}",
                                credentials.why()
                            )),
                        }
                    } else {
                        // Connect, DNS, protocol errors: the OS's and hyper's own words.
                        set(format!("{dest}: {e}"));
                    }
                    drop(open_until_recorded);
                    return Err(e);
                }
            };
            let (mut parts, body) = response.into_parts();
            // Buffered (bounded) so the whole response can be checked before
            // the guest reads it; each frame charged to the call's budget
            // before it is kept ([`collect_charged`]).
            let head: usize = parts.headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
            let (collected, _) = tokio::join!(collect_charged(&call, head, body, &limits), io);
            let (data, mut charge) = collected.map_err(|refused| {
                if let Refused::BudgetSpent = refused {
                    records.quoting(|q| {
                        format!(
                            "response from {} refused: the call's {}-byte response budget is spent",
                            q(&dest),
                            limits.response_bytes_per_call
                        )
                    });
                }
                refused.into_error(&limits)
            })?;
            let scanner = match call.watch.scanner(records) {
                Watched::Complete(scanner) => scanner,
                // What the host cannot check it does not hand over, as if it held the secret.
                // (Not sent while unvouched; a source cannot become unread.)
                Watched::Unvouched { credentials, .. } => {
                    records.quoting(|q| {
                        format!(
                            "response from {} withheld: the host cannot check it for {}",
                            q(&dest),
                            credentials.why()
                        )
                    });
                    return Err(HttpError::InternalError(Some(format!(
                        "the host withheld the response: it cannot check it for credential {} (see the host's \
                         records)",
                        credentials.names()
                    ))));
                }
            };
            // Decoding and checking are CPU work proportional to what the
            // server sent: off the async workers. The request's in-flight
            // slots are held until the check is done (even if the guest gave
            // up waiting), so a guest cannot queue checks without bound.
            let inspected = tokio::task::spawn_blocking(move || {
                let verdict = inspect(&mut parts, data, &scanner, limits.response_bytes);
                drop((call_slot, host_slot));
                (parts, verdict)
            })
            .await;
            let Ok((parts, verdict)) = inspected else {
                return Err(HttpError::InternalError(Some("the host could not check the response".into())));
            };
            let data = match verdict {
                Ok(data) => data,
                Err(Withheld { why, coding, secret }) => {
                    records.quoting(|q| format!("response from {} withheld: {why}", q(&dest)));
                    return Err(if coding {
                        HttpError::HttpResponseContentCoding(Some(why))
                    } else if secret {
                        HttpError::InternalError(Some(WITHHELD.into()))
                    } else {
                        HttpError::InternalError(Some(format!("the host withheld the response: {why}")))
                    });
                }
            };
            if !charge.resize(data.len().saturating_add(head), limits.response_bytes_per_call) {
                records.quoting(|q| {
                    format!(
                        "response from {} refused: decoded, it is over what is left of the call's {}-byte response \
                         budget",
                        q(&dest),
                        limits.response_bytes_per_call
                    )
                });
                return Err(HttpError::HttpResponseBodySize(Some(limits.response_bytes_per_call as u64)));
            }
            let held = HeldBody { data, _charge: charge };
            let body = held.map_err(|never| match never {}).boxed_unsync();
            let done: Box<dyn Future<Output = Result<(), HttpError>> + Send> = Box::new(async { Ok(()) });
            Ok((http::Response::from_parts(parts, body), done))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoding_is_query_safe() {
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn content_codings_are_decoded_bounded_or_refused() {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"hello hello hello").unwrap();
        let gz = Bytes::from(gz.finish().unwrap());
        assert_eq!(decode("gzip", gz.clone(), 100).unwrap(), Bytes::from_static(b"hello hello hello"));
        assert_eq!(decode(" GZIP ", gz.clone(), 100).unwrap().len(), 17);
        assert!(decode("gzip", gz, 5).unwrap_err().contains("limit"), "a bomb stops at the limit");
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(b"x").unwrap();
        assert_eq!(decode("deflate", Bytes::from(z.finish().unwrap()), 10).unwrap(), Bytes::from_static(b"x"));
        for coding in ["br", "zstd", "compress", "gzip, br"] {
            assert!(decode(coding, Bytes::from_static(b"..."), 10).is_err(), "{coding}");
        }
        assert!(decode("gzip", Bytes::from_static(b"not gzip"), 10).is_err());
        assert_eq!(decode("identity", Bytes::from_static(b"as is"), 1).unwrap(), Bytes::from_static(b"as is"));
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(data).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn every_declared_coding_counts_on_every_line() {
        let mut h = http::HeaderMap::new();
        assert_eq!(codings(&h).unwrap(), Vec::<String>::new());
        h.append(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        h.append(CONTENT_ENCODING, HeaderValue::from_static(" Deflate , identity"));
        h.append(http::header::TRANSFER_ENCODING, HeaderValue::from_static("x-gzip, chunked"));
        // Undone last-applied first: the transfer coding, then the content codings in reverse.
        assert_eq!(codings(&h).unwrap(), ["x-gzip", "deflate", "gzip"]);
        h.append(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(codings(&h).unwrap_err().contains("stacks 4"));
    }

    fn check(s: &SecretScanner, data: &[u8], limit: usize) -> Result<Option<super::super::scan::Finding>, String> {
        check_body(
            s,
            data,
            &mut Inflate {
                budget: limit * INFLATE_FACTOR,
                attempts: MAX_STREAMS,
                members: MAX_MEMBERS,
                budget_is: "4× `limits.http_response_kib`",
            },
            0,
        )
    }

    #[test]
    fn compressed_bytes_are_inflated_for_the_check_whatever_the_headers_say() {
        use std::io::Write as _;
        let secret = "s3cr3t/t0ken+v4lue";
        let s = SecretScanner::new(&[("tracker".into(), secret.as_bytes().to_vec())]);
        let limit = 1 << 20;
        let body = format!("{{\"echo\":\"{secret}\"}}");
        // A whole body, a stream after other bytes, streams inside streams, a member after others.
        let mut after = b"--boundary\r\n".to_vec();
        after.extend(gzip(body.as_bytes()));
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(body.as_bytes()).unwrap();
        let members: Vec<u8> = (0..40).flat_map(|_| gzip(b"ordinary line\n")).chain(gzip(body.as_bytes())).collect();
        let apart = [gzip(b"first part"), b"--between--".to_vec(), gzip(body.as_bytes())].concat();
        // A stream hidden in input another stream took: in a header's extra
        // field, and where a member cut short of its trailer reads the next one's bytes as its trailer.
        let mut in_extra =
            flate2::GzBuilder::new().extra(gzip(body.as_bytes())).write(Vec::new(), flate2::Compression::default());
        in_extra.write_all(b"x").unwrap();
        let in_extra = in_extra.finish().unwrap();
        let cut = gzip(b"x");
        let as_trailer = [&cut[..cut.len() - 8], &gzip(body.as_bytes())].concat();
        for data in [
            gzip(body.as_bytes()),
            after,
            apart,
            in_extra,
            as_trailer,
            gzip(&gzip(&gzip(body.as_bytes()))),
            z.finish().unwrap(),
            members,
        ] {
            let f = check(&s, &data, limit).unwrap().expect("found");
            assert!(f.view.starts_with("inflated from"), "{f:?}");
        }
        // A bomb is not inflated past the budget: the response cannot be vouched for.
        let bomb = gzip(&vec![b'a'; 5 * limit]);
        assert!(check(&s, &bomb, limit).unwrap_err().contains("inflate past"));
        // Nor are streams nested beyond the bound, or more than the bound.
        let mut deep = b"x".to_vec();
        for _ in 0..=MAX_NESTING {
            deep = gzip(&deep);
        }
        assert!(check(&s, &deep, limit).unwrap_err().contains("nests"));
        let many: Vec<u8> =
            (0..=MAX_STREAMS).flat_map(|i| [format!("part {i}").into_bytes(), gzip(b"x")].concat()).collect();
        assert!(check(&s, &many, limit).unwrap_err().contains("more than 64"));
        // Ordinary data passes: a multi-member gzip file (its members are one
        // stream), bytes that only look like a header, text that starts like zlib.
        let bgzf: Vec<u8> = (0..500).flat_map(|i| gzip(format!("record {i}\n").as_bytes())).collect();
        assert_eq!(check(&s, &bgzf, limit), Ok(None));
        assert_eq!(check(&s, b"\x1f\x8b\x08 not a stream", limit), Ok(None));
        for text in ["x\u{9c} plain", "80 items", "hb"] {
            assert_eq!(check(&s, text.as_bytes(), limit), Ok(None), "{text}");
        }
    }

    #[test]
    fn an_empty_body_and_raw_deflate_decode() {
        use std::io::Write as _;
        assert_eq!(decode("gzip", Bytes::new(), 10).unwrap(), Bytes::new());
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        raw.write_all(b"raw deflate").unwrap();
        assert_eq!(
            decode("deflate", Bytes::from(raw.finish().unwrap()), 100).unwrap(),
            Bytes::from_static(b"raw deflate")
        );
    }

    #[test]
    fn a_credential_rewritten_during_a_call_is_watched_in_both_values() {
        use crate::authority::credentials::{CredentialConfig, Source};
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let write = |v: &str| {
            std::fs::write(&file, v).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        write("first-value-1111");
        let config = CredentialConfig {
            source: Source::File(file.clone()),
            destinations: vec!["http://127.0.0.1:8080".into()],
            apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
        };
        let spec = Arc::new(CredentialSpec::new("tracker", &config, dir.path()).unwrap());
        let watch = SecretWatch::new(Arc::from([spec.clone()]));
        let records = HostRecords::default();
        let first = spec.materialize("http", "127.0.0.1", 8080).unwrap();
        assert!(watch.scanner(&records).complete().find(b"first-value-1111").is_some());
        // A token refresh rewrites the file mid-call: the next response is checked for the new value...
        write("second-value-2222");
        let s = watch.scanner(&records).complete();
        assert!(s.find(b"second-value-2222").is_some() && s.find(b"first-value-1111").is_some());
        // ...and for the exact value a request carried, even when the source no longer holds it.
        write("third-value-33333");
        watch.sent(&spec, &first);
        let s = watch.scanner(&records).complete();
        for v in ["first-value-1111", "second-value-2222", "third-value-33333"] {
            assert!(s.find(v.as_bytes()).is_some(), "{v}");
        }
        assert!(records.take().0.is_empty());
        // A value is watched from the moment a request carries it, for every
        // response of the call — one checked before that request's own.
        let watch = SecretWatch::new(Arc::from([spec.clone()]));
        write("fourth-value-4444");
        let sent = spec.materialize("http", "127.0.0.1", 8080).unwrap();
        watch.sent(&spec, &sent);
        write("fifth-value-55555");
        assert!(watch.scanner(&records).complete().find(b"fourth-value-4444").is_some());
        // A later call still watches a value an earlier one saw (it may still be valid),
        // also while the source cannot be read.
        std::fs::remove_file(&file).unwrap();
        let later = SecretWatch::new(Arc::from([spec.clone()]));
        let s = later.scanner(&records).complete();
        for v in ["first-value-1111", "fourth-value-4444", "fifth-value-55555"] {
            assert!(s.find(v.as_bytes()).is_some(), "{v}");
        }
        assert!(
            records.take().0.iter().any(|r| r.line().contains("response check")),
            "the unreadable source is recorded"
        );
    }

    /// A value rotated away stays watched in the process while it may
    /// still be valid — within a day of its last read, whatever the count
    /// of rotations since (before: the last 8 only) — and a source
    /// rewritten without end keeps at most [`HISTORY_MOST`] values.
    #[test]
    fn a_value_rotated_away_many_times_is_still_watched_within_the_day() {
        use crate::authority::credentials::{CredentialConfig, Source};
        let var = format!("TOOLGATE_OUTBOUND_ROTATED_{}", std::process::id());
        let config = CredentialConfig {
            source: Source::Env(var.clone()),
            destinations: vec!["http://127.0.0.1:8080".into()],
            apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
        };
        let spec = Arc::new(CredentialSpec::new("rotated", &config, std::path::Path::new("/")).unwrap());
        let value = |i: usize| format!("r0tated-t0ken/number={i:03}");
        let records = HostRecords::default();
        let rotate = |range: std::ops::Range<usize>| {
            for i in range {
                // SAFETY (edition 2024): the variable is this test's own.
                unsafe { std::env::set_var(&var, value(i)) };
                SecretWatch::new(Arc::from([spec.clone()])).scanner(&records);
            }
        };
        rotate(0..20);
        let s = SecretWatch::new(Arc::from([spec.clone()])).scanner(&records).complete();
        for i in 0..20 {
            assert!(s.find(value(i).as_bytes()).is_some(), "rotation {i} of 20");
        }
        rotate(20..HISTORY_MOST + 10);
        let s = SecretWatch::new(Arc::from([spec.clone()])).scanner(&records).complete();
        let watched = (0..HISTORY_MOST + 10).filter(|i| s.find(value(*i).as_bytes()).is_some()).count();
        assert_eq!(watched, HISTORY_MOST);
        assert!(s.find(value(HISTORY_MOST + 9).as_bytes()).is_some() && s.find(value(0).as_bytes()).is_none());
        // SAFETY: as above.
        unsafe { std::env::remove_var(&var) };
    }

    impl Watched {
        fn complete(self) -> Arc<SecretScanner> {
            match self {
                Watched::Complete(s) => s,
                Watched::Unvouched { credentials, .. } => panic!("unvouched: {}", credentials.why()),
            }
        }
    }

    /// A credential whose source the host cannot read and never read has
    /// nothing to look for: the watch says so (it fails open otherwise),
    /// naming the source and the fix, until the source can be read; from
    /// then on its values are in the history, read or not.
    #[test]
    fn a_credential_never_read_leaves_the_check_unvouched_until_it_is() {
        use crate::authority::credentials::{CredentialConfig, Source};
        let var = format!("TOOLGATE_OUTBOUND_NEVER_READ_{}", std::process::id());
        let spec = |name: &str, source| {
            let config = CredentialConfig {
                source,
                destinations: vec!["https://api.example:443".into()],
                apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
            };
            Arc::new(CredentialSpec::new(name, &config, std::path::Path::new("/")).unwrap())
        };
        let unset = spec("never-read-env", Source::Env(var.clone()));
        let missing = spec("never-read-file", Source::File("/nonexistent/toolgate/secret".into()));
        let watch = SecretWatch::new(Arc::from([unset, missing]));
        let records = HostRecords::default();
        let Watched::Unvouched { credentials, .. } = watch.scanner(&records) else { panic!("vouched for nothing") };
        assert_eq!(credentials.names(), "`never-read-env`, `never-read-file`");
        let why = credentials.why();
        for part in [var.as_str(), "not set", "MCP client", "/nonexistent/toolgate/secret"] {
            assert!(why.contains(part), "{part}: {why}");
        }
        // Set but empty is no value either.
        // SAFETY (edition 2024): the variable is this test's own.
        unsafe { std::env::set_var(&var, " \n") };
        let Watched::Unvouched { credentials, .. } = watch.scanner(&records) else { panic!("vouched for a blank") };
        assert!(credentials.why().contains("is empty"), "{}", credentials.why());
        unsafe { std::env::set_var(&var, "n3ver-read-t0ken-value") };
        let Watched::Unvouched { credentials, .. } = watch.scanner(&records) else {
            panic!("the file is still missing")
        };
        assert_eq!(credentials.names(), "`never-read-file`");
        unsafe { std::env::remove_var(&var) };
        // Read once, its value is watched for while the variable is unset: only the file is missing still.
        let Watched::Unvouched { scanner, credentials } = watch.scanner(&records) else { panic!() };
        assert_eq!(credentials.names(), "`never-read-file`");
        assert!(scanner.find(b"x n3ver-read-t0ken-value").is_some());
    }

    /// An embedder's two configs in one process, each with a credential
    /// `github`: one from a variable it has read, the other from a file
    /// that is missing. The second has never been read — its check is
    /// unvouched, whatever the first's history holds under the same name —
    /// until its file can be read; then a third config naming that file
    /// differently (`./`) shares what was read of it.
    #[test]
    fn a_credential_counts_as_read_only_when_its_own_source_was() {
        use crate::authority::credentials::{CredentialConfig, Source};
        let var = format!("TOOLGATE_OUTBOUND_SAME_NAME_{}", std::process::id());
        let dir = tempfile::tempdir().unwrap();
        let spec = |source, base: &std::path::Path| {
            let config = CredentialConfig {
                source,
                destinations: vec!["https://api.example:443".into()],
                apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
            };
            Arc::new(CredentialSpec::new("github", &config, base).unwrap())
        };
        // SAFETY (edition 2024): the variable is this test's own.
        unsafe { std::env::set_var(&var, "env-t0ken-of-the-first-config") };
        let first = SecretWatch::new(Arc::from([spec(Source::Env(var.clone()), dir.path())]));
        let records = HostRecords::default();
        assert!(first.scanner(&records).complete().find(b"env-t0ken-of-the-first-config").is_some());
        let second = SecretWatch::new(Arc::from([spec(Source::File("gh.secret".into()), dir.path())]));
        let Watched::Unvouched { scanner, credentials } = second.scanner(&records) else {
            panic!("the second `github` was never read: it cannot be vouched for")
        };
        assert!(credentials.why().contains("gh.secret"), "{}", credentials.why());
        assert!(scanner.find(b"env-t0ken-of-the-first-config").is_some(), "other values are still looked for");
        let file = dir.path().join("gh.secret");
        std::fs::write(&file, "file-t0ken-of-the-second-config\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(second.scanner(&records).complete().find(b"file-t0ken-of-the-second-config").is_some());
        std::fs::remove_file(&file).unwrap();
        let third = SecretWatch::new(Arc::from([spec(Source::File("./gh.secret".into()), dir.path())]));
        let s = third.scanner(&records).complete();
        assert!(s.find(b"file-t0ken-of-the-second-config").is_some(), "read before, as the same file");
        unsafe { std::env::remove_var(&var) };
    }

    /// A response is checked for a secret the host refuses to apply (its
    /// file readable by others): refusing to send a secret does not make it
    /// less of one.
    #[test]
    fn a_credential_refused_for_use_is_still_watched_in_responses() {
        use crate::authority::credentials::{CredentialConfig, Source};
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "w0rld-r3adable-t0ken\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let config = CredentialConfig {
            source: Source::File(file.clone()),
            destinations: vec!["http://127.0.0.1:8080".into()],
            apply: Apply::Header { name: "authorization".into(), format: "Bearer {}".into() },
        };
        let spec = Arc::new(CredentialSpec::new("k8s", &config, dir.path()).unwrap());
        let e = spec.materialize("http", "127.0.0.1", 8080).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        let watch = SecretWatch::new(Arc::from([spec]));
        let records = HostRecords::default();
        let s = watch.scanner(&records).complete();
        let f = s.find(br#"{"echo":"Bearer w0rld-r3adable-t0ken"}"#).expect("watched");
        assert_eq!(f.credential, "k8s");
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode("w0rld-r3adable-t0ken");
        assert!(s.find(b64.as_bytes()).is_some(), "in its encodings");
        assert!(records.take().0.is_empty(), "read, so not reported unreadable");
    }

    #[test]
    fn a_transport_error_is_recorded_only_when_its_text_holds_no_secret() {
        let s = SecretScanner::new(&[("tracker".into(), b"s3cr3t-in-a-cert-name".to_vec())]);
        let tls = |text: &str| HttpError::Tls(std::io::Error::other(text.to_owned()));
        assert_eq!(
            transport_line("https://a:443", &tls("invalid peer certificate: expired"), &s),
            "https://a:443: TLS error: invalid peer certificate: expired"
        );
        let line = transport_line("https://a:443", &tls("not valid for name: s3cr3t-in-a-cert-name.example"), &s);
        assert!(line.contains("credential `tracker`") && !line.contains("s3cr3t"), "{line}");
    }

    #[test]
    fn host_records_are_bounded() {
        let r = HostRecords::default();
        for i in 0..100 {
            r.add(format!("line {i}"));
        }
        let (lines, dropped) = r.take();
        assert_eq!((lines.len(), dropped), (MAX_RECORDS, 100 - MAX_RECORDS as u64));
        // Each line too, at a character boundary.
        r.add(format!("denied: {}", "é".repeat(2 << 20)));
        let (lines, _) = r.take();
        let line = lines[0].line();
        assert!(line.len() <= MAX_RECORD_BYTES + 40 && line.ends_with("more bytes not kept)"), "{}", line.len());
    }

    /// A record keeps the host's words apart from the guest's text it
    /// quotes, so it can be kept without the guest's text.
    #[test]
    fn a_record_can_be_kept_without_the_guests_text() {
        let r = HostRecords::default();
        let dest = "http://746f6b656e.x:80";
        r.quoting(|q| format!("outbound request denied: {} is not granted to this Tool", q(dest)));
        r.add("response check: credential `a`: cannot read /s".into());
        let (mut lines, _) = r.take();
        assert_eq!(lines[0].line(), "outbound request denied: http://746f6b656e.x:80 is not granted to this Tool");
        for line in &mut lines {
            line.leave_out_guest_text();
        }
        assert_eq!(
            lines[0].line(),
            format!("outbound request denied: {GUEST_TEXT_LEFT_OUT} is not granted to this Tool")
        );
        assert_eq!(lines[1].line(), "response check: credential `a`: cannot read /s", "the host's words stay");
        // A long quote is cut in both forms.
        r.quoting(|q| format!("file {} refused", q(&"p".repeat(1 << 20))));
        let (lines, _) = r.take();
        assert!(lines[0].line().len() < MAX_RECORD_BYTES + 40, "{}", lines[0].line().len());
    }

    #[test]
    fn only_public_addresses_are_public() {
        let table = [
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("0.0.0.0", Some("unspecified")),
            ("10.1.2.3", Some("private")),
            ("172.16.0.1", Some("private")),
            ("192.168.1.1", Some("private")),
            ("169.254.169.254", Some("link-local")),
            ("100.64.0.1", Some("shared (carrier-grade NAT)")),
            ("192.0.2.1", Some("reserved")),
            ("198.18.0.1", Some("reserved")),
            ("224.0.0.1", Some("multicast or reserved")),
            ("255.255.255.255", Some("multicast or reserved")),
            ("::1", Some("loopback")),
            ("::", Some("unspecified")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("::ffff:10.0.0.1", Some("private")),
            ("fd00::1", Some("private (unique local)")),
            ("fe80::1", Some("link-local")),
            ("64:ff9b::a9fe:a9fe", Some("link-local")),
            ("2002:7f00:1::", Some("loopback")),
            ("::7f00:1", Some("reserved")),
            ("ff02::1", Some("multicast or reserved")),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("172.32.0.1", None),
            ("2606:4700:4700::1111", None),
            ("64:ff9b::808:808", None),
            ("::ffff:0:7f00:1", Some("loopback")),
            ("::ffff:0:a9fe:a9fe", Some("link-local")),
            ("::ffff:0:808:808", None),
            ("64:ff9b:1::a00:1", Some("reserved (local-use NAT64)")),
            ("64:ff9b:1:ffff::1", Some("reserved (local-use NAT64)")),
        ];
        for (ip, kind) in table {
            assert_eq!(not_public(ip.parse().unwrap()), kind, "{ip}");
        }
    }

    fn http_to(host: &str, port: u16) -> Target {
        Target { host: host.into(), port, literal: host.parse().ok(), tls: false }
    }

    #[tokio::test]
    async fn a_name_over_http_leads_only_where_it_was_checked() {
        let resolver = Resolver::system(4);
        let lookups = Arc::new(Semaphore::new(LOOKUPS_PER_CALL));
        let tool = Share::new(4);
        let checked = |target: Target| {
            let (resolver, lookups, tool) = (resolver.clone(), lookups.clone(), tool.clone());
            async move { checked_addresses(&resolver, &lookups, &tool, &target, Duration::from_secs(5)).await }
        };
        // A numeric name (not an address literal) that the resolver reads as 127.0.0.1.
        for name in ["2130706433", "127.1", "0x7f000001"] {
            match checked(http_to(name, 80)).await {
                Err(Unreachable::Prohibited(why)) => {
                    assert!(why.contains("resolved to 127.0.0.1, a loopback address"), "{name}: {why}")
                }
                Err(Unreachable::Dns(why)) => panic!("{name}: {why}"),
                Ok(a) => panic!("{name} was let through to {a:?}"),
            }
        }
        // `localhost` names this machine: its loopback addresses are where it leads.
        let a = checked(http_to("localhost", 8080)).await.ok().unwrap();
        assert!(a.iter().all(|a| a.ip().is_loopback() && a.port() == 8080), "{a:?}");
        assert!(matches!(checked(http_to("no-such-name.invalid", 80)).await, Err(Unreachable::Dns(_))));
        // Over HTTPS the certificate binds the name: any address it resolves to.
        let tls = Target { tls: true, ..http_to("2130706433", 443) };
        assert_eq!(checked(tls).await.ok().unwrap(), ["127.0.0.1:443".parse().unwrap()]);
        // An address literal is not looked up.
        assert_eq!(checked(http_to("10.0.0.1", 80)).await.ok().unwrap(), ["10.0.0.1:80".parse().unwrap()]);
        assert_eq!(lookups.available_permits(), LOOKUPS_PER_CALL, "every lookup gave its slot back");
    }

    /// A resolver that answers only once the test opens it, counting the lookups it started.
    #[derive(Default)]
    struct SlowDns {
        started: std::sync::atomic::AtomicUsize,
        open: Mutex<bool>,
        opened: std::sync::Condvar,
    }

    impl SlowDns {
        fn resolver(self: &Arc<Self>, at_once: usize) -> Resolver {
            let dns = self.clone();
            Resolver::with(
                Arc::new(move |_: &str, port: u16| {
                    dns.started.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let mut open = dns.open.lock().unwrap();
                    while !*open {
                        open = dns.opened.wait(open).unwrap();
                    }
                    Ok(vec![std::net::SocketAddr::new([203, 0, 113, 7].into(), port)])
                }),
                at_once,
            )
        }
        fn started(&self) -> usize {
            self.started.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn answer(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    /// Invariant 14, threads: a lookup blocks a thread until DNS answers,
    /// and cannot be stopped. Requests that give up on one (timeout 0, in a
    /// loop) leave it running; each running lookup keeps its call's and the
    /// host's slot until the resolver returns, so a call has at most its
    /// share running and the host at most its bound, and a request that
    /// finds none free fails within its timeout, naming the host. (Before,
    /// `lookup_host` and wasmtime-wasi-http's connect queued one blocking
    /// job per request, without bound.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_name_lookup_holds_its_slots_until_the_resolver_answers() {
        let dns = Arc::new(SlowDns::default());
        let resolver = dns.resolver(3);
        let short = Duration::from_millis(50);
        let tool = Share::new(3);
        let call_a = Arc::new(Semaphore::new(2));
        for _ in 0..2 {
            let e = resolver.resolve(&call_a, &tool, "slow.example", 443, short).await.unwrap_err();
            assert!(e.contains("resolving slow.example took longer than"), "{e}");
        }
        // Both requests gave up; their lookups still run, holding the call's share.
        let began = std::time::Instant::now();
        for within in [Duration::ZERO, short] {
            let e = resolver.resolve(&call_a, &tool, "slow.example", 443, within).await.unwrap_err();
            assert!(e.contains("no lookup of slow.example could start") && e.contains("this call's"), "{e}");
        }
        assert!(began.elapsed() < Duration::from_secs(2), "refused within the request's timeout");
        assert_eq!(dns.started(), 2, "a call starts no more lookups than its share");
        // Another call gets the host's last slot, and a third none.
        let call_b = Arc::new(Semaphore::new(2));
        assert!(
            resolver.resolve(&call_b, &tool, "slow.example", 443, short).await.unwrap_err().contains("took longer")
        );
        let call_c = Arc::new(Semaphore::new(2));
        let e = resolver.resolve(&call_c, &Share::new(3), "other.example", 80, short).await.unwrap_err();
        assert!(e.contains("no lookup of other.example could start") && e.contains("the host's 3"), "{e}");
        assert_eq!(dns.started(), 3, "the host starts no more lookups than its bound");
        // The calls are over; their lookups are not, and hold their slots.
        drop((call_a, call_b));
        tokio::time::sleep(short).await;
        assert_eq!(resolver.slots.available_permits(), 0);
        dns.answer();
        let freed = std::time::Instant::now();
        while resolver.slots.available_permits() < 3 {
            assert!(freed.elapsed() < Duration::from_secs(10), "slots come back when the lookups return");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let found = resolver.resolve(&call_c, &tool, "other.example", 80, Duration::from_secs(5)).await.unwrap();
        assert_eq!(found, ["203.0.113.7:80".parse().unwrap()]);
        assert_eq!(call_c.available_permits(), 2);
    }

    #[test]
    fn a_tools_share_mirrors_its_share_of_the_instances_and_is_never_the_whole_pool() {
        // (pool, max_instances_per_tool, max_instances) → share
        for (pool, per_tool, instances, share) in [
            (64, 16, 64, 16),
            (LOOKUPS_AT_ONCE, 16, 64, 8),
            (4, 2, 4, 2),
            (64, 64, 64, 63),
            (64, 10_000, 1, 63),
            (1, 16, 64, 1),
            (2, 1, 64, 1),
            (65_536, 10_000, 10_000, 65_535),
        ] {
            assert_eq!(tool_share(pool, per_tool, instances), share, "{pool} × {per_tool} / {instances}");
        }
    }

    fn policy_of(pools: &HostPools, tool: &str) -> OutboundPolicy {
        let limits = HttpLimits {
            request_bytes: 0,
            response_bytes: 0,
            timeout: Duration::from_secs(1),
            in_flight_per_call: 8,
            response_bytes_per_call: 0,
        };
        OutboundPolicy::new(Arc::default(), Arc::default(), limits, Arc::default(), pools.for_tool(tool))
    }

    fn lines(policy: &OutboundPolicy) -> Vec<String> {
        policy.take_records().0
    }

    /// Invariant 14, requests in flight: a Tool holds at most its share of
    /// the host's (here 2 of 4, as 2 of 4 instances), so another Tool's
    /// request still gets a slot; a request that has to wait says which
    /// limit is full, once a call, and gets its slot when one is freed.
    /// (Before, one Tool's calls could hold every slot, and others' requests
    /// waited until their calls' deadlines with nothing recorded.)
    #[tokio::test]
    async fn one_tool_holds_at_most_its_share_of_the_hosts_requests_in_flight() {
        let pools = HostPools::new(4, Resolver::system(1), 2, 4);
        let (a, b, c) = (policy_of(&pools, "a"), policy_of(&pools, "b"), policy_of(&pools, "c"));
        let a_again = policy_of(&pools, "a");
        let dest = "http://127.0.0.1:9";
        let slots = |p: &OutboundPolicy| {
            let (pools, call) = (p.pools.clone(), p.traffic().clone());
            async move { pools.http_slots(&call, dest).await.unwrap() }
        };
        let short = Duration::from_millis(50);
        let held_a = (slots(&a).await, slots(&a_again).await);
        // The Tool's share is held (by two of its calls): its next request waits, and says why.
        let mut waiting = Box::pin(slots(&a));
        assert!(tokio::time::timeout(short, &mut waiting).await.is_err());
        assert!(tokio::time::timeout(short, slots(&a)).await.is_err(), "a second wait");
        let said = lines(&a);
        assert_eq!(said.len(), 1, "once a call: {said:?}");
        assert!(
            said[0].contains("this Tool's 2 requests in flight")
                && said[0].contains("`limits.http_requests_in_flight_host` (4)")
                && said[0].contains("`limits.max_instances_per_tool`"),
            "{said:?}"
        );
        // Another Tool gets the host's other two at once.
        let held_b = (slots(&b).await, slots(&b).await);
        assert!(lines(&b).is_empty(), "nothing waited");
        // Now the host's pool is full: a third Tool waits, naming it.
        assert!(tokio::time::timeout(short, slots(&c)).await.is_err());
        let said = lines(&c);
        assert!(said.len() == 1 && said[0].contains("all 4 requests in flight of the host"), "{said:?}");
        // A slot freed goes to the request waiting for it.
        drop(held_a.0);
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("a freed slot is taken");
        drop((got, held_a.1, held_b));
        assert_eq!(pools.0.http.available_permits(), 4);
    }

    /// Invariant 14, threads: name lookups too — a Tool whose DNS never
    /// answers holds its share of the host's lookups (here 1 of 3), and
    /// another Tool's lookup still starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tool_whose_dns_never_answers_holds_only_its_share_of_the_lookups() {
        let dns = Arc::new(SlowDns::default());
        let pools = HostPools::new(4, dns.resolver(3), 2, 4);
        let (a, b) = (pools.for_tool("a"), pools.for_tool("b"));
        let short = Duration::from_millis(50);
        let resolve = |p: &ToolPools, name: &'static str| {
            let (p, call) = (p.clone(), Arc::new(Semaphore::new(LOOKUPS_PER_CALL)));
            async move { p.pools.resolver.resolve(&call, &p.tool.lookups, name, 443, short).await.unwrap_err() }
        };
        assert!(resolve(&a, "slow.example").await.contains("took longer"));
        let e = resolve(&a, "slow.example").await;
        assert!(e.contains("could start") && e.contains("this Tool's 1 (its share of the host's 3)"), "{e}");
        assert!(resolve(&b, "other.example").await.contains("took longer"), "another Tool's lookup starts");
        assert_eq!(dns.started(), 2);
        dns.answer();
    }

    /// HTTPS goes where the host's lookup said, not through a second lookup
    /// by the HTTP client: the connection reaches the resolved address and
    /// asks for the name (SNI), whose certificate is then checked.
    #[tokio::test]
    async fn https_connects_to_the_address_the_host_resolved_and_asks_for_the_name() {
        use tokio::io::AsyncReadExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut hello = vec![0; 4096];
            let n = tcp.read(&mut hello).await.unwrap();
            hello.truncate(n);
            hello
        });
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let resolver = Resolver::with(
            Arc::new(move |name: &str, port: u16| {
                seen.lock().unwrap().push(name.to_owned());
                Ok(vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))])
            }),
            1,
        );
        let target = Target { host: "api.tool.example".into(), port, literal: None, tls: true };
        let lookups = Arc::new(Semaphore::new(1));
        let addresses =
            checked_addresses(&resolver, &lookups, &Share::new(1), &target, Duration::from_secs(5)).await.ok().unwrap();
        let body = http_body_util::Empty::<Bytes>::new().map_err(|never| -> HttpError { match never {} });
        let request = http::Request::get(format!("https://api.tool.example:{port}/x")).body(body).unwrap();
        let second = Duration::from_secs(5);
        let options = RequestOptions {
            connect_timeout: Some(second),
            first_byte_timeout: Some(second),
            between_bytes_timeout: Some(second),
        };
        let sent = send_to(request, &target, &addresses, options, &Default::default()).await;
        assert!(matches!(sent, Err(HttpError::Tls(_))), "the test server speaks no TLS");
        let hello = server.await.unwrap();
        assert!(memchr::memmem::find(&hello, b"api.tool.example").is_some(), "SNI names the host");
        assert_eq!(*asked.lock().unwrap(), ["api.tool.example"], "looked up once, by the host");
    }

    /// The host's client sends a path that is only a query (`?a=b`, which
    /// wasi-http allows) as wasmtime-wasi-http's did, and reads no response
    /// head larger than [`MAX_RESPONSE_HEAD`]: a server answering with heads
    /// of hundreds of KiB and empty bodies held memory no budget counted.
    #[tokio::test]
    async fn a_query_only_path_is_sent_and_a_huge_response_head_is_refused() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut lines = Vec::new();
            for head in [1usize, 100 << 10] {
                let (mut tcp, _) = listener.accept().await.unwrap();
                let mut request = vec![0; 4096];
                let n = tcp.read(&mut request).await.unwrap();
                lines.push(String::from_utf8_lossy(&request[..n]).lines().next().unwrap_or_default().to_owned());
                let response = format!("HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 0\r\n\r\n", "y".repeat(head));
                let _ = tcp.write_all(response.as_bytes()).await;
            }
            lines
        });
        let target = Target { host: "127.0.0.1".into(), port: address.port(), literal: Some(address.ip()), tls: false };
        let second = Some(Duration::from_secs(5));
        let options =
            RequestOptions { connect_timeout: second, first_byte_timeout: second, between_bytes_timeout: second };
        let addresses = [address];
        static FALSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let send = || {
            let body = http_body_util::Empty::<Bytes>::new().map_err(|never| -> HttpError { match never {} });
            let request = http::Request::get(format!("http://{address}?a=b")).body(body).unwrap();
            send_to(request, &target, &addresses, options, &FALSE)
        };
        let (response, _conn) = send().await.ok().unwrap();
        assert_eq!(response.status(), 200);
        assert!(send().await.is_err(), "a 100 KiB head is refused");
        let lines = server.await.unwrap();
        assert!(lines[0].starts_with("GET /?a=b ") || lines[0].starts_with("GET ?a=b "), "{lines:?}");
    }

    /// A body that yields the chunks it was given.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = HttpError;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
            std::task::Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
        }
    }

    fn kib_chunks(n: usize) -> Chunks {
        Chunks((0..n).map(|_| Bytes::from(vec![b'x'; 1024])).collect())
    }

    /// Invariant 14, memory: responses collected at once share the call's
    /// budget (`limits.http_response_total_kib`): each frame is charged
    /// before it is kept. (Before, each response was given what was left
    /// when its head arrived and charged once whole: 8 in flight each
    /// held up to the per-response limit against a total of 4.)
    #[tokio::test]
    async fn responses_collected_at_once_share_the_calls_budget() {
        let limits = HttpLimits {
            request_bytes: 0,
            response_bytes: 4 << 10,
            timeout: Duration::from_secs(1),
            in_flight_per_call: 8,
            response_bytes_per_call: 6 << 10,
        };
        let policy = OutboundPolicy::new(
            Arc::default(),
            Arc::default(),
            limits,
            Arc::default(),
            HostPools::new(8, Resolver::system(1), 1, 1).for_tool("t"),
        );
        let call = policy.traffic().clone();
        let buffered = || call.buffered.load(std::sync::atomic::Ordering::SeqCst);
        let (a, b) = tokio::join!(
            collect_charged(&call, 0, kib_chunks(4), &limits),
            collect_charged(&call, 0, kib_chunks(4), &limits)
        );
        let (data, charge) = a.unwrap();
        assert_eq!(data.len(), 4 << 10);
        assert!(matches!(b, Err(Refused::BudgetSpent)), "{:?}", b.map(|(data, _)| data.len()));
        assert_eq!(buffered(), 4 << 10, "the refused response's bytes were given back");
        let (small, held) = collect_charged(&call, 0, kib_chunks(2), &limits).await.unwrap();
        assert_eq!((small.len(), buffered()), (2 << 10, 6 << 10));
        assert!(matches!(collect_charged(&call, 0, kib_chunks(1), &limits).await, Err(Refused::BudgetSpent)));
        drop((charge, held));
        assert_eq!(buffered(), 0);
        // Over the per-response limit, whatever the budget holds.
        assert!(matches!(collect_charged(&call, 0, kib_chunks(5), &limits).await, Err(Refused::TooLarge)));
        assert_eq!(buffered(), 0);
        assert_eq!(collect_charged(&call, 0, kib_chunks(4), &limits).await.unwrap().0.len(), 4 << 10);
        // A response's head is charged with its body: heads with empty
        // bodies no longer hold memory outside the budget.
        let (empty, head) = collect_charged(&call, 5 << 10, kib_chunks(0), &limits).await.unwrap();
        assert_eq!((empty.len(), buffered()), (0, 5 << 10));
        assert!(matches!(collect_charged(&call, 2 << 10, kib_chunks(0), &limits).await, Err(Refused::BudgetSpent)));
        drop(head);
        assert_eq!(buffered(), 0);
        // The per-response limit is the body's: a head does not push a body
        // of exactly the limit over it.
        let (full, with_head) = collect_charged(&call, 1 << 10, kib_chunks(4), &limits).await.unwrap();
        assert_eq!((full.len(), buffered()), (4 << 10, 5 << 10));
        drop(with_head);
    }
}
