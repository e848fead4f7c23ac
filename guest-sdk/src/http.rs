//! Outbound HTTP for Tools, through the host's `wasi:http` boundary.
//!
//! A Tool may reach only the destinations it declared and the host granted.
//! Credentials are attached **by reference** ([`Request::credential`]): the
//! Tool names a credential, the host writes the secret into the request as it
//! leaves the host, and only for a destination bound to that credential. The
//! Tool never sees the secret. The host does not follow redirects; a Tool that
//! follows one makes a new request, decided anew.
//!
//! **Sent or not.** A failed request either never left the host — the
//! destination cannot have seen it ([`HttpError::Denied`],
//! [`HttpError::NotSent`], [`HttpError::InvalidUrl`]) — or may have reached
//! the destination, which may have acted on it though its answer never
//! reached the Tool ([`HttpError::Transport`]; see
//! [`HttpError::may_have_reached_server`]). The split is made from the
//! `wasi:http` error code, never from the host's prose: the codes of a
//! failure before any byte of the request is written (name lookup, an
//! address the host refuses, connection refused or timed out while
//! connecting, TLS setup) mean not sent; an `internal-error` means not sent
//! only when its text starts with [`NOT_SENT`], which the toolgate host
//! writes for nothing else. Everything else — the host withholding a
//! response (it held a configured secret, was over the size limit, used a
//! content coding the host refuses), a read timeout, a protocol error —
//! may have reached the server. (This module is compiled without the
//! `guest` feature too, so the host shares [`NOT_SENT`].)

#[cfg(feature = "guest")]
use wasip2::http::outgoing_handler;
#[cfg(feature = "guest")]
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

/// The request header that carries a credential reference to the host.
pub const CREDENTIAL_HEADER: &str = "toolgate-credential";

/// How the text of a `wasi:http` `internal-error` starts when the host
/// failed the request before any of it left the host (a credential it
/// could not read or apply, secrets it could not check, shutting down).
/// The host uses this prefix for nothing else; an `internal-error` without
/// it may have come after the request was sent.
pub const NOT_SENT: &str = "the host did not send the request";

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HttpError {
    /// The URL does not parse (nothing was sent).
    InvalidUrl(String),
    /// The host refused: destination not granted, or credential not granted
    /// or not bound to it (nothing was sent).
    Denied(String),
    /// The request never left the host: the name did not resolve, the
    /// connection was refused or timed out while connecting, TLS setup
    /// failed, or the host failed it before sending ([`NOT_SENT`]). The
    /// destination cannot have acted on it.
    NotSent(String),
    /// Anything else on the way (timeouts after sending, size limits, a
    /// response the host withheld, protocol errors): the request **may have
    /// reached the destination** and been acted on.
    Transport(String),
}

impl HttpError {
    /// Whether the destination may have received the request (and acted on
    /// it): `false` only when the host knows it was never sent.
    pub fn may_have_reached_server(&self) -> bool {
        matches!(self, HttpError::Transport(_))
    }

    /// The error for the `wasi:http` error `code` of a request to `url`.
    #[cfg(feature = "guest")]
    fn from_code(url: &str, code: ErrorCode) -> HttpError {
        match code {
            ErrorCode::HttpRequestDenied => HttpError::Denied(url.to_owned()),
            code if never_sent(&code) => HttpError::NotSent(format!("{code:?}")),
            code => HttpError::Transport(format!("{code:?}")),
        }
    }
}

/// Whether `code` says the request failed before any of it was written to
/// the destination: a lookup, an address refused, a connection that never
/// opened, TLS setup, a request the client could not even form, or the
/// host's own [`NOT_SENT`]. Conservative: any other code (a TLS alert,
/// which a server may send after reading the request, included) may have
/// come after sending.
#[cfg(feature = "guest")]
fn never_sent(code: &ErrorCode) -> bool {
    match code {
        ErrorCode::DnsTimeout
        | ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DestinationIpProhibited
        | ErrorCode::DestinationIpUnroutable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionLimitReached
        | ErrorCode::TlsProtocolError
        | ErrorCode::TlsCertificateError
        | ErrorCode::HttpRequestDenied
        | ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::HttpRequestUriInvalid => true,
        ErrorCode::InternalError(Some(text)) => text.starts_with(NOT_SENT),
        _ => false,
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::InvalidUrl(u) => write!(f, "invalid URL `{u}`"),
            HttpError::Denied(u) => write!(
                f,
                "the host denied the request to {u}: the destination (or the credential for it) is not granted to this Tool"
            ),
            HttpError::NotSent(m) => write!(f, "HTTP request failed (not sent): {m}"),
            HttpError::Transport(m) => write!(f, "HTTP request failed: {m}"),
        }
    }
}

impl From<HttpError> for crate::ToolError {
    fn from(e: HttpError) -> Self {
        crate::ToolError::Failed(e.to_string())
    }
}

/// A response, fully read.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers (lossy UTF-8 values).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, HttpError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| HttpError::Transport(format!("response is not the expected JSON: {e}")))
    }
    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// An outgoing request.
#[cfg(feature = "guest")]
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Vec<u8>>,
}

