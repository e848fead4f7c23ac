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
//! What one client can hold of what every agent shares is bounded: a
//! connection stays open only after a request with a valid token; at most
//! `[serve] max_connections_per_address` connections per peer (past it, the
//! peer's oldest connection that has carried no valid token is closed for
//! the new one: idle connections of anyone on an address never lock out its
//! authenticated clients); per
//! `[[serve.auth]]` entry at most `max_sessions_per_token` live sessions (a
//! new one past it ends the entry's least recently used session with no
//! request or stream open: clients commonly abandon sessions without a
//! DELETE) and `max_requests_per_token` requests open (SSE streams included)
//! — and as many `tools/call`s running, counted where the call runs
//! (`McpServer::call_place`): in a session rmcp runs a call until it answers
//! or is cancelled, whatever became of its HTTP request. A session's request
//! whose client hung up before it could resume the stream is cancelled
//! ([`Withdraw`]); a withdrawn request's stream is kept [`WITHDRAWN_KEPT`]
//! for a late resume, not rmcp's minute.
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
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{Stream, StreamExt as _};
use rmcp::model::{ClientJsonRpcMessage, ProtocolVersion, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{EventStore, ServerSseMessage, SessionId, SessionManager};
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
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            // One token bound twice would act for whichever entry is
            // matched, not the agent the operator meant for it.
            if let Some(j) = tokens.iter().position(|(known, _): &([u8; 32], String)| *known == digest) {
                anyhow::bail!(
                    "serve.auth[{j}].token and serve.auth[{i}].token are the same token (agents `{}` and `{}`): \
                     each entry needs its own token — give one of them a new secret, or remove it",
                    tokens[j].1,
                    a.agent
                );
            }
            tokens.push((digest, a.agent.clone()));
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

tokio::task_local! {
    /// The `[[serve.auth]]` entry of the request being served, for a session
    /// rmcp opens while serving it: its `create_session` is given no request
    /// (rmcp awaits it inside the request's own future, in this task).
    pub(super) static OPENER: Opener;
}

pub(super) struct Opener {
    pub(super) digest: [u8; 32],
    pub(super) entry: usize,
    /// Set when a session was refused for this request's token.
    pub(super) refused: Arc<AtomicBool>,
}

/// rmcp's session store with each session bound to the token that opened it
/// (by digest) and at most `max` live sessions per `[[serve.auth]]` entry:
/// counted at `create_session`, released at `close_session`, which rmcp calls
/// whenever a session ends — DELETE, a failed handshake, shutdown — and
/// which [`TokenSessions::reap_idle`] calls for a session idle past `idle`.
/// Without a cap one token's client could open sessions, and their streams,
/// until no connection was left for any other agent.
///
/// At the cap, a new session ends the entry's least recently used session
/// that is not busy — no request in flight, no stream open
/// ([`TokenSessions::evict`]); it is refused only when every one is busy.
/// Clients end sessions without telling: the TypeScript SDK's v1 transport
/// (Claude Code, Claude Desktop, Cursor) sends no DELETE when it closes, so
/// with a refusal at the cap the 33rd connect of one token within
/// `session_idle_secs` failed. An ended session's client gets 404 on its
/// next request and initializes again, as the transport specifies.
///
/// Idle sessions are reaped here, not by rmcp: rmcp's own timer (5 min)
/// restarts only on the session's messages, not on an SSE stream the client
/// holds open, so a client listening on its GET stream lost its session
/// after 5 quiet minutes (the Python SDK then fails every call: "Session
/// terminated"). Here a session is idle only with no stream open, for
/// `[serve] session_idle_secs` since its last request or stream.
///
/// Priming events (an SSE event with an id and empty data, SEP-1699) go only
/// to sessions of 2025-11-25 and later: clients of earlier revisions (the
/// Java and Go SDKs, older TypeScript ones) fail on an event with no data.
pub(super) struct TokenSessions {
    /// Shared with each request stream ([`Tracked`]), which withdraws its
    /// request when dropped before its client could resume it.
    inner: Arc<LocalSessionManager>,
    /// Session → the digest of the token that opened it, its place in
    /// `live` (freed with the entry) and its activity.
    owners: Mutex<HashMap<SessionId, Owned>>,
    /// Live sessions (and ones being opened) per entry.
    live: Arc<Counts<usize>>,
    max: usize,
    /// How long a session with no stream open may go without a request.
    idle: Duration,
}

struct Owned {
    digest: [u8; 32],
    /// The `[[serve.auth]]` entry whose place it holds.
    entry: usize,
    _place: Slot<usize>,
    activity: Arc<Activity>,
}

/// When a session was last used, how many of its requests and SSE streams
/// are open, whether its handshake is done, and whether its revision takes
/// priming events.
struct Activity {
    state: Mutex<(Instant, usize)>,
    initialized: AtomicBool,
    primed: AtomicBool,
}

impl Activity {
    fn state(&self) -> std::sync::MutexGuard<'_, (Instant, usize)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn touch(&self) {
        self.state().0 = Instant::now();
    }

    /// Whether it is idle past `idle` at `now`: no stream open, and no use since.
    fn idle_past(&self, idle: Duration, now: Instant) -> bool {
        let (last, open) = *self.state();
        open == 0 && now.saturating_duration_since(last) >= idle
    }

    /// When it was last used, if it may be ended for a new session at `now`:
    /// nothing open, and its handshake done (or given up on: a handshake
    /// under way is not taken from its client).
    fn evictable(&self, now: Instant) -> Option<Instant> {
        let (last, open) = *self.state();
        let settled = self.initialized.load(Ordering::Relaxed) || now.saturating_duration_since(last) >= HANDSHAKE;
        (open == 0 && settled).then_some(last)
    }
}

