//! HTTP: `toolgate serve --http ADDR`, MCP over Streamable HTTP (rmcp on axum).
//!
//! Owns what an HTTP endpoint adds to the MCP front end: bearer-token
//! authentication, each token bound to one agent (the client never chooses
//! its agent), compared in constant time against SHA-256 digests of the
//! configured tokens (read by reference at start, like every secret); the
//! OAuth protected-resource metadata (RFC 9728) and the `WWW-Authenticate`
//! challenge on 401 so standard clients discover how to authenticate;
//! allowed `Host`s and `Origin`s (DNS-rebinding protection: 403), a request
//! body limit, `/healthz` and `/readyz`, and graceful shutdown that drains
//! calls in flight.
//!
//! Architecture invariant: nothing reaches the MCP service without a valid
//! token, and the agent a request acts for comes only from its token.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tokio_util::sync::CancellationToken;
use toolgate::config::ServeConfig;

use super::{BoundAgent, McpServer, terminated};

/// The MCP endpoint's path.
const ENDPOINT: &str = "/mcp";

/// Accepted tokens: SHA-256 of each, with the agent it is bound to.
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

    /// The agent of `presented`, compared in constant time with every token.
    fn agent(&self, presented: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (known, agent) in &self.0 {
            if bool::from(known.ct_eq(&digest)) {
                found = Some(agent.as_str());
            }
        }
        found
    }
}

struct Auth {
    tokens: Tokens,
    /// Where the protected-resource metadata is, for the 401 challenge.
    metadata_url: String,
}

/// Let through only requests with a valid bearer token; bind its agent.
async fn authenticate(State(auth): State<Arc<Auth>>, mut request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let agent = presented.and_then(|t| auth.tokens.agent(t)).map(str::to_owned);
    let Some(agent) = agent else {
        let mut challenge = format!("Bearer resource_metadata=\"{}\"", auth.metadata_url);
        if presented.is_some() {
            challenge.push_str(", error=\"invalid_token\"");
        }
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
    request.extensions_mut().insert(BoundAgent(agent));
    next.run(request).await
}

/// Serve `server` over Streamable HTTP on `addr` until SIGTERM/SIGINT, then
/// drain calls in flight.
pub async fn serve(server: McpServer, addr: SocketAddr) -> anyhow::Result<()> {
    let config = server.shared.config.serve.clone();
    let tokens = Tokens::read(&config)?;
    let listener =
        tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    // The bound address: a `:0` port resolved.
    let bound = listener.local_addr()?;
    let public = config.public_url.clone().unwrap_or_else(|| format!("http://{bound}{ENDPOINT}"));
    let origin = public.split(ENDPOINT).next().unwrap_or(&public).trim_end_matches('/').to_owned();
    let metadata_url = format!("{origin}/.well-known/oauth-protected-resource{ENDPOINT}");
    let auth = Arc::new(Auth { tokens, metadata_url });
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
    let mcp: StreamableHttpService<McpServer, LocalSessionManager> =
        StreamableHttpService::new(factory, Default::default(), http);
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
        )
        .route(
            "/.well-known/oauth-protected-resource",
            get({
                let m = metadata.clone();
                move || async move { axum::Json(m) }
            }),
        )
        .route(
            &format!("/.well-known/oauth-protected-resource{ENDPOINT}"),
            get(move || async move { axum::Json(metadata) }),
        );

    // Announced only once listening, for whoever started us (a test reads the port here).
    eprintln!("toolgate: serving MCP on http://{bound}{ENDPOINT}");
    let watcher = tokio::spawn(server.clone().watch());
    let shutdown = {
        let stop = stop.clone();
        async move {
            terminated().await;
            stop.cancel();
        }
    };
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    watcher.abort();
    server.drain().await;
    Ok(())
}
