//! Runtime: the path of one call, top to bottom (DESIGN.md "The path of one call").
//!
//! ```text
//! snapshot ─► descriptor ─► availability & capability filter ─► argument validation
//!          ─► gate ─┬─ Allow ─────────────► executor ─► Step commit
//!                   ├─ Deny ──────────────► blocked result ─► Step commit
//!                   └─ RequireConfirmation ► Awaiting + ResumeTicket ─► Step commit
//! ```
//!
//! Owns the sequence and nothing else: each decision is made by its own module
//! (snapshot, gate, executor, commit) and this module only calls them in
//! order. Every call that reaches a Tool ends in exactly one Step commit.
//!
//! Architecture invariant: there is no path from a call to the executor that
//! does not pass the gate; approval of a ticket goes through the gate again
//! (`gate::decide_resumed`), so a Deny rule in force wins over an approval.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::authority::narrowing::ToolCapabilityNarrowing;
use crate::config::Restriction;
use crate::policy::gate::{self, GateOutcome, ToolCall, ToolPermissionVerdict};
use crate::sandbox::executor::{Captured, Content, Execution, Executor, ExecutorError, GuestCommand, ToolFailure};
use crate::snapshot::{Candidate, ExecutableAgentSnapshot};
use crate::store::{
    AwaitingRecord, ClaimedTicket, CommitError, NewStep, OutcomeKind, RunRecord, StateChange, StepStore, TicketError,
    Verdict,
};

/// A claim older than this is settled as interrupted even if its process
/// cannot be checked (another machine, PID reuse): far beyond any deadline.
pub const CLAIM_LEASE_SECS: i64 = 3600;

/// Whether process `pid` exists on this machine. Where that cannot be told
/// (not Linux), assume it does: only the lease then settles its claims.
fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") { Path::new(&format!("/proc/{pid}")).exists() } else { true }
}

/// Largest state key a Command may write.
pub const MAX_STATE_KEY: usize = 256;

/// What a call ended as. Every variant was committed.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// The Tool's output.
    Output {
        /// Journal sequence.
        seq: i64,
        /// Content for the model.
        content: Content,
    },
    /// A Tool error the model reads (invalid arguments, failure, trap, timeout, OOM).
    ToolError {
        /// Journal sequence.
        seq: i64,
        /// Model-visible message.
        message: String,
    },
    /// The gate or the filter blocked it; the model reads the reason.
    Blocked {
        /// Journal sequence.
        seq: i64,
        /// Why.
        reason: String,
    },
    /// A human must approve; the ticket resumes it.
    Awaiting {
        /// Journal sequence.
        seq: i64,
        /// The ticket id.
        ticket: String,
        /// Unix seconds.
        expires_at: i64,
    },
}

impl StepResult {
    /// The text the model reads.
    pub fn model_text(&self) -> String {
        match self {
            StepResult::Output { content: Content::Json(v), .. } => v.to_string(),
            StepResult::Output { content: Content::Text(t), .. } => t.clone(),
            StepResult::ToolError { message, .. } => message.clone(),
            StepResult::Blocked { reason, .. } => format!("blocked: {reason}"),
            StepResult::Awaiting { ticket, .. } => {
                format!("awaiting human approval; approve with `toolgate approve {ticket}`")
            }
        }
    }
}

/// Errors for which someone outside the agent loop must act. Nothing about
/// them is a Tool result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The Tool is not visible or not installed: to the model it does not exist.
    #[error("unknown tool `{0}`; `toolgate list` shows the tools this agent can call")]
    UnknownTool(String),
    /// The executor could not run the call (committed as an executor error).
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// A ticket cannot be used.
    #[error(transparent)]
    Ticket(#[from] TicketError),
    /// The journal failed.
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// The stored call belongs to another agent than this runtime serves.
    #[error("ticket belongs to agent `{ticket_agent}`; run this with `--agent {ticket_agent}`")]
    WrongAgent {
        /// The ticket's agent.
        ticket_agent: String,
    },
}

