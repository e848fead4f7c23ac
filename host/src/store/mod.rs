//! Store: the Step commit's one interface to the journal.
//!
//! Owns the records of run state — runs, steps (call, verdict, outcome,
//! captured output), Awaiting records with their resume tickets, Tool state —
//! and the [`StepStore`] trait that every backend implements with the same
//! semantics: a step's result and its Commands are written in one
//! transaction or not at all; a ticket moves pending → claimed → resolved
//! exactly once, whatever number of threads, processes or hosts race for it;
//! a caller is answered only once its write is durable. [`sqlite`] is the
//! embedded default; `postgres` (feature `postgres`) is the journal several
//! hosts share. The conformance suite in the `toolgate-tests` crate
//! (`toolgate_tests::conformance`) is what a backend must pass.
//!
//! Architecture invariant: nothing writes run state beside this trait, and a
//! claimed ticket is never handed out again, so an approved call executes at
//! most once.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::digest::Digest;

/// What an acknowledged step survives: the `durability` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A crash of the machine or a power loss: every commit is fsynced
    /// before it is acknowledged (SQLite WAL `synchronous = FULL`). The default.
    #[default]
    Machine,
    /// A crash of the toolgate process (SIGKILL, panic, OOM kill): a commit
    /// reaches the operating system before it is acknowledged, and the disk
    /// at the next checkpoint (SQLite WAL `synchronous = NORMAL`). A power
    /// loss or an OS crash may lose the last acknowledged steps. Saves the
    /// one fsync per call.
    Process,
}

pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;
mod write;

/// Journal errors: the store itself failed.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// SQLite failed.
    #[error("journal {path}: {source}")]
    Sqlite {
        /// The journal file.
        path: String,
        /// Why.
        source: rusqlite::Error,
    },
    /// A group commit failed as a whole (every write in it is not committed).
    #[error("journal {path}: {message}")]
    Group {
        /// The journal file.
        path: String,
        /// Why.
        message: String,
    },
    /// PostgreSQL failed (connecting, a statement, the schema).
    #[error("journal {store}: {message}")]
    Postgres {
        /// User, hosts and database: never the password.
        store: String,
        /// Why.
        message: String,
    },
    /// A record with this key is already written (a ticket or a call that
    /// already has an Awaiting record): nothing of the write was kept.
    #[error("journal {store}: {message}")]
    Duplicate {
        /// The store.
        store: String,
        /// What was duplicated.
        message: String,
    },
    /// This build cannot open the configured store.
    #[error("journal {store}: {message}")]
    Unsupported {
        /// The store.
        store: String,
        /// Why, and what to do.
        message: String,
    },
    /// The Tool's state changed between the call reading it and committing
    /// (a concurrent call of the same Tool committed first): nothing of this
    /// step was written.
    #[error(
        "the state of `{tool}` for agent `{agent}` changed while the call ran (a concurrent call of it committed first)"
    )]
    StateChanged {
        /// The agent.
        agent: String,
        /// The Tool.
        tool: String,
    },
    /// The step's Commands would grow the Tool's state, as it is at commit
    /// (concurrent calls' cache keys included), past `limits.state_kib`:
    /// nothing of this step was written. Worded for the model, which reads
    /// it as the call's Tool error.
    #[error(
        "`{tool}` returned Commands that would grow its state to {size_kib} KiB, over limits.state_kib ({limit_kib}); \
         nothing was changed — remove keys it no longer needs, keep bulk data in a granted directory, or raise \
         limits.state_kib"
    )]
    StateTooLarge {
        /// The agent.
        agent: String,
        /// The Tool.
        tool: String,
        /// The state's size after the Commands, in KiB (rounded up).
        size_kib: u64,
        /// `limits.state_kib`.
        limit_kib: u64,
    },
    /// A run the journal records for another agent: an agent continues
    /// only its own runs (their recorded restriction, Skills and decided
    /// asks are that agent's).
    #[error(
        "run `{run}` belongs to agent `{owner}`; agent `{agent}` cannot continue it — start a new run (leave out the run id) or act as agent `{owner}`"
    )]
    RunOfAnotherAgent {
        /// The run.
        run: String,
        /// The agent the journal records it for.
        owner: String,
        /// The agent that asked to continue it.
        agent: String,
    },
    /// Cannot create the journal's directory.
    #[error("cannot create journal directory for {path}: {source}; check `store` in the config")]
    Directory {
        /// The journal file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The journal was written by a newer toolgate whose schema this one does not know.
    #[error(
        "journal {path} has schema version {found}, newer than the {known} this toolgate knows; upgrade toolgate or use another `store`"
    )]
    NewerSchema {
        /// The journal file.
        path: String,
        /// Its version.
        found: i64,
        /// The newest this build knows.
        known: i64,
    },
}