/// How long a session's handshake may take before the session counts as
/// abandoned, and may be ended for a new one.
const HANDSHAKE: Duration = Duration::from_secs(30);

/// An open request or SSE stream of a session, counted until it is dropped
/// (hyper drops a response body when it has sent all of it or the
/// connection went).
struct OpenStream(Arc<Activity>);

impl OpenStream {
    fn new(activity: Arc<Activity>) -> Self {
        let mut state = activity.state();
        state.0 = Instant::now();
        state.1 += 1;
        drop(state);
        OpenStream(activity)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.0 = Instant::now();
        state.1 = state.1.saturating_sub(1);
    }
}

/// A session's SSE stream: counted open while it lives; without priming
/// events (no message) for a session of a revision before 2025-11-25.
struct Tracked<S> {
    inner: std::pin::Pin<Box<S>>,
    primed: bool,
    _open: Option<OpenStream>,
    /// A request's stream (a POST's): withdrawn if dropped while armed.
    withdraw: Option<Withdraw>,
}

/// The request a POST's SSE stream answers, withdrawn
/// (`notifications/cancelled`, as if its client had sent it) when the
/// stream is dropped — the client hung up — before it yielded any event
/// with an id. rmcp runs a session's request until it answers or is
/// cancelled, whatever became of the HTTP request that carried it: without
/// this a client that hung up left its call running (its guest, its
/// arguments held) with nobody to read the result. Disarmed once an event
/// with an id went out (a priming event — 2025-11-25 sessions —, a message):
/// from then the client can resume the stream with `Last-Event-ID`, so the
/// call is left to finish (counted in its token's calls in flight, see
/// `McpServer::call_tool`); and when the stream ends (the request answered).
struct Withdraw {
    sessions: Arc<LocalSessionManager>,
    session: SessionId,
    request: rmcp::model::RequestId,
}

impl Withdraw {
    fn now(self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let Withdraw { sessions, session, request } = self;
        runtime.spawn(async move {
            let reason = "the client closed the HTTP request before any event of its response".to_owned();
            let cancelled = rmcp::model::CancelledNotification::new(rmcp::model::CancelledNotificationParam::new(
                Some(request),
                Some(reason),
            ));
            let message =
                ClientJsonRpcMessage::notification(rmcp::model::ClientNotification::CancelledNotification(cancelled));
            // A session already ended has nothing left to withdraw.
            if let Err(e) = sessions.accept_message(&session, message).await {
                tracing::debug!("withdrawing a request of session {session}: {e}");
            }
        });
    }
}

impl<S> Drop for Tracked<S> {
    fn drop(&mut self) {
        if let Some(withdraw) = self.withdraw.take() {
            withdraw.now();
        }
    }
}

