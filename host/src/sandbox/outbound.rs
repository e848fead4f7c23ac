//! Outbound: the only network a guest has — HTTP through `wasi:http`, mediated here.
//!
//! Owns the request hook: each request must go to a granted destination
//! (exact scheme, host, port); a credential is attached *by reference* with
//! the `toolgate-credential` request header, which never leaves the host: the
//! hook removes it, checks the credential is granted to this call and bound
//! to this destination, and only then reads the secret and writes it into the
//! request. Request and response sizes and time are bounded; the response is
//! buffered and every form of an applied secret is redacted before the guest
//! can read it. Redirects are not followed: a guest that follows one makes a
//! new request, decided anew.
//!
//! Architecture invariant: a denial is `HttpRequestDenied` to the guest and a
//! line naming the destination in the step's log; no secret appears in either.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full, Limited};
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::authority::credentials::{Apply, CredentialSpec, Secret};
use crate::authority::destination::{Destination, default_port};
use crate::sandbox::capture::Capture;

/// The request header a guest sets to ask for a credential by name.
pub const CREDENTIAL_HEADER: &str = "toolgate-credential";

/// Bounds on one outbound request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Largest request body.
    pub request_bytes: usize,
    /// Largest response body.
    pub response_bytes: usize,
    /// Connect, first byte and between bytes.
    pub timeout: Duration,
}

/// The outbound authority of one call.
pub struct OutboundPolicy {
    hosts: Arc<Vec<Destination>>,
    credentials: Arc<Vec<Arc<CredentialSpec>>>,
    limits: HttpLimits,
    log: Capture,
    transport: TransportFailure,
}

/// The last transport failure (connect, DNS, TLS, timeout, protocol) of a
/// granted request during one call, as `scheme://host:port: reason`. Denials
/// and size limits are policy, not transport, and are not recorded.
#[derive(Debug, Clone, Default)]
pub struct TransportFailure(Arc<std::sync::Mutex<Option<String>>>);

impl TransportFailure {
    fn set(&self, what: String) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(what);
        }
    }
    /// The recorded failure, if any.
    pub fn get(&self) -> Option<String> {
        self.0.lock().ok().and_then(|s| s.clone())
    }
}

impl OutboundPolicy {
    /// Exactly `hosts` and `credentials`; denials are written to `log`.
    pub fn new(
        hosts: Arc<Vec<Destination>>,
        credentials: Arc<Vec<Arc<CredentialSpec>>>,
        limits: HttpLimits,
        log: Capture,
    ) -> Self {
        OutboundPolicy { hosts, credentials, limits, log, transport: TransportFailure::default() }
    }

    /// Where this policy records transport failures.
    pub fn transport_failure(&self) -> TransportFailure {
        self.transport.clone()
    }

    fn deny(&self, what: &str) -> HttpError {
        self.log.write(format!("[host] outbound request denied: {what}\n").as_bytes());
        HttpError::HttpRequestDenied
    }

    /// Decide a request: its destination (`scheme://host:port`) and the credential it asks for.
    #[allow(clippy::type_complexity)]
    fn authorize(
        &self,
        request: &mut http::Request<WasiBody>,
    ) -> Result<(String, Option<(Arc<CredentialSpec>, Secret)>), HttpError> {
        let uri = request.uri();
        let scheme = uri.scheme_str().unwrap_or("https").to_ascii_lowercase();
        let Some(host) = uri.host().map(str::to_ascii_lowercase) else {
            return Err(self.deny("the request names no host"));
        };
        let port = uri.port_u16().unwrap_or_else(|| default_port(&scheme));
        let dest = format!("{scheme}://{host}:{port}");
        if !self.hosts.iter().any(|d| d.matches(&scheme, &host, port)) {
            return Err(self.deny(&format!("{dest} is not granted to this Tool")));
        }
        let asked: Vec<HeaderValue> = request.headers_mut().remove(CREDENTIAL_HEADER).into_iter().collect();
        let mut more = request.headers().get_all(CREDENTIAL_HEADER).iter().count();
        while request.headers_mut().remove(CREDENTIAL_HEADER).is_some() {
            more += 1;
        }
        let Some(name) = asked.first() else { return Ok((dest, None)) };
        if more > 0 {
            return Err(self.deny("more than one credential requested"));
        }
        let name = name.to_str().unwrap_or_default().trim().to_owned();
        let Some(spec) = self.credentials.iter().find(|c| c.name == name) else {
            return Err(self.deny(&format!("credential `{name}` is not granted to this Tool")));
        };
        if !spec.bound_to(&scheme, &host, port) {
            return Err(self.deny(&format!("credential `{name}` is not bound to {dest}")));
        }
        match spec.materialize(&scheme, &host, port) {
            Ok(secret) => Ok((dest, Some((spec.clone(), secret)))),
            Err(e) => {
                self.log.write(format!("[host] {e}\n").as_bytes());
                Err(HttpError::InternalError(Some(format!("credential `{name}` is unavailable on this host"))))
            }
        }
    }
}

