//! Serve: `toolgate serve`, the MCP front end — over stdio, or Streamable
//! HTTP with authentication ([`http`]).
//!
//! Owns translating between MCP (rmcp) and the runtime: `tools/list` is the
//! agent snapshot's list (sorted by id: deterministic), `tools/call` is
//! `Run::call` — the same descriptor, gate, executor and Step commit as every
//! other front end. A blocked call or a Tool error is an `isError` result the
//! model reads; an unknown or invisible tool is a protocol error.
//!
//! Revisions offered: 2024-11-05 through 2025-11-25 (an `initialize`
//! session) and 2026-07-28 (stateless: `server/discover`, per-request
//! `_meta`). An ask reaches the human in the client's own UI: on 2026-07-28
//! as an `InputRequiredResult` with a form elicitation and a sealed
//! `requestState` naming the pending request in the durable journal (the
//! client's retry carries the answer; the ticket never leaves the host); on
//! 2025-06-18 and 2025-11-25, as a server-initiated `elicitation/create`
//! (earlier revisions have none). The prompt shows the pending record as the
//! journal holds it, and the approval names that record (its call digest),
//! so a record rewritten while the human reads is not approved. A client
//! that cannot ask gets the pending request named (never its ticket); an
//! approver decides it out of band and the identical call later returns the
//! result. With
//! `[approval] mcp_elicitation` off (the default with `[approval] keys`),
//! every client is answered that way and no answer is taken. List changes go
//! out through `subscriptions/listen` (2026-07-28) or as
//! `notifications/tools/list_changed` to initialized sessions. A withdrawn
//! request (`notifications/cancelled`, a closed HTTP request — in a session,
//! one closed before its client got an event id it could resume the stream
//! from, see `http::Withdraw`) stops its guest and is journaled as
//! `cancelled`. The calls each HTTP token has running are counted until they
//! end, whether or not their request is still open, and refused past
//! `[serve] max_requests_per_token` ([`McpServer::call_place`]). Each session — a stdio
//! connection, an HTTP session, or on stateless 2026-07-28 HTTP each request
//! (and the retries it asks for) — is its own run. No message sent exceeds
//! [`MAX_MESSAGE_BYTES`], on either transport.
//!
//! Architecture invariant: this is the only module that knows MCP server
//! types, and it makes no decision of its own — no side channel for
//! authorization. Guest output never reaches stdout: the executor captures it.

pub mod http;

use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam, ClientResult, ContentBlock,
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationSchema, Implementation, InitializeResult,
    InputRequest, InputRequests, InputRequiredResult, ListToolsResult, PaginatedRequestParams, PingRequest,
    ProtocolVersion, ServerCapabilities, ServerRequest, SubscriptionFilter, Tool, ToolAnnotations,
};
use rmcp::model::{RequestStateCodec, SealOptions};
use rmcp::service::{NotificationContext, Peer, RequestContext, RoleServer, SubscriptionContext};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use toolgate::approval::ApprovalError;
use toolgate::config::Config;
use toolgate::runtime::{CallError, Runtime, StepResult, new_id};
use toolgate::sandbox::executor::Content;
use toolgate::{Approval, ExecutableAgentSnapshot, ToolCapabilityNarrowing};
use toolgate_sdk::ToolDescriptor;

/// How long one session's list-changed notice may take to be sent before
/// the others' go on without it.
const NOTICE_WAIT: Duration = Duration::from_secs(2);

/// How often the plugin directory is checked for changes.
const RELOAD_POLL: Duration = Duration::from_millis(500);

/// The revisions offered, each driven by a client in the test suite
/// (2024-11-05 and 2025-03-26 by raw exchanges in `host/cli/tests/mcp.rs`
/// and the Python SDK's 1.x client). What the older two do not define —
/// `outputSchema`, `structuredContent`, annotations — goes out as extra
/// fields their clients ignore; elicitation, which they lack, is never sent
/// to them ([`can_elicit`]).
const VERSIONS: &[ProtocolVersion] = &[
    ProtocolVersion::V_2024_11_05,
    ProtocolVersion::V_2025_03_26,
    ProtocolVersion::V_2025_06_18,
    ProtocolVersion::V_2025_11_25,
    ProtocolVersion::V_2026_07_28,
];

/// How long a stopping stdio server waits for rmcp to write what its
/// handlers answered and close.
const STDIO_CLOSE: Duration = Duration::from_secs(10);

/// The most bytes one JSON-RPC message this server sends may take, as
/// serialized: under the 1 MiB (1,048,576 bytes) the Python SDK 2.x client
/// takes in one SSE event by default (`max_sse_event_size`), leaving room
/// for the SSE framing (its `event:` and `id:` lines). rmcp answers every
/// POST of a session as SSE; a message past the client's limit failed its
/// transport after the call had run and been committed, and the model
/// retried it. Held on every transport alike, so what the model reads does
/// not depend on it: a result over it is sent without the text copy of a
/// JSON output, or else as an `isError` result saying the call ran and where
/// its result is recorded ([`bounded_result`]); an approval prompt over it
/// is not sent ([`McpServer::ask`]); a `tools/list` over it is paged.
pub const MAX_MESSAGE_BYTES: usize = 1_000_000;

/// What the JSON-RPC envelope of a result may add to it
/// (`{"jsonrpc":"2.0","id":…,"result":…}`, an id up to ~990 bytes): a
/// result is held to [`MAX_MESSAGE_BYTES`] less this.
const ENVELOPE_BYTES: usize = 1_024;

/// The key of the one input request an ask makes.
const CONFIRM: &str = "confirm";
/// How often a server waiting on a human's answer pings the client, and
/// how long the client has to answer (a client whose transport is gone
/// ends the wait).
const KEEP_ASKING: Duration = Duration::from_secs(60);

/// How a server runs: the grace period for calls in flight at shutdown.
#[derive(Debug, Clone, Copy)]
pub struct ServeSettings {
    /// How long calls in flight may finish after the server stops accepting;
    /// those still running then are cancelled (and journaled as such).
    pub grace: Duration,
    /// [`KEEP_ASKING`]; shorter in tests.
    keep_alive: Duration,
}

impl ServeSettings {
    pub fn new(grace: Duration) -> Self {
        ServeSettings { grace, keep_alive: KEEP_ASKING }
    }
}

/// The MCP server: shared state, and the session this handle serves.
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
    session: Arc<Session>,
}

struct Shared {
    config: Config,
    /// The agent of a stdio server; HTTP requests carry theirs (bound to the token).
    stdio_agent: Option<String>,
    /// One runtime per agent, over the current catalog; replaced on reload.
    runtimes: RwLock<Runtimes>,
    /// Bumped on every reload: listen streams notify, sessions rebuild their view.
    generation: tokio::sync::watch::Sender<u64>,
    /// Initialized (pre-2026) sessions, told about list changes directly.
    legacy_peers: Mutex<Vec<(u64, Peer<RoleServer>)>>,
    next_peer: std::sync::atomic::AtomicU64,
    /// Seals the `requestState` of an ask (HMAC, TTL, bound to tool and agent).
    codec: RequestStateCodec,
    /// Keys the tag of a token in the ids of its stateless runs (derived
    /// from the request-state key): the journal holds no plain digest of a
    /// token to test guesses against.
    asker_key: [u8; 32],
    /// Calls in flight, waited for at shutdown.
    inflight: TaskTracker,
    /// Fired when the grace period is over: calls still running are cancelled.
    stopping: CancellationToken,
    /// When the grace period ends, set by the first [`McpServer::drain`].
    drain_deadline: std::sync::OnceLock<tokio::time::Instant>,
    settings: ServeSettings,
    /// The names clients see for each agent's tools, per catalog generation.
    names: Mutex<HashMap<String, (u64, Arc<ToolNames>)>>,
    /// `tools/call`s of each HTTP token (by [`BoundAgent::key`]) running,
    /// each counted until its handler returns ([`McpServer::call_place`]).
    calls: Arc<http::Counts<String>>,
}

struct Runtimes {
    generation: u64,
    by_agent: HashMap<String, Arc<Runtime>>,
    /// The executor and store every agent's runtime shares.
    base: Arc<Runtime>,
}

/// One conversation: its run, and the run's view kept across calls — with
/// the generation and the agent it was built for: a view is reused only for
/// the same agent (an HTTP session is bound to its token, and this keeps
/// another agent's request from ever running with this agent's view).
struct Session {
    /// Chosen at its first call: a stateless request's run is marked as one
    /// (`toolgate::runtime::stateless_run_id`), a conversation's is not.
    run_id: std::sync::OnceLock<String>,
    /// The agent of its first call; a request of another agent is refused.
    agent: std::sync::OnceLock<String>,
    view: Mutex<Option<CachedView>>,
    /// Told of tool list changes (its peer kept once, however many
    /// `notifications/initialized` the client sends).
    announced: std::sync::atomic::AtomicBool,
}

struct CachedView {
    generation: u64,
    agent: String,
    view: Arc<ExecutableAgentSnapshot>,
}

impl Session {
    fn new() -> Arc<Self> {
        Arc::new(Session {
            run_id: std::sync::OnceLock::new(),
            agent: std::sync::OnceLock::new(),
            view: Mutex::new(None),
            announced: Default::default(),
        })
    }

    fn of_run(run_id: String) -> Self {
        Session {
            run_id: run_id.into(),
            agent: std::sync::OnceLock::new(),
            view: Mutex::new(None),
            announced: Default::default(),
        }
    }

    /// This conversation's run; `stateless`: it serves one stateless request
    /// of `principal` ([`asker`]), whose run id is tagged with it so it finds
    /// only that principal's asks.
    fn run_id(&self, stateless: bool, principal: impl FnOnce() -> String) -> &str {
        self.run_id
            .get_or_init(|| if stateless { toolgate::runtime::stateless_run_id(&principal()) } else { new_id("run") })
    }
}

/// What the sealed `requestState` of an ask names: the pending request in the
/// journal, never its ticket, and the call its prompt showed.
#[derive(Debug, Serialize, Deserialize)]
struct AskState {
    run: String,
    request: String,
    tool: String,
    digest: String,
    /// `call_digest` (hex) of the pending record the prompt was built from:
    /// the retry's approval names it, so a record rewritten since is not
    /// approved. Required: a state sealed without it (an older server) does
    /// not open, and the retry is refused like any state that does not.
    shown: String,
}

/// What the authentication layer bound an HTTP request to, from its token.
#[derive(Debug, Clone)]
pub struct BoundAgent {
    /// The agent the request acts for.
    pub agent: String,
    /// Who the request is, as the journal records an approval it answers:
    /// the `[[serve.auth]]` entry whose token it presented.
    pub principal: String,
    /// The SHA-256 of the token it presented (hex): whose stateless asks it
    /// may find and answer.
    pub key: String,
}

/// Who a stdio connection is: the local process that started `toolgate serve`.
const STDIO_PRINCIPAL: &str = "stdio";

/// How long a client's self-given name may be in the journal's note.
const CLIENT_NAME_CHARS: usize = 64;

impl McpServer {
    /// A server over `runtime` (its agent serves stdio); `config` rebuilds
    /// runtimes for other agents and on reload.
    pub fn new(
        config: Config,
        stdio_agent: Option<&str>,
        runtime: Runtime,
        settings: ServeSettings,
    ) -> anyhow::Result<Self> {
        let agent = runtime.snapshot().agent().to_owned();
        let runtime = Arc::new(runtime);
        let key: Vec<u8> = match &config.serve.state_key {
            // Shared by replicas: each resumes the asks the others sealed.
            Some(source) => {
                let secret = toolgate::authority::credentials::read_source(source)
                    .map_err(|e| anyhow::anyhow!("serve.state_key: {e}"))?;
                if secret.len() < 32 {
                    anyhow::bail!("serve.state_key: use a key of at least 32 characters (e.g. `openssl rand -hex 32`)");
                }
                // Domain-separated, so the same secret used elsewhere seals nothing here.
                Sha256::digest([b"toolgate request-state v1\0".as_slice(), secret.as_bytes()].concat()).to_vec()
            }
            // A per-process key: states sealed by another process (or before a
            // restart) fail to open and the retry is refused (the client calls
            // again without it and is asked anew). Never a fixed
            // key: a guessable one would let a client forge request states.
            None => {
                let mut key = [0u8; 32];
                getrandom::fill(&mut key).map_err(|e| {
                    anyhow::anyhow!("no OS randomness for the request-state key (needed to seal asks): {e}")
                })?;
                key.to_vec()
            }
        };
        let asker_key: [u8; 32] = Sha256::digest([b"toolgate stateless asker v1\0".as_slice(), &key].concat()).into();
        let codec = RequestStateCodec::try_new(key)
            .map_err(|e| anyhow::anyhow!("cannot build the request-state codec: {e}"))?;
        Ok(McpServer {
            shared: Arc::new(Shared {
                config,
                stdio_agent: stdio_agent.map(str::to_owned),
                runtimes: RwLock::new(Runtimes {
                    generation: 0,
                    by_agent: HashMap::from([(agent, runtime.clone())]),
                    base: runtime,
                }),
                generation: tokio::sync::watch::Sender::new(0),
                legacy_peers: Mutex::new(Vec::new()),
                next_peer: std::sync::atomic::AtomicU64::new(0),
                codec,
                asker_key,
                inflight: TaskTracker::new(),
                stopping: CancellationToken::new(),
                drain_deadline: std::sync::OnceLock::new(),
                settings,
                names: Mutex::new(HashMap::new()),
                calls: http::Counts::new(),
            }),
            session: Session::new(),
        })
    }

