//! HTTP: `toolgate serve --http ADDR`, MCP over Streamable HTTP (rmcp on axum).
//!
//! Owns what an HTTP endpoint adds to the MCP front end: bearer-token
//! authentication, each token bound to one agent (the client never chooses
//! its agent), compared in constant time against SHA-256 digests of the
//! configured tokens (read by reference at start, like every secret); the
//! OAuth protected-resource metadata (RFC 9728) and the `WWW-Authenticate`
//! challenge on 401 so standard clients discover how to authenticate;
//! allowed `Host`s and `Origin`s (DNS-rebinding protection: 403; an empty
//! `serve.allowed_hosts` is refused at start, never "any Host"), a request
//! body limit, `/healthz` and `/readyz`, and graceful shutdown that drains
//! calls in flight and writes their results before it ends rmcp's sessions. An MCP session (`Mcp-Session-Id`) belongs to the token
//! that initialized it: a request of any other token naming it gets 404, as
//! for a session that does not exist.
//!
//! A request is known by the `[[serve.auth]]` entry whose token it
//! presented (`http token serve.auth[N]`, N counting from 0 in the config
//! the server started with): the journal records that entry as who answered
//! an ask in the client's UI, never the token or a digest of it.
//!
//! Architecture invariant: nothing reaches the MCP service without a valid
//! token, the agent a request acts for and the principal it approves as come
//! only from its token, and a session is reached only with the token that
//! made it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::model::ProtocolVersion;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;
use toolgate::config::ServeConfig;

use super::{BoundAgent, McpServer, terminated};

/// The MCP endpoint's path.
const ENDPOINT: &str = "/mcp";

/// Accepted tokens: SHA-256 of each, with the agent it is bound to, in the
/// order of `[[serve.auth]]` (the index names the entry).
struct Tokens(Vec<([u8; 32], String)>);

impl Tokens {
    fn read(config: &ServeConfig) -> anyhow::Result<Self> {
        if config.auth.is_empty() {
            anyhow::bail!(
                "serving over HTTP needs authentication: add a `[[serve.auth]]` entry binding a token (by reference) to an agent"
            );
        }
        let mut tokens = Vec::new();
        for (i, a) in config.auth.iter().enumerate() {
            let token = toolgate::authority::credentials::read_source(&a.token)
                .map_err(|e| anyhow::anyhow!("serve.auth[{i}].token: {e}"))?;
            if token.len() < 16 {
                anyhow::bail!("serve.auth[{i}].token: use a token of at least 16 characters");
            }
            tokens.push((Sha256::digest(token.as_bytes()).into(), a.agent.clone()));
        }
        Ok(Tokens(tokens))
    }

    /// The digest, agent and `[[serve.auth]]` index of `presented`, compared
    /// in constant time with every token.
    fn agent(&self, presented: &str) -> Option<([u8; 32], &str, usize)> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (i, (known, agent)) in self.0.iter().enumerate() {
            if bool::from(known.ct_eq(&digest)) {
                found = Some((digest, agent.as_str(), i));
            }
        }
        found
    }
}

/// The token `credentials` of an `Authorization` value present when its
/// scheme is `Bearer`, in any letter case (RFC 7235: the scheme is
/// case-insensitive).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Which token (by digest) made each MCP session.
struct Sessions {
    owners: Mutex<Owners>,
    /// rmcp's sessions: bindings of sessions that ended are pruned against it.
    manager: Arc<LocalSessionManager>,
}

struct Owners {
    by_id: HashMap<String, [u8; 32]>,
    /// Prune ended sessions when the map grows past this (amortized).
    prune_at: usize,
}

impl Sessions {
    const PRUNE_FLOOR: usize = 256;