/// Write the secret into the request as configured; returns every form in
/// which it now appears, for redaction. The one way a secret enters a
/// request: the hook uses it, and so does `toolgate mcp import` (author side).
pub fn apply<B>(
    request: &mut http::Request<B>,
    spec: &CredentialSpec,
    secret: &Secret,
) -> Result<Vec<Vec<u8>>, HttpError> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let value = secret.expose();
    let mut forms = vec![value.as_bytes().to_vec(), b64.encode(value).into_bytes()];
    let bad = || HttpError::InternalError(Some(format!("credential `{}` cannot be applied", spec.name)));
    match spec.apply() {
        Apply::Header { name, format } => {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            let v = HeaderValue::from_str(&format.replacen("{}", value, 1)).map_err(|_| bad())?;
            request.headers_mut().insert(header, v);
        }
        Apply::Basic { username } => {
            let token = b64.encode(format!("{username}:{value}"));
            forms.push(token.clone().into_bytes());
            let v = HeaderValue::from_str(&format!("Basic {token}")).map_err(|_| bad())?;
            request.headers_mut().insert(AUTHORIZATION, v);
        }
        Apply::Query { param } => {
            let encoded = percent_encode(value);
            forms.push(encoded.clone().into_bytes());
            let uri = request.uri().clone();
            let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let sep = if pq.contains('?') { '&' } else { '?' };
            let new_pq = format!("{pq}{sep}{}={encoded}", percent_encode(param));
            let mut parts = uri.into_parts();
            parts.path_and_query = Some(new_pq.parse().map_err(|_| bad())?);
            *request.uri_mut() = http::Uri::from_parts(parts).map_err(|_| bad())?;
        }
    }
    Ok(forms)
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

/// Replace every occurrence of each form with `[redacted]`.
pub fn redact(data: &[u8], forms: &[Vec<u8>]) -> Vec<u8> {
    let mut out = data.to_vec();
    for form in forms.iter().filter(|f| !f.is_empty()) {
        let mut next = Vec::with_capacity(out.len());
        let mut i = 0;
        while i < out.len() {
            if out[i..].starts_with(form) {
                next.extend_from_slice(b"[redacted]");
                i += form.len();
            } else {
                next.push(out[i]);
                i += 1;
            }
        }
        out = next;
    }
    out
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
        let transport = self.transport.clone();
        Box::new(async move {
            let (dest, credential) = decided?;
            let forms = match &credential {
                Some((spec, secret)) => apply(&mut request, spec, secret)?,
                None => Vec::new(),
            };
            drop(credential);
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
                    transport.set(format!("{dest}: {e}"));
                    return Err(e);
                }
            };
            let (mut parts, body) = response.into_parts();
            // Buffer (bounded) so the whole body can be redacted before the guest reads it.
            let collect = async {
                Limited::new(body, limits.response_bytes)
                    .collect()
                    .await
                    .map(|c| c.to_bytes())
                    .map_err(|_| HttpError::HttpResponseBodySize(Some(limits.response_bytes as u64)))
            };
            let (collected, _) = tokio::join!(collect, io);
            let data = collected?;
            let data = if forms.is_empty() { data } else { Bytes::from(redact(&data, &forms)) };
            if !forms.is_empty() {
                for value in parts.headers.values_mut() {
                    let redacted = redact(value.as_bytes(), &forms);
                    if redacted != value.as_bytes() {
                        *value = HeaderValue::from_bytes(&redacted).unwrap_or(HeaderValue::from_static("[redacted]"));
                    }
                }
            }
            let body = Full::new(data).map_err(|never| match never {}).boxed_unsync();
            let done: Box<dyn Future<Output = Result<(), HttpError>> + Send> = Box::new(async { Ok(()) });
            Ok((http::Response::from_parts(parts, body), done))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_replaces_every_form() {
        let forms = vec![b"s3cr3t".to_vec(), b"czNjcjN0".to_vec()];
        let out = redact(b"a s3cr3t b czNjcjN0 s3cr3ts3cr3t", &forms);
        assert_eq!(String::from_utf8(out).unwrap(), "a [redacted] b [redacted] [redacted][redacted]");
    }

    #[test]
    fn percent_encoding_is_query_safe() {
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}