/// Why a ticket cannot be used. Nothing was executed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// No such ticket.
    #[error("unknown ticket `{0}`; list pending tickets with `toolgate journal --awaiting`")]
    Unknown(String),
    /// Already approved or denied.
    #[error("ticket `{0}` was already used; a ticket approves exactly one execution")]
    Used(String),
    /// Past its expiry.
    #[error("ticket `{0}` expired; ask the agent to make the call again")]
    Expired(String),
    /// The claim was settled by another host (this one looked dead) while
    /// this one still ran the call: its late result is not recorded.
    #[error(
        "ticket `{0}` was settled as interrupted by another host while this one ran it (its heartbeat lapsed); this result was not recorded — check the call's effects"
    )]
    Settled(String),
    /// The ticket's call changed between the approval's check and the claim.
    #[error(
        "ticket `{0}`: the call changed in the journal while it was being approved; nothing ran — check who writes the journal, then ask the agent to make the call again"
    )]
    Changed(String),
    /// The component changed since the ticket was issued.
    #[error(
        "ticket `{ticket}`: the component of `{tool}` changed since the call was requested (was {was}, now {now}); the approval does not carry over, make the call again"
    )]
    ComponentChanged {
        /// The ticket.
        ticket: String,
        /// The Tool.
        tool: String,
        /// Digest when issued.
        was: String,
        /// Digest now.
        now: String,
    },
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// The Tool returned output.
    Output,
    /// The Tool returned an error (or trapped, timed out, ran out of memory).
    ToolError,
    /// The gate denied it.
    Blocked,
    /// Waiting for a human.
    Awaiting,
    /// The host could not run it (compile, instantiate); someone must act.
    ExecutorError,
    /// The caller withdrew the call (e.g. MCP `notifications/cancelled`, a
    /// closed HTTP request, shutdown); the guest was stopped or never started.
    Cancelled,
}

impl OutcomeKind {
    /// Stable name in the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeKind::Output => "output",
            OutcomeKind::ToolError => "tool_error",
            OutcomeKind::Blocked => "blocked",
            OutcomeKind::Awaiting => "awaiting",
            OutcomeKind::ExecutorError => "executor_error",
            OutcomeKind::Cancelled => "cancelled",
        }
    }

    /// The kind a stored name means; an unknown name reads as an executor
    /// error (someone must look), never as output.
    pub fn parse(s: &str) -> Self {
        match s {
            "output" => OutcomeKind::Output,
            "tool_error" => OutcomeKind::ToolError,
            "blocked" => OutcomeKind::Blocked,
            "awaiting" => OutcomeKind::Awaiting,
            "cancelled" => OutcomeKind::Cancelled,
            _ => OutcomeKind::ExecutorError,
        }
    }
}

/// What the gate said about a step's call, as the journal records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The gate allowed it (or a human approved it).
    Allow,
    /// A rule, a narrowing or a human denied it.
    Deny,
    /// The gate asked for a human's approval.
    Ask,
    /// The call never reached the gate (unavailable, invalid arguments).
    None,
}

impl Verdict {
    /// Stable name in the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Ask => "ask",
            Verdict::None => "none",
        }
    }

    /// The verdict a stored name means (an unknown one reads as `none`).
    pub fn parse(s: &str) -> Self {
        match s {
            "allow" => Verdict::Allow,
            "deny" => Verdict::Deny,
            "ask" => Verdict::Ask,
            _ => Verdict::None,
        }
    }
}