impl<S: Stream<Item = ServerSseMessage>> Stream for Tracked<S> {
    type Item = ServerSseMessage;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<ServerSseMessage>> {
        let this = self.get_mut();
        loop {
            match this.inner.as_mut().poll_next(cx) {
                std::task::Poll::Ready(Some(m)) if !this.primed && m.message.is_none() => continue,
                other => {
                    // An event the client can resume from, or the end.
                    if matches!(&other, std::task::Poll::Ready(None))
                        || matches!(&other, std::task::Poll::Ready(Some(m)) if m.event_id.is_some())
                    {
                        this.withdraw = None;
                    }
                    return other;
                }
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum TokenSessionError {
    #[error(
        "serve.auth[{entry}] has {max} sessions open, each with a request or stream open, the most `[serve] max_sessions_per_token` allows"
    )]
    Refused { entry: usize, max: usize },
    #[error("a session can be opened only by an authenticated request")]
    Unauthenticated,
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// The retry a priming event names (rmcp's default).
const SSE_RETRY: Duration = Duration::from_secs(3);

/// How long rmcp keeps the stream of a request withdrawn by its client
/// (`notifications/cancelled`, or [`Withdraw`]), with the events it cached
/// (up to 16), for a late resume: long enough for a client reconnecting
/// after [`SSE_RETRY`]. rmcp's default, 60 s, with no bound on how many,
/// let one session hold a minute of every request it withdrew. (A request
/// that was answered is forgotten by rmcp at once.)
const WITHDRAWN_KEPT: Duration = Duration::from_secs(5);

impl TokenSessions {
    pub(super) fn new(max: usize, idle: Duration) -> Self {
        let mut inner = LocalSessionManager::default();
        // Reaped here ([`TokenSessions::reap_idle`]), streams counted.
        inner.session_config.keep_alive = None;
        // Priming on request streams stays on (2025-11-25 sessions resume
        // with it); [`Tracked`] takes it out for earlier revisions.
        inner.session_config.sse_retry = Some(SSE_RETRY);
        inner.session_config.completed_cache_ttl = WITHDRAWN_KEPT;
        TokenSessions {
            inner: Arc::new(inner),
            owners: Mutex::new(HashMap::new()),
            live: Counts::new(),
            max: max.max(1),
            idle,
        }
    }

    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Owned>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Session `id`, if the token of `digest` made it, held busy (never
    /// ended for a new session) until the returned guard is dropped: found
    /// and held under one lock, so [`TokenSessions::evict`] ends a session
    /// either before a request reaches it (404) or not at all.
    fn hold(&self, id: &str, digest: &[u8; 32]) -> Option<OpenStream> {
        let owners = self.owners();
        let owned = owners.get(id).filter(|o| bool::from(o.digest.ct_eq(digest)))?;
        Some(OpenStream::new(owned.activity.clone()))
    }

    /// End the least recently used session of `entry` with no request or
    /// stream open, freeing its place; whether there was one.
    async fn evict(&self, entry: usize) -> bool {
        let now = Instant::now();
        // Chosen and forgotten under one lock: a request holding it
        // ([`TokenSessions::hold`]) is either counted here or finds it gone.
        let victim = {
            let mut owners = self.owners();
            let oldest = owners
                .iter()
                .filter(|(_, o)| o.entry == entry)
                .filter_map(|(id, o)| o.activity.evictable(now).map(|last| (last, id.clone())))
                .min_by_key(|(last, _)| *last)
                .map(|(_, id)| id);
            oldest.and_then(|id| owners.remove(&id).map(|owned| (id, owned)))
        };
        let Some((id, owned)) = victim else { return false };
        // Its place is freed here, outside the owners' lock.
        drop(owned);
        tracing::info!(
            "closing HTTP session {id} of serve.auth[{entry}], its least recently used with no request or stream open: `[serve] max_sessions_per_token` reached"
        );
        if let Err(e) = self.inner.close_session(&id).await {
            tracing::debug!("closing session {id}: {e}");
        }
        true
    }

    /// Forget session `id` and free its place (once: rmcp closes a deleted
    /// session again when its worker ends).
    fn release(&self, id: &SessionId) {
        let gone = self.owners().remove(id);
        // The place is freed here, outside the owners' lock.
        drop(gone);
    }

    fn activity(&self, id: &SessionId) -> Option<Arc<Activity>> {
        self.owners().get(id).map(|o| o.activity.clone())
    }

    /// `stream` counted open, without priming events unless its session takes them.
    fn tracked<S: Stream<Item = ServerSseMessage>>(&self, id: &SessionId, stream: S) -> Tracked<S> {
        let activity = self.activity(id);
        Tracked {
            inner: Box::pin(stream),
            primed: activity.as_ref().is_some_and(|a| a.primed.load(Ordering::Relaxed)),
            _open: activity.map(OpenStream::new),
            withdraw: None,
        }
    }

    /// Close every session idle past `idle` with no stream open; returns how many.
    pub(super) async fn reap_idle(&self) -> usize {
        let now = Instant::now();
        let idle: Vec<SessionId> = self
            .owners()
            .iter()
            .filter(|(_, o)| o.activity.idle_past(self.idle, now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &idle {
            // Used since it was found idle: kept.
            if !self.activity(id).is_some_and(|a| a.idle_past(self.idle, Instant::now())) {
                continue;
            }
            tracing::debug!("closing HTTP session {id}: idle for {:?} with no stream open", self.idle);
            if let Err(e) = self.close_session(id).await {
                tracing::debug!("closing idle session {id}: {e}");
            }
        }
        idle.len()
    }

    /// [`TokenSessions::reap_idle`] for ever, checking often enough that a
    /// session outlives its idle time by at most a quarter of it (or a minute).
    pub(super) async fn reap(self: Arc<Self>) {
        let every = (self.idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(60));
        loop {
            tokio::time::sleep(every).await;
            self.reap_idle().await;
        }
    }
}

impl SessionManager for TokenSessions {
    type Error = TokenSessionError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let Ok((digest, entry, refused)) = OPENER.try_with(|o| (o.digest, o.entry, o.refused.clone())) else {
            return Err(TokenSessionError::Unauthenticated);
        };
        // Held while the session is made: given back if it is not (also
        // when the request's future is dropped meanwhile). At the cap, the
        // entry's least recently used session that is not busy makes room.
        let place = loop {
            if let Some(place) = self.live.take(entry, self.max, false) {
                break place;
            }
            if !self.evict(entry).await {
                refused.store(true, Ordering::Relaxed);
                return Err(TokenSessionError::Refused { entry, max: self.max });
            }
        };
        let (id, transport) = self.inner.create_session().await?;
        let activity = Arc::new(Activity {
            state: Mutex::new((Instant::now(), 0)),
            initialized: AtomicBool::new(false),
            primed: AtomicBool::new(false),
        });
        self.owners().insert(id.clone(), Owned { digest, entry, _place: place, activity });
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        let answer = self.inner.initialize_session(id, message).await?;
        if let Some(activity) = self.activity(id) {
            activity.initialized.store(true, Ordering::Relaxed);
            activity.touch();
        }
        // The revision the session speaks, as the server answered it.
        if let rmcp::model::JsonRpcMessage::Response(r) = &answer
            && let rmcp::model::ServerResult::InitializeResult(init) = &r.result
            && let Some(activity) = self.activity(id)
        {
            activity.primed.store(takes_priming(&init.protocol_version), Ordering::Relaxed);
            activity.touch();
        }
        Ok(answer)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // Freed first: a close cut short (its request dropped) still frees it.
        self.release(id);
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if let Some(a) = self.activity(id) {
            a.touch();
        }
        let request = match &message {
            ClientJsonRpcMessage::Request(r) => Some(r.id.clone()),
            _ => None,
        };
        let stream = self.inner.create_stream(id, message).await?;
        let mut tracked = self.tracked(id, stream);
        tracked.withdraw =
            request.map(|request| Withdraw { sessions: self.inner.clone(), session: id.clone(), request });
        Ok(tracked)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        if let Some(a) = self.activity(id) {
            a.touch();
        }
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.create_standalone_stream(id).await?;
        // rmcp's own priming of this stream is off (it primed every
        // revision): a session that takes priming gets the same event here.
        let primed = self.activity(id).is_some_and(|a| a.primed.load(Ordering::Relaxed));
        let priming = primed.then(|| ServerSseMessage::priming("0", SSE_RETRY));
        Ok(self.tracked(id, futures_util::stream::iter(priming).chain(stream)))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(self.tracked(id, stream))
    }

    // `restore_session` keeps its default (not supported): no session store
    // is configured, and a restored session would bypass the count.

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

/// Whether a session of `version` is sent priming events: from 2025-11-25,
/// the revision that defines them (as the TypeScript SDK's server does).
fn takes_priming(version: &ProtocolVersion) -> bool {
    version.as_str() >= ProtocolVersion::V_2025_11_25.as_str()
}

/// How many of something each key holds open (requests per
/// `[[serve.auth]]` entry, connections per [`peer_key`]), each place freed
/// when its [`Slot`] is dropped.
pub(super) struct Counts<K> {
    open: Mutex<HashMap<K, usize>>,
}

impl<K: std::hash::Hash + Eq + Clone> Counts<K> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Counts { open: Mutex::new(HashMap::new()) })
    }

    /// A place for `key` if it holds fewer than `max` (`always`: taken past
    /// the cap too).
    pub(super) fn take(self: &Arc<Self>, key: K, max: usize, always: bool) -> Option<Slot<K>> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(key.clone()).or_insert(0);
        if *n >= max && !always {
            return None;
        }
        *n += 1;
        Some(Slot { counts: self.clone(), key })
    }
}

/// A place in [`Counts`], freed when dropped.
pub(super) struct Slot<K: std::hash::Hash + Eq> {
    counts: Arc<Counts<K>>,
    key: K,
}

impl<K: std::hash::Hash + Eq> Drop for Slot<K> {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// Put on a response to a request whose token was valid: only then does its
/// connection stay open for another request.
#[derive(Clone, Copy)]
struct Authenticated;

/// Close the connection after any response to a request not authenticated
/// (401, `/healthz`, a CORS preflight): otherwise a client with
/// no token held a connection for ever by re-sending such a request before
/// each header deadline.
async fn close_unless_authenticated(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    if response.extensions().get::<Authenticated>().is_none() {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A JSON-RPC error answering a request refused with `status`.
fn refusal(status: StatusCode, code: i64, message: String) -> Response {
    let body = serde_json::json!({"jsonrpc": "2.0", "id": null, "error": { "code": code, "message": message }});
    (status, axum::Json(body)).into_response()
}

/// The header naming an MCP session.
const SESSION_ID: &str = "mcp-session-id";

/// The header naming the revision a request speaks.
const PROTOCOL_VERSION: &str = "mcp-protocol-version";

struct Auth {
    tokens: Tokens,
    sessions: Arc<TokenSessions>,
    /// Requests of each `[[serve.auth]]` entry open at once: each holds a
    /// connection until its response ends (an SSE stream while it is open —
    /// a session may hold 33 GET streams in rmcp), so without a cap one
    /// token's client could hold every connection.
    requests: Arc<Counts<usize>>,
    max_requests: usize,
    /// Responses to POSTs not yet written: at shutdown, what the calls in
    /// flight answered is written before rmcp ends its streams.
    responses: TaskTracker,
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
async fn authenticate(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
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
                // Not -32001: the SDKs read that as a request timeout.
                "error": { "code": -32600, "message": "authentication required: send `Authorization: Bearer <token>` with a token of `[[serve.auth]]`" }
            })),
        )
            .into_response();
        if let Ok(v) = HeaderValue::from_str(&challenge) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        return response;
    };
    // Its connection is a client's now: never closed for another one from
    // its address ([`PerAddress::admit`]).
    if let Some(OnConnection(connection)) = request.extensions().get::<OnConnection>() {
        connection.authenticated.store(true, Ordering::Relaxed);
    }
    let mut response = authenticated(&auth, request, next, digest, agent, entry).await;
    // The token was valid: the connection may carry its next request.
    response.extensions_mut().insert(Authenticated);
    response
}

/// [`authenticate`] past the token check: the request of `[[serve.auth]]`
/// entry `entry`, whose token has `digest` and is bound to `agent`.
async fn authenticated(
    auth: &Arc<Auth>,
    mut request: Request,
    next: Next,
    digest: [u8; 32],
    agent: String,
    entry: usize,
) -> Response {
    // A session named by the request must be one this token made: anything
    // else (another token's, an unknown or unreadable id) is not found.
    // The session is held busy until the response ends: not ended for a
    // new session of the token while it serves this request.
    let held = match request.headers().get(SESSION_ID) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|id| auth.sessions.hold(id, &digest)) {
            Some(held) => Some(held),
            None => return no_such_session(),
        },
    };
    let named = held.is_some();
    // A revision this server does not offer is refused (400, as the
    // transport requires) within a session, and for any revision rmcp knows
    // that this server does not offer: rmcp checks the header only against
    // the revisions it knows, and lets any through when the body's `_meta`
    // claims the same. A request without a session naming an unknown one is
    // rmcp's to answer (on 2026-07-28, an error listing the supported ones).
    if let Some(v) = request.headers().get(PROTOCOL_VERSION)
        && not_offered(v.to_str().unwrap_or(""), super::VERSIONS, named)
    {
        let offered: Vec<&str> = super::VERSIONS.iter().map(|o| o.as_str()).collect();
        let message =
            format!("Bad Request: unsupported MCP-Protocol-Version; this server offers {}", offered.join(", "));
        return (StatusCode::BAD_REQUEST, message).into_response();
    }
    let deleting = request.method() == Method::DELETE;
    let posting = request.method() == Method::POST;
    // A DELETE is let past the cap: it ends a session, and is short.
    // A DELETE, which frees a session, is taken past the cap.
    let Some(open) = auth.requests.take(entry, auth.max_requests, deleting) else {
        let max = auth.max_requests;
        return refusal(
            StatusCode::TOO_MANY_REQUESTS,
            -32000,
            format!(
                "too many requests open: serve.auth[{entry}] has {max} open (SSE streams included), the most `[serve] max_requests_per_token` allows; end a stream, or raise the setting"
            ),
        );
    };
    // Who the request is, as the journal records an approval it answers:
    // the configured entry whose token it presented (never the token).
    let principal = format!("http token serve.auth[{entry}]");
    // Whose asks a stateless request may find and answer: this token's (its
    // digest, stable across restarts and reordered entries).
    request.extensions_mut().insert(BoundAgent { agent, principal, key: hex::encode(digest) });
    let refused = Arc::new(AtomicBool::new(false));
    let opener = Opener { digest, entry, refused: refused.clone() };
    // A call's result goes out in the body of its POST (JSON or an SSE
    // stream): counted from now until hyper has taken its last byte. From
    // now, not from when a response exists: a stateless POST has none until
    // rmcp hands its handler's first message over, and a stopping server
    // that counted only responses cancelled rmcp between the call's end and
    // that hand-over — the client got "no response message received from
    // handler" instead of its result.
    let token = posting.then(|| auth.responses.token());
    let mut response = OPENER.scope(opener, next.run(request)).await;
    // A session ended: 204 No Content, not rmcp's 202 Accepted — nothing is
    // left to process, and a client that takes only 200 and 204 for a
    // DELETE (the Python SDK 2.x) warns of a failed termination at every
    // clean disconnect otherwise.
    if deleting && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        response.headers_mut().remove(header::CONTENT_LENGTH);
        *response.body_mut() = axum::body::Body::empty();
    }
    if refused.load(Ordering::Relaxed) {
        let max = auth.sessions.max;
        return refusal(
            StatusCode::TOO_MANY_REQUESTS,
            -32000,
            format!(
                "too many sessions: serve.auth[{entry}] has {max} open, each with a request or stream open, the most `[serve] max_sessions_per_token` allows; end one (DELETE with its Mcp-Session-Id, or close its streams: the least recently used session with none open makes room for a new one), or raise the setting"
            ),
        );
    }
    // Every response holds the request's place until hyper has taken its
    // last byte.
    response.map(|body| axum::body::Body::new(Counted { body, _token: token, _open: open, _session: held }))
}

