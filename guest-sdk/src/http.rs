//! Outbound HTTP for Tools, through the host's `wasi:http` boundary.
//!
//! A Tool may reach only the destinations it declared and the host granted.
//! Credentials are attached **by reference** ([`Request::credential`]): the
//! Tool names a credential, the host writes the secret into the request as it
//! leaves the host, and only for a destination bound to that credential. The
//! Tool never sees the secret. The host does not follow redirects; a Tool that
//! follows one makes a new request, decided anew.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

/// The request header that carries a credential reference to the host.
pub const CREDENTIAL_HEADER: &str = "toolgate-credential";

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The URL does not parse.
    InvalidUrl(String),
    /// The host refused: destination not granted, or credential not granted
    /// or not bound to it.
    Denied(String),
    /// Anything else on the way (connect, timeout, size limits, protocol).
    Transport(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::InvalidUrl(u) => write!(f, "invalid URL `{u}`"),
            HttpError::Denied(u) => write!(
                f,
                "the host denied the request to {u}: the destination (or the credential for it) is not granted to this Tool"
            ),
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
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, Vec<u8>)>,
    body: Option<Vec<u8>>,
}

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
        let future = outgoing_handler::handle(req, None).map_err(|e| self.error(e))?;
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
        match e {
            ErrorCode::HttpRequestDenied => HttpError::Denied(self.url.clone()),
            other => HttpError::Transport(format!("{other:?}")),
        }
    }
}

/// `scheme://authority/path?query` → parts; `None` if it does not parse.
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