/// One committed step.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// Journal order.
    pub seq: i64,
    /// The run.
    pub run_id: String,
    /// The call.
    pub call_id: String,
    /// The Tool.
    pub tool_id: String,
    /// Arguments as the model sent them (JSON).
    pub arguments: String,
    /// The verdict ([`Verdict::as_str`]).
    pub verdict: String,
    /// How it ended.
    pub outcome: OutcomeKind,
    /// Output or error text the model reads.
    pub result: String,
    /// Captured guest stdout, stderr and log (JSON object).
    pub captured: String,
    /// The ticket this step resolved, issued or delivered, if any.
    pub ticket_id: Option<String>,
    /// Whether `result` is a JSON document (the Tool returned structured content).
    pub structured: bool,
    /// Who decided the ticket this step resolves, if a human did.
    pub approved_by: Option<ApprovedBy>,
}

/// Who decided a ticket, through which channel, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovedBy {
    /// The approver: a public key, an OS user, an MCP client, an embedder's principal.
    pub principal: String,
    /// `signature`, `terminal`, `mcp-elicitation` or `embedder`.
    pub channel: String,
    /// Unix seconds.
    pub at: i64,
}

/// A step to commit (sequence assigned by the store).
#[derive(Debug, Clone)]
pub struct NewStep<'a> {
    /// The run.
    pub run_id: &'a str,
    /// The agent (Tool state is scoped by agent and Tool).
    pub agent: &'a str,
    /// The call.
    pub call_id: &'a str,
    /// The Tool.
    pub tool_id: &'a str,
    /// Arguments (JSON).
    pub arguments: &'a str,
    /// What the gate said.
    pub verdict: Verdict,
    /// How it ended.
    pub outcome: OutcomeKind,
    /// What the model reads.
    pub result: &'a str,
    /// Captured output (JSON).
    pub captured: &'a str,
    /// The ticket this step issues, resolves or delivers, if any.
    pub ticket: Option<&'a str>,
    /// Whether `result` is a JSON document.
    pub structured: bool,
    /// Who decided the ticket this step resolves.
    pub approved_by: Option<&'a ApprovedBy>,
    /// The Tool state the call read, when its Commands change state: the
    /// step commits only if the Tool's state (for this agent) is still
    /// exactly this, so a concurrent call of the same Tool — in this process
    /// or another host — is never overwritten with changes computed from
    /// what it replaced; otherwise [`CommitError::StateChanged`] and nothing
    /// is written. Cache keys ([`CACHE_KEY_PREFIX`]) take no part in the
    /// comparison.
    pub state_read: Option<&'a BTreeMap<String, String>>,
    /// `limits.state_kib`, when the step's Commands change state: the step
    /// commits only if they keep the Tool's state (for this agent) as it is
    /// at commit — not as the call read it: concurrent calls' cache keys
    /// commit beside it — within this many KiB ([`STATE_ENTRY_BYTES`] per
    /// entry beside its bytes), or shrink it; otherwise
    /// [`CommitError::StateTooLarge`] and nothing is written. `None`: not
    /// checked.
    pub state_limit_kib: Option<u64>,
}

/// What each entry of a Tool's state counts toward `limits.state_kib`
/// beside its key and value bytes: an entry costs more than its bytes (a
/// row, a map node, a check of its own), so many tiny keys cannot hold far
/// more than the limit says (262,000 three-byte keys fit 1 MiB by their
/// bytes alone).
pub const STATE_ENTRY_BYTES: usize = 64;

/// The size of a Tool's state as `limits.state_kib` counts it, before and
/// after `changes` (the last change of a key wins) are applied to `current`.
pub fn state_sizes(current: &BTreeMap<String, String>, changes: &[StateChange]) -> (usize, usize) {
    let size = |k: &str, v: &str| k.len() + v.len() + STATE_ENTRY_BYTES;
    let before: usize = current.iter().map(|(k, v)| size(k, v)).sum();
    let mut last: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for c in changes {
        last.insert(&c.key, c.value.as_deref());
    }
    let mut after = before;
    for (k, v) in &last {
        after -= current.get(*k).map_or(0, |old| size(k, old));
        after += v.map_or(0, |v| size(k, v));
    }
    (before, after)
}