/// A response body counted in [`Auth::responses`] (a POST's), in
/// [`Auth::requests`] and as its session's open request until it is dropped
/// — which hyper does once it has taken the last byte, or the connection went.
struct Counted {
    body: axum::body::Body,
    _token: Option<TaskTrackerToken>,
    _open: Slot<usize>,
    _session: Option<OpenStream>,
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
    // Checked at load too; again here for a config built in code: an origin
    // the CORS layer cannot take would panic it, or be left out of it alone.
    for (i, o) in config.allowed_origins.iter().enumerate() {
        toolgate::config::check_origin(o).map_err(|e| anyhow::anyhow!("serve.allowed_origins[{i}]: {e}"))?;
    }
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
    let sessions =
        Arc::new(TokenSessions::new(config.max_sessions_per_token, Duration::from_secs(config.session_idle_secs)));
    let responses = TaskTracker::new();
    let auth = Arc::new(Auth {
        tokens,
        sessions: sessions.clone(),
        requests: Counts::new(),
        max_requests: config.max_requests_per_token.max(1),
        responses: responses.clone(),
        metadata_url,
    });
    let stop = CancellationToken::new();

    // No priming event from rmcp's HTTP layer (on the initialize answer and
    // each GET stream, whatever the revision): [`TokenSessions`] primes only
    // the sessions whose revision takes it.
    let mut http = StreamableHttpServerConfig::default()
        .with_sse_retry(None)
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
    let mcp: StreamableHttpService<McpServer, TokenSessions> =
        StreamableHttpService::new(factory, sessions.clone(), http);
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
    // Outermost of all: whatever answered, only an authenticated request's
    // connection is kept.
    let app = app.layer(axum::middleware::from_fn(close_unless_authenticated));