    fn new(manager: Arc<LocalSessionManager>) -> Self {
        let owners = Owners { by_id: HashMap::new(), prune_at: Self::PRUNE_FLOOR };
        Sessions { owners: Mutex::new(owners), manager }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, Owners> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether session `id` was made by the token of `digest`.
    fn belongs_to(&self, id: &str, digest: &[u8; 32]) -> bool {
        self.owners().by_id.get(id).is_some_and(|owner| bool::from(owner.ct_eq(digest)))
    }

    async fn bind(&self, id: String, digest: [u8; 32]) {
        let grown = {
            let mut o = self.owners();
            o.by_id.insert(id, digest);
            o.by_id.len() > o.prune_at
        };
        if grown {
            let live: std::collections::HashSet<String> =
                self.manager.sessions.read().await.keys().map(|k| k.to_string()).collect();
            let mut o = self.owners();
            o.by_id.retain(|id, _| live.contains(id));
            o.prune_at = (o.by_id.len() * 2).max(Self::PRUNE_FLOOR);
        }
    }

    fn unbind(&self, id: &str) {
        self.owners().by_id.remove(id);
    }
}

/// The header naming an MCP session.
const SESSION_ID: &str = "mcp-session-id";

/// The header naming the revision a request speaks.
const PROTOCOL_VERSION: &str = "mcp-protocol-version";

struct Auth {
    tokens: Tokens,
    sessions: Sessions,
    /// Responses to POSTs not yet written: at shutdown, what the calls in
    /// flight answered is written before rmcp ends its streams.
    responses: TaskTracker,
    /// Where the protected-resource metadata is, for the 401 challenge.
    /// Where the RFC 9728 metadata is, named in the challenge: only when it
    /// names an authorization server (the metadata MUST name one; without,
    /// clients went looking for one at this origin and failed).
    metadata_url: Option<String>,
}

/// The answer to a session this token may not reach: the same as rmcp's for
/// a session that does not exist, so its existence is not revealed.
fn no_such_session() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}

/// Whether a request naming `version` in its `MCP-Protocol-Version` header
/// is refused here: a revision not in `offered`, within a session, or one
/// rmcp knows (and would let through) outside of one.
fn not_offered(version: &str, offered: &[ProtocolVersion], in_session: bool) -> bool {
    let known = ProtocolVersion::KNOWN_VERSIONS.iter().any(|k| k.as_str() == version);
    !offered.iter().any(|o| o.as_str() == version) && (in_session || known)
}

/// Let through only requests with a valid bearer token; bind its agent; let
/// a request name only a session its token made.
async fn authenticate(State(auth): State<Arc<Auth>>, mut request: Request, next: Next) -> Response {
    let presented = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
    let found = presented.and_then(|t| auth.tokens.agent(t)).map(|(digest, agent, i)| (digest, agent.to_owned(), i));
    let Some((digest, agent, entry)) = found else {
        let mut params = Vec::new();
        if let Some(url) = &auth.metadata_url {
            params.push(format!("resource_metadata=\"{url}\""));
        }
        if presented.is_some() {
            params.push("error=\"invalid_token\"".to_owned());
        }
        let challenge = if params.is_empty() { "Bearer".to_owned() } else { format!("Bearer {}", params.join(", ")) };
        let mut response = (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({
                "jsonrpc": "2.0", "id": null,
                "error": { "code": -32001, "message": "authentication required: send `Authorization: Bearer <token>`" }
            })),
        )
            .into_response();
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        return response;
    };
    // A session named by the request must be one this token made: anything
    // else (another token's, an unknown or unreadable id) is not found.
    let named = match request.headers().get(SESSION_ID) {
        None => None,
        Some(v) => match v.to_str() {
            Ok(id) if auth.sessions.belongs_to(id, &digest) => Some(id.to_owned()),
            _ => return no_such_session(),
        },
    };
    // A revision this server does not offer is refused (400, as the
    // transport requires) within a session, and for any revision rmcp knows
    // that this server does not offer: rmcp checks the header only against
    // the revisions it knows, and lets any through when the body's `_meta`
    // claims the same. A request without a session naming an unknown one is
    // rmcp's to answer (on 2026-07-28, an error listing the supported ones).
    if let Some(v) = request.headers().get(PROTOCOL_VERSION)
        && not_offered(v.to_str().unwrap_or(""), super::VERSIONS, named.is_some())
    {
        let offered: Vec<&str> = super::VERSIONS.iter().map(|o| o.as_str()).collect();
        let message =
            format!("Bad Request: unsupported MCP-Protocol-Version; this server offers {}", offered.join(", "));
        return (StatusCode::BAD_REQUEST, message).into_response();
    }
    let deleting = request.method() == Method::DELETE;
    let posting = request.method() == Method::POST;
    // Who the request is, as the journal records an approval it answers:
    // the configured entry whose token it presented (never the token).
    let principal = format!("http token serve.auth[{entry}]");
    // Whose asks a stateless request may find and answer: this token's (its
    // digest, stable across restarts and reordered entries).
    request.extensions_mut().insert(BoundAgent { agent, principal, key: hex::encode(digest) });
    let response = next.run(request).await;
    match named {
        // A new session (the `initialize` response names it): this token's.
        None => {
            if let Some(id) = response.headers().get(SESSION_ID).and_then(|v| v.to_str().ok()) {
                auth.sessions.bind(id.to_owned(), digest).await;
            }
        }
        Some(id) if deleting && response.status().is_success() => auth.sessions.unbind(&id),
        Some(_) => {}
    }
    if posting {
        // A call's result goes out in the body of its POST (JSON or an SSE
        // stream): counted until hyper has taken its last byte.
        let token = auth.responses.token();
        response.map(|body| axum::body::Body::new(Counted { body, _token: token }))
    } else {
        response
    }
}