/// One agent's runtime over an executor and a store.
pub struct Runtime {
    snapshot: ExecutableAgentSnapshot,
    executor: Arc<Executor>,
    store: Arc<dyn StepStore>,
    ticket_ttl_secs: i64,
}

/// A run: a sequence of steps under one narrowing.
pub struct Run<'r> {
    runtime: &'r Runtime,
    id: String,
    /// Replaced (never mutated) when a Skill activates and narrows the run.
    snapshot: std::sync::Mutex<Arc<ExecutableAgentSnapshot>>,
}

/// A random id with `prefix` (128 bits: unguessable, so a ticket id is a capability).
pub fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 16];
    // The OS RNG failing is not recoverable for id generation.
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        b = t.to_le_bytes();
    }
    format!("{prefix}-{}", hex::encode(b))
}

/// A call id: unique, not secret (tickets carry the authority, not call ids),
/// so a per-process random prefix and a counter do instead of an OS RNG call.
fn call_id() -> String {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| new_id("call"));
    format!("{prefix}-{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

impl Runtime {
    /// A runtime for `snapshot`.
    pub fn new(
        snapshot: ExecutableAgentSnapshot,
        executor: Arc<Executor>,
        store: Arc<dyn StepStore>,
        ticket_ttl_secs: u64,
    ) -> Self {
        Runtime { snapshot, executor, store, ticket_ttl_secs: ticket_ttl_secs as i64 }
    }

    /// Settle tickets whose approving host died before committing the result
    /// (see [`StepStore::settle_interrupted`]): claimed by a process that is
    /// gone, or more than [`CLAIM_LEASE_SECS`] ago. Hosts call this at start.
    pub async fn settle_interrupted(&self) -> Result<Vec<String>, CommitError> {
        let me = std::process::id();
        let alive = move |pid: u32| pid == me || process_alive(pid);
        self.store.settle_interrupted(crate::store::now() - CLAIM_LEASE_SECS, &alive).await
    }

    /// The same runtime over a new snapshot (a reload): same executor, same store.
    pub fn with_snapshot(&self, snapshot: ExecutableAgentSnapshot) -> Runtime {
        Runtime {
            snapshot,
            executor: self.executor.clone(),
            store: self.store.clone(),
            ticket_ttl_secs: self.ticket_ttl_secs,
        }
    }

    /// The agent's snapshot.
    pub fn snapshot(&self) -> &ExecutableAgentSnapshot {
        &self.snapshot
    }
    /// The executor.
    pub fn executor(&self) -> &Arc<Executor> {
        &self.executor
    }
    /// The store.
    pub fn store(&self) -> &Arc<dyn StepStore> {
        &self.store
    }

    /// Descriptors the model sees.
    pub fn list(&self) -> Vec<toolgate_sdk::ToolDescriptor> {
        self.snapshot.list(&|d| self.executor.unhealthy(d))
    }

    /// Start a run, optionally narrowed (e.g. `DenyAll`: tools disabled).
    pub async fn start_run(
        &self,
        id: Option<String>,
        narrowing: ToolCapabilityNarrowing,
    ) -> Result<Run<'_>, CommitError> {
        self.start_restricted_run(id, narrowing, Restriction::default()).await
    }

    /// Start a run whose Tools get at most `restriction` of their granted
    /// authority (intersected with the agent's): a run can only remove.
    pub async fn start_restricted_run(
        &self,
        id: Option<String>,
        narrowing: ToolCapabilityNarrowing,
        restriction: Restriction,
    ) -> Result<Run<'_>, CommitError> {
        let (id, continued) = match id {
            Some(id) => (id, true),
            None => (new_id("run"), false),
        };
        let mut snapshot = self.snapshot.narrowed(narrowing).restricted(restriction);
        if continued {
            // Skills activated earlier in this run (maybe by another process) still narrow it.
            snapshot = self.with_run_skills(snapshot, &id).await?;
        }
        let n = match snapshot.narrowing() {
            ToolCapabilityNarrowing::Configured => "configured",
            ToolCapabilityNarrowing::DenyAll => "deny-all",
        };
        self.store.begin_run(&RunRecord { run_id: &id, agent: self.snapshot.agent(), narrowing: n }).await?;
        Ok(Run { runtime: self, id, snapshot: std::sync::Mutex::new(Arc::new(snapshot)) })
    }

    /// `snapshot` narrowed by every Skill the journal shows activated in run
    /// `run_id` (an output step of a Skill Tool with `allowed-tools`).
    async fn with_run_skills(
        &self,
        mut snapshot: ExecutableAgentSnapshot,
        run_id: &str,
    ) -> Result<ExecutableAgentSnapshot, CommitError> {
        let catalog = snapshot.catalog().clone();
        let skills = catalog.narrowing_skills();
        // Most catalogs hold no narrowing Skill: then there is nothing to look up.
        if skills.is_empty() {
            return Ok(snapshot);
        }
        for id in self.store.output_tools(run_id).await? {
            if let Some(allowed) = skills.get(&id) {
                snapshot = snapshot.with_skill(&id, allowed);
            }
        }
        Ok(snapshot)
    }

    /// Approve a ticket: execute exactly the stored call, once.
    pub async fn approve(&self, ticket_id: &str) -> Result<StepResult, CallError> {
        let ticket = self.claim(ticket_id).await?;
        let r = ticket.record().clone();
        // The gate decides again on the run's view now, Skills activated since included.
        let snapshot = self.with_run_skills(self.snapshot.clone(), &r.run_id).await?;
        let call = stored_call(&r);
        let step = Step { run_id: &r.run_id, agent: &r.agent, call: &call };
        let candidate = match snapshot.candidate(&call.tool_id, &|d| self.executor.unhealthy(d)) {
            Ok(c) => c,
            Err(removal) => {
                let reason = format!("`{}` is no longer available: {removal}", call.tool_id);
                let seq = step.resolve(self, ticket, Ending::blocked(Verdict::None, &reason)).await?;
                return Ok(StepResult::Blocked { seq, reason });
            }
        };
        if ticket.component_digest() != &candidate.installed.component.digest {
            let err = TicketError::ComponentChanged {
                ticket: ticket_id.to_owned(),
                tool: call.tool_id.clone(),
                was: ticket.component_digest().to_string(),
                now: candidate.installed.component.digest.to_string(),
            };
            step.resolve(self, ticket, Ending::blocked(Verdict::None, &err.to_string())).await?;
            return Err(err.into());
        }
        let verdict = gate::decide_resumed(&snapshot, &candidate, &call, &ticket);
        match GateOutcome::from_verdict(verdict, candidate, call.clone()) {
            GateOutcome::Execute(allowed) => {
                let state = self.store.tool_state(&r.agent, &call.tool_id).await?;
                let exec = self.executor.execute(&allowed, state).await;
                step.finish(self, Some(ticket), exec).await
            }
            GateOutcome::Blocked { reason } => {
                let seq = step.resolve(self, ticket, Ending::blocked(Verdict::Deny, &reason)).await?;
                Ok(StepResult::Blocked { seq, reason })
            }
            // decide_resumed never asks again; treat it as a block rather than loop.
            GateOutcome::AwaitConfirmation { .. } => {
                let reason = "the approval could not be applied".to_owned();
                let seq = step.resolve(self, ticket, Ending::blocked(Verdict::Ask, &reason)).await?;
                Ok(StepResult::Blocked { seq, reason })
            }
        }
    }

    /// Deny a ticket: commit a blocked result; nothing executes.
    pub async fn deny(&self, ticket_id: &str, reason: &str) -> Result<StepResult, CallError> {
        let ticket = self.claim(ticket_id).await?;
        let r = ticket.record().clone();
        let call = stored_call(&r);
        let step = Step { run_id: &r.run_id, agent: &r.agent, call: &call };
        let reason = format!("a human denied `{}`: {reason}", call.tool_id);
        let seq = step.resolve(self, ticket, Ending::blocked(Verdict::Deny, &reason)).await?;
        Ok(StepResult::Blocked { seq, reason })
    }

    async fn claim(&self, ticket_id: &str) -> Result<ClaimedTicket, CallError> {
        let ticket = self.store.claim_ticket(ticket_id, crate::store::now()).await??;
        if ticket.record().agent != self.snapshot.agent() {
            let ticket_agent = ticket.record().agent.clone();
            // Not ours to resolve: put nothing back into play, but say whose it is.
            self.store.abandon_ticket(ticket, "claimed by the wrong agent").await?;
            return Err(CallError::WrongAgent { ticket_agent });
        }
        Ok(ticket)
    }
}