    // Announced only once listening, for whoever started us (a test reads the port here).
    eprintln!("toolgate: serving MCP on http://{bound}{ENDPOINT}");
    let watcher = tokio::spawn(server.clone().watch());
    let reaper = tokio::spawn(sessions.clone().reap());
    let caps = Caps {
        max: config.max_connections,
        per_address: config.max_connections_per_address,
        header_timeout: Duration::from_millis(config.header_timeout_ms),
    };
    let connections = serve_connections(listener, app, terminated(), caps).await;
    watcher.abort();
    reaper.abort();
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

/// What a browser page of one of `origins` may send and read. Any request
/// header it asks for is allowed (the preflight's list is mirrored): the
/// 2026-07-28 revision adds `Mcp-Method`, `Mcp-Name` and one `Mcp-Param-…`
/// per parameter a tool marks, which no fixed list holds, and a header
/// grants nothing here — the origin list, the `Host` check and the token
/// still decide every request.
fn cors(origins: &[String]) -> tower_http::cors::CorsLayer {
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    let origins: Vec<HeaderValue> = origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    let name = axum::http::HeaderName::from_static;
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(origins))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers([name("mcp-session-id"), name("mcp-protocol-version"), header::WWW_AUTHENTICATE])
}

/// How long a stopping server waits for open connections to finish.
const DRAIN_CONNECTIONS: Duration = Duration::from_secs(30);