/// A response body counted in [`Auth::responses`] until it is dropped —
/// which hyper does once it has taken the last byte, or the connection went.
struct Counted {
    body: axum::body::Body,
    _token: TaskTrackerToken,
}

impl http_body::Body for Counted {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Serve `server` over Streamable HTTP on `addr` until SIGTERM/SIGINT, then
/// drain calls in flight.
pub async fn serve(server: McpServer, addr: SocketAddr) -> anyhow::Result<()> {
    let config = server.shared.config.serve.clone();
    let tokens = Tokens::read(&config)?;
    if config.allowed_hosts.is_empty() {
        // rmcp reads an empty list as "any Host": DNS rebinding unchecked.
        anyhow::bail!(
            "serve.allowed_hosts is empty, which would accept any `Host` (no DNS-rebinding protection): list the names clients use (default: localhost, 127.0.0.1, ::1)"
        );
    }
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    // The bound address: a `:0` port resolved.
    let bound = listener.local_addr()?;
    let public = config.public_url.clone().unwrap_or_else(|| format!("http://{bound}{ENDPOINT}"));
    let origin = public.split(ENDPOINT).next().unwrap_or(&public).trim_end_matches('/').to_owned();
    let metadata_url = (!config.authorization_servers.is_empty())
        .then(|| format!("{origin}/.well-known/oauth-protected-resource{ENDPOINT}"));
    let manager = Arc::new(LocalSessionManager::default());
    let responses = TaskTracker::new();
    let auth =
        Arc::new(Auth { tokens, sessions: Sessions::new(manager.clone()), responses: responses.clone(), metadata_url });
    let stop = CancellationToken::new();

    let mut http = StreamableHttpServerConfig::default()
        .with_cancellation_token(stop.clone())
        .with_max_request_body_bytes((config.max_body_kib as usize) << 10)
        .with_allowed_hosts(config.allowed_hosts.clone());
    http = if config.allowed_origins.is_empty() {
        // No browser origin is trusted: any request carrying an Origin is refused (403).
        http.enforce_origin_validation()
    } else {
        http.with_allowed_origins(config.allowed_origins.clone())
    };
    let factory = {
        let server = server.clone();
        move || Ok(server.for_new_session())
    };
    let mcp: StreamableHttpService<McpServer, LocalSessionManager> = StreamableHttpService::new(factory, manager, http);
    let metadata = serde_json::json!({
        "resource": public,
        "authorization_servers": config.authorization_servers,
        "bearer_methods_supported": ["header"],
        "resource_name": "toolgate",
    });
    let ready = server.clone();
    let app = Router::new()
        .nest_service(ENDPOINT, mcp)
        .layer(axum::middleware::from_fn_with_state(auth, authenticate))
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let server = ready.clone();
                async move {
                    // Ready when the journal answers.
                    let base = server.shared.runtimes.read().unwrap_or_else(|p| p.into_inner()).base.clone();
                    match base.store().run("readiness-probe").await {
                        Ok(_) => (StatusCode::OK, "ready"),
                        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the journal does not answer"),
                    }
                }
            }),
        );
    // The metadata only when it names an authorization server (RFC 9728 via
    // the MCP authorization spec: it MUST name at least one).
    let app = if config.authorization_servers.is_empty() {
        app
    } else {
        app.route(
            "/.well-known/oauth-protected-resource",
            get({
                let m = metadata.clone();
                move || async move { axum::Json(m) }
            }),
        )
        .route(
            &format!("/.well-known/oauth-protected-resource{ENDPOINT}"),
            get(move || async move { axum::Json(metadata) }),
        )
    };

    // Browsers: a page of an allowed origin sends a preflight (`OPTIONS`,
    // no token) and reads only what the response allows it to. Outermost,
    // so a preflight is answered before authentication; only the origins
    // rmcp also accepts (it refuses any other `Origin` with 403).
    let app = if config.allowed_origins.is_empty() { app } else { app.layer(cors(&config.allowed_origins)) };

    // Announced only once listening, for whoever started us (a test reads the port here).
    eprintln!("toolgate: serving MCP on http://{bound}{ENDPOINT}");
    let watcher = tokio::spawn(server.clone().watch());
    let header_timeout = Duration::from_millis(config.header_timeout_ms);
    let connections = serve_connections(listener, app, terminated(), config.max_connections, header_timeout).await;
    watcher.abort();
    // No new connection is accepted, nor a new call taken. Calls in flight
    // finish within the grace (the rest are withdrawn then) and their
    // results are written while rmcp's sessions and streams are still up;
    // only then does rmcp stop — cancelling it first cut every call and
    // stream at once.
    server.drain().await;
    responses.close();
    if tokio::time::timeout(RESPONSES_WRITTEN, responses.wait()).await.is_err() {
        tracing::warn!("responses still unwritten {}s after the calls ended were cut", RESPONSES_WRITTEN.as_secs());
    }
    stop.cancel();
    if tokio::time::timeout(DRAIN_CONNECTIONS, connections.shutdown()).await.is_err() {
        tracing::warn!("connections still open {}s after the stop were closed", DRAIN_CONNECTIONS.as_secs());
    }
    Ok(())
}