/// The size in KiB (rounded up) `changes` would grow `current` to, when
/// that is over `limit_kib` and more than it is now; `None` when they fit
/// or shrink it (shrinking always commits).
pub fn state_over_limit(current: &BTreeMap<String, String>, changes: &[StateChange], limit_kib: u64) -> Option<u64> {
    let (before, after) = state_sizes(current, changes);
    let limit = usize::try_from(limit_kib).unwrap_or(usize::MAX).saturating_mul(1024);
    (after > limit && after > before).then(|| after.div_ceil(1024) as u64)
}

/// Tool-state keys under this prefix are a cache: values a Tool can recompute
/// (a remote session id, the time it last verified something). They commit
/// with the step like every other key, but last writer wins: neither reading
/// nor writing them makes a concurrent call's commit conflict — a Tool with
/// an outbound effect would otherwise be told to "make the call again" after
/// its effect happened, for a value nobody needed to keep.
pub const CACHE_KEY_PREFIX: &str = "cache/";

/// Whether `key` is a cache key ([`CACHE_KEY_PREFIX`]).
pub fn is_cache_key(key: &str) -> bool {
    key.starts_with(CACHE_KEY_PREFIX)
}

/// A run as the journal records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord<'a> {
    /// The run id.
    pub run_id: &'a str,
    /// Its agent.
    pub agent: &'a str,
    /// `configured` or `deny-all`.
    pub narrowing: &'a str,
    /// The run's restriction of concrete authority (JSON), if it has one:
    /// an approval later in the run is held to it.
    pub restriction: Option<&'a str>,
}

/// A recorded run, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInfo {
    /// Its agent.
    pub agent: String,
    /// `configured` or `deny-all`.
    pub narrowing: String,
    /// Its restriction (JSON), if any.
    pub restriction: Option<String>,
}

/// An earlier ask for the same call (run, Tool, argument digest), as the
/// runtime finds it before asking again.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorAsk {
    /// Its Awaiting record (state included).
    pub record: AwaitingRecord,
    /// Whether its result was already handed to a retry.
    pub delivered: bool,
    /// The step that resolved it, once decided.
    pub resolution: Option<StepRecord>,
}

/// Where an earlier ask of the same call is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskScope<'a> {
    /// The run (a conversation): asks never cross conversations.
    Run(&'a str),
    /// One principal's stateless requests to an agent: runs whose id starts
    /// with `runs`, the [`STATELESS_RUN_PREFIX`] and that principal's tag
    /// ([`crate::runtime::stateless_run_id`]). No conversation spans requests
    /// there (MCP 2026-07-28 over HTTP) and the principal is all that
    /// identifies who asked: another principal's ask (another token bound to
    /// the same agent) is never found, nor is a conversation's.
    StatelessRequests {
        /// The agent.
        agent: &'a str,
        /// The prefix every run id of the principal's stateless requests has.
        runs: &'a str,
    },
}

/// How the id of a run serving one stateless request starts.
pub const STATELESS_RUN_PREFIX: &str = "req-";

/// How every ticket id starts: what a front end looks for to keep ticket
/// ids out of everything the model reads (invariant 11).
pub const TICKET_PREFIX: &str = "tkt-";

/// A state change, already checked to be in the called Tool's scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// Key.
    pub key: String,
    /// `Some(json)` sets, `None` removes.
    pub value: Option<String>,
}