    /// The same server for a new session (an HTTP session or stateless request).
    fn for_new_session(&self) -> Self {
        McpServer { shared: self.shared.clone(), session: Session::new() }
    }

    /// The runtime of `agent` over the current catalog.
    fn runtime(&self, agent: &str) -> Result<(u64, Arc<Runtime>), ErrorData> {
        {
            let r = self.shared.runtimes.read().unwrap_or_else(|p| p.into_inner());
            if let Some(rt) = r.by_agent.get(agent) {
                return Ok((r.generation, rt.clone()));
            }
        }
        let mut r = self.shared.runtimes.write().unwrap_or_else(|p| p.into_inner());
        // Another request may have built it while this one waited for the
        // lock: one runtime per agent, never a second one replacing it.
        if let Some(rt) = r.by_agent.get(agent) {
            return Ok((r.generation, rt.clone()));
        }
        let catalog = r.base.snapshot().catalog().clone();
        let snapshot = ExecutableAgentSnapshot::build(&self.shared.config, agent, catalog).map_err(internal)?;
        // Derived from the base: one executor, store, host instance and set
        // of Skill marks per process, so a Skill committed through any of
        // them (an approval) narrows its run wherever that run is served.
        let rt = Arc::new(r.base.with_snapshot(snapshot));
        r.by_agent.insert(agent.to_owned(), rt.clone());
        Ok((r.generation, rt))
    }

    /// The agent a request acts for: bound to the HTTP token, or the stdio agent.
    fn agent(&self, extensions: &rmcp::model::Extensions) -> Result<String, ErrorData> {
        if let Some(parts) = extensions.get::<::http::request::Parts>()
            && let Some(BoundAgent { agent, .. }) = parts.extensions.get::<BoundAgent>()
        {
            return Ok(agent.clone());
        }
        self.shared
            .stdio_agent
            .clone()
            .ok_or_else(|| ErrorData::internal_error("the request carries no authenticated agent", None))
    }

    /// Serve MCP over stdin/stdout until stdin closes (or SIGTERM), then
    /// drain calls in flight.
    pub async fn serve_stdio(self) -> anyhow::Result<()> {
        let watcher = tokio::spawn(self.clone().watch());
        let ct = CancellationToken::new();
        let stdio = rmcp::transport::stdio();
        let max_line = max_line(&self.shared.config);
        let transport = line_transport(stdio.0, stdio.1, max_line).draining_at_end(self.clone());
        let service = match self.clone().serve_with_ct(transport, ct.clone()).await {
            Ok(service) => Some(service),
            // Input closed before any `initialize`: a client of the stateless
            // 2026-07-28 revision (or one that only discovered) is done. A
            // clean end, like stdin closing after a session.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => None,
            Err(e) => return Err(e.into()),
        };
        if let Some(service) = service {
            let waiting = service.waiting();
            tokio::pin!(waiting);
            tokio::select! {
                r = &mut waiting => { r?; }
                () = terminated() => {
                    // rmcp keeps serving while calls in flight finish (or,
                    // after the grace, are withdrawn), so their results go
                    // out; only then is it stopped — it writes what its
                    // handlers answered before it closes. Cancelling its
                    // token first cancelled every call at once.
                    self.drain().await;
                    ct.cancel();
                    // Bounded: rmcp's close waits on its writer, which a
                    // client that stopped reading stdout blocks for ever.
                    if tokio::time::timeout(STDIO_CLOSE, waiting).await.is_err() {
                        tracing::warn!("stdout not drained {}s after the calls ended; exiting", STDIO_CLOSE.as_secs());
                    }
                }
            }
        }
        watcher.abort();
        self.drain().await;
        Ok(())
    }

    /// Stop accepting new calls, let calls in flight finish within the grace
    /// period, then cancel the rest; every step is committed. The caller
    /// keeps the transport up meanwhile, so each call's result reaches its
    /// client. The grace runs from the first drain: a signal arriving while
    /// stdin's end is being drained does not start another.
    async fn drain(&self) {
        let s = &self.shared;
        s.inflight.close();
        let deadline = *s.drain_deadline.get_or_init(|| tokio::time::Instant::now() + s.settings.grace);
        if tokio::time::timeout_at(deadline, s.inflight.wait()).await.is_err() {
            tracing::warn!("cancelling calls still running after the {:?} grace period", s.settings.grace);
            s.stopping.cancel();
            s.inflight.wait().await;
        }
    }

    /// Reload the catalog when the plugin directory changes.
    async fn watch(self) {
        let dir = self.shared.config.plugins.clone();
        let mut last = fingerprint(&dir);
        loop {
            tokio::time::sleep(RELOAD_POLL).await;
            let now = fingerprint(&dir);
            if now == last {
                continue;
            }
            last = now;
            // Reloading reads every plugin file (up to 256 MiB each), hashes
            // it and compiles its schemas: on the blocking pool, so the async
            // worker this task runs on keeps serving calls and connections.
            let server = self.clone();
            let reloaded = match tokio::task::spawn_blocking(move || server.reload()).await {
                Ok(reloaded) => reloaded,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                // The runtime is shutting down.
                Err(_) => return,
            };
            match reloaded {
                Ok(()) => self.announce_list_changed().await,
                Err(e) => tracing::warn!("plugin directory changed but cannot be reloaded: {e:#}"),
            }
        }
    }

    fn reload(&self) -> anyhow::Result<()> {
        let catalog = Arc::new(toolgate::host::catalog(&self.shared.config)?);
        for r in catalog.refused() {
            tracing::warn!(
                "refused plugin {}: {}",
                toolgate::display::escape_unseen(&r.path.display().to_string(), toolgate::display::Lines::Escape),
                toolgate::display::escape_unseen(&r.reason, toolgate::display::Lines::Escape)
            );
        }
        let mut runtimes = self.shared.runtimes.write().unwrap_or_else(|p| p.into_inner());
        let mut next = HashMap::new();
        for (agent, rt) in &runtimes.by_agent {
            let snapshot = ExecutableAgentSnapshot::build(&self.shared.config, agent, catalog.clone())?;
            next.insert(agent.clone(), Arc::new(rt.with_snapshot(snapshot)));
        }
        let base_agent = runtimes.base.snapshot().agent().to_owned();
        if let Some(base) = next.get(&base_agent) {
            runtimes.base = base.clone();
        }
        runtimes.by_agent = next;
        runtimes.generation += 1;
        let generation = runtimes.generation;
        drop(runtimes);
        self.shared.generation.send_replace(generation);
        Ok(())
    }

    /// Tell every initialized (pre-2026) session; listen streams see the generation change.
    async fn announce_list_changed(&self) {
        let peers = self.shared.legacy_peers.lock().unwrap_or_else(|p| p.into_inner()).clone();
        // All at once, each for a bounded time: a notice waits until its
        // transport took it, and a client that reads nothing (a full stdout
        // pipe, an SSE stream nobody reads) held every later session's notice,
        // and the next reload, for as long as it did not read.
        let sent = futures_util::future::join_all(peers.iter().map(|(id, peer)| async move {
            match tokio::time::timeout(NOTICE_WAIT, peer.notify_tool_list_changed()).await {
                Ok(Err(_)) => Some(*id),
                // Sent, or still waiting: the session is kept.
                Ok(Ok(())) | Err(_) => None,
            }
        }))
        .await;
        let gone: Vec<_> = sent.into_iter().flatten().collect();
        if !gone.is_empty() {
            self.shared.legacy_peers.lock().unwrap_or_else(|p| p.into_inner()).retain(|(id, _)| !gone.contains(id));
        }
    }

