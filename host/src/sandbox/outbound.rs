//! Outbound: the only network a guest has — HTTP through `wasi:http`, mediated here.
//!
//! Owns the request hook, both directions of the boundary (DESIGN.md
//! invariants 7 and 13). On the way out, each request must go to a granted
//! destination (exact scheme, host, port; no userinfo in the URL); at most
//! one credential is attached *by reference* with the `toolgate-credential`
//! request header, which never leaves the host: the hook removes it, checks
//! the credential is granted to this call and bound to this destination,
//! and only then reads the secret and writes it into the request. The guest
//! cannot negotiate what the host could not check: `Accept-Encoding` is
//! pinned to `identity`, `TE` is dropped and `Range` requests are refused.
//! On the way back, the response is buffered (bounded per request, per call
//! and in number in flight), a content coding the host can decode (gzip,
//! deflate) is decoded, any other is refused, and the body and every header
//! are checked for every configured secret (not only the one applied) in
//! the encodings of [`super::scan`]; a response holding one is withheld from
//! the guest. Redirects are not followed: a guest that follows one makes a
//! new request, decided anew.
//!
//! Architecture invariant: a denial is `HttpRequestDenied` (a withheld
//! response an error) to the guest and a line in the call's host records;
//! no secret appears in either, and the guest cannot write to those records.

use std::io::Read as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT_ENCODING, AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Limited};
use tokio::sync::Semaphore;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::scan::SecretScanner;
use crate::authority::credentials::{Apply, CredentialSpec, Secret};
use crate::authority::destination::{Destination, default_port};

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
struct HostRecords(Mutex<(Vec<String>, u64)>);

/// Most host records kept per call; further ones are counted.
const MAX_RECORDS: usize = 64;

impl HostRecords {
    /// Record one line.
    fn add(&self, line: String) {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if r.0.len() < MAX_RECORDS {
            r.0.push(line);
        } else {
            r.1 += 1;
        }
    }
    /// The lines kept, and how many more were dropped.
    fn take(&self) -> (Vec<String>, u64) {
        let mut r = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut r.0), r.1)
    }
}

/// Every configured credential, read the first time a response needs
/// checking: what comes back to any guest is searched for all of them, not
/// only the one the request carried (a trusted API may store one request
/// and return it to another).
struct SecretWatch {
    specs: Arc<[Arc<CredentialSpec>]>,
    scanner: OnceLock<SecretScanner>,
}

impl SecretWatch {
    /// Watch for the secrets of `specs`.
    fn new(specs: Arc<[Arc<CredentialSpec>]>) -> Self {
        SecretWatch { specs, scanner: OnceLock::new() }
    }

    fn scanner(&self, records: &HostRecords) -> &SecretScanner {
        self.scanner.get_or_init(|| {
            let mut secrets = Vec::with_capacity(self.specs.len());
            for spec in self.specs.iter() {
                match spec.read_to_check() {
                    Ok(s) => secrets.push((spec.name.clone(), s.expose().as_bytes().to_vec())),
                    // Unreadable now: it was not sent either (every use reads it the same way).
                    Err(e) => records.add(format!("response check: {e}")),
                }
            }
            SecretScanner::new(&secrets)
        })
    }
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
}

/// The outbound authority of one call.
pub struct OutboundPolicy {
    hosts: Arc<[Destination]>,
    credentials: Arc<[Arc<CredentialSpec>]>,
    limits: HttpLimits,
    /// Requests in flight in the whole host.
    host_slots: Arc<Semaphore>,
    watched: Arc<[Arc<CredentialSpec>]>,
    call: OnceLock<Arc<CallTraffic>>,
}

/// What the hook decided about a request before it leaves.
struct Decided {
    dest: String,
    credential: Option<(Arc<CredentialSpec>, Secret)>,
}