/// A call waiting for approval.
#[derive(Debug, Clone, PartialEq)]
pub struct AwaitingRecord {
    /// The ticket id (unguessable).
    pub ticket_id: String,
    /// The run.
    pub run_id: String,
    /// The agent.
    pub agent: String,
    /// The call.
    pub call_id: String,
    /// The Tool.
    pub tool_id: String,
    /// Arguments (JSON), exactly as they will run.
    pub arguments: String,
    /// [`crate::policy::gate::argument_digest`] of them.
    pub argument_digest: String,
    /// The component digest when the call was requested.
    pub component_digest: Digest,
    /// Unix seconds.
    pub expires_at: i64,
    /// Unix seconds, when the call asked.
    pub requested_at: i64,
    /// `pending`, `claimed` or `resolved`.
    pub state: String,
    /// The run's restrictions in force when the call asked (a JSON array of
    /// [`crate::config::Restriction`]; `None`: none beyond the agent's). An
    /// approval runs the call held to them, whatever the run's record says:
    /// a run continued under a narrower restriction is not recorded with the
    /// run, and the approval must not widen what the ask was made under.
    pub restriction: Option<String>,
    /// Who may decide it, as when the call asked
    /// ([`crate::approval::Approvers::to_text`]); `None`: asked before
    /// toolgate recorded it (a migrated journal) — such an ask can be denied,
    /// not approved.
    pub approvers: Option<String>,
}

/// A ticket this process claimed: the only value that lets the gate treat an
/// approved call as Allow. Built only by a [`StepStore`] of this crate when
/// it moves a ticket from pending to claimed.
#[derive(Debug)]
pub struct ClaimedTicket {
    record: AwaitingRecord,
    holder: String,
}

impl ClaimedTicket {
    /// Only a store makes one, at the moment `holder` wins the claim.
    pub(crate) fn new(record: AwaitingRecord, holder: String) -> Self {
        ClaimedTicket { record, holder }
    }
    /// The host instance holding the claim.
    pub fn holder(&self) -> &str {
        &self.holder
    }
    /// The stored call's record.
    pub fn record(&self) -> &AwaitingRecord {
        &self.record
    }
    /// Ticket id.
    pub fn ticket_id(&self) -> &str {
        &self.record.ticket_id
    }
    /// Tool id.
    pub fn tool_id(&self) -> &str {
        &self.record.tool_id
    }
    /// Call id.
    pub fn call_id(&self) -> &str {
        &self.record.call_id
    }
    /// Argument digest.
    pub fn argument_digest(&self) -> &str {
        &self.record.argument_digest
    }
    /// Component digest.
    pub fn component_digest(&self) -> &Digest {
        &self.record.component_digest
    }
}