#[cfg(feature = "guest")]
impl Request {
    /// A GET request.
    pub fn get(url: &str) -> Self {
        Self::new(Method::Get, url)
    }
    /// A POST request.
    pub fn post(url: &str) -> Self {
        Self::new(Method::Post, url)
    }
    /// A DELETE request.
    pub fn delete(url: &str) -> Self {
        Self::new(Method::Delete, url)
    }
    fn new(method: Method, url: &str) -> Self {
        Request { method, url: url.to_owned(), headers: Vec::new(), body: None }
    }
    /// Add a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.as_bytes().to_vec()));
        self
    }
    /// Ask the host to apply the credential named `name` (a reference, never a value).
    pub fn credential(self, name: &str) -> Self {
        self.header(CREDENTIAL_HEADER, name)
    }
    /// A JSON body.
    pub fn json<T: serde::Serialize>(mut self, body: &T) -> Result<Self, HttpError> {
        let bytes = serde_json::to_vec(body).map_err(|e| HttpError::Transport(e.to_string()))?;
        self.body = Some(bytes);
        Ok(self.header("content-type", "application/json"))
    }

    /// Send it and read the whole response.
    pub fn send(self) -> Result<Response, HttpError> {
        let (scheme, authority, path) = split_url(&self.url).ok_or_else(|| HttpError::InvalidUrl(self.url.clone()))?;
        let fields = Fields::new();
        for (k, v) in &self.headers {
            fields.append(k, v).map_err(|e| HttpError::Transport(format!("header `{k}`: {e:?}")))?;
        }
        let req = OutgoingRequest::new(fields);
        let bad = |_| HttpError::InvalidUrl(self.url.clone());
        req.set_method(&self.method).map_err(bad)?;
        req.set_scheme(Some(&scheme)).map_err(bad)?;
        req.set_authority(Some(authority)).map_err(bad)?;
        req.set_path_with_query(Some(path)).map_err(bad)?;
        let body = req.body().map_err(|_| HttpError::Transport("request body unavailable".into()))?;
        // Refused at once: the request was never handed to the client.
        let future = outgoing_handler::handle(req, None).map_err(|e| match self.error(e) {
            HttpError::Transport(m) => HttpError::NotSent(m),
            other => other,
        })?;
        if let Some(bytes) = &self.body {
            let stream = body.write().map_err(|_| HttpError::Transport("request body unavailable".into()))?;
            for chunk in bytes.chunks(4096) {
                stream
                    .blocking_write_and_flush(chunk)
                    .map_err(|e| HttpError::Transport(format!("writing the request body: {e:?}")))?;
            }
            drop(stream);
        }
        OutgoingBody::finish(body, None).map_err(|e| self.error(e))?;
        future.subscribe().block();
        let response = match future.get() {
            Some(Ok(Ok(r))) => r,
            Some(Ok(Err(e))) => return Err(self.error(e)),
            _ => return Err(HttpError::Transport("no response".into())),
        };
        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect();
        let incoming = response.consume().map_err(|_| HttpError::Transport("response body unavailable".into()))?;
        let stream = incoming.stream().map_err(|_| HttpError::Transport("response body unavailable".into()))?;
        let mut out = Vec::new();
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => out.extend_from_slice(&chunk),
                Err(wasip2::io::streams::StreamError::Closed) => break,
                Err(e) => return Err(HttpError::Transport(format!("reading the response: {e:?}"))),
            }
        }
        Ok(Response { status, headers, body: out })
    }

    fn error(&self, e: ErrorCode) -> HttpError {
        HttpError::from_code(&self.url, e)
    }
}

/// `scheme://authority/path?query` → parts; `None` if it does not parse.
#[cfg(feature = "guest")]
fn split_url(url: &str) -> Option<(Scheme, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        _ => return None,
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], &rest[i..]),
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        return None;
    }
    Some((scheme, authority, path))
}

#[cfg(all(test, feature = "guest"))]
mod tests {
    use super::*;

    /// A failure before anything was written is "not sent"; one the host
    /// gave after the destination answered (a withheld response, a body
    /// over the limit, a refused coding) or after the request went out (a
    /// read timeout) may have reached it. Before, every code but a denial
    /// was one `Transport`, and the MCP adapter told the model a call whose
    /// answer the host withheld could not reach the server.
    #[test]
    fn a_failure_after_sending_may_have_reached_the_server() {
        let url = "http://h/mcp";
        let not_sent = [
            ErrorCode::ConnectionRefused,
            ErrorCode::ConnectionTimeout,
            ErrorCode::DestinationIpProhibited,
            ErrorCode::TlsProtocolError,
            ErrorCode::DnsError(wasip2::http::types::DnsErrorPayload { rcode: Some("x".into()), info_code: None }),
            ErrorCode::InternalError(Some(format!("{NOT_SENT}: credential `c` is unavailable on this host"))),
        ];
        for code in not_sent {
            let e = HttpError::from_code(url, code);
            assert!(matches!(e, HttpError::NotSent(_)) && !e.may_have_reached_server(), "{e:?}");
        }
        let denied = HttpError::from_code(url, ErrorCode::HttpRequestDenied);
        assert!(matches!(denied, HttpError::Denied(_)) && !denied.may_have_reached_server());
        let sent = [
            ErrorCode::InternalError(Some(
                "the host withheld the response: it held a configured secret (see the host's records)".into(),
            )),
            ErrorCode::InternalError(Some("the host could not check the response".into())),
            ErrorCode::InternalError(None),
            ErrorCode::HttpResponseBodySize(Some(1024)),
            ErrorCode::HttpResponseContentCoding(Some("br".into())),
            ErrorCode::ConnectionReadTimeout,
            ErrorCode::HttpResponseTimeout,
            ErrorCode::HttpProtocolError,
            ErrorCode::HttpRequestBodySize(Some(1)),
        ];
        for code in sent {
            let e = HttpError::from_code(url, code);
            assert!(matches!(e, HttpError::Transport(_)) && e.may_have_reached_server(), "{e:?}");
        }
    }
}