    /// This session's run over `runtime`: its view is kept across calls (no
    /// journal lookup per call), rebuilt once after a reload.
    async fn session_run<'r>(
        &self,
        generation: u64,
        runtime: &'r Runtime,
        stateless: bool,
        principal: impl FnOnce() -> String,
    ) -> Result<toolgate::Run<'r>, ErrorData> {
        let run_id = self.session.run_id(stateless, principal);
        let agent = runtime.snapshot().agent();
        let cached = self
            .session
            .view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|c| c.generation == generation && c.agent == agent && c.view.agent() == agent)
            .map(|c| c.view.clone());
        match cached {
            Some(view) => Ok(runtime.continue_run(run_id, view)),
            None => runtime
                .start_run(Some(run_id.to_owned()), ToolCapabilityNarrowing::Configured)
                .await
                .map_err(journal_error),
        }
    }

    fn remember(&self, generation: u64, run: &toolgate::Run<'_>) {
        let view = run.snapshot();
        let agent = view.agent().to_owned();
        *self.session.view.lock().unwrap_or_else(|p| p.into_inner()) = Some(CachedView { generation, agent, view });
    }

    async fn call(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let agent = self.agent(&context.extensions)?;
        let (generation, runtime) = self.runtime(&agent)?;
        // The name the client saw, as the tool's id: the gate, the rules, the
        // journal and the prompt know only ids. Anything else (an unknown
        // name) goes on as is, to be refused as unknown.
        let name = match self.names(generation, &agent, &runtime).id(&request.name) {
            Ok(id) => id.unwrap_or(&request.name).to_owned(),
            Err(ambiguous) => return Err(ErrorData::invalid_params(ambiguous.to_string(), None)),
        };
        let arguments = request.arguments.clone().map(serde_json::Value::Object).unwrap_or(serde_json::Value::Null);
        // A session serves the agent it first served (an HTTP session is also
        // bound to its token, in `http`): never another agent's request.
        if self.session.agent.get_or_init(|| agent.clone()) != &agent {
            return Err(ErrorData::invalid_request("this session belongs to another client", None));
        }
        // The client's answer to an ask this server made (2026-07-28).
        if let Some(state) = &request.request_state {
            return self.answered(&runtime, &agent, &name, &arguments, state, &request, context).await;
        }
        let structured = structured_output(&runtime, &name);
        let stateless = stateless(context);
        let mut run = self.session_run(generation, &runtime, stateless, || self.asker_tag(context)).await?;
        if stateless {
            run = run.stateless();
        }
        let cancel = withdrawn(context.ct.clone(), self.shared.stopping.clone());
        let result = run.call_until(&name, arguments.clone(), cancel).await;
        self.remember(generation, &run);
        let result = match result {
            Ok(r) => r,
            Err(CallError::UnknownTool(id)) => {
                return Err(ErrorData::invalid_params(format!("unknown tool `{id}`"), None));
            }
            Err(e) => return Err(call_error(&name, e, None)),
        };
        match result {
            StepResult::Awaiting { ref ticket, ref correlation, .. } => {
                let (ticket, correlation) = (ticket.clone(), correlation.clone());
                self.ask(&runtime, &name, &arguments, &ticket, &correlation, result, context).await
            }
            other => Ok(to_mcp_result(&name, &other, structured).into()),
        }
    }

    /// Ask the human through the client's own UI, the way its revision allows;
    /// a client that cannot ask gets the pending request named (never its ticket).
    #[allow(clippy::too_many_arguments)]
    async fn ask(
        &self,
        runtime: &Runtime,
        name: &str,
        arguments: &serde_json::Value,
        ticket: &str,
        correlation: &str,
        awaiting: StepResult,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if !self.shared.config.mcp_elicitation {
            // `[approval] mcp_elicitation` is off (the default with keys): an
            // answer in a client's UI decides nothing — the agent may run the
            // client — so none is asked for, on any revision; the request
            // stays pending for an approver.
            let how = if self.shared.config.approvers.is_empty() {
                "on a terminal with `toolgate approve …`"
            } else {
                "with `toolgate approve … --key FILE --digest HEX`, the digest `toolgate journal --awaiting` lists"
            };
            let message = format!(
                "`{name}` needs human approval, which this server does not take in the client's UI (an approver \
                 decides it {how}): {}",
                awaiting.model_text()
            );
            return Ok(CallToolResult::error(vec![ContentBlock::text(message)]).into());
        }
        if !can_elicit(context) {
            let message =
                format!("`{name}` needs human approval and this client cannot ask: {}", awaiting.model_text());
            return Ok(CallToolResult::error(vec![ContentBlock::text(message)]).into());
        }
        // The human is shown the pending record, not the request: what an
        // approval runs is the record, and anything that writes the journal
        // (the agent's OS user can) may have rewritten it since the gate
        // stored it. One that is no longer this call is not shown at all;
        // the approval names the record shown, so one rewritten while the
        // human reads is refused (`ChangedSinceShown`).
        let digest = toolgate::policy::gate::argument_digest(&normalize(arguments));
        let record = runtime.store().awaiting(ticket).await.map_err(journal_error)?.filter(|r| {
            r.state == "pending" && r.call_id == correlation && r.tool_id == name && r.argument_digest == digest
        });
        let Some(record) = record else {
            let why = "the journal no longer holds this call as the pending request (something else wrote it), so \
                       the human was not asked";
            return Ok(still_pending(name, correlation, why));
        };
        // A call that would run failed closed here whatever it does (a
        // credential this host cannot read) cannot be approved: the human is
        // not asked for an answer that would be refused.
        if let Err(e) = runtime.approvable_here(&record).await {
            return Err(call_error(name, e, Some(correlation)));
        }
        let shown = record.call_digest();
        let question = elicitation(&record.tool_id, &record.arguments);
        let modern = context.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        if modern {
            // Stateless: the client retries with the answer and this sealed
            // state, naming the run that holds the pending ask: this one, or
            // — a stateless request that found the agent's identical ask from
            // an earlier request — that request's run, where the retry's
            // answer is looked up.
            let state = AskState {
                run: record.run_id.clone(),
                request: correlation.to_owned(),
                tool: name.to_owned(),
                digest,
                shown: shown.hex(),
            };
            let ttl = Duration::from_secs(self.shared.config.limits.ticket_ttl_secs);
            let bound = seal_binding(name, &self.agent(&context.extensions)?, asker(context));
            let sealed = self
                .shared
                .codec
                .seal_json_with(&state, &SealOptions::new().associated_data(&bound).ttl(ttl))
                .map_err(|e| ErrorData::internal_error(format!("cannot seal the request state: {e}"), None))?;
            let mut requests = InputRequests::new();
            requests.insert(CONFIRM.into(), InputRequest::Elicitation(ElicitRequest::new(question)));
            let asking = InputRequiredResult::new(Some(requests), Some(sealed));
            let size = json_len(&asking).saturating_add(ENVELOPE_BYTES);
            if size > MAX_MESSAGE_BYTES {
                return Ok(prompt_too_large(name, &record.arguments, size, &awaiting));
            }
            return Ok(asking.into());
        }
        // Too large to send, the prompt is not sent: the request stays
        // pending for an approver, as for a client that cannot ask.
        let size = json_len(&ServerRequest::ElicitRequest(ElicitRequest::new(question.clone())))
            .saturating_add(ENVELOPE_BYTES);
        if size > MAX_MESSAGE_BYTES {
            return Ok(prompt_too_large(name, &record.arguments, size, &awaiting));
        }
        // Only the human's answer decides. A call withdrawn while the human
        // reads (the client cancelled it, e.g. at its request timeout, or the
        // server stops), an ask whose client stopped answering, and an ask
        // that failed (the client refused it, the connection went) leave the
        // request pending for an approver: an answer arriving after the call
        // was withdrawn runs nothing.
        let still_pending = |why: &str| Ok(still_pending(name, correlation, why));
        let expires_at = match &awaiting {
            StepResult::Awaiting { expires_at, .. } => *expires_at,
            _ => now_secs().saturating_add(self.shared.config.limits.ticket_ttl_secs as i64),
        };
        // A second past the ticket's expiry: no wait outlives what it waits for.
        let expires_in = Duration::from_secs(u64::try_from(expires_at.saturating_sub(now_secs())).unwrap_or(0) + 1);
        let decision = match self.wait_for_answer(question, expires_in, context).await {
            Waited::Withdrawn => return still_pending("the call was withdrawn before the human answered"),
            Waited::Gone => return still_pending("the client went away while the human was asked"),
            Waited::Answer(Ok(r)) => decision_of(&serde_json::to_value(r).unwrap_or_default()),
            Waited::Answer(Err(rmcp::service::ServiceError::Timeout { .. })) => {
                let message = format!(
                    "`{name}` needs human approval and the approval of request `{correlation}` expired before the \
                     human answered; make the same call again to be asked anew"
                );
                return Ok(CallToolResult::error(vec![ContentBlock::text(without_tickets(&message))]).into());
            }
            Waited::Answer(Err(e)) => {
                // The client's words, on one line of the host's log.
                let said = e.to_string();
                tracing::warn!(
                    "elicitation failed: {}",
                    toolgate::display::escape_unseen(&said, toolgate::display::Lines::Escape)
                );
                return still_pending("asking in the client failed");
            }
        };
        let approval = Approval::by_mcp_client_for(approver(context), shown);
        // Decided on the catalog in force now, not the one the call was
        // asked under: a reload while the human read (a plugin added that
        // makes the id ambiguous, the component replaced or removed) must not
        // run the component from before it.
        let (_, current) = self.runtime(&self.agent(&context.extensions)?)?;
        let runtime: &Runtime = &current;
        let step = match decision {
            Decision::Approve => runtime.approve(ticket, &approval).await,
            Decision::Deny(why) => runtime.deny(ticket, why, &approval).await,
            Decision::Undecided(why) => return still_pending(why),
        };
        let step = step.map_err(|e| call_error(name, e, Some(correlation)))?;
        Ok(to_mcp_result(name, &step, structured_output(runtime, name)).into())
    }

    /// Ask `question` in the client's UI and wait for the answer, no longer
    /// than `expires_in` — rmcp's own timeout, so at its end rmcp forgets the
    /// request and tells the client (`notifications/cancelled`). While
    /// waiting, the client is pinged every `keep_alive` (an HTTP session is
    /// not idle meanwhile: the call's stream is open); a ping
    /// that cannot be sent (the transport is gone) ends the wait as a
    /// withdrawal does, and one left unanswered does not (a client may be
    /// busy with the dialog) — the ticket's life bounds the wait either way.
    /// A wait ended without an answer withdraws the question.
    async fn wait_for_answer(
        &self,
        question: ElicitRequestParams,
        expires_in: Duration,
        context: &RequestContext<RoleServer>,
    ) -> Waited {
        use rmcp::service::{PeerRequestOptions, ServiceError};
        let peer = &context.peer;
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(question));
        let handle = match peer.send_request_with_option(request, PeerRequestOptions::with_timeout(expires_in)).await {
            Ok(handle) => handle,
            Err(e) => return Waited::Answer(Err(e)),
        };
        let asked = handle.id.clone();
        let answer = handle.await_response();
        tokio::pin!(answer);
        let withdrawn = withdrawn(context.ct.clone(), self.shared.stopping.clone());
        tokio::pin!(withdrawn);
        let every = self.shared.settings.keep_alive;
        let mut there = Box::pin(answers_ping(peer.clone(), every));
        let waited = loop {
            tokio::select! {
                biased;
                () = &mut withdrawn => break Waited::Withdrawn,
                a = &mut answer => break Waited::Answer(a.and_then(|r| match r {
                    ClientResult::ElicitResult(r) => Ok(r),
                    _ => Err(ServiceError::UnexpectedResponse),
                })),
                answered = &mut there => {
                    if !answered {
                        break Waited::Gone;
                    }
                    there.set(answers_ping(peer.clone(), every));
                }
            }
        };
        if !matches!(waited, Waited::Answer(_)) {
            let peer = peer.clone();
            tokio::spawn(async move {
                let withdrawn = CancelledNotificationParam::new(Some(asked), Some("the call was withdrawn".into()));
                let _ = peer.notify_cancelled(withdrawn).await;
            });
        }
        waited
    }

    /// The retry of a 2026-07-28 call that was asked: verify the sealed state
    /// names this exact call, then apply the human's answer to the pending
    /// request it names. Anything else (a decided or expired request) goes the
    /// ordinary way: the identical call gets the decided result once, or asks again.
    #[allow(clippy::too_many_arguments)]
    async fn answered(
        &self,
        runtime: &Runtime,
        agent: &str,
        name: &str,
        arguments: &serde_json::Value,
        sealed: &str,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let refused = |why: &str| ErrorData::invalid_params(format!("the request state was refused: {why}"), None);
        let bound = seal_binding(name, agent, asker(context));
        let state: AskState = self.shared.codec.open_json_with(sealed, &bound).map_err(|e| refused(&e.to_string()))?;
        let digest = toolgate::policy::gate::argument_digest(&normalize(arguments));
        if state.tool != name || state.digest != digest {
            return Err(refused("it belongs to another call"));
        }
        // What the human was shown when asked, as sealed then: never the
        // record as read now, which may have been rewritten since.
        let Some(shown) = toolgate::Digest::from_hex(&state.shown) else {
            return Err(refused("it names no call shown to the human"));
        };
        let store = runtime.store();
        let prior = store
            .prior_ask(toolgate::store::AskScope::Run(&state.run), &state.tool, &state.digest)
            .await
            .map_err(journal_error)?;
        let pending = prior.filter(|p| p.record.call_id == state.request && p.record.state == "pending");
        // With `[approval] mcp_elicitation` off (e.g. a state another replica
        // sealed), an answer decides nothing: the ordinary way leaves it pending.
        let pending = pending.filter(|_| self.shared.config.mcp_elicitation);
        // The session of this retry is the run that asked.
        let session = McpServer { shared: self.shared.clone(), session: Arc::new(Session::of_run(state.run.clone())) };
        let Some(prior) = pending else {
            let mut plain = request.clone();
            plain.request_state = None;
            plain.input_responses = None;
            return Box::pin(session.call(plain, context)).await;
        };
        let answer = request.input_responses.as_ref().and_then(|r| r.get(CONFIRM));
        let Some(answer) = answer else {
            // Asked but not answered: ask again (SHOULD per the revision),
            // showing the record the sealed state names as shown — if it
            // still is: an answer to anything else would be refused anyway.
            if prior.record.call_digest() != shown {
                let changed = ApprovalError::ChangedSinceShown { ticket: prior.record.ticket_id.clone() };
                return Err(call_error(name, CallError::Approval(changed), Some(&prior.record.call_id)));
            }
            let question = elicitation(&prior.record.tool_id, &prior.record.arguments);
            let mut requests = InputRequests::new();
            requests.insert(CONFIRM.into(), InputRequest::Elicitation(ElicitRequest::new(question)));
            return Ok(InputRequiredResult::new(Some(requests), Some(sealed.to_owned())).into());
        };
        let approval = Approval::by_mcp_client_for(approver(context), shown);
        let ticket = prior.record.ticket_id.clone();
        let step = match decision_of(answer) {
            Decision::Approve => runtime.approve(&ticket, &approval).await,
            Decision::Deny(why) => runtime.deny(&ticket, why, &approval).await,
            Decision::Undecided(why) => return Ok(still_pending(name, &prior.record.call_id, why)),
        };
        let step = step.map_err(|e| call_error(name, e, Some(&prior.record.call_id)))?;
        Ok(to_mcp_result(name, &step, structured_output(runtime, name)).into())
    }
}

/// Whether the client can be asked with a form. Elicitation came with
/// 2025-06-18: a client of an earlier revision is never sent one, even if
/// it declares the capability (an SDK of that time may declare what its
/// revision lacks). A form is what the human answers: a client declaring
/// only URL-mode elicitation cannot show one (servers MUST NOT send it a
/// mode it did not declare); one declaring neither mode takes forms.
fn can_elicit(context: &RequestContext<RoleServer>) -> bool {
    context.protocol_version().is_some_and(|v| v.as_str() >= ProtocolVersion::V_2025_06_18.as_str())
        && context
            .client_capabilities()
            .is_some_and(|c| c.elicitation.as_ref().is_some_and(|e| e.form.is_some() || e.url.is_none()))
}

/// The descriptor `name` has in `runtime`'s snapshot: a result carries
/// structured content only when the listed tool declared an output schema.
/// Whether `name` declares an object output schema, so its output also goes
/// out as `structuredContent` (looked up, not cloned: this runs every call).
fn structured_output(runtime: &Runtime, name: &str) -> bool {
    runtime
        .snapshot()
        .candidate(name, &|d| runtime.executor().unhealthy(d))
        .is_ok_and(|c| has_object_schema(c.descriptor()))
}

/// `version-traceid-parentid-flags`, lowercase hex (W3C Trace Context):
/// anything else is not logged (it is client input).
fn is_traceparent(t: &str) -> bool {
    let parts: Vec<&str> = t.split('-').collect();
    parts.len() == 4
        && [2, 32, 16, 2].iter().zip(&parts).all(|(n, p)| p.len() == *n)
        && t.bytes().all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A 2026-07-28 request over HTTP: no session, no conversation beyond it.
/// A request inside a session (it names one) is the session's, whatever
/// revision its `_meta` claims: its asks stay the conversation's.
fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context.extensions.get::<::http::request::Parts>().is_some_and(|p| !p.headers.contains_key("mcp-session-id"))
        && context.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
}

/// An error for the client, its text held to invariant 11 (no ticket).
fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(without_tickets(&e.to_string()), None)
}

/// A failure of the host's journal as the client (the model) reads it: what
/// happened and that the operator must act, without the journal's path or
/// server (the whole text is logged). `None` for an error that is the
/// call's own to say (state changed under it, a run of another agent).
fn journal_failure(e: &toolgate::store::CommitError) -> Option<String> {
    use toolgate::store::CommitError as E;
    if matches!(e, E::StateChanged { .. } | E::RunOfAnotherAgent { .. }) {
        return None;
    }
    tracing::error!("journal: {e}");
    Some(
        "the host's journal failed, so nothing of this call was recorded (or run); this is for the host's \
         operator to fix (the host's log holds the cause), not the call"
            .to_owned(),
    )
}