/// What [`serve_connections`] allows.
struct Caps {
    /// Connections served at once; more wait in the listen backlog.
    max: usize,
    /// Connections served at once from one peer ([`peer_key`]); more are refused.
    per_address: usize,
    /// A request's headers must arrive within this of the connection or of
    /// the end of the previous response (hyper re-arms it for each request,
    /// so it also bounds a keep-alive connection left idle).
    header_timeout: Duration,
}

/// What a connection is counted under: an IPv4 address (also written as
/// IPv4-mapped IPv6), or the /64 of an IPv6 one — a single host is commonly
/// given a whole /64 and can pick any address in it.
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

/// A connection being served: whether it has carried a request with a
/// valid token, and how to close it.
struct Served {
    authenticated: AtomicBool,
    close: CancellationToken,
    /// When it was accepted: a connection younger than [`EVICTABLE_AFTER`]
    /// is never closed for a newer one.
    opened: std::time::Instant,
}

/// How long a new connection has to send its first request's headers before
/// a newer connection from its address may take its place at the cap:
/// without it, a peer opening connections in a loop made each new one the
/// oldest unauthenticated connection, closed before its headers were read.
const EVICTABLE_AFTER: Duration = Duration::from_secs(1);

/// Put on each request of a connection, for [`authenticate`] to mark it.
#[derive(Clone)]
struct OnConnection(Arc<Served>);