impl OutboundPolicy {
    /// Exactly `hosts` and `credentials`; responses checked for the secrets
    /// of `watched`; at most `host_slots` requests in flight in the host.
    pub fn new(
        hosts: Arc<[Destination]>,
        credentials: Arc<[Arc<CredentialSpec>]>,
        limits: HttpLimits,
        watched: Arc<[Arc<CredentialSpec>]>,
        host_slots: Arc<Semaphore>,
    ) -> Self {
        OutboundPolicy { hosts, credentials, limits, host_slots, watched, call: OnceLock::new() }
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
        self.call.get().map(|c| c.records.take()).unwrap_or_default()
    }

    fn deny(&self, what: &str) -> HttpError {
        self.traffic().records.add(format!("outbound request denied: {what}"));
        HttpError::HttpRequestDenied
    }

    /// Decide a request: its destination (`scheme://host:port`) and the credential it asks for.
    fn authorize(&self, request: &mut http::Request<WasiBody>) -> Result<Decided, HttpError> {
        let uri = request.uri();
        let scheme = uri.scheme_str().unwrap_or("https").to_ascii_lowercase();
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(self.deny("a URL with user information (`user:pass@`) is refused; use a credential reference"));
        }
        let Some(host) = uri.host().map(str::to_ascii_lowercase) else {
            return Err(self.deny("the request names no host"));
        };
        let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
        let dest = format!("{scheme}://{host}:{port}");
        if !self.hosts.iter().any(|d| d.matches(&scheme, &host, port)) {
            return Err(self.deny(&format!("{dest} is not granted to this Tool")));
        }
        let headers = request.headers_mut();
        // A partial response could carry a secret in pieces too short to recognize.
        if headers.contains_key(http::header::RANGE) || headers.contains_key(http::header::IF_RANGE) {
            return Err(self.deny(&format!("a `Range` request to {dest}: the host checks whole responses only")));
        }
        // The guest cannot negotiate a coding the host would have to trust blindly.
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        headers.remove(http::header::TE);
        // Count before removing: `remove` drops every value of the header at once.
        let asked: Vec<HeaderValue> = headers.get_all(CREDENTIAL_HEADER).iter().cloned().collect();
        headers.remove(CREDENTIAL_HEADER);
        let name = match asked.as_slice() {
            [] => return Ok(Decided { dest, credential: None }),
            [one] => one.to_str().unwrap_or_default().trim().to_owned(),
            more => {
                return Err(
                    self.deny(&format!("{} credentials requested for {dest}; one request carries one", more.len()))
                );
            }
        };
        let Some(spec) = self.credentials.iter().find(|c| c.name == name) else {
            return Err(self.deny(&format!("credential `{name}` is not granted to this Tool")));
        };
        if !spec.bound_to(&scheme, &host, port) {
            return Err(self.deny(&format!("credential `{name}` is not bound to {dest}")));
        }
        match spec.materialize(&scheme, &host, port) {
            Ok(secret) => Ok(Decided { dest, credential: Some((spec.clone(), secret)) }),
            Err(e) => {
                self.traffic().records.add(e.to_string());
                Err(HttpError::InternalError(Some(format!("credential `{name}` is unavailable on this host"))))
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
    let bad = || HttpError::InternalError(Some(format!("credential `{}` cannot be applied", spec.name)));
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
    call: Arc<CallTraffic>,
    size: usize,
}

impl Drop for HeldBody {
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
        "gzip" | "x-gzip" => take(&mut flate2::read::MultiGzDecoder::new(&data[..]), &mut out)?,
        "deflate" => take(&mut flate2::read::ZlibDecoder::new(&data[..]), &mut out)?,
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

type Sent = Result<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), HttpError>> + Send>), HttpError>;

impl WasiHttpHooks for OutboundPolicy {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        let decided = self.authorize(&mut request);
        let limits = self.limits;
        let (call, host_slots) = (self.traffic().clone(), self.host_slots.clone());
        Box::new(async move {
            let records = &call.records;
            let Decided { dest, credential } = decided?;
            if let Some((spec, secret)) = &credential {
                apply(&mut request, spec, secret)?;
            }
            drop(credential);
            // In flight: at most so many of this call, and of the host; more wait their turn.
            let closed = || HttpError::InternalError(Some("the host is shutting down".into()));
            let call_slot = call.slots.acquire().await.map_err(|_| closed())?;
            let host_slot = host_slots.acquire().await.map_err(|_| closed())?;
            let (parts, body) = request.into_parts();
            let request_bytes = limits.request_bytes;
            let body = Limited::new(body, request_bytes)
                .map_err(move |_| HttpError::HttpRequestBodySize(Some(request_bytes as u64)))
                .boxed_unsync();
            let request = http::Request::from_parts(parts, body);
            let cap = |t: Option<Duration>| Some(t.map_or(limits.timeout, |t| t.min(limits.timeout)));
            let options = RequestOptions {
                connect_timeout: cap(options.and_then(|o| o.connect_timeout)),
                first_byte_timeout: cap(options.and_then(|o| o.first_byte_timeout)),
                between_bytes_timeout: cap(options.and_then(|o| o.between_bytes_timeout)),
            };
            let (response, io) = match wasmtime_wasi_http::default_send_request(request, Some(options)).await {
                Ok(sent) => sent,
                Err(e) => {
                    *call.transport.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{dest}: {e}"));
                    return Err(e);
                }
            };
            let (mut parts, body) = response.into_parts();
            // Buffer (bounded) so the whole response can be checked before the guest reads it.
            use std::sync::atomic::Ordering;
            let left = limits.response_bytes_per_call.saturating_sub(call.buffered.load(Ordering::Relaxed));
            let limit = limits.response_bytes.min(left);
            let collect = async {
                Limited::new(body, limit).collect().await.map(|c| c.to_bytes()).map_err(|_| {
                    if limit < limits.response_bytes {
                        records.add(format!(
                            "response from {dest} refused: the call's {}-byte response budget is spent",
                            limits.response_bytes_per_call
                        ));
                    }
                    HttpError::HttpResponseBodySize(Some(limit as u64))
                })
            };
            let (collected, _) = tokio::join!(collect, io);
            // In flight no longer: the next request of the call may go.
            drop((call_slot, host_slot));
            let data = collected?;
            // The head is checked as the server sent it, before anything
            // (decoding among them) can end the exchange with an error.
            let scanner = call.watch.scanner(records);
            let in_head = parts
                .headers
                .iter()
                .find_map(|(k, v)| scanner.find(k.as_str().as_bytes()).or_else(|| scanner.find(v.as_bytes())))
                .map(|f| (f, "a header"));
            let mut data = data;
            if in_head.is_none() {
                let coding =
                    parts.headers.get(CONTENT_ENCODING).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                data = match decode(coding.as_deref().unwrap_or(""), data, limits.response_bytes) {
                    Ok(d) => d,
                    Err(why) => {
                        records.add(format!("response from {dest} withheld: {why}"));
                        return Err(HttpError::HttpResponseContentCoding(Some(why)));
                    }
                };
                if coding.is_some() {
                    parts.headers.remove(CONTENT_ENCODING);
                    parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(data.len()));
                }
            }
            let found = in_head.or_else(|| scanner.find(&data).map(|f| (f, "the body")));
            if let Some((f, place)) = found {
                records.add(format!(
                    "response from {dest} withheld: {place} held credential `{}` ({}, {})",
                    f.credential, f.form, f.view
                ));
                return Err(HttpError::InternalError(Some(
                    "the host withheld the response: it held a configured credential".into(),
                )));
            }
            let size = data.len();
            call.buffered.fetch_add(size, Ordering::Relaxed);
            let held = HeldBody { data, call: call.clone(), size };
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

    #[test]
    fn host_records_are_bounded() {
        let r = HostRecords::default();
        for i in 0..100 {
            r.add(format!("line {i}"));
        }
        let (lines, dropped) = r.take();
        assert_eq!((lines.len(), dropped), (MAX_RECORDS, 100 - MAX_RECORDS as u64));
    }
}