/// [`internal`] for the journal's errors ([`journal_failure`]).
fn journal_error(e: toolgate::store::CommitError) -> ErrorData {
    match journal_failure(&e) {
        Some(text) => ErrorData::internal_error(text, None),
        None => internal(e),
    }
}

/// A call's error as the client reads it. A ticket error names the request
/// (the correlation id the model already reads: `request`, or the pending
/// request when not known here), never its ticket, and says what to do.
fn call_error(tool: &str, e: CallError, request: Option<&str>) -> ErrorData {
    use toolgate::store::TicketError;
    let named = request.map_or_else(|| "the pending request".to_owned(), |r| format!("request {r}"));
    let message = match &e {
        CallError::Ticket(t) => match t {
            TicketError::Unknown(_) => format!("{named} is no longer pending; make the call again to be asked anew"),
            TicketError::Used(_) => format!(
                "{named} was already decided (an approval runs its call once); make the call again to be asked anew"
            ),
            TicketError::Expired(_) => {
                format!("the approval of {named} expired before it was decided; make the call again to be asked anew")
            }
            TicketError::Settled(_) => format!(
                "{named} was settled as interrupted by another host while this one ran it; its result was not recorded — check the call's effects before making it again"
            ),
            TicketError::Changed(_) => format!(
                "{named} changed in the journal while it was being approved; nothing ran — make the call again to be asked anew"
            ),
            TicketError::ComponentChanged { tool, .. } => format!(
                "the component of `{tool}` changed since {named} was asked; the approval does not carry over, make the call again"
            ),
        },
        CallError::Approval(ApprovalError::ChangedSinceShown { .. }) => format!(
            "{named} changed in the journal since it was shown to the human (toolgate never changes a pending \
             request: something else wrote the journal); nothing was approved or run and it is still pending — \
             make the same call again to be asked anew, and check who can write the journal"
        ),
        CallError::Approval(ApprovalError::CredentialUnreadable { why, .. }) => {
            // Which credential and its fix are the operator's: in the host's log.
            tracing::warn!("{named} cannot be approved here: this host cannot read {why}");
            format!(
                "{named} cannot be approved on this host: it cannot read a configured credential (named in the \
                 host's log), so the call would run with its files and requests refused; nothing was approved or \
                 run and it is still pending"
            )
        }
        CallError::Executor(e) => {
            // The whole text (paths of this host) is the operator's: in the log.
            tracing::warn!("{named}: {e}");
            e.model_text(tool)
        }
        CallError::Commit(c) => journal_failure(c).unwrap_or_else(|| c.to_string()),
        // The call ran: never "nothing ran" — a retry would repeat its effects.
        // The journal's error (its path or server) is the operator's: in the log.
        CallError::RanUnrecorded { .. } => {
            tracing::error!("{e}");
            e.model_text().unwrap_or_default()
        }
        other => other.to_string(),
    };
    ErrorData::internal_error(without_tickets(&message), None)
}

/// The last guard of invariant 11 on what the host writes to the client:
/// any ticket id (`tkt-…`) in `text` is replaced.
fn without_tickets(text: &str) -> String {
    const PREFIX: &[u8] = toolgate::store::TICKET_PREFIX.as_bytes();
    let lower = text.to_ascii_lowercase();
    let (bytes, mut out, mut i) = (lower.as_bytes(), String::with_capacity(text.len()), 0);
    while let Some(at) = bytes[i..].windows(PREFIX.len()).position(|w| w == PREFIX).map(|p| p + i) {
        let mut end = at + PREFIX.len();
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_' || bytes[end] == b'-') {
            end += 1;
        }
        // ASCII bytes only were matched: both ends are char boundaries.
        out.push_str(&text[i..at]);
        out.push_str("[ticket withheld]");
        i = end;
    }
    out.push_str(&text[i..]);
    out
}

/// [`without_tickets`] on an error going to the client.
fn scrubbed(mut e: ErrorData) -> ErrorData {
    if e.message.to_ascii_lowercase().contains(toolgate::store::TICKET_PREFIX) {
        e.message = without_tickets(&e.message).into();
    }
    if e.data.as_ref().is_some_and(|d| d.to_string().to_ascii_lowercase().contains(toolgate::store::TICKET_PREFIX)) {
        e.data = None;
    }
    e
}

/// What the seal binds a request state to: the tool, the agent and the
/// asker ([`asker`]): a state is opened only by the token it was sealed for.
fn seal_binding(tool: &str, agent: &str, asker: &str) -> Vec<u8> {
    format!("toolgate-ask\n{agent}\n{tool}\n{asker}").into_bytes()
}

fn normalize(arguments: &serde_json::Value) -> serde_json::Value {
    match arguments {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        v => v.clone(),
    }
}

/// The yes/no form an ask shows in the client's UI: the pending record's
/// tool and arguments (its JSON text, exactly as it will run).
fn elicitation(name: &str, arguments: &str) -> ElicitRequestParams {
    let schema: ElicitationSchema =
        ElicitationSchema::builder().required_bool_property("confirm", |b| b.title("Run this call?")).build_unchecked();
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: approval_prompt(name, arguments),
        requested_schema: schema,
    }
}

/// The text of an ask, for a human deciding it. The host's words come
/// first; the arguments (`json`, the exact text the gate decided on) come
/// whole, last, on one line of their own, with every character that would
/// not be seen (bidi controls, zero-width and format characters, line and
/// paragraph separators, controls) escaped by [`toolgate::display`] — so
/// nothing the model wrote can reorder what is shown or start a line that
/// reads as the host's. Their byte length is named, so a client that cuts
/// a long message cannot hide that it did. The tool id (from a component's
/// metadata) is escaped the same way.
fn approval_prompt(name: &str, json: &str) -> String {
    use toolgate::display::{Lines, escape_unseen};
    format!(
        "Allow the tool `{}` to run with the arguments below?\n\
         The arguments are {} bytes of JSON, all on the one line after this one; \
         characters that would not be seen are shown as escapes (\\u{{…}}):\n{}",
        escape_unseen(name, Lines::Escape),
        json.len(),
        escape_unseen(json, Lines::Escape)
    )
}

/// How the wait for an ask's answer ended.
enum Waited {
    /// The client answered (or rmcp gave up: `ServiceError::Timeout` at the
    /// ticket's expiry).
    Answer(Result<ElicitResult, rmcp::service::ServiceError>),
    /// The call was withdrawn, or the server's grace period ended.
    Withdrawn,
    /// A keep-alive ping could not be sent: the client is gone.
    Gone,
}

/// Whether the client is still there for a ping sent after `every`.
/// rmcp's own timeout, not ours around it: at its end rmcp drops its record
/// of the ping and sends `notifications/cancelled`.
async fn answers_ping(peer: Peer<RoleServer>, every: Duration) -> bool {
    use rmcp::service::{PeerRequestOptions, ServiceError};
    tokio::time::sleep(every).await;
    let ping = ServerRequest::PingRequest(PingRequest::default());
    match peer.send_request_with_option(ping, PeerRequestOptions::with_timeout(every)).await {
        Ok(handle) => match handle.await_response().await {
            // An error is an answer too: the client is there. So is a ping
            // that timed out: a client may read nothing while its elicitation
            // dialog is open (the Python SDK's 1.x session handles one
            // request at a time), and the ask's own wait is bounded by its
            // ticket. Only a transport that is gone ends the wait.
            Ok(_) | Err(ServiceError::McpError(_) | ServiceError::Timeout { .. }) => true,
            Err(_) => false,
        },
        Err(_) => false,
    }
}

/// Now, in Unix seconds (a ticket's `expires_at`).
fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// What an answer to an ask decides.
#[derive(Debug, PartialEq)]
enum Decision {
    Approve,
    /// The human said no: a blocked result, in their name.
    Deny(&'static str),
    /// No decision: the request stays pending (why, for the client).
    Undecided(&'static str),
}

/// An elicitation result (as JSON). Only `accept` with `confirm: true`
/// approves, and only an explicit no — `decline`, or `accept` with
/// `confirm: false` — denies. `cancel` is the human dismissing the question
/// without choosing (the revision: prompt again later), and an unknown
/// action or malformed content is no answer: neither is journaled as the
/// human's denial.
fn decision_of(answer: &serde_json::Value) -> Decision {
    let action = answer.get("action").and_then(|a| a.as_str()).unwrap_or("");
    let confirm = answer.get("content").and_then(|c| c.get("confirm")).and_then(|v| v.as_bool());
    match (action, confirm) {
        ("accept", Some(true)) => Decision::Approve,
        ("accept", Some(false)) | ("decline", _) => Decision::Deny("declined by the user"),
        ("cancel", _) => Decision::Undecided("the human dismissed the question without deciding"),
        _ => Decision::Undecided("the client's answer decided nothing"),
    }
}

/// The result of an ask that decided nothing: the request stays pending,
/// named (never its ticket), with what to do.
fn still_pending(name: &str, correlation: &str, why: &str) -> CallToolResponse {
    let message = format!(
        "`{name}` needs human approval and {why}; request `{correlation}` stays pending: an approver can decide it \
         with `toolgate approve`, or make the same call again to be asked anew"
    );
    CallToolResult::error(vec![ContentBlock::text(without_tickets(&message))]).into()
}

/// Who a request is, as the server authenticated it: the `[[serve.auth]]`
/// entry whose token an HTTP request presented (`http token serve.auth[N]`),
/// or `stdio` — the local process that started the server.
fn connection(context: &RequestContext<RoleServer>) -> &str {
    match context.extensions.get::<::http::request::Parts>() {
        Some(parts) => parts.extensions.get::<BoundAgent>().map_or("http, unauthenticated", |b| b.principal.as_str()),
        None => STDIO_PRINCIPAL,
    }
}

/// The JSON-RPC error code of a call refused past its token's cap (as the
/// HTTP layer's refusals past `[serve]` caps).
const OVER_CAP: rmcp::model::ErrorCode = rmcp::model::ErrorCode(-32000);

impl McpServer {
    /// A place among the calls in flight of the HTTP token a call came
    /// with, held until the call's handler returns; refused past `[serve]
    /// max_requests_per_token`. A call is counted where it runs, not by its
    /// HTTP request: in a session rmcp runs a call until it answers or is
    /// cancelled, whatever became of the request that carried it, so a
    /// client that hung up after the response's head and posted again had,
    /// with only its requests counted, any number of calls running — queued
    /// at their Tool's slots ahead of every other agent's calls of it, each
    /// holding its arguments. A stdio call (one local client) is not counted.
    fn call_place(&self, context: &RequestContext<RoleServer>) -> Result<Option<http::Slot<String>>, ErrorData> {
        let Some(bound) =
            context.extensions.get::<::http::request::Parts>().and_then(|p| p.extensions.get::<BoundAgent>())
        else {
            return Ok(None);
        };
        let max = self.shared.config.serve.max_requests_per_token.max(1);
        match self.shared.calls.take(bound.key.clone(), max, false) {
            Some(place) => Ok(Some(place)),
            None => Err(ErrorData::new(
                OVER_CAP,
                format!(
                    "too many calls in flight: {} has {max} tools/call running, the most `[serve] \
                     max_requests_per_token` allows (a call runs until it answers or is cancelled, even after \
                     the HTTP request that carried it closed); wait for one to end, cancel one \
                     (`notifications/cancelled`), or raise the setting",
                    bound.principal
                ),
                None,
            )),
        }
    }

    /// The tag of a request's asker in its stateless runs' ids: keyed, so
    /// the journal holds no plain digest of a token.
    fn asker_tag(&self, context: &RequestContext<RoleServer>) -> String {
        hex::encode(Sha256::digest([self.shared.asker_key.as_slice(), asker(context).as_bytes()].concat()))
    }
}

/// Whose asks a request may find and answer: the token an HTTP request
/// presented (its digest; another token bound to the same agent is another
/// asker), or `stdio`.
fn asker(context: &RequestContext<RoleServer>) -> &str {
    match context.extensions.get::<::http::request::Parts>() {
        Some(parts) => parts.extensions.get::<BoundAgent>().map_or("http, unauthenticated", |b| b.key.as_str()),
        None => STDIO_PRINCIPAL,
    }
}

/// Who answered an ask in the client's UI, as the journal records it: the
/// authenticated connection — the `[[serve.auth]]` entry whose token an HTTP
/// request presented, or `stdio` (the local process that started the server)
/// — never what the client calls itself. That name (`clientInfo.name`, any
/// text the client chose, e.g. `ed25519:… via signature`) follows only as a
/// note marked unverified, quoted, escaped and bounded.
fn approver(context: &RequestContext<RoleServer>) -> String {
    let connection = connection(context);
    match context.client_info() {
        Some(info) => format!(
            "{connection} (client says {}, unverified)",
            toolgate::display::quoted(&info.name, CLIENT_NAME_CHARS)
        ),
        None => connection.to_owned(),
    }
}

/// Completes when the request is withdrawn (its token) or the grace period
/// at shutdown is over.
async fn withdrawn(request: CancellationToken, stopping: CancellationToken) {
    tokio::select! {
        () = request.cancelled() => {}
        () = stopping.cancelled() => {}
    }
}

/// SIGTERM or SIGINT.
async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// What identifies the directory's content cheaply: names, sizes, mtimes.
fn fingerprint(dir: &std::path::Path) -> Vec<(String, u64, Option<SystemTime>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), m.len(), m.modified().ok()))
        })
        .collect();
    v.sort();
    v
}