/// The connections served per peer ([`peer_key`]), oldest first.
#[derive(Default)]
struct PerAddress {
    open: Mutex<HashMap<IpAddr, Vec<Arc<Served>>>>,
}

impl PerAddress {
    /// A place for a new connection from `key`, at most `max` at once. At
    /// the cap, the oldest connection that has not carried a request with a
    /// valid token (idle, or sending its first headers) is closed to make
    /// room; `None` — refused — only when every one has. Otherwise anyone
    /// on the address (on loopback, every local user) holding `max` idle
    /// connections, each renewed within `header_timeout_ms`, had every
    /// authenticated client of that address refused.
    ///
    /// Only a connection open for [`EVICTABLE_AFTER`] is closed: a peer
    /// opening connections in a loop gets its own newest ones refused, never
    /// another client's still sending its headers.
    fn admit(&self, key: IpAddr, max: usize, now: std::time::Instant) -> Option<Arc<Served>> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let here = open.entry(key).or_default();
        if here.len() >= max.max(1) {
            let oldest = here.iter().position(|c| {
                !c.authenticated.load(Ordering::Relaxed) && now.saturating_duration_since(c.opened) >= EVICTABLE_AFTER
            })?;
            let closed = here.remove(oldest);
            closed.close.cancel();
            tracing::debug!(
                "closed a connection from {key} that sent no authenticated request, for a new one: `[serve] max_connections_per_address` reached"
            );
        }
        let served =
            Arc::new(Served { authenticated: AtomicBool::new(false), close: CancellationToken::new(), opened: now });
        here.push(served.clone());
        Some(served)
    }

    fn forget(&self, key: IpAddr, served: &Arc<Served>) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(here) = open.get_mut(&key) {
            here.retain(|c| !Arc::ptr_eq(c, served));
            if here.is_empty() {
                open.remove(&key);
            }
        }
    }
}

/// A connection's global slot and its place among its address's.
struct Place {
    per_address: Arc<PerAddress>,
    key: IpAddr,
    served: Arc<Served>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.per_address.forget(self.key, &self.served);
    }
}