/// How long a stopping server waits, once its calls have ended, for their
/// responses to be written (a client that does not read them).
const RESPONSES_WRITTEN: Duration = Duration::from_secs(10);

/// What a browser page of one of `origins` may send and read.
fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins: Vec<HeaderValue> = origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    let name = axum::http::HeaderName::from_static;
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
            name("mcp-session-id"),
            name("mcp-protocol-version"),
            name("last-event-id"),
        ])
        .expose_headers([name("mcp-session-id"), name("mcp-protocol-version"), header::WWW_AUTHENTICATE])
}

/// How long a stopping server waits for open connections to finish.
const DRAIN_CONNECTIONS: Duration = Duration::from_secs(30);

/// Serve `app` on `listener` until `shutdown`, then stop accepting; the
/// connections still open are returned, to be let finish. What
/// `axum::serve` does, with what it leaves
/// out: a deadline for a request's headers (`header_timeout`; hyper has none without a timer,
/// so a client sending nothing, or a byte at a time, held a task and a
/// descriptor for ever — before authentication, which needs the headers) and
/// at most `max` connections at once (more wait in the listen backlog).
async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
    max: usize,
    header_timeout: Duration,
) -> hyper_util::server::graceful::GracefulShutdown {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(tokio::sync::Semaphore::new(max.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            biased;
            () = &mut shutdown => break,
            // Never closed: `Err` cannot happen.
            slot = slots.clone().acquire_owned() => match slot { Ok(s) => s, Err(_) => break },
        };
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, a connection reset before accept: wait, go on.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    graceful
}

#[cfg(test)]
mod tests {
    use super::{ProtocolVersion, bearer, not_offered};

    /// rmcp refuses a revision it does not know, but lets through one it
    /// knows that the server does not offer — as it did 2025-03-26 in a
    /// session while the server offered 2025-06-18 and later.
    #[test]
    fn a_revision_the_server_does_not_offer_is_refused_even_when_rmcp_knows_it() {
        let offered = [ProtocolVersion::V_2025_06_18, ProtocolVersion::V_2025_11_25];
        for in_session in [true, false] {
            assert!(not_offered("2025-03-26", &offered, in_session));
            assert!(!not_offered("2025-11-25", &offered, in_session));
        }
        // Unknown to rmcp too: in a session, refused here; outside one, rmcp's
        // answer (on 2026-07-28 it lists the supported revisions).
        assert!(not_offered("2099-01-01", &offered, true));
        assert!(!not_offered("2099-01-01", &offered, false));
        assert!(not_offered("", &offered, true));
    }

    #[test]
    fn the_bearer_scheme_is_matched_in_any_letter_case() {
        for v in ["Bearer t0k", "bearer t0k", "BEARER  t0k ", " BeArEr t0k"] {
            assert_eq!(bearer(v), Some("t0k"), "{v:?}");
        }
        for v in ["Basic t0k", "Bearert0k", "Bearer", "", "Bear t0k"] {
            assert_eq!(bearer(v), None, "{v:?}");
        }
    }
}