impl Run<'_> {
    /// The run id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The run's current view (narrowed by every Skill activated in it).
    pub fn snapshot(&self) -> Arc<ExecutableAgentSnapshot> {
        self.snapshot.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Make one call: the whole path of DESIGN.md, ending in one Step commit.
    pub async fn call(&self, tool_id: &str, arguments: Value) -> Result<StepResult, CallError> {
        self.call_in(&self.snapshot(), tool_id, arguments).await
    }

    async fn call_in(
        &self,
        snapshot: &ExecutableAgentSnapshot,
        tool_id: &str,
        arguments: Value,
    ) -> Result<StepResult, CallError> {
        let rt = self.runtime;
        let call = ToolCall { call_id: call_id(), tool_id: tool_id.to_owned(), arguments: normalize(arguments) };
        let step = Step { run_id: &self.id, agent: snapshot.agent(), call: &call };

        // 1. Visibility and availability: can only remove.
        let candidate = match snapshot.candidate(tool_id, &|d| rt.executor.unhealthy(d)) {
            Ok(c) => c,
            Err(r) if r.is_unknown_to_model() => return Err(CallError::UnknownTool(tool_id.to_owned())),
            Err(removal) => {
                let reason = format!("`{tool_id}` is unavailable: {removal}");
                let seq = step.commit(rt, Ending::blocked(Verdict::None, &reason), None).await?;
                return Ok(StepResult::Blocked { seq, reason });
            }
        };

        // 2. Arguments against the descriptor's schema: before the gate, nothing instantiated.
        if let Err(message) = candidate.installed.tool.validate_arguments(&call.arguments) {
            let ending = Ending { outcome: OutcomeKind::ToolError, ..Ending::blocked(Verdict::None, &message) };
            let seq = step.commit(rt, ending, None).await?;
            return Ok(StepResult::ToolError { seq, message });
        }

        // 3. The gate on the exact call.
        let verdict = gate::decide(snapshot, &candidate, &call);
        let verdict_kind = verdict_kind(&verdict);
        match GateOutcome::from_verdict(verdict, candidate.clone(), call.clone()) {
            // 4. Effect and durable result.
            GateOutcome::Execute(allowed) => {
                let state = rt.store.tool_state(snapshot.agent(), tool_id).await?;
                let exec = rt.executor.execute(&allowed, state).await;
                let result = step.finish(rt, None, exec).await?;
                if let (StepResult::Output { .. }, Some(skill)) = (&result, &candidate.installed.tool.metadata.skill) {
                    self.activate(tool_id, skill);
                }
                Ok(result)
            }
            GateOutcome::Blocked { reason } => {
                let seq = step.commit(rt, Ending::blocked(verdict_kind, &reason), None).await?;
                Ok(StepResult::Blocked { seq, reason })
            }
            GateOutcome::AwaitConfirmation { correlation_id } => {
                let awaiting = awaiting_record(rt, &self.id, snapshot.agent(), &call, &candidate, &correlation_id);
                let text = format!("awaiting approval: ticket {}", awaiting.ticket_id);
                let ending = Ending { outcome: OutcomeKind::Awaiting, ..Ending::blocked(verdict_kind, &text) };
                let seq = step.commit(rt, ending, Some(&awaiting)).await?;
                Ok(StepResult::Awaiting { seq, ticket: awaiting.ticket_id, expires_at: awaiting.expires_at })
            }
        }
    }
}