/// The answer to a connection past its address's cap, written before its
/// request is read (the connection is closed at once).
fn too_many_from_address() -> String {
    let body = "too many connections from this address: `[serve] max_connections_per_address`; behind a reverse proxy, raise it and limit connections at the proxy\n";
    format!(
        "HTTP/1.1 429 Too Many Requests\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Serve `app` on `listener` until `shutdown`, then stop accepting; the
/// connections still open are returned, to be let finish. What
/// `axum::serve` does, with what it leaves out: a deadline for a request's
/// headers (hyper has none without a timer, so a client sending nothing, or
/// a byte at a time, held a task and a descriptor for ever — before
/// authentication, which needs the headers), at most `caps.max` connections
/// at once (more wait in the listen backlog), and at most `caps.per_address`
/// of them from one peer, so that one client cannot take them all: past it
/// the peer's oldest connection with no authenticated request is closed
/// ([`PerAddress::admit`]), and when every one has had one the new
/// connection is answered 429 and closed.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
    caps: Caps,
) -> hyper_util::server::graceful::GracefulShutdown {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(tokio::sync::Semaphore::new(caps.max.max(1)));
    let per_address = Arc::new(PerAddress::default());
    let refused = too_many_from_address();
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            biased;
            () = &mut shutdown => break,
            // Never closed: `Err` cannot happen.
            slot = slots.clone().acquire_owned() => match slot { Ok(s) => s, Err(_) => break },
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, a connection reset before accept: wait, go on.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let key = peer_key(peer.ip());
        let Some(served) = per_address.admit(key, caps.per_address, std::time::Instant::now()) else {
            // Its global slot goes back at once; the answer fits the socket
            // buffer, so it never waits on the client.
            drop(slot);
            tracing::debug!("refused a connection from {peer}: `[serve] max_connections_per_address` reached");
            let _ = stream.try_write(refused.as_bytes());
            continue;
        };
        let _ = stream.set_nodelay(true);
        let inner = hyper_util::service::TowerToHyperService::new(app.clone());
        let mark = OnConnection(served.clone());
        let service = hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(mark.clone());
            hyper::service::Service::call(&inner, request)
        });
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(caps.header_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        // Its places go back however the task ends, a panic included.
        let place = Place { per_address: per_address.clone(), key, served: served.clone(), _slot: slot };
        tokio::spawn(async move {
            tokio::select! {
                _ = connection => {}
                // Closed for a newer connection of its address: dropped.
                () = served.close.cancelled() => {}
            }
            drop(place);
        });
    }
    drop(listener);
    graceful
}

#[cfg(test)]
mod tests {
    use super::{Duration, ProtocolVersion, SSE_RETRY, TokenSessions, WITHDRAWN_KEPT, bearer, not_offered, peer_key};

    /// At its address's cap a new connection takes the place of the oldest
    /// one that sent no authenticated request — only once that one had
    /// [`super::EVICTABLE_AFTER`] to send its headers: a peer opening
    /// connections in a loop is refused its newest, and cannot close a
    /// client's connection before the client's first request is read.
    #[test]
    fn a_connection_still_sending_its_first_headers_is_never_closed_for_a_newer_one() {
        use std::sync::atomic::Ordering;
        let per_address = super::PerAddress::default();
        let key: std::net::IpAddr = [127, 0, 0, 1].into();
        let t0 = std::time::Instant::now();
        let client = per_address.admit(key, 2, t0).unwrap();
        let flood = per_address.admit(key, 2, t0).unwrap();
        // Both just opened: the newcomer is refused, neither is closed.
        assert!(per_address.admit(key, 2, t0 + Duration::from_millis(100)).is_none());
        assert!(!client.close.is_cancelled() && !flood.close.is_cancelled());
        // Later, the client has authenticated: the flood's old connection goes.
        client.authenticated.store(true, Ordering::Relaxed);
        let later = t0 + super::EVICTABLE_AFTER;
        let newer = per_address.admit(key, 2, later).unwrap();
        assert!(flood.close.is_cancelled() && !client.close.is_cancelled());
        // The newer one is young and the client authenticated: refused.
        assert!(per_address.admit(key, 2, later).is_none() && !newer.close.is_cancelled());
        per_address.forget(key, &flood);
    }

    /// rmcp keeps a withdrawn request's stream and its cached events for a
    /// late resume, 60 s by default and with no bound on how many: here
    /// only a little longer than a client waits to reconnect.
    #[test]
    fn a_withdrawn_requests_stream_is_kept_only_long_enough_to_resume() {
        let sessions = TokenSessions::new(4, Duration::from_secs(60));
        let kept = sessions.inner.session_config.completed_cache_ttl;
        assert_eq!(kept, WITHDRAWN_KEPT);
        assert!(kept > SSE_RETRY && kept <= Duration::from_secs(10), "{kept:?}");
    }

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

    /// A host picks any address of its IPv6 /64, and a dual-stack listener
    /// sees IPv4 peers as IPv4-mapped: both count as one peer.
    #[test]
    fn a_peer_is_counted_by_its_ipv4_address_or_its_ipv6_64() {
        let key = |s: &str| peer_key(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:192.0.2.7"), key("192.0.2.7"));
        assert_ne!(key("192.0.2.7"), key("192.0.2.8"));
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