/// The store behind the Step commit. Every method is one transaction.
///
/// Claims are held by a host instance (`holder`, unique per process) whose
/// liveness is its heartbeat: a claim is taken over and settled only after
/// its holder's heartbeat is older than the lease, so a live host — on this
/// machine or another, in any PID namespace — is never settled.
#[async_trait::async_trait]
pub trait StepStore: Send + Sync {
    /// Record a new run (a durable store may write it with the run's first step).
    async fn begin_run(&self, run: &RunRecord<'_>) -> Result<(), CommitError>;
    /// A recorded run.
    async fn run(&self, run_id: &str) -> Result<Option<RunInfo>, CommitError>;
    /// Commit a step with its state changes and, for RequireConfirmation, its
    /// Awaiting record — one transaction. Returns the step's sequence number.
    async fn commit_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError>;
    /// Claim a pending, unexpired ticket for `holder`: pending → claimed,
    /// atomically; records `holder`'s heartbeat.
    async fn claim_ticket(
        &self,
        ticket_id: &str,
        now: i64,
        holder: &str,
    ) -> Result<Result<ClaimedTicket, TicketError>, CommitError>;
    /// `holder` is alive at `now`: its claims are not taken over.
    async fn heartbeat(&self, holder: &str, now: i64) -> Result<(), CommitError>;
    /// Commit the step that resolves a claimed ticket, with its state
    /// changes — only if the ticket is still claimed by the ticket's holder
    /// (exactly one row changes); otherwise nothing is written and the
    /// answer is [`TicketError::Settled`]. `delivered`: the result already
    /// went back to the conversation, so no retry receives it again.
    async fn resolve_ticket(
        &self,
        ticket: ClaimedTicket,
        step: &NewStep<'_>,
        changes: &[StateChange],
        delivered: bool,
    ) -> Result<Result<i64, TicketError>, CommitError>;
    /// Take over, for `holder`, every claim whose holder's heartbeat (or, if
    /// it never beat, whose claim) is older than `now - lease_secs` — with
    /// `only`, just that ticket's (a call settling its own ask leaves every
    /// other to its own retry or the next host's start). The caller settles
    /// each through the Step commit; a late result of the old holder is then
    /// refused.
    async fn take_over_stale_claims(
        &self,
        holder: &str,
        now: i64,
        lease_secs: i64,
        only: Option<&str>,
    ) -> Result<Vec<ClaimedTicket>, CommitError>;
    /// The latest ask in `scope` for Tool `tool_id` with arguments of
    /// `argument_digest`, with its resolution once decided.
    async fn prior_ask(
        &self,
        scope: AskScope<'_>,
        tool_id: &str,
        argument_digest: &str,
    ) -> Result<Option<PriorAsk>, CommitError>;
    /// Commit `step` (a retry receiving the decided result of `ticket_id`)
    /// and mark the result delivered — once: `None` if it already was (or is
    /// not resolved), and then nothing is written.
    async fn deliver(&self, ticket_id: &str, step: &NewStep<'_>) -> Result<Option<i64>, CommitError>;
    /// A Tool's committed state for an agent.
    async fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError>;
    /// [`StepStore::tool_state`] answered at once by a store that never
    /// waits (one in process memory); `None`: ask `tool_state`. The same
    /// answer either way — it only spares the per-call future.
    fn tool_state_now(&self, agent: &str, tool_id: &str) -> Option<Result<BTreeMap<String, String>, CommitError>> {
        let _ = (agent, tool_id);
        None
    }
    /// [`StepStore::commit_step`] done at once by a store that never waits;
    /// `None`: nothing was done, call `commit_step`.
    fn commit_step_now(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Option<Result<i64, CommitError>> {
        let _ = (step, changes, awaiting);
        None
    }
    /// Steps in journal order, optionally of one run.
    async fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError>;
    /// The Awaiting record of `ticket_id`, in whatever state it is.
    async fn awaiting(&self, ticket_id: &str) -> Result<Option<AwaitingRecord>, CommitError>;
    /// Awaiting records still pending.
    async fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError>;
    /// Every distinct (Tool, journaled allowed-tools) of the outputs of
    /// run `run_id`: the Skill activations, each with the list the step
    /// journaled in its captured object's `narrowed_to` member (JSON text;
    /// `None` for any other Tool's output, and for a Skill's journaled before
    /// activations carried it). In journal order of first appearance.
    async fn skill_activations(&self, run_id: &str) -> Result<Vec<(String, Option<String>)>, CommitError> {
        let steps = self.steps(Some(run_id)).await?;
        Ok(activations(
            steps.into_iter().filter(|s| s.outcome == OutcomeKind::Output).map(|s| (s.tool_id, Some(s.captured))),
        ))
    }
}

/// [`StepStore::skill_activations`] from a run's outputs, in journal order:
/// (Tool, captured text — or `None` where it holds no list).
pub fn activations<C: AsRef<str>>(
    outputs: impl IntoIterator<Item = (String, Option<C>)>,
) -> Vec<(String, Option<String>)> {
    let mut out: Vec<(String, Option<String>)> = Vec::new();
    for (tool, captured) in outputs {
        let activation = (tool, captured.as_ref().map(AsRef::as_ref).and_then(narrowed_to));
        if !out.contains(&activation) {
            out.push(activation);
        }
    }
    out
}

/// The `narrowed_to` member of a step's captured JSON object, as JSON text
/// ([`StepStore::skill_activations`]); a captured text that is not a JSON
/// object, or a member that is not a list, holds none. A list that cannot
/// be read narrows to nothing where it is applied.
pub fn narrowed_to(captured: &str) -> Option<String> {
    // Most captured objects hold no list: not parsed at all.
    if !captured.contains("\"narrowed_to\"") {
        return None;
    }
    let value: serde_json::Value = serde_json::from_str(captured).ok()?;
    match value.get("narrowed_to")? {
        list @ serde_json::Value::Array(_) => Some(list.to_string()),
        // Present but not a list: nothing is allowed.
        _ => Some("[]".to_owned()),
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}