impl Run<'_> {
    /// A Skill ran: from now on this run may only call its `allowed-tools`
    /// (intersected with everything already in force — it only narrows).
    fn activate(&self, skill_id: &str, skill: &toolgate_sdk::metadata::SkillInfo) {
        let Some(allowed) = &skill.allowed_tools else { return };
        let mut current = self.snapshot.lock().unwrap_or_else(|p| p.into_inner());
        *current = Arc::new(current.with_skill(skill_id, allowed));
    }
}

fn awaiting_record(
    rt: &Runtime,
    run_id: &str,
    agent: &str,
    call: &ToolCall,
    candidate: &Candidate,
    correlation_id: &str,
) -> AwaitingRecord {
    AwaitingRecord {
        ticket_id: new_id("tkt"),
        run_id: run_id.to_owned(),
        agent: agent.to_owned(),
        call_id: correlation_id.to_owned(),
        tool_id: call.tool_id.clone(),
        arguments: call.arguments.to_string(),
        argument_digest: gate::argument_digest(&call.arguments),
        component_digest: candidate.installed.component.digest,
        expires_at: crate::store::now() + rt.ticket_ttl_secs,
        state: "pending".into(),
    }
}

/// The call an Awaiting record stores.
fn stored_call(r: &AwaitingRecord) -> ToolCall {
    ToolCall {
        call_id: r.call_id.clone(),
        tool_id: r.tool_id.clone(),
        // Stored by us from a Value; unreadable JSON cannot match the ticket's
        // argument digest, so the gate refuses it.
        arguments: serde_json::from_str(&r.arguments).unwrap_or(Value::Null),
    }
}