/// A descriptor as an MCP tool listed as `name` ([`ToolNames`]): its id as
/// the title, description, input schema, output schema (object-rooted only,
/// as MCP requires), annotations.
pub fn to_mcp_tool(d: &ToolDescriptor, name: &str) -> Tool {
    let input = d.input_schema.as_object().cloned().unwrap_or_default();
    let mut tool = Tool::new(name.to_owned(), d.description.clone(), Arc::new(input));
    tool.title = Some(d.id.clone());
    if let Some(out) = object_schema(d) {
        tool = tool.with_raw_output_schema(Arc::new(out));
    }
    let a = &d.annotations;
    if a.read_only.is_some() || a.destructive.is_some() || a.idempotent.is_some() || a.open_world.is_some() {
        tool = tool.with_annotations(ToolAnnotations::from_raw(
            None,
            a.read_only,
            a.destructive,
            a.idempotent,
            a.open_world,
        ));
    }
    tool
}

fn has_object_schema(d: &ToolDescriptor) -> bool {
    d.output_schema.as_ref().is_some_and(|out| out.get("type").and_then(|t| t.as_str()) == Some("object"))
}

fn object_schema(d: &ToolDescriptor) -> Option<serde_json::Map<String, serde_json::Value>> {
    has_object_schema(d).then(|| d.output_schema.as_ref().and_then(|out| out.as_object().cloned())).flatten()
}

/// `result` of the tool `name` as the client reads it, held to
/// [`MAX_MESSAGE_BYTES`] ([`bounded_result`]).
fn to_mcp_result(name: &str, result: &StepResult, structured: bool) -> CallToolResult {
    let r = match result {
        StepResult::Output { content, .. } => {
            let text = result.model_text();
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            if let (Content::Json(v), true) = (content, structured) {
                r.structured_content = Some(v.clone());
            }
            r
        }
        other => CallToolResult::error(vec![ContentBlock::text(other.model_text())]),
    };
    bounded_result(name, result, r)
}

/// `r`, the result of `step`, if it fits in one message of
/// [`MAX_MESSAGE_BYTES`] (measured as serialized, with its envelope). Else
/// without the text copy of a JSON output that also goes out as
/// `structuredContent` (a short note in its place); else an `isError`
/// result saying that the call ran, that its result is recorded (the step
/// named) and too large for one message, with both sizes — never a
/// transport failure, and never "nothing ran": a retry would run it again.
fn bounded_result(name: &str, step: &StepResult, mut r: CallToolResult) -> CallToolResult {
    let size = |r: &CallToolResult| json_len(r).saturating_add(ENVELOPE_BYTES);
    let whole = size(&r);
    if whole <= MAX_MESSAGE_BYTES {
        return r;
    }
    if r.structured_content.is_some() && r.is_error != Some(true) {
        let note = "(the output is the JSON object in `structuredContent`: its text copy was left out, as both \
                    would not fit in one MCP message)";
        r.content = vec![ContentBlock::text(note)];
        if size(&r) <= MAX_MESSAGE_BYTES {
            return r;
        }
    }
    let seq = match step {
        StepResult::Output { seq, .. }
        | StepResult::ToolError { seq, .. }
        | StepResult::Blocked { seq, .. }
        | StepResult::Cancelled { seq }
        | StepResult::Awaiting { seq, .. } => *seq,
    };
    let what = match step {
        StepResult::Output { .. } => "ran and its result was recorded",
        StepResult::ToolError { .. } => "ran and failed, and its error was recorded",
        _ => "was recorded",
    };
    let message = format!(
        "`{name}` {what} in the host's journal as step #{seq}, but the result is too large for one MCP message: \
         {whole} bytes, over the {MAX_MESSAGE_BYTES} bytes this server sends in one. It is not shown here; do \
         not make the same call again to get it (it would run again). The host's operator can read it with \
         `toolgate journal --json` (step #{seq}); a smaller request (less output) fits."
    );
    tracing::warn!("`{name}`: step #{seq}'s result is {whole} bytes, over MAX_MESSAGE_BYTES; sent as an error");
    CallToolResult::error(vec![ContentBlock::text(without_tickets(&message))])
}

/// The page of `tools` (the agent's whole list, of catalog `generation`)
/// that `cursor` names, held to `max` bytes as a message: the whole list,
/// without a cursor, when it fits — else as many tools from the cursor's
/// place as fit, with a cursor to the next page (`tools.GENERATION.INDEX`,
/// opaque to clients). A tool too large for any page is left out (warned
/// of), as an ambiguous name is. A cursor of another generation — the
/// catalog was reloaded since, so its place may name another tool — or one
/// this server did not make is refused (-32602), never served from the
/// wrong place.
fn tools_page(
    mut tools: Vec<Tool>,
    generation: u64,
    cursor: Option<&str>,
    max: usize,
) -> Result<ListToolsResult, ErrorData> {
    let cursor_at = |index: usize| format!("tools.{generation}.{index}");
    let budget = max.saturating_sub(ENVELOPE_BYTES);
    let start = match cursor {
        None => 0,
        Some(c) => c
            .strip_prefix("tools.")
            .and_then(|c| c.split_once('.'))
            .filter(|(g, _)| g.parse::<u64>().is_ok_and(|g| g == generation))
            .and_then(|(_, i)| i.parse::<usize>().ok())
            .ok_or_else(|| {
                ErrorData::invalid_params(
                    "the cursor names no page of the current tool list (the catalog was reloaded since it was \
                     given, or this server did not make it); list the tools again from the start, without a cursor",
                    None,
                )
            })?,
    };
    let sizes: Vec<usize> = tools.iter().map(json_len).collect();
    let empty = |next: Option<String>| {
        let mut r = ListToolsResult::with_all_items(Vec::new());
        r.next_cursor = next;
        json_len(&r)
    };
    // `{"tools":[a,b]}`: the empty list's bytes, each tool's, a comma between.
    let whole = empty(None).saturating_add(sizes.iter().map(|s| s.saturating_add(1)).sum::<usize>());
    if start == 0 && whole <= budget {
        return Ok(ListToolsResult::with_all_items(tools));
    }
    // The most a page takes besides its tools: the longest cursor it can carry.
    let base = empty(Some(cursor_at(usize::MAX)));
    let mut kept = Vec::with_capacity(tools.len());
    for (tool, size) in tools.drain(..).zip(sizes) {
        if base.saturating_add(size) > budget {
            tracing::warn!(
                "tool `{}` is left out of tools/list: its definition is {size} bytes, more than one MCP message of \
                 {MAX_MESSAGE_BYTES} bytes can carry",
                toolgate::display::escape_unseen(&tool.name, toolgate::display::Lines::Escape)
            );
        } else {
            kept.push((tool, size));
        }
    }
    if start > kept.len() {
        return Err(ErrorData::invalid_params(
            "the cursor names no page of the current tool list; list the tools again from the start, without a cursor",
            None,
        ));
    }
    let total = kept.len();
    let mut used = base;
    let mut page = Vec::new();
    for (tool, size) in kept.drain(..).skip(start) {
        // A comma before every tool but the first: a tool kept above always
        // fits on a page of its own, so every page moves the cursor on.
        let cost = size.saturating_add(usize::from(!page.is_empty()));
        if used.saturating_add(cost) > budget {
            break;
        }
        used = used.saturating_add(cost);
        page.push(tool);
    }
    let end = start + page.len();
    if page.is_empty() && end < total {
        return Err(ErrorData::internal_error("a page of the tool list came out empty; list the tools again", None));
    }
    let mut r = ListToolsResult::with_all_items(page);
    r.next_cursor = (end < total).then(|| cursor_at(end));
    Ok(r)
}

/// The result of an ask whose approval prompt (`size` bytes as a message,
/// the arguments `json` whole) is too large to send: not asked, the request
/// stays pending for an approver, as for a client that cannot ask.
fn prompt_too_large(name: &str, json: &str, size: usize, awaiting: &StepResult) -> CallToolResponse {
    let message = format!(
        "`{name}` needs human approval and cannot be asked in this client: the approval prompt, which shows the \
         call's {} bytes of arguments whole, would be a {size}-byte message, over the {MAX_MESSAGE_BYTES} bytes \
         this server sends in one; {}",
        json.len(),
        awaiting.model_text()
    );
    CallToolResult::error(vec![ContentBlock::text(without_tickets(&message))]).into()
}

/// The length of `value` serialized as JSON, counted without building it.
fn json_len<T: Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // A value that cannot be serialized cannot be sent either: over any bound.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// The longest tool name clients take (Claude Desktop refuses a whole
/// server listing a longer one).
const NAME_MAX: usize = 64;

/// Whether `name` is a tool name every client takes: `^[a-zA-Z0-9_-]{1,64}$`
/// (Claude Desktop; OpenAI's function names and Codex allow the same
/// characters).
fn portable_name(name: &str) -> bool {
    (1..=NAME_MAX).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The name `id` is listed as, a function of the id alone: the id itself
/// when it is a [`portable_name`]; otherwise the id with each character
/// outside `[A-Za-z0-9_-]` made `_` (`files.read` → `files_read`), and one
/// still longer than [`NAME_MAX`] cut to 55 characters, `_` and 8 hex digits
/// of the SHA-256 of the id. No other id changes it (a name that depended on
/// the whole list changed under clients that had not listed again).
pub fn tool_name(id: &str) -> String {
    if portable_name(id) {
        return id.to_owned();
    }
    let plain: String = id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    if portable_name(&plain) {
        return plain;
    }
    // Longer than NAME_MAX (or empty): every character is ASCII now, so
    // cutting by bytes cuts by characters.
    const TAG: usize = 8;
    let keep = plain.len().min(NAME_MAX - 1 - TAG);
    let digest = hex::encode(Sha256::digest(id.as_bytes()));
    format!("{}_{}", &plain[..keep], &digest[..TAG])
}

/// The names a client sees for the tools of one list ([`tool_name`]), and
/// back. A name that two listed ids get is ambiguous — as two components
/// claiming one id are: neither tool is listed under it, and a call by it is
/// refused naming both ids (each is still called by its real id), never
/// given to the one that came first.
pub struct ToolNames {
    by_id: HashMap<String, String>,
    by_name: HashMap<String, String>,
    ambiguous: HashMap<String, Vec<String>>,
}

/// A call by a name two or more listed ids get.
#[derive(Debug, PartialEq, Eq)]
pub struct AmbiguousName {
    pub name: String,
    pub ids: Vec<String>,
}

impl std::fmt::Display for AmbiguousName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.ids.iter().map(|id| format!("`{id}`")).collect();
        write!(
            f,
            "tool name `{}` is ambiguous: it stands for {}; call the tool by its real id",
            self.name,
            ids.join(" and ")
        )
    }
}

impl ToolNames {
    pub fn new<'a>(ids: impl IntoIterator<Item = &'a str>) -> Self {
        let mut ids: Vec<&str> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        let mut claims: HashMap<String, Vec<String>> = HashMap::new();
        for id in ids {
            claims.entry(tool_name(id)).or_default().push(id.to_owned());
        }
        let (mut by_id, mut by_name, mut ambiguous) = (HashMap::new(), HashMap::new(), HashMap::new());
        for (name, ids) in claims {
            match <[String; 1]>::try_from(ids) {
                Ok([id]) => {
                    by_id.insert(id.clone(), name.clone());
                    by_name.insert(name, id);
                }
                Err(ids) => {
                    let shown: Vec<String> = ids.iter().map(|id| toolgate::display::quoted(id, 128)).collect();
                    tracing::warn!(
                        "tools {} are all named `{name}` for MCP clients: none is listed; call each by its id",
                        shown.join(" and ")
                    );
                    ambiguous.insert(name, ids);
                }
            }
        }
        ToolNames { by_id, by_name, ambiguous }
    }

    /// The name `id` is listed under; `None` when that name is ambiguous
    /// (or `id` is not in the list).
    pub fn listed(&self, id: &str) -> Option<&str> {
        self.by_id.get(id).map(String::as_str)
    }

    /// The id a client's `name` stands for: a listed name, or an id of the
    /// list (as clients named tools before); `Ok(None)` for neither. A name
    /// two ids get is refused, naming both.
    pub fn id<'a>(&'a self, name: &'a str) -> Result<Option<&'a str>, AmbiguousName> {
        if let Some(ids) = self.ambiguous.get(name) {
            return Err(AmbiguousName { name: name.to_owned(), ids: ids.clone() });
        }
        if let Some(id) = self.by_name.get(name) {
            return Ok(Some(id));
        }
        let an_id = self.by_id.contains_key(name) || self.ambiguous.values().flatten().any(|id| id == name);
        Ok(an_id.then_some(name))
    }
}