/// JSON `null` arguments mean `{}`.
fn normalize(arguments: Value) -> Value {
    match arguments {
        Value::Null => Value::Object(Default::default()),
        v => v,
    }
}

fn verdict_kind(v: &ToolPermissionVerdict) -> Verdict {
    match v {
        ToolPermissionVerdict::Allow => Verdict::Allow,
        ToolPermissionVerdict::Deny { .. } => Verdict::Deny,
        ToolPermissionVerdict::RequireConfirmation { .. } => Verdict::Ask,
    }
}

/// The step being committed: the one place results reach the store.
struct Step<'a> {
    run_id: &'a str,
    agent: &'a str,
    call: &'a ToolCall,
}

/// What a step ended as: the plain data the Step commit writes.
struct Ending<'a> {
    verdict: Verdict,
    outcome: OutcomeKind,
    /// What the model reads.
    text: &'a str,
    captured: &'a Captured,
    /// The Tool's Commands, already checked to be in its scope.
    changes: &'a [StateChange],
}

static NOTHING_CAPTURED: std::sync::LazyLock<Captured> = std::sync::LazyLock::new(Captured::default);

impl<'a> Ending<'a> {
    /// A result that ran nothing: blocked by `verdict` (or, with another
    /// `outcome`, an error found before the gate), nothing captured or changed.
    fn blocked(verdict: Verdict, text: &'a str) -> Self {
        Ending { verdict, outcome: OutcomeKind::Blocked, text, captured: &NOTHING_CAPTURED, changes: &[] }
    }
}

impl Step<'_> {
    fn record<'s>(&'s self, ending: &Ending<'s>, args: &'s str, captured: &'s str) -> NewStep<'s> {
        NewStep {
            run_id: self.run_id,
            agent: self.agent,
            call_id: &self.call.call_id,
            tool_id: &self.call.tool_id,
            arguments: args,
            verdict: ending.verdict,
            outcome: ending.outcome,
            result: ending.text,
            captured,
        }
    }

    /// Commit a fresh call's step (with its Awaiting record, for an ask).
    async fn commit(
        &self,
        rt: &Runtime,
        ending: Ending<'_>,
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
        let args = self.call.arguments.to_string();
        let captured = serde_json::to_string(ending.captured).unwrap_or_default();
        rt.store.commit_step(&self.record(&ending, &args, &captured), ending.changes, awaiting).await
    }

    /// Commit the step that resolves `ticket`.
    async fn resolve(&self, rt: &Runtime, ticket: ClaimedTicket, ending: Ending<'_>) -> Result<i64, CommitError> {
        let args = self.call.arguments.to_string();
        let captured = serde_json::to_string(ending.captured).unwrap_or_default();
        rt.store.resolve_ticket(ticket, &self.record(&ending, &args, &captured), ending.changes).await
    }

    async fn commit_or_resolve(
        &self,
        rt: &Runtime,
        ticket: Option<ClaimedTicket>,
        ending: Ending<'_>,
    ) -> Result<i64, CommitError> {
        match ticket {
            Some(t) => self.resolve(rt, t, ending).await,
            None => self.commit(rt, ending, None).await,
        }
    }

    /// Commit an execution: output with its Commands, or the failure.
    async fn finish(
        &self,
        rt: &Runtime,
        ticket: Option<ClaimedTicket>,
        exec: Result<Execution, ExecutorError>,
    ) -> Result<StepResult, CallError> {
        let ran =
            |outcome, text, captured, changes| Ending { verdict: Verdict::Allow, outcome, text, captured, changes };
        let exec = match exec {
            Ok(e) => e,
            Err(e) => {
                // Someone must act (reload, rebuild); the journal still says what happened.
                let text = e.to_string();
                self.commit_or_resolve(rt, ticket, ran(OutcomeKind::ExecutorError, &text, &NOTHING_CAPTURED, &[]))
                    .await?;
                return Err(e.into());
            }
        };
        match exec.result {
            Ok(out) => match scope_commands(&self.call.tool_id, out.commands) {
                Ok(changes) => {
                    let text = match &out.content {
                        Content::Json(v) => v.to_string(),
                        Content::Text(t) => t.clone(),
                    };
                    let ending = ran(OutcomeKind::Output, &text, &exec.captured, &changes);
                    let seq = self.commit_or_resolve(rt, ticket, ending).await?;
                    Ok(StepResult::Output { seq, content: out.content })
                }
                Err(message) => {
                    let ending = ran(OutcomeKind::ToolError, &message, &exec.captured, &[]);
                    let seq = self.commit_or_resolve(rt, ticket, ending).await?;
                    Ok(StepResult::ToolError { seq, message })
                }
            },
            Err(ToolFailure::Failed(said)) if exec.transport_failure.is_some() => {
                // Not the model's to fix: someone must bring the destination up.
                let e = ExecutorError::Transport {
                    tool: self.call.tool_id.clone(),
                    failure: exec.transport_failure.unwrap_or_default(),
                    said,
                };
                let text = e.to_string();
                self.commit_or_resolve(rt, ticket, ran(OutcomeKind::ExecutorError, &text, &exec.captured, &[])).await?;
                Err(e.into())
            }
            Err(failure) => {
                let message = failure.to_string();
                let ending = ran(OutcomeKind::ToolError, &message, &exec.captured, &[]);
                let seq = self.commit_or_resolve(rt, ticket, ending).await?;
                Ok(StepResult::ToolError { seq, message })
            }
        }
    }
}

/// Check every Command is in the called Tool's own scope; one that is not
/// turns the whole call into a Tool error and nothing changes.
fn scope_commands(tool_id: &str, commands: Vec<GuestCommand>) -> Result<Vec<StateChange>, String> {
    let mut out = Vec::with_capacity(commands.len());
    for c in commands {
        if c.scope != tool_id {
            return Err(format!(
                "`{tool_id}` returned a Command for the state of `{}`, outside its own scope; nothing was changed",
                c.scope
            ));
        }
        if c.key.is_empty() || c.key.len() > MAX_STATE_KEY {
            return Err(format!("`{tool_id}` returned a Command with an empty or over-long key; nothing was changed"));
        }
        if let Some(v) = &c.value
            && serde_json::from_str::<serde::de::IgnoredAny>(v).is_err()
        {
            return Err(format!(
                "`{tool_id}` returned a Command for key `{}` whose value is not JSON; nothing was changed",
                c.key
            ));
        }
        out.push(StateChange { key: c.key, value: c.value });
    }
    Ok(out)
}