impl McpServer {
    /// The names of `agent`'s tools in generation `generation` (built once
    /// per agent and generation, from every tool the agent sees — healthy
    /// or not, so a tool's health never renames another).
    fn names(&self, generation: u64, agent: &str, runtime: &Runtime) -> Arc<ToolNames> {
        let mut names = self.shared.names.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((g, n)) = names.get(agent)
            && *g == generation
        {
            return n.clone();
        }
        let listed = runtime.snapshot().list(&|_| None);
        let built = Arc::new(ToolNames::new(listed.iter().map(|d| d.id.as_str())));
        names.insert(agent.to_owned(), (generation, built.clone()));
        built
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> InitializeResult {
        let capabilities = ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build();
        let mut info = InitializeResult::new(capabilities);
        info.server_info = Implementation::new("toolgate", env!("CARGO_PKG_VERSION"));
        info.instructions =
            Some("Tools run sandboxed after a permission check; some calls need human approval.".into());
        info
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(VERSIONS)
    }

    /// A tool as the requesting agent lists it, for rmcp's check that an
    /// HTTP request's `Mcp-Param-*` headers (MCP 2026-07-28, from the
    /// schema's `x-mcp-header`) match its arguments — without it rmcp skips
    /// the check, and a gateway routing or authorizing on the headers would
    /// see other values than the call runs with. The agent is the request's
    /// `[[serve.auth]]` entry's (rmcp asks inside the request's own task);
    /// a tool the agent does not see is `None`, as it is unlisted.
    fn get_tool(&self, name: &str) -> Option<Tool> {
        let entry = http::OPENER.try_with(|o| o.entry).ok()?;
        let agent = self.shared.config.serve.auth.get(entry)?.agent.clone();
        let (generation, runtime) = self.runtime(&agent).ok()?;
        let names = self.names(generation, &agent, &runtime);
        let id = names.id(name).ok()??;
        let Some(toolgate::catalog::Availability::Installed(t)) = runtime.snapshot().catalog().get(id) else {
            return None;
        };
        // rmcp reads only the input schema; a tool without annotations has
        // no header to check (`None` skips just that).
        let schema = t.tool.mcp_header_schema()?.clone();
        Some(Tool::new(name.to_owned(), String::new(), schema))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let agent = self.agent(&context.extensions).map_err(scrubbed)?;
        let (generation, runtime) = self.runtime(&agent).map_err(scrubbed)?;
        let names = self.names(generation, &agent, &runtime);
        // Sorted by id: the same order for the same set (clients cache it).
        // A tool whose name is ambiguous is left out (warned of when the
        // names were made); it is still called by its id.
        let tools = runtime.list().iter().filter_map(|d| Some(to_mcp_tool(d, names.listed(&d.id)?))).collect();
        let cursor = request.and_then(|r| r.cursor);
        tools_page(tools, generation, cursor.as_deref(), MAX_MESSAGE_BYTES)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // Tracked, so shutdown waits for the step to be committed. A stdio
        // call is counted from its receipt ([`Received`]): its handler may
        // start only after stdin's end closed the tracker, and it still runs.
        let received = context.extensions.get::<Received>().map(|r| r.0.clone());
        let Some(_inflight) = received.or_else(|| self.shared.track()) else {
            return Err(ErrorData::internal_error("the server is shutting down", None));
        };
        let _place = self.call_place(&context)?;
        // The client's W3C trace context (`_meta.traceparent`), when well-formed,
        // names the span the call's logs belong to.
        let trace = context.meta.get_traceparent().filter(|t| is_traceparent(t)).unwrap_or("");
        // The client's words in every log line of the call: quoted, escaped, cut.
        let tool = toolgate::display::quoted(&request.name, 128);
        let span = tracing::info_span!("tools/call", tool = %tool, traceparent = trace);
        tracing::Instrument::instrument(self.call(request, &context), span).await.map_err(scrubbed)
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.shared.generation.subscribe();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                () = self.shared.stopping.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    if context.accepted().tools_list_changed == Some(true)
                        && context.sink().notify_tool_list_changed().await.is_err()
                    {
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        if self.session.announced.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let id = self.shared.next_peer.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut peers = self.shared.legacy_peers.lock().unwrap_or_else(|p| p.into_inner());
        // Sessions that ended go (each peer holds what its client sent at
        // `initialize`): the list holds live sessions, not every one served.
        peers.retain(|(_, p)| !p.is_transport_closed());
        peers.push((id, context.peer.clone()));
    }
}

impl Shared {
    /// A token counting one call in flight; `None` once shutdown began.
    fn track(&self) -> Option<tokio_util::task::task_tracker::TaskTrackerToken> {
        (!self.inflight.is_closed()).then(|| self.inflight.token())
    }
}

/// A transport that holds back notifications arriving before the first
/// request (a client that sends `notifications/initialized` too early, or
/// any stray notification): rmcp would end the session on them; the
/// protocol says to ignore what cannot be handled.
///
/// With [`RequestsFirst::draining_at_end`], it also holds back the end of
/// its input until the server has drained: rmcp, told the input ended,
/// gives handlers 5 s to answer and then cancels them whatever the grace
/// period — so a stdio client that closes our stdin (as the spec's
/// shutdown has it) would lose a call that needed longer. Meanwhile rmcp
/// keeps writing what handlers answer.
struct RequestsFirst<T> {
    inner: T,
    started: bool,
    /// Awaited once the input has ended, before rmcp hears of it; kept here,
    /// not in `receive`'s future, because rmcp drops that future whenever
    /// something else is ready (a handler's answer) and calls it again.
    at_end: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
    ended: bool,
    /// The server's calls in flight, each `tools/call` counted on receipt.
    tracker: Option<TaskTracker>,
}

/// A `tools/call` counted in flight from its receipt (in its extensions,
/// which rmcp hands its handler): the drain at stdin's end waits for calls
/// already received whose handler has not started yet.
#[derive(Clone)]
struct Received(tokio_util::task::task_tracker::TaskTrackerToken);

impl<T> RequestsFirst<T> {
    fn new(inner: T) -> Self {
        RequestsFirst { inner, started: false, at_end: None, ended: false, tracker: None }
    }

    /// Hold back the end of the input until `server` drained its calls in
    /// flight (within its grace period).
    fn draining_at_end(mut self, server: McpServer) -> Self {
        self.tracker = Some(server.shared.inflight.clone());
        self.at_end = Some(Box::pin(async move { server.drain().await }));
        self
    }
}

impl<T> rmcp::transport::Transport<RoleServer> for RequestsFirst<T>
where
    T: rmcp::transport::Transport<RoleServer>,
{
    type Error = T::Error;

    fn send(
        &mut self,
        item: rmcp::service::TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<rmcp::service::RxJsonRpcMessage<RoleServer>> {
        loop {
            if self.ended {
                if let Some(end) = self.at_end.as_mut() {
                    end.await;
                    self.at_end = None;
                }
                return None;
            }
            let Some(mut message) = self.inner.receive().await else {
                self.ended = true;
                continue;
            };
            if let Some(answer) = oversized_answer(&message) {
                // Spawned: rmcp may drop this future at any await, and the
                // answer must go out all the same.
                tokio::spawn(self.inner.send(answer));
                continue;
            }
            if let Some(answers) = batch_answers(&message) {
                let mut sends = Vec::with_capacity(answers.len());
                for answer in answers {
                    sends.push(self.inner.send(answer));
                }
                tokio::spawn(async move {
                    for send in sends {
                        let _ = send.await;
                    }
                });
                continue;
            }
            if let (rmcp::model::JsonRpcMessage::Request(r), Some(tracker)) = (&mut message, &self.tracker)
                && matches!(r.request, rmcp::model::ClientRequest::CallToolRequest(_))
                && !tracker.is_closed()
            {
                use rmcp::model::GetExtensions as _;
                r.request.extensions_mut().insert(Received(tracker.token()));
            }
            if !self.started {
                if matches!(message, rmcp::model::JsonRpcMessage::Notification(_)) {
                    tracing::debug!("ignoring a notification that arrived before the first request");
                    continue;
                }
                self.started = true;
            }
            return Some(message);
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

/// The longest line (one JSON-RPC message, its newline included) read from
/// a stdio client: rmcp's 16 MiB, or more when `[limits] arguments_kib`
/// allows arguments that would not fit in it.
fn max_line(config: &Config) -> usize {
    let arguments = usize::try_from(config.limits.arguments_kib.saturating_mul(1024)).unwrap_or(usize::MAX);
    rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH.max(arguments.saturating_add(1 << 20))
}

/// The transport of a line-delimited client (stdio): rmcp's, reading
/// through [`Bounded`] so that a message longer than `max_line` is answered
/// (-32600, with its id when the line's start names it) instead of being
/// dropped with no answer — rmcp drops it and the client waited for ever.
fn line_transport<R, W>(
    read: R,
    write: W,
    max_line: usize,
) -> RequestsFirst<rmcp::transport::async_rw::AsyncRwTransport<RoleServer, Bounded<R>, W>>
where
    R: tokio::io::AsyncRead + Send + Unpin,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    // rmcp's own cap past ours: a line it gets is at most ours, plus the
    // two bytes that end a line cut short.
    let inner = rmcp::transport::async_rw::AsyncRwTransport::new_server(Bounded::new(read, max_line), write)
        .with_max_line_length(max_line.saturating_add(64));
    RequestsFirst::new(inner)
}

/// The method of the notification [`Bounded`] puts in place of a line that
/// was too long; [`RequestsFirst`] answers it and rmcp never sees it.
const OVERSIZED: &str = "notifications/toolgate/oversized";

/// The method of the notification [`Bounded`] puts in place of a JSON-RPC
/// batch (a line holding an array); [`RequestsFirst`] answers each request
/// id it names with an error of its own, and rmcp never sees it. rmcp takes
/// no batch: it answered the whole array with one error of id `null`, so
/// no request in it was ever answered and its client waited for ever.
const BATCH: &str = "notifications/toolgate/batch";

/// How much of a line's start is kept to read its id from.
const HEAD: usize = 4096;

/// Reads a line-delimited stream, passing lines of at most `max` bytes (the
/// newline included) as they are. A longer line is cut where it passes the
/// limit — what was passed of it is ended with a NUL and a newline, which no
/// JSON parser takes, so rmcp ignores it — the rest of it is dropped, and in
/// its place comes an [`OVERSIZED`] notification naming the id read from the
/// line's first [`HEAD`] bytes. Memory stays bounded: nothing is held but
/// the line's start and what is being handed on.
pub(crate) struct Bounded<R> {
    inner: R,
    max: usize,
    /// Bytes of the current line passed on so far.
    line: usize,
    /// The current line's first bytes.
    head: Vec<u8>,
    /// Dropping the rest of a line that was too long, up to its newline.
    discarding: bool,
    /// Bytes to hand on before reading more.
    out: Vec<u8>,
    at: usize,
    /// The line so far is white space only (a batch's `[` may come next).
    blank: bool,
    /// The current line, held whole: it opened with `[`, a batch.
    batch: Option<Vec<u8>>,
}

impl<R> Bounded<R> {
    fn new(inner: R, max: usize) -> Self {
        Bounded {
            inner,
            max: max.max(2),
            line: 0,
            head: Vec::new(),
            discarding: false,
            out: Vec::new(),
            at: 0,
            blank: true,
            batch: None,
        }
    }

    /// The line in place of a batch (`line`, whole): a [`BATCH`]
    /// notification naming the id of each request in it. A line that is not
    /// a JSON array, or an empty one, goes on as it is, for rmcp to answer.
    fn batch_line(line: Vec<u8>) -> Vec<u8> {
        let Ok(serde_json::Value::Array(items)) = serde_json::from_slice::<serde_json::Value>(&line) else {
            return line;
        };
        if items.is_empty() {
            return line;
        }
        let ids: Vec<serde_json::Value> = items
            .iter()
            .filter(|m| m.get("method").is_some_and(|m| m.is_string()))
            .filter_map(|m| m.get("id").filter(|id| id.is_string() || id.is_i64()).cloned())
            .collect();
        let mut marker = serde_json::json!({"jsonrpc": "2.0", "method": BATCH,
            "params": {"ids": ids, "messages": items.len()}})
        .to_string()
        .into_bytes();
        marker.push(b'\n');
        marker
    }

    /// Take `data`, as read, into what is handed on.
    fn take(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let newline = data.iter().position(|b| *b == b'\n');
            let end = newline.map_or(data.len(), |i| i + 1);
            let (segment, rest) = data.split_at(end);
            data = rest;
            if self.discarding {
                if newline.is_some() {
                    self.discarding = false;
                }
                continue;
            }
            if self.head.len() < HEAD {
                let more = (HEAD - self.head.len()).min(segment.len());
                self.head.extend_from_slice(&segment[..more]);
            }
            if self.line + segment.len() > self.max {
                // A batch held so far is dropped: it was never handed on.
                let held = self.batch.take().is_some();
                if self.line > 0 && !held {
                    self.out.extend_from_slice(b"\0\n");
                }
                self.blank = true;
                let id = id_at_start(&self.head);
                let marker = serde_json::json!({"jsonrpc": "2.0", "method": OVERSIZED,
                    "params": {"id": id, "max": self.max}});
                self.out.extend_from_slice(marker.to_string().as_bytes());
                self.out.push(b'\n');
                self.discarding = newline.is_none();
                self.line = 0;
                self.head.clear();
                continue;
            }
            self.line += segment.len();
            // A line whose first character past white space is `[`: a batch,
            // held whole (within `max`) to be answered request by request.
            let segment = if self.batch.is_none() && self.blank {
                let text = segment.iter().position(|b| !b.is_ascii_whitespace());
                match text {
                    Some(i) if segment[i] == b'[' => {
                        self.out.extend_from_slice(&segment[..i]);
                        self.batch = Some(Vec::new());
                        &segment[i..]
                    }
                    Some(_) => {
                        self.blank = false;
                        segment
                    }
                    None => segment,
                }
            } else {
                segment
            };
            match self.batch.as_mut() {
                Some(batch) => batch.extend_from_slice(segment),
                None => self.out.extend_from_slice(segment),
            }
            if newline.is_some() {
                if let Some(batch) = self.batch.take() {
                    self.out.extend_from_slice(&Self::batch_line(batch));
                }
                self.line = 0;
                self.blank = true;
                self.head.clear();
            }
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Bounded<R> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = self.get_mut();
        loop {
            if this.at < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.at);
                buf.put_slice(&this.out[this.at..this.at + n]);
                this.at += n;
                if this.at == this.out.len() {
                    this.out.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = tokio::io::ReadBuf::new(&mut chunk);
            match std::pin::Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => this.take(read.filled()),
                other => return other,
            }
        }
    }
}

/// The `id` member of the JSON object that `head` (a line's start) begins,
/// when it comes before any other member's value ends the head: a number or
/// a string; `null` otherwise. Only the object's own members are read, not
/// those nested in a value (`params` may hold an `id` of its own).
fn id_at_start(head: &[u8]) -> serde_json::Value {
    let owned = String::from_utf8_lossy(head);
    let text = owned.trim_start_matches('\u{feff}');
    let mut chars = text.char_indices().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.peek().is_some_and(|(_, c)| c.is_whitespace()) {
            chars.next();
        }
    };
    // A JSON string starting at the current `"`: its raw text, decoded.
    let string = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| -> Option<String> {
        let (start, _) = chars.next()?;
        let mut escaped = false;
        for (i, c) in chars.by_ref() {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                return serde_json::from_str(&text[start..=i]).ok();
            }
        }
        None
    };
    skip_ws(&mut chars);
    if chars.next().map(|(_, c)| c) != Some('{') {
        return serde_json::Value::Null;
    }
    loop {
        skip_ws(&mut chars);
        if chars.peek().map(|(_, c)| *c) != Some('"') {
            return serde_json::Value::Null;
        }
        let Some(key) = string(&mut chars) else { return serde_json::Value::Null };
        skip_ws(&mut chars);
        if chars.next().map(|(_, c)| c) != Some(':') {
            return serde_json::Value::Null;
        }
        skip_ws(&mut chars);
        let Some(&(start, first)) = chars.peek() else { return serde_json::Value::Null };
        if key == "id" {
            if first == '"' {
                return string(&mut chars).map_or(serde_json::Value::Null, serde_json::Value::String);
            }
            let mut end = start;
            while let Some(&(i, c)) = chars.peek() {
                if !(c.is_ascii_digit() || c == '-') {
                    break;
                }
                end = i + 1;
                chars.next();
            }
            // A number must end before the head does.
            if chars.peek().is_none() {
                return serde_json::Value::Null;
            }
            return text[start..end].parse::<i64>().map_or(serde_json::Value::Null, serde_json::Value::from);
        }
        // Skip the value: strings, and nesting, to the comma at this level.
        let mut depth = 0usize;
        loop {
            match chars.peek().map(|(_, c)| *c) {
                None => return serde_json::Value::Null,
                Some('"') => {
                    if string(&mut chars).is_none() {
                        return serde_json::Value::Null;
                    }
                    continue;
                }
                Some('{' | '[') => depth += 1,
                Some('}' | ']') if depth == 0 => return serde_json::Value::Null,
                Some('}' | ']') => depth -= 1,
                Some(',') if depth == 0 => {
                    chars.next();
                    break;
                }
                Some(_) => {}
            }
            chars.next();
        }
    }
}

/// The answer to an [`OVERSIZED`] notification: the JSON-RPC error for the
/// line it stands for.
fn oversized_answer(
    message: &rmcp::service::RxJsonRpcMessage<RoleServer>,
) -> Option<rmcp::model::ServerJsonRpcMessage> {
    let rmcp::model::JsonRpcMessage::Notification(n) = message else { return None };
    let rmcp::model::ClientNotification::CustomNotification(c) = &n.notification else { return None };
    if c.method != OVERSIZED {
        return None;
    }
    let params = c.params.clone().unwrap_or_default();
    let id = match &params["id"] {
        serde_json::Value::Number(n) => n.as_i64().map(rmcp::model::NumberOrString::Number),
        serde_json::Value::String(s) => Some(rmcp::model::NumberOrString::String(s.as_str().into())),
        _ => None,
    };
    let max = params["max"].as_u64().unwrap_or(0);
    let message = format!(
        "the message is longer than the {max} bytes a line may hold (`[limits] arguments_kib` raises it); it was not read"
    );
    Some(rmcp::model::JsonRpcMessage::error(ErrorData::invalid_request(message, None), id))
}

/// The answers to a [`BATCH`] notification: an error for each request id
/// the batch held, saying batches are not taken and to send each request
/// on its own. Nothing in the batch ran (its notifications and responses
/// were not taken either).
fn batch_answers(
    message: &rmcp::service::RxJsonRpcMessage<RoleServer>,
) -> Option<Vec<rmcp::model::ServerJsonRpcMessage>> {
    let rmcp::model::JsonRpcMessage::Notification(n) = message else { return None };
    let rmcp::model::ClientNotification::CustomNotification(c) = &n.notification else { return None };
    if c.method != BATCH {
        return None;
    }
    let params = c.params.clone().unwrap_or_default();
    let count = params["messages"].as_u64().unwrap_or(0);
    tracing::warn!("a JSON-RPC batch of {count} messages was refused: this server takes one message per line");
    let ids = params["ids"].as_array().cloned().unwrap_or_default();
    let answers = ids
        .iter()
        .filter_map(|id| match id {
            serde_json::Value::Number(n) => n.as_i64().map(rmcp::model::NumberOrString::Number),
            serde_json::Value::String(s) => Some(rmcp::model::NumberOrString::String(s.as_str().into())),
            _ => None,
        })
        .map(|id| {
            let message = format!(
                "this server does not take JSON-RPC batches (an array of {count} messages); nothing in the batch was \
                 run or read — send each request as a message of its own, one per line"
            );
            rmcp::model::JsonRpcMessage::error(ErrorData::invalid_request(message, None), Some(id))
        })
        .collect();
    Some(answers)
}

#[cfg(test)]
mod inproc_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every result fits in one message of [`MAX_MESSAGE_BYTES`], as
    /// serialized: an object output of 600 KB went out twice (its JSON
    /// escaped again as text), over the Python client's 1 MiB SSE event.
    #[test]
    fn a_result_is_held_to_one_message_and_one_too_large_says_it_ran() {
        let output = |v: serde_json::Value| StepResult::Output { seq: 7, content: Content::Json(v) };
        let sent = |r: &CallToolResult| json_len(r) + ENVELOPE_BYTES;
        // Small: as it was, text and structured content.
        let small = output(json!({"n": 1}));
        let r = to_mcp_result("t", &small, true);
        assert_eq!((r.structured_content.clone(), r.is_error), (Some(json!({"n": 1})), Some(false)));
        assert_eq!(json_len(&r.content), json_len(&vec![ContentBlock::text("{\"n\":1}")]));
        // 400 KB of quotes: 2.4 MB as sent before (each `"` 4 bytes in the text
        // copy, 2 in the structured content); now the structured content alone.
        let quotes = json!({"q": "\"".repeat(400_000)});
        let r = to_mcp_result("t", &output(quotes.clone()), true);
        assert!(sent(&r) <= MAX_MESSAGE_BYTES, "{}", sent(&r));
        assert!(r.structured_content.as_ref() == Some(&quotes) && r.is_error == Some(false));
        // The same as plain text (no object schema): too large, an error that it ran.
        let r = to_mcp_result("t", &output(quotes), false);
        let text = serde_json::to_string(&r.content).unwrap();
        assert!(r.structured_content.is_none() && r.is_error == Some(true));
        assert!(text.contains("`t` ran and its result was recorded in the host's journal as step #7"), "{text}");
        assert!(
            text.contains(&format!("over the {MAX_MESSAGE_BYTES} bytes")) && text.contains("toolgate journal --json"),
            "{text}"
        );
        assert!(sent(&r) < 2_000, "{}", sent(&r));
        // A text output just under the bound passes whole; one byte more does not.
        let fitting =
            |n: usize| to_mcp_result("t", &StepResult::Output { seq: 1, content: Content::Text("a".repeat(n)) }, false);
        let base = sent(&fitting(0));
        assert_eq!(sent(&fitting(MAX_MESSAGE_BYTES - base)), MAX_MESSAGE_BYTES);
        assert_eq!(fitting(MAX_MESSAGE_BYTES - base).is_error, Some(false));
        assert_eq!(fitting(MAX_MESSAGE_BYTES - base + 1).is_error, Some(true));
    }

    /// A `tools/list` over the bound is paged by size, every page within it
    /// and together the whole list in order; a cursor from before a reload,
    /// or one this server did not make, is refused (-32602).
    #[test]
    fn a_tool_list_over_one_message_is_paged_and_a_stale_cursor_is_refused() {
        let tool = |i: usize, description: usize| {
            let mut t = Tool::new(format!("t{i:03}"), "d".repeat(description), Arc::new(Default::default()));
            t.title = Some(format!("t.{i:03}"));
            t
        };
        let tools: Vec<Tool> = (0..50).map(|i| tool(i, 1_000)).collect();
        let sent = |r: &ListToolsResult| json_len(r) + ENVELOPE_BYTES;
        // Under the bound: the whole list, no cursor (as before).
        let whole = tools_page(tools.clone(), 3, None, MAX_MESSAGE_BYTES).unwrap();
        assert_eq!((whole.tools.len(), whole.next_cursor.as_deref()), (50, None));
        // Over a bound of 12,000 bytes: pages of it, in order, each within it.
        let (max, mut cursor, mut listed) = (12_000, None, Vec::new());
        loop {
            let page = tools_page(tools.clone(), 3, cursor.as_deref(), max).unwrap();
            assert!(sent(&page) <= max && !page.tools.is_empty(), "{}", sent(&page));
            listed.extend(page.tools.iter().map(|t| t.name.to_string()));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
            assert!(listed.len() < 50, "a page past the end");
        }
        assert_eq!(listed, tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>());
        // The second page's cursor, after a reload (generation 4), and forged ones.
        let second = tools_page(tools.clone(), 3, None, max).unwrap().next_cursor.unwrap();
        for stale in [second.as_str(), "tools.3.51", "tools.x.1", "1", ""] {
            let generation = if stale == second { 4 } else { 3 };
            let e = tools_page(tools.clone(), generation, Some(stale), max).unwrap_err();
            assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{stale}");
            assert!(e.message.contains("list the tools again from the start"), "{}", e.message);
        }
        // A tool too large for any page is left out; the others are listed.
        let mut with_huge = tools.clone();
        with_huge.insert(7, tool(999, 20_000));
        let (mut cursor, mut listed) = (None, 0);
        loop {
            let page = tools_page(with_huge.clone(), 3, cursor.as_deref(), max).unwrap();
            assert!(page.tools.iter().all(|t| t.name != "t999"));
            listed += page.tools.len();
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(listed, 50);
        // A tool that exactly fills a page alone is listed on its own page:
        // before, it was kept but fit no page (charged a comma it does not
        // have), and the page came back empty with its own cursor — a
        // client following it looped forever.
        let base = {
            let mut r = ListToolsResult::with_all_items(Vec::new());
            r.next_cursor = Some(format!("tools.3.{}", usize::MAX));
            json_len(&r)
        };
        let room = max - ENVELOPE_BYTES - base;
        let n = (0..room).find(|&n| json_len(&tool(998, n)) == room).expect("a description that fills a page");
        let mut with_full = tools.clone();
        with_full.insert(20, tool(998, n));
        let (mut cursor, mut names, mut pages) = (None, Vec::new(), 0);
        loop {
            let page = tools_page(with_full.clone(), 3, cursor.as_deref(), max).unwrap();
            assert!(!page.tools.is_empty() && sent(&page) <= max, "page {pages}");
            names.extend(page.tools.iter().map(|t| t.name.to_string()));
            pages += 1;
            assert!(pages < 60, "pages without end");
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(names, with_full.iter().map(|t| t.name.to_string()).collect::<Vec<_>>());
    }

    /// A batch (a line holding an array), however its bytes arrive, is
    /// handed on as one [`BATCH`] notification naming its requests' ids;
    /// other lines pass as they are, and a batch past the line limit is
    /// answered as any line too long.
    #[test]
    fn a_batch_line_is_replaced_by_the_ids_of_its_requests() {
        let batch = r#"[{"jsonrpc":"2.0","id":5,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":"six","method":"tools/list"}]"#;
        let line = format!("  {batch}\n{{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}}\n");
        for cut in [1, 2, 3, 10, line.len() - 1] {
            let mut b = Bounded::new(tokio::io::empty(), 1 << 20);
            b.take(&line.as_bytes()[..cut]);
            b.take(&line.as_bytes()[cut..]);
            let out = String::from_utf8(b.out.clone()).unwrap();
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 2, "{out}");
            let marker: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
            assert_eq!(marker["method"], BATCH, "cut at {cut}: {out}");
            assert_eq!(marker["params"]["ids"], json!([5, "six"]), "{out}");
            assert_eq!(lines[1], r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
        }
        // Not JSON, or an empty array: as it is (rmcp answers or ignores it).
        for same in ["[1, 2\n", "[]\n"] {
            let mut b = Bounded::new(tokio::io::empty(), 1 << 20);
            b.take(same.as_bytes());
            assert_eq!(b.out, same.as_bytes());
        }
        // Past the limit: the oversized notice, the batch never handed on.
        let mut b = Bounded::new(tokio::io::empty(), 64);
        b.take(format!("{batch}\n").as_bytes());
        let out = String::from_utf8(b.out.clone()).unwrap();
        assert!(out.contains(OVERSIZED) && !out.contains("tools/list"), "{out}");
    }

    #[test]
    fn only_an_explicit_confirmation_approves_and_only_an_explicit_no_denies() {
        assert_eq!(decision_of(&json!({"action": "accept", "content": {"confirm": true}})), Decision::Approve);
        for denied in [
            json!({"action": "accept", "content": {"confirm": false}}),
            json!({"action": "decline"}),
            json!({"action": "decline", "content": {"confirm": true}}),
        ] {
            assert!(matches!(decision_of(&denied), Decision::Deny(_)), "{denied}");
        }
        // No explicit choice: not the human's denial, the request stays pending.
        for undecided in [
            json!({"action": "cancel"}),
            json!({"action": "cancel", "content": {"confirm": true}}),
            json!({"action": "accept", "content": {"confirm": "true"}}),
            json!({"action": "accept", "content": {}}),
            json!({"action": "accept"}),
            json!({"action": "ACCEPT", "content": {"confirm": true}}),
            json!({"action": "dismiss"}),
            json!({"content": {"confirm": true}}),
            json!(null),
        ] {
            assert!(matches!(decision_of(&undecided), Decision::Undecided(_)), "{undecided}");
        }
    }

    #[test]
    fn no_ticket_id_reaches_the_client_in_an_error() {
        use toolgate::store::TicketError;
        let t = "tkt-99425ace523c3ea239789211b7ec0e5f".to_owned();
        for e in [
            TicketError::Unknown(t.clone()),
            TicketError::Used(t.clone()),
            TicketError::Expired(t.clone()),
            TicketError::Settled(t.clone()),
            TicketError::ComponentChanged { ticket: t.clone(), tool: "notes".into(), was: "a".into(), now: "b".into() },
        ] {
            let named = call_error("notes", CallError::Ticket(e.clone()), Some("call-1"));
            assert!(named.message.contains("request call-1") && !named.message.contains("tkt-"), "{e:?}: {named:?}");
            let unnamed = call_error("notes", CallError::Ticket(e.clone()), None);
            assert!(!unnamed.message.contains("tkt-"), "{e:?}: {unnamed:?}");
            let raw = ErrorData::internal_error(e.to_string(), Some(json!({ "t": t })));
            assert!(!scrubbed(raw).message.contains("tkt-"));
        }
        // An approval refused because the record changed since it was shown.
        let changed = ApprovalError::ChangedSinceShown { ticket: t.clone() };
        let named = call_error("notes", CallError::Approval(changed), Some("call-1"));
        assert!(named.message.contains("request call-1 changed") && !named.message.contains("tkt-"), "{named:?}");
        assert_eq!(
            without_tickets("ticket `TKT-ab_c-1` and tkt-ff, tkt-; é tkt"),
            "ticket `[ticket withheld]` and [ticket withheld], [ticket withheld]; é tkt"
        );
        assert!(scrubbed(ErrorData::internal_error("x", Some(json!(["tkt-1"])))).data.is_none());
    }

    /// The journal failing after the Tool ran is told as a call that ran,
    /// whose result was not recorded — check its effects before calling
    /// again — never as "nothing ran" (a model that believed it repeated the
    /// effects); failing before it ran still says nothing ran. Neither names
    /// the journal's path.
    #[test]
    fn a_call_that_ran_but_was_not_recorded_is_not_told_as_not_run() {
        use toolgate::store::CommitError;
        let full = || CommitError::Group { path: "/srv/secret/journal.db".into(), message: "disk is full".into() };
        let ran = CallError::RanUnrecorded { tool: "notes".into(), request: "call-1".into(), error: full() };
        let told = call_error("notes", ran, None).message;
        assert!(told.contains("`notes` ran") && told.contains("not recorded"), "{told}");
        assert!(told.contains("check its effects before making the call again"), "{told}");
        assert!(!told.contains("nothing") && !told.contains("/srv/secret") && !told.contains("disk is full"), "{told}");
        let before = call_error("notes", CallError::Commit(full()), None).message;
        assert!(before.contains("nothing of this call was recorded (or run)") && !before.contains("/srv"), "{before}");
    }

    /// Tool names every client takes (`^[a-zA-Z0-9_-]{1,64}$`): Claude
    /// Desktop refused a whole server listing `files.read`, and Codex any
    /// name with a dot. Before, the id went out as the name.
    #[test]
    fn every_listed_name_is_one_every_client_takes_and_maps_back_to_its_id() {
        let long = format!("mcp__{}__{}", "a".repeat(40), "list_open_issues_for_repository_with_labels");
        let ids = ["files.read", "text.upper", "tracker.issues", "notes", "é.tool", "", long.as_str(), "a b/c"];
        let names = ToolNames::new(ids);
        let mut seen = std::collections::HashSet::new();
        for id in ids {
            let name = names.listed(id).unwrap_or_else(|| panic!("{id:?} listed"));
            assert!(portable_name(name), "{id:?} → {name:?}");
            assert!(seen.insert(name.to_owned()), "{name} given twice");
            assert_eq!(names.id(name), Ok(Some(id)), "{name} maps back");
        }
        assert_eq!(names.listed("files.read"), Some("files_read"));
        assert_eq!(names.listed("notes"), Some("notes"), "a portable id is its own name");
        // The real id is still taken (clients that called by it before).
        assert_eq!(names.id("files.read"), Ok(Some("files.read")));
        assert_eq!(names.id("no.such"), Ok(None));
        // Deterministic, whatever the order: the same after a restart.
        let mut reversed = ids;
        reversed.reverse();
        let again = ToolNames::new(reversed);
        assert!(ids.iter().all(|id| again.listed(id) == names.listed(id)));
    }

    /// An id of `mcp import` (`mcp__NAME__tool`) past 64 characters is cut
    /// and tagged with its hash: two that share their first 55 characters
    /// still get two names.
    #[test]
    fn a_long_imported_id_is_cut_and_tagged_with_its_hash() {
        let prefix = format!("mcp__github__{}", "x".repeat(60));
        let (a, b) = (format!("{prefix}_alpha"), format!("{prefix}_beta"));
        let names = ToolNames::new([a.as_str(), b.as_str()]);
        let (na, nb) = (names.listed(&a).unwrap(), names.listed(&b).unwrap());
        assert_eq!(na.len(), 64, "{na}");
        assert_ne!(na, nb);
        let tag = &hex::encode(Sha256::digest(a.as_bytes()))[..8];
        assert_eq!(na, format!("{}_{tag}", &a[..55]));
        assert_eq!((names.id(na), names.id(nb)), (Ok(Some(a.as_str())), Ok(Some(b.as_str()))));
    }

    /// Ids that get one name (`a.b`, `a/b` and `a_b` → `a_b`) make it
    /// ambiguous, as two components claiming one id are: none is listed
    /// under it and a call by it is refused naming every id — never given to
    /// one of them. Each is still called by its real id. Before, `a_b` kept
    /// the name and the others were renamed by the rest of the list.
    #[test]
    fn a_name_two_ids_get_is_ambiguous_never_first_wins() {
        let names = ToolNames::new(["a.b", "a/b", "a_b", "c"]);
        for id in ["a.b", "a/b", "a_b"] {
            assert_eq!(names.listed(id), None, "{id} is not listed under an ambiguous name");
        }
        let refused = names.id("a_b").unwrap_err();
        assert_eq!(refused.ids, ["a.b", "a/b", "a_b"]);
        let message = refused.to_string();
        assert!(message.contains("`a.b`") && message.contains("`a/b`") && message.contains("real id"), "{message}");
        assert_eq!(names.id("a.b"), Ok(Some("a.b")), "the real id still calls it");
        assert_eq!(names.id("a/b"), Ok(Some("a/b")));
        assert_eq!(names.listed("c"), Some("c"));
    }

    /// A name is a function of its id alone: adding ids never renames a tool
    /// — it only makes a name ambiguous, which then calls nothing. Before,
    /// adding a plugin `files_read` gave it the name `files.read` had been
    /// listed under, and a client that had not listed again ran it.
    #[test]
    fn a_name_does_not_change_when_ids_are_added_unless_it_becomes_ambiguous() {
        let before = ToolNames::new(["files.read", "notes"]);
        assert_eq!(before.listed("files.read"), Some("files_read"));
        let long = "x".repeat(70);
        let more = ["files.read", "notes", "files_read", "text.upper", "files-read", long.as_str()];
        let after = ToolNames::new(more);
        assert!(after.id("files_read").is_err(), "the stale name calls neither tool");
        assert_eq!(after.id("files.read"), Ok(Some("files.read")));
        for id in more {
            assert_eq!(after.listed(id).is_none(), tool_name(id) == "files_read", "{id}");
            if let Some(name) = after.listed(id) {
                assert_eq!(name, tool_name(id), "{id}: named by itself");
            }
        }
        assert_eq!(after.listed("notes"), before.listed("notes"));
    }

    /// Ids crafted to fill every candidate of the old search (`files_read`,
    /// then `files_read_` and 8, 16, 32 hex digits of the SHA-256 of
    /// `files.read`) drove it past its last candidate, where `64 - 1 - n`
    /// underflowed: a panic on every list and call of the agent in a debug
    /// build, a 75-character name in a release one. Now no name is searched
    /// for: each is portable, and a clash is an ambiguity.
    #[test]
    fn crafted_ids_neither_panic_nor_give_a_name_clients_refuse() {
        let digest = hex::encode(Sha256::digest(b"files.read"));
        let mut ids = vec!["files.read".to_owned(), "files_read".to_owned()];
        for n in [8, 16, 32, 64] {
            ids.push(format!("files_read_{}", &digest[..n]));
        }
        ids.push(digest[..NAME_MAX].to_owned());
        ids.push(format!("x{}", &digest[..NAME_MAX]));
        let names = ToolNames::new(ids.iter().map(String::as_str));
        for id in &ids {
            if let Some(name) = names.listed(id) {
                assert!(portable_name(name), "{id} → {name}");
                assert_eq!(names.id(name), Ok(Some(id.as_str())));
            }
            assert!(portable_name(&tool_name(id)), "{id}");
        }
        assert!(names.id("files_read").is_err());
        for len in [0, 1, 63, 64, 65, 200] {
            let id = ".".repeat(len);
            assert!(portable_name(&tool_name(&id)), "{len} dots → {}", tool_name(&id));
        }
    }

    /// A line past the limit is answered with -32600 and the id its start
    /// names; an `id` inside `params` is not taken for it.
    #[test]
    fn the_id_of_a_line_is_read_from_its_start_only() {
        let id = |s: &str| id_at_start(s.as_bytes());
        assert_eq!(id(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"#), json!(7));
        assert_eq!(id(r#" {"id" : "abc\"d", "method""#), json!("abc\"d"));
        assert_eq!(id(r#"{"jsonrpc":"2.0","method":"x","params":{"id":3,"a":[1,{"id":4}]},"id":-5,"#), json!(-5));
        assert_eq!(id(r#"{"method":"x","params":{"id":3,"text":"aaaa"#), json!(null));
        assert_eq!(id(r#"{"id":12"#), json!(null), "a number the head may have cut");
        assert_eq!(id(r#"{"method":"x"}, "id": 3"#), json!(null));
        assert_eq!(id("not json"), json!(null));
    }

    #[test]
    fn only_a_well_formed_traceparent_is_logged() {
        assert!(is_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\ninjected",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert!(!is_traceparent(bad), "{bad:?}");
        }
    }
}
