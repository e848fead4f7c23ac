//! Commit: the Step commit and the journal behind it.
//!
//! Owns the one store of run state: runs, steps (call, verdict, outcome,
//! captured output), Awaiting records with their resume tickets, and Tool
//! state. A step's result and its Commands are written in one transaction, or
//! not at all. SQLite is the embedded default (WAL, `synchronous = FULL`);
//! a file journal group-commits: steps arriving while one commit is being
//! made durable share the next transaction (a savepoint each, so a failing
//! step rolls back alone), and each caller is answered only once its step is
//! durable. The [`StepStore`] trait is the seam for a shared backend.
//!
//! Architecture invariant: nothing else writes run state. A ticket moves
//! pending → claimed → resolved exactly once; a claimed ticket is never
//! handed out again, so an approved call executes at most once.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};

use crate::catalog::Digest;

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
    /// A group commit failed as a whole (every step in it is not committed).
    #[error("journal {path}: {message}")]
    Group {
        /// The journal file.
        path: String,
        /// Why.
        message: String,
    },
    /// Cannot create the journal's directory.
    #[error("cannot create journal directory for {path}: {source}; check `store` in the config")]
    Directory {
        /// The journal file.
        path: String,
        /// Why.
        source: std::io::Error,
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
        }
    }
    fn parse(s: &str) -> Self {
        match s {
            "output" => OutcomeKind::Output,
            "tool_error" => OutcomeKind::ToolError,
            "blocked" => OutcomeKind::Blocked,
            "awaiting" => OutcomeKind::Awaiting,
            _ => OutcomeKind::ExecutorError,
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
    /// The verdict (`allow`, `deny`, `ask`, `none`).
    pub verdict: String,
    /// How it ended.
    pub outcome: OutcomeKind,
    /// Output or error text the model reads.
    pub result: String,
    /// Captured guest stdout, stderr and log (JSON object).
    pub captured: String,
    /// The ticket this step resolved or issued, if any.
    pub ticket_id: Option<String>,
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
    /// `allow`, `deny`, `ask` or `none`.
    pub verdict: &'a str,
    /// How it ended.
    pub outcome: OutcomeKind,
    /// What the model reads.
    pub result: &'a str,
    /// Captured output (JSON).
    pub captured: &'a str,
}

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
    /// [`crate::gate::argument_digest`] of them.
    pub argument_digest: String,
    /// The component digest when the call was requested.
    pub component_digest: Digest,
    /// Unix seconds.
    pub expires_at: i64,
    /// `pending`, `claimed` or `resolved`.
    pub state: String,
}

/// A ticket this process claimed: the only value that lets the gate treat an
/// approved call as Allow. Built only by [`StepStore::claim_ticket`].
#[derive(Debug)]
pub struct ClaimedTicket {
    record: AwaitingRecord,
}

impl ClaimedTicket {
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

/// The store behind the Step commit.
pub trait StepStore: Send + Sync {
    /// Record a new run.
    fn begin_run(&self, run_id: &str, agent: &str, narrowing: &str) -> Result<(), CommitError>;
    /// Commit a step with its state changes and, for RequireConfirmation, its
    /// Awaiting record — one transaction. Returns the step's sequence number.
    fn commit_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError>;
    /// Commit the step that resolves a claimed ticket, with its state changes.
    fn resolve_ticket(
        &self,
        ticket: ClaimedTicket,
        step: &NewStep<'_>,
        changes: &[StateChange],
    ) -> Result<i64, CommitError>;
    /// Claim a pending, unexpired ticket: pending → claimed, atomically.
    fn claim_ticket(&self, ticket_id: &str, now: i64) -> Result<Result<ClaimedTicket, TicketError>, CommitError>;
    /// Release a claim that could not run for a reason outside the call
    /// (e.g. the component changed): the ticket is marked resolved.
    fn abandon_ticket(&self, ticket: ClaimedTicket, reason: &str) -> Result<(), CommitError>;
    /// Settle claimed tickets whose result was never committed because the
    /// claiming host died mid-call: those claimed before `claimed_before`
    /// (unix seconds), or by a process `alive` says is gone. Each gets an
    /// `executor_error` step saying so and is resolved: the call may have
    /// run, so it never runs again, and nothing is silently lost. Returns the
    /// tickets settled.
    fn settle_interrupted(&self, claimed_before: i64, alive: &dyn Fn(u32) -> bool) -> Result<Vec<String>, CommitError>;
    /// A Tool's committed state for an agent.
    fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError>;
    /// Steps in journal order, optionally of one run.
    fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError>;
    /// Awaiting records still pending.
    fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError>;
    /// The distinct Tools that produced output in run `run_id` (Skill activations).
    fn output_tools(&self, run_id: &str) -> Result<Vec<String>, CommitError> {
        let mut ids: Vec<String> = self
            .steps(Some(run_id))?
            .into_iter()
            .filter(|s| s.outcome == OutcomeKind::Output)
            .map(|s| s.tool_id)
            .collect();
        ids.sort();
        ids.dedup();
        Ok(ids)
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// The embedded SQLite journal.
pub struct SqliteJournal {
    conn: Mutex<Connection>,
    path: String,
    /// Durable journals commit steps through the group committer.
    group: Option<GroupCommitter>,
    /// Runs begun but not yet written: a durable journal records a run in the
    /// transaction of its first step (one fsync instead of two for a one-call run).
    pending_runs: Mutex<HashMap<String, (String, String)>>,
}

/// Runs begun without a step yet, at most; beyond, a run is written at once.
const MAX_PENDING_RUNS: usize = 4096;

/// Most steps one group commit writes.
const MAX_GROUP: usize = 256;

/// Group commit for a durable journal: steps that arrive while a commit is
/// being made durable are written together in the next transaction, one
/// fsync for all of them. Each step still gets its own savepoint, so a step
/// that fails (e.g. a constraint) rolls back alone; each caller is answered
/// only after the transaction holding its step is durable.
struct GroupCommitter {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Transactions and steps committed, for the average group size.
    counts: Arc<(AtomicU64, AtomicU64)>,
}

/// One write waiting for a group commit, with where to send its result.
struct Job {
    write: Write,
    reply: std::sync::mpsc::SyncSender<Result<i64, CommitError>>,
}

/// What a job writes.
#[allow(clippy::large_enum_variant)] // moved once into the committer's channel; boxing buys nothing
enum Write {
    /// A step with its changes and Awaiting record.
    Step {
        step: OwnedStep,
        changes: Vec<StateChange>,
        awaiting: Option<AwaitingRecord>,
        /// The run's record, when this is its first step: `(agent, narrowing)`.
        run: Option<(String, String)>,
    },
    /// A run record.
    Run { run_id: String, agent: String, narrowing: String },
}

/// [`NewStep`], owned, to cross to the committer thread.
struct OwnedStep {
    run_id: String,
    agent: String,
    call_id: String,
    tool_id: String,
    arguments: String,
    verdict: String,
    outcome: OutcomeKind,
    result: String,
    captured: String,
}

impl OwnedStep {
    fn of(s: &NewStep<'_>) -> Self {
        OwnedStep {
            run_id: s.run_id.to_owned(),
            agent: s.agent.to_owned(),
            call_id: s.call_id.to_owned(),
            tool_id: s.tool_id.to_owned(),
            arguments: s.arguments.to_owned(),
            verdict: s.verdict.to_owned(),
            outcome: s.outcome,
            result: s.result.to_owned(),
            captured: s.captured.to_owned(),
        }
    }
    fn borrow(&self) -> NewStep<'_> {
        NewStep {
            run_id: &self.run_id,
            agent: &self.agent,
            call_id: &self.call_id,
            tool_id: &self.tool_id,
            arguments: &self.arguments,
            verdict: &self.verdict,
            outcome: self.outcome,
            result: &self.result,
            captured: &self.captured,
        }
    }
}

impl GroupCommitter {
    fn start(mut conn: Connection, path: String) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        let c = counts.clone();
        let thread = std::thread::Builder::new().name("toolgate-commit".into()).spawn(move || {
            while let Ok(first) = rx.recv() {
                let mut batch = vec![first];
                while batch.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(j) => batch.push(j),
                        Err(_) => break,
                    }
                }
                let results = commit_group(&mut conn, &batch, &path);
                c.0.fetch_add(1, Ordering::Relaxed);
                c.1.fetch_add(batch.len() as u64, Ordering::Relaxed);
                for (job, r) in batch.into_iter().zip(results) {
                    // The caller may be gone (its task was cancelled): its step is committed regardless.
                    let _ = job.reply.send(r);
                }
            }
        })?;
        Ok(GroupCommitter { jobs: Some(tx), thread: Some(thread), counts })
    }
}

impl Drop for GroupCommitter {
    fn drop(&mut self) {
        // Closing the channel ends the thread after the batch in hand.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Write `batch` in one transaction, a savepoint per step; one result per job.
fn commit_group(conn: &mut Connection, batch: &[Job], path: &str) -> Vec<Result<i64, CommitError>> {
    let all_failed = |message: String| -> Vec<Result<i64, CommitError>> {
        batch.iter().map(|_| Err(CommitError::Group { path: path.to_owned(), message: message.clone() })).collect()
    };
    let mut tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return all_failed(e.to_string()),
    };
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        let r = (|| -> rusqlite::Result<i64> {
            let sp = tx.savepoint()?;
            let seq = match &job.write {
                Write::Step { step, changes, awaiting, run } => {
                    if let Some((agent, narrowing)) = run {
                        insert_run(&sp, &step.run_id, agent, narrowing)?;
                    }
                    write_step(&sp, &step.borrow(), changes, awaiting.as_ref())?
                }
                Write::Run { run_id, agent, narrowing } => {
                    insert_run(&sp, run_id, agent, narrowing)?;
                    0
                }
            };
            sp.commit()?;
            Ok(seq)
        })();
        results.push(r.map_err(|source| CommitError::Sqlite { path: path.to_owned(), source }));
    }
    if let Err(e) = tx.commit() {
        return all_failed(format!("the group commit failed, nothing in it was written: {e}"));
    }
    results
}

/// Block the calling thread on `wait`; on a multi-threaded tokio runtime, let
/// the runtime move its other tasks elsewhere meanwhile, so many calls can
/// wait on one group commit at once.
fn wait_blocking<T>(wait: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(wait),
        _ => wait(),
    }
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    narrowing TEXT NOT NULL,
    started_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    -- A rowid alias: steps are never deleted, so seq only grows (no AUTOINCREMENT bookkeeping per insert).
    seq INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool_id TEXT NOT NULL,
    arguments TEXT NOT NULL,
    verdict TEXT NOT NULL,
    outcome TEXT NOT NULL,
    result TEXT NOT NULL,
    captured TEXT NOT NULL,
    ticket_id TEXT,
    committed_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS steps_run ON steps(run_id, seq);
CREATE TABLE IF NOT EXISTS awaiting (
    ticket_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    agent TEXT NOT NULL,
    call_id TEXT NOT NULL UNIQUE,
    tool_id TEXT NOT NULL,
    arguments TEXT NOT NULL,
    argument_digest TEXT NOT NULL,
    component_digest TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'claimed', 'resolved')),
    claimed_at INTEGER,
    claimed_by INTEGER
);
CREATE TABLE IF NOT EXISTS tool_state (
    agent TEXT NOT NULL,
    tool_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (agent, tool_id, key)
);
"#;

/// The `store` value that selects an in-memory journal.
pub const IN_MEMORY: &str = ":memory:";

impl SqliteJournal {
    /// The journal a config's `store` names: [`IN_MEMORY`], or a file.
    pub fn open_store(store: &Path) -> Result<Self, CommitError> {
        if store.as_os_str() == IN_MEMORY { Self::in_memory() } else { Self::open(store) }
    }

    /// Open (creating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<Self, CommitError> {
        let shown = path.display().to_string();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| CommitError::Directory { path: shown.clone(), source })?;
        }
        let open = || Connection::open(path).map_err(|source| CommitError::Sqlite { path: shown.clone(), source });
        let mut journal = Self::init(open()?, shown.clone(), true)?;
        // The committer writes steps on its own connection (WAL: readers are not blocked).
        let writer = open()?;
        let err = |source| CommitError::Sqlite { path: shown.clone(), source };
        writer.pragma_update(None, "synchronous", "FULL").map_err(err)?;
        writer.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        let group = GroupCommitter::start(writer, shown.clone()).map_err(|e| CommitError::Group {
            path: shown.clone(),
            message: format!("cannot start the committer: {e}"),
        })?;
        journal.group = Some(group);
        Ok(journal)
    }

    /// A journal in memory: the same commit path without durability
    /// (benchmarks, tests).
    pub fn in_memory() -> Result<Self, CommitError> {
        let conn =
            Connection::open_in_memory().map_err(|source| CommitError::Sqlite { path: ":memory:".into(), source })?;
        Self::init(conn, ":memory:".into(), false)
    }

    fn init(conn: Connection, path: String, durable: bool) -> Result<Self, CommitError> {
        let err = |source| CommitError::Sqlite { path: path.clone(), source };
        if durable {
            // WAL + FULL: a committed step survives a crash of the host or the machine.
            conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
            conn.pragma_update(None, "synchronous", "FULL").map_err(err)?;
        }
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        // Journals written before these columns existed get them (NULL: unknown claimer).
        for column in ["claimed_at", "claimed_by"] {
            let present: i64 = conn
                .query_row("SELECT COUNT(*) FROM pragma_table_info('awaiting') WHERE name = ?1", [column], |r| r.get(0))
                .map_err(err)?;
            if present == 0 {
                conn.execute_batch(&format!("ALTER TABLE awaiting ADD COLUMN {column} INTEGER")).map_err(err)?;
            }
        }
        Ok(SqliteJournal { conn: Mutex::new(conn), path, group: None, pending_runs: Mutex::new(HashMap::new()) })
    }

    /// Group commits made and the steps they held (`(0, 0)` for an in-memory journal).
    pub fn group_commits(&self) -> (u64, u64) {
        self.group.as_ref().map_or((0, 0), |g| (g.counts.0.load(Ordering::Relaxed), g.counts.1.load(Ordering::Relaxed)))
    }

    /// Hand `write` to the group committer and wait until it is durable (or failed).
    fn through_group(&self, write: Write) -> Result<i64, CommitError> {
        let gone = || CommitError::Group { path: self.path.clone(), message: "the committer stopped".into() };
        let group = self.group.as_ref().and_then(|g| g.jobs.as_ref()).ok_or_else(gone)?;
        let (reply, answer) = std::sync::mpsc::sync_channel(1);
        group.send(Job { write, reply }).map_err(|_| gone())?;
        wait_blocking(|| answer.recv()).map_err(|_| gone())?
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T, CommitError> {
        // A poisoned lock only means another thread panicked mid-call; SQLite
        // rolled its transaction back, so the connection is still consistent.
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn).map_err(|source| CommitError::Sqlite { path: self.path.clone(), source })
    }
}

// Statements run on every call are prepared once per connection
// (`prepare_cached`): re-parsing the SQL was about a third of an in-memory
// commit (BENCHMARKS.md).
fn insert_run(c: &Connection, run_id: &str, agent: &str, narrowing: &str) -> rusqlite::Result<()> {
    c.prepare_cached("INSERT OR IGNORE INTO runs (run_id, agent, narrowing, started_at) VALUES (?1, ?2, ?3, ?4)")?
        .execute(params![run_id, agent, narrowing, now()])
        .map(|_| ())
}

/// A step, its state changes and its Awaiting record, inside the caller's transaction.
fn write_step(
    tx: &Connection,
    step: &NewStep<'_>,
    changes: &[StateChange],
    awaiting: Option<&AwaitingRecord>,
) -> rusqlite::Result<i64> {
    let seq = insert_step(tx, step, awaiting.map(|a| a.ticket_id.as_str()))?;
    apply_changes(tx, step.agent, step.tool_id, changes)?;
    if let Some(a) = awaiting {
        tx.prepare_cached(&format!(
            "INSERT INTO awaiting ({AWAITING_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'pending')"
        ))?
        .execute(params![
            a.ticket_id,
            a.run_id,
            a.agent,
            a.call_id,
            a.tool_id,
            a.arguments,
            a.argument_digest,
            a.component_digest.hex(),
            a.expires_at
        ])?;
    }
    Ok(seq)
}

fn insert_step(tx: &Connection, s: &NewStep<'_>, ticket: Option<&str>) -> rusqlite::Result<i64> {
    tx.prepare_cached(
        "INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id, committed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![s.run_id, s.call_id, s.tool_id, s.arguments, s.verdict, s.outcome.as_str(), s.result, s.captured, ticket, now()])?;
    Ok(tx.last_insert_rowid())
}

fn apply_changes(tx: &Connection, agent: &str, tool: &str, changes: &[StateChange]) -> rusqlite::Result<()> {
    for c in changes {
        match &c.value {
            Some(v) => tx
                .prepare_cached(
                    "INSERT INTO tool_state (agent, tool_id, key, value) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (agent, tool_id, key) DO UPDATE SET value = excluded.value",
                )?
                .execute(params![agent, tool, c.key, v])?,
            None => tx
                .prepare_cached("DELETE FROM tool_state WHERE agent = ?1 AND tool_id = ?2 AND key = ?3")?
                .execute(params![agent, tool, c.key])?,
        };
    }
    Ok(())
}

fn awaiting_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AwaitingRecord> {
    let digest: String = r.get(7)?;
    Ok(AwaitingRecord {
        ticket_id: r.get(0)?,
        run_id: r.get(1)?,
        agent: r.get(2)?,
        call_id: r.get(3)?,
        tool_id: r.get(4)?,
        arguments: r.get(5)?,
        argument_digest: r.get(6)?,
        // Written by us from a Digest; an unreadable one matches no component.
        component_digest: Digest::from_hex(&digest).unwrap_or(Digest([0; 32])),
        expires_at: r.get(8)?,
        state: r.get(9)?,
    })
}

const AWAITING_COLS: &str =
    "ticket_id, run_id, agent, call_id, tool_id, arguments, argument_digest, component_digest, expires_at, state";

impl StepStore for SqliteJournal {
    fn begin_run(&self, run_id: &str, agent: &str, narrowing: &str) -> Result<(), CommitError> {
        if self.group.is_some() {
            let mut pending = self.pending_runs.lock().unwrap_or_else(|p| p.into_inner());
            if pending.len() < MAX_PENDING_RUNS {
                pending.insert(run_id.to_owned(), (agent.to_owned(), narrowing.to_owned()));
                return Ok(());
            }
            drop(pending);
            let write =
                Write::Run { run_id: run_id.to_owned(), agent: agent.to_owned(), narrowing: narrowing.to_owned() };
            return self.through_group(write).map(|_| ());
        }
        self.with(|c| insert_run(c, run_id, agent, narrowing))
    }

    fn commit_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
        if self.group.is_some() {
            let run = self.pending_runs.lock().unwrap_or_else(|p| p.into_inner()).remove(step.run_id);
            let write = Write::Step {
                step: OwnedStep::of(step),
                changes: changes.to_vec(),
                awaiting: awaiting.cloned(),
                run: run.clone(),
            };
            let result = self.through_group(write);
            if let (Err(_), Some(run)) = (&result, run) {
                // Not written with this step: the run's next step records it.
                self.pending_runs.lock().unwrap_or_else(|p| p.into_inner()).insert(step.run_id.to_owned(), run);
            }
            return result;
        }
        self.with(|c| {
            let tx = c.transaction()?;
            let seq = write_step(&tx, step, changes, awaiting)?;
            tx.commit()?;
            Ok(seq)
        })
    }

    fn resolve_ticket(
        &self,
        ticket: ClaimedTicket,
        step: &NewStep<'_>,
        changes: &[StateChange],
    ) -> Result<i64, CommitError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let seq = insert_step(&tx, step, Some(&ticket.record.ticket_id))?;
            apply_changes(&tx, step.agent, step.tool_id, changes)?;
            tx.execute(
                "UPDATE awaiting SET state = 'resolved' WHERE ticket_id = ?1 AND state = 'claimed'",
                params![ticket.record.ticket_id],
            )?;
            tx.commit()?;
            Ok(seq)
        })
    }

    fn claim_ticket(&self, ticket_id: &str, now: i64) -> Result<Result<ClaimedTicket, TicketError>, CommitError> {
        self.with(|c| {
            // IMMEDIATE takes the write lock first, so two processes claiming
            // the same ticket serialize and exactly one sees it pending.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let record = tx
                .query_row(
                    &format!("SELECT {AWAITING_COLS} FROM awaiting WHERE ticket_id = ?1"),
                    params![ticket_id],
                    awaiting_from_row,
                )
                .optional()?;
            let result = match record {
                None => Err(TicketError::Unknown(ticket_id.to_owned())),
                Some(r) if r.state != "pending" => Err(TicketError::Used(ticket_id.to_owned())),
                Some(r) if r.expires_at <= now => Err(TicketError::Expired(ticket_id.to_owned())),
                Some(mut r) => {
                    tx.execute(
                        "UPDATE awaiting SET state = 'claimed', claimed_at = ?2, claimed_by = ?3
                         WHERE ticket_id = ?1 AND state = 'pending'",
                        params![ticket_id, now, std::process::id()],
                    )?;
                    r.state = "claimed".into();
                    Ok(ClaimedTicket { record: r })
                }
            };
            tx.commit()?;
            Ok(result)
        })
    }

    fn abandon_ticket(&self, ticket: ClaimedTicket, _reason: &str) -> Result<(), CommitError> {
        self.with(|c| {
            c.execute("UPDATE awaiting SET state = 'resolved' WHERE ticket_id = ?1", params![ticket.record.ticket_id])
                .map(|_| ())
        })
    }

    fn settle_interrupted(&self, claimed_before: i64, alive: &dyn Fn(u32) -> bool) -> Result<Vec<String>, CommitError> {
        self.with(|c| {
            // A cheap read first: almost always there is nothing to settle.
            let any: i64 = c.query_row("SELECT COUNT(*) FROM awaiting WHERE state = 'claimed'", [], |r| r.get(0))?;
            if any == 0 {
                return Ok(Vec::new());
            }
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let stuck: Vec<AwaitingRecord> = {
                let mut stmt = tx.prepare(&format!(
                    "SELECT {AWAITING_COLS}, claimed_at, claimed_by FROM awaiting WHERE state = 'claimed' ORDER BY ticket_id"
                ))?;
                let rows = stmt.query_map([], |r| {
                    let at: Option<i64> = r.get(10)?;
                    let by: Option<u32> = r.get(11)?;
                    Ok((awaiting_from_row(r)?, at, by))
                })?;
                let mut out = Vec::new();
                for row in rows {
                    let (record, at, by) = row?;
                    let old = at.is_none_or(|at| at < claimed_before);
                    let gone = by.is_some_and(|pid| !alive(pid));
                    if old || gone {
                        out.push(record);
                    }
                }
                out
            };
            for r in &stuck {
                let result = format!(
                    "interrupted: the host that approved ticket `{}` stopped before committing the result; the call \
                     may have run and will not run again — check its effects, then make the call again if needed",
                    r.ticket_id
                );
                let step = NewStep {
                    run_id: &r.run_id,
                    agent: &r.agent,
                    call_id: &r.call_id,
                    tool_id: &r.tool_id,
                    arguments: &r.arguments,
                    verdict: "allow",
                    outcome: OutcomeKind::ExecutorError,
                    result: &result,
                    captured: "{}",
                };
                insert_step(&tx, &step, Some(&r.ticket_id))?;
                tx.execute(
                    "UPDATE awaiting SET state = 'resolved' WHERE ticket_id = ?1 AND state = 'claimed'",
                    params![r.ticket_id],
                )?;
            }
            tx.commit()?;
            Ok(stuck.into_iter().map(|r| r.ticket_id).collect())
        })
    }

    fn output_tools(&self, run_id: &str) -> Result<Vec<String>, CommitError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT DISTINCT tool_id FROM steps WHERE run_id = ?1 AND outcome = 'output' ORDER BY tool_id",
            )?;
            let rows = stmt.query_map(params![run_id], |r| r.get(0))?;
            rows.collect()
        })
    }

    fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached("SELECT key, value FROM tool_state WHERE agent = ?1 AND tool_id = ?2")?;
            let rows = stmt.query_map(params![agent, tool_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
    }

    fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        self.with(|c| {
            let mut stmt = c.prepare(
                "SELECT seq, run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id
                 FROM steps WHERE ?1 IS NULL OR run_id = ?1 ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![run_id], |r| {
                let outcome: String = r.get(6)?;
                Ok(StepRecord {
                    seq: r.get(0)?,
                    run_id: r.get(1)?,
                    call_id: r.get(2)?,
                    tool_id: r.get(3)?,
                    arguments: r.get(4)?,
                    verdict: r.get(5)?,
                    outcome: OutcomeKind::parse(&outcome),
                    result: r.get(7)?,
                    captured: r.get(8)?,
                    ticket_id: r.get(9)?,
                })
            })?;
            rows.collect()
        })
    }

    fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError> {
        self.with(|c| {
            let mut stmt =
                c.prepare(&format!("SELECT {AWAITING_COLS} FROM awaiting WHERE state = 'pending' ORDER BY rowid"))?;
            let rows = stmt.query_map([], awaiting_from_row)?;
            rows.collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    fn step<'a>(call_id: &'a str, outcome: OutcomeKind) -> NewStep<'a> {
        NewStep {
            run_id: "run-1",
            agent: "main",
            call_id,
            tool_id: "notes.add",
            arguments: r#"{"text":"hi"}"#,
            verdict: "allow",
            outcome,
            result: "ok",
            captured: "{}",
        }
    }

    fn set(key: &str, value: &str) -> StateChange {
        StateChange { key: key.into(), value: Some(value.into()) }
    }

    fn awaiting(ticket: &str, call_id: &str, expires_at: i64) -> AwaitingRecord {
        AwaitingRecord {
            ticket_id: ticket.into(),
            run_id: "run-1".into(),
            agent: "main".into(),
            call_id: call_id.into(),
            tool_id: "notes.add".into(),
            arguments: r#"{"text":"hi"}"#.into(),
            argument_digest: "d".repeat(64),
            component_digest: Digest::of(b"component"),
            expires_at,
            state: "pending".into(),
        }
    }

    fn ticket_state(j: &SqliteJournal, ticket: &str) -> Option<String> {
        j.with(|c| {
            c.query_row("SELECT state FROM awaiting WHERE ticket_id = ?1", params![ticket], |r| r.get(0)).optional()
        })
        .unwrap()
    }

    fn journals() -> Vec<(SqliteJournal, Option<tempfile::TempDir>)> {
        let dir = tempfile::tempdir().unwrap();
        let file = SqliteJournal::open(&dir.path().join("nested/dir/journal.db")).unwrap();
        vec![(SqliteJournal::in_memory().unwrap(), None), (file, Some(dir))]
    }

    #[test]
    fn a_step_and_its_changes_commit_together() {
        for (j, _dir) in journals() {
            j.begin_run("run-1", "main", "configured").unwrap();
            let seq = j.commit_step(&step("c1", OutcomeKind::Output), &[set("a", "1"), set("b", "2")], None).unwrap();
            let removal = StateChange { key: "a".into(), value: None };
            let seq2 = j.commit_step(&step("c2", OutcomeKind::Output), &[removal, set("b", "3")], None).unwrap();
            assert!(seq2 > seq);
            let state = j.tool_state("main", "notes.add").unwrap();
            assert_eq!(state, BTreeMap::from([("b".to_owned(), "3".to_owned())]));
            // State is scoped by agent and Tool.
            assert!(j.tool_state("other", "notes.add").unwrap().is_empty());
            assert!(j.tool_state("main", "notes.list").unwrap().is_empty());
            let steps = j.steps(Some("run-1")).unwrap();
            assert_eq!(steps.iter().map(|s| s.call_id.as_str()).collect::<Vec<_>>(), ["c1", "c2"]);
            assert_eq!(steps[0].seq, seq);
            assert_eq!(steps[0].outcome, OutcomeKind::Output);
            assert!(j.steps(Some("run-2")).unwrap().is_empty());
            assert_eq!(j.steps(None).unwrap().len(), 2);
        }
    }

    #[test]
    fn a_failed_awaiting_insert_rolls_back_step_and_changes() {
        for (j, _dir) in journals() {
            let first = awaiting("t-1", "c1", i64::MAX);
            j.commit_step(&step("c1", OutcomeKind::Awaiting), &[set("k", "before")], Some(&first)).unwrap();
            let before_steps = j.steps(None).unwrap();
            let before_state = j.tool_state("main", "notes.add").unwrap();

            // Same ticket id (primary key), then same call id (unique): both must fail whole.
            for dup in [awaiting("t-1", "c2", i64::MAX), awaiting("t-2", "c1", i64::MAX)] {
                let r = j.commit_step(
                    &step("c2", OutcomeKind::Awaiting),
                    &[set("k", "after"), set("new", "x"), StateChange { key: "k".into(), value: None }],
                    Some(&dup),
                );
                match r {
                    Err(e @ CommitError::Sqlite { .. }) => assert!(e.to_string().contains("UNIQUE"), "{e}"),
                    other => panic!("expected a constraint failure, got {other:?}"),
                }
                assert_eq!(j.steps(None).unwrap(), before_steps, "the step must not be visible");
                assert_eq!(j.tool_state("main", "notes.add").unwrap(), before_state, "no change may be visible");
            }
            let pending = j.pending().unwrap();
            assert_eq!(pending.len(), 1);
            assert_eq!(pending[0], first);
            // The journal still works after the rollback.
            j.commit_step(&step("c3", OutcomeKind::Output), &[set("k", "later")], None).unwrap();
            assert_eq!(j.tool_state("main", "notes.add").unwrap()["k"], "later");
        }
    }

    #[test]
    fn a_run_is_recorded_with_its_first_step() {
        for (j, dir) in journals() {
            j.begin_run("run-1", "main", "deny-all").unwrap();
            j.begin_run("run-empty", "main", "configured").unwrap();
            j.commit_step(&step("c1", OutcomeKind::Blocked), &[], None).unwrap();
            j.commit_step(&step("c2", OutcomeKind::Blocked), &[], None).unwrap();
            let runs = |j: &SqliteJournal| -> Vec<(String, String)> {
                j.with(|c| {
                    let mut st = c.prepare("SELECT run_id, narrowing FROM runs ORDER BY run_id")?;
                    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
                })
                .unwrap()
            };
            let got = runs(&j);
            assert!(got.contains(&("run-1".into(), "deny-all".into())), "{got:?}");
            if let Some(d) = dir {
                // Durable: a run is written with its first step; one that made no call leaves no record.
                assert_eq!(got, [("run-1".to_owned(), "deny-all".to_owned())]);
                drop(j);
                let j = SqliteJournal::open(&d.path().join("nested/dir/journal.db")).unwrap();
                assert_eq!(runs(&j), [("run-1".to_owned(), "deny-all".to_owned())]);
            }
        }
    }

    #[test]
    fn concurrent_steps_share_durable_commits_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let j = std::sync::Arc::new(SqliteJournal::open(&dir.path().join("j.db")).unwrap());
        j.commit_step(&step("dup", OutcomeKind::Awaiting), &[], Some(&awaiting("taken", "dup", i64::MAX))).unwrap();
        let threads: Vec<_> = (0..16)
            .map(|t| {
                let j = j.clone();
                std::thread::spawn(move || {
                    let mut seqs = Vec::new();
                    for i in 0..20 {
                        let call = format!("c{t}-{i}");
                        if t == 3 && i == 10 {
                            // Same ticket id as an existing record: this step alone must fail.
                            let r = j.commit_step(
                                &step(&call, OutcomeKind::Awaiting),
                                &[set("poison", "1")],
                                Some(&awaiting("taken", &call, i64::MAX)),
                            );
                            assert!(matches!(r, Err(CommitError::Sqlite { .. })), "{r:?}");
                            continue;
                        }
                        seqs.push(j.commit_step(&step(&call, OutcomeKind::Output), &[set(&call, "1")], None).unwrap());
                    }
                    seqs
                })
            })
            .collect();
        let mut seqs: Vec<i64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        seqs.sort();
        seqs.dedup();
        assert_eq!(seqs.len(), 16 * 20 - 1, "every other step committed, each with its own seq");
        let state = j.tool_state("main", "notes.add").unwrap();
        assert_eq!(state.len(), 16 * 20 - 1);
        assert!(!state.contains_key("poison"), "the failed step's changes rolled back with it");
        let (groups, steps) = j.group_commits();
        assert_eq!(steps, 16 * 20 + 1);
        assert!(groups <= steps, "{groups} groups for {steps} steps");
        // Reopened: everything acknowledged is there.
        drop(j);
        let j = SqliteJournal::open(&dir.path().join("j.db")).unwrap();
        assert_eq!(j.steps(None).unwrap().len(), 16 * 20);
    }

    #[test]
    fn claims_of_a_dead_host_are_settled_once_and_never_rerun() {
        for (j, _dir) in journals() {
            let now = now();
            j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t1", "c1", now + 600))).unwrap();
            j.commit_step(&step("c2", OutcomeKind::Awaiting), &[], Some(&awaiting("t2", "c2", now + 600))).unwrap();
            let _claimed = j.claim_ticket("t1", now).unwrap().unwrap();
            // The claimer is alive and the claim is fresh: in flight, left alone.
            assert!(j.settle_interrupted(now - 3600, &|_| true).unwrap().is_empty());
            assert_eq!(ticket_state(&j, "t1").as_deref(), Some("claimed"));
            // The claimer is gone: settled with an executor_error step; the pending ticket is untouched.
            assert_eq!(j.settle_interrupted(now - 3600, &|_| false).unwrap(), ["t1"]);
            assert_eq!(ticket_state(&j, "t1").as_deref(), Some("resolved"));
            assert_eq!(ticket_state(&j, "t2").as_deref(), Some("pending"));
            let last = j.steps(None).unwrap().pop().unwrap();
            assert_eq!((last.call_id.as_str(), last.outcome), ("c1", OutcomeKind::ExecutorError));
            assert!(last.result.contains("interrupted") && last.result.contains("t1"), "{}", last.result);
            assert_eq!(j.claim_ticket("t1", now).unwrap().unwrap_err(), TicketError::Used("t1".into()));
            assert!(j.settle_interrupted(now + 1, &|_| false).unwrap().is_empty(), "settled once");
            // A claim older than the lease is settled even if its process looks alive.
            let _c2 = j.claim_ticket("t2", now).unwrap().unwrap();
            assert_eq!(j.settle_interrupted(now + 1, &|_| true).unwrap(), ["t2"]);
        }
    }

    #[test]
    fn tickets_are_claimed_once() {
        for (j, _dir) in journals() {
            let now = 1_000;
            j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("live", "c1", now + 1))).unwrap();
            j.commit_step(&step("c2", OutcomeKind::Awaiting), &[], Some(&awaiting("stale", "c2", now))).unwrap();
            j.commit_step(&step("c3", OutcomeKind::Awaiting), &[], Some(&awaiting("old", "c3", now - 60))).unwrap();
            assert_eq!(j.pending().unwrap().len(), 3);

            let claimed = j.claim_ticket("live", now).unwrap().expect("a pending ticket is claimable");
            assert_eq!(claimed.ticket_id(), "live");
            assert_eq!(claimed.call_id(), "c1");
            assert_eq!(claimed.tool_id(), "notes.add");
            assert_eq!(claimed.argument_digest(), "d".repeat(64));
            assert_eq!(claimed.component_digest(), &Digest::of(b"component"));
            assert_eq!(claimed.record().state, "claimed");
            assert_eq!(ticket_state(&j, "live").as_deref(), Some("claimed"));
            assert_eq!(j.claim_ticket("live", now).unwrap().unwrap_err(), TicketError::Used("live".into()));

            // Expired (at and past expiry): refused, and left as it was.
            for t in ["stale", "old"] {
                assert_eq!(j.claim_ticket(t, now).unwrap().unwrap_err(), TicketError::Expired(t.into()));
                assert_eq!(ticket_state(&j, t).as_deref(), Some("pending"));
            }
            assert_eq!(j.pending().unwrap().iter().map(|a| a.ticket_id.as_str()).collect::<Vec<_>>(), ["stale", "old"]);

            for t in ["nope", "", "live' OR '1'='1"] {
                assert_eq!(j.claim_ticket(t, now).unwrap().unwrap_err(), TicketError::Unknown(t.into()));
            }
            assert_eq!(ticket_state(&j, "live").as_deref(), Some("claimed"));
        }
    }

    #[test]
    fn resolving_a_ticket_commits_its_step_and_changes() {
        for (j, _dir) in journals() {
            j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t", "c1", i64::MAX))).unwrap();
            let claimed = j.claim_ticket("t", now()).unwrap().unwrap();
            let seq = j.resolve_ticket(claimed, &step("c1", OutcomeKind::Output), &[set("n", "1")]).unwrap();
            assert_eq!(ticket_state(&j, "t").as_deref(), Some("resolved"));
            assert_eq!(j.tool_state("main", "notes.add").unwrap()["n"], "1");
            let steps = j.steps(None).unwrap();
            let resolved = steps.iter().find(|s| s.seq == seq).unwrap();
            assert_eq!(resolved.ticket_id.as_deref(), Some("t"));
            assert_eq!(resolved.outcome, OutcomeKind::Output);
            // The awaiting step carries the ticket too.
            assert_eq!(steps[0].ticket_id.as_deref(), Some("t"));
            assert_eq!(steps[0].outcome, OutcomeKind::Awaiting);
            assert_eq!(j.claim_ticket("t", now()).unwrap().unwrap_err(), TicketError::Used("t".into()));
            assert!(j.pending().unwrap().is_empty());

            // Abandoning a claim resolves it as well, without a step.
            j.commit_step(&step("c2", OutcomeKind::Awaiting), &[], Some(&awaiting("u", "c2", i64::MAX))).unwrap();
            let claimed = j.claim_ticket("u", now()).unwrap().unwrap();
            j.abandon_ticket(claimed, "component changed").unwrap();
            assert_eq!(ticket_state(&j, "u").as_deref(), Some("resolved"));
            assert_eq!(j.claim_ticket("u", now()).unwrap().unwrap_err(), TicketError::Used("u".into()));
            assert_eq!(j.steps(None).unwrap().len(), 3);
        }
    }

    #[test]
    fn a_file_journal_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        {
            let j = SqliteJournal::open(&path).unwrap();
            j.commit_step(&step("c1", OutcomeKind::Awaiting), &[set("k", "v")], Some(&awaiting("t", "c1", i64::MAX)))
                .unwrap();
        }
        let j = SqliteJournal::open(&path).unwrap();
        assert_eq!(j.tool_state("main", "notes.add").unwrap()["k"], "v");
        assert_eq!(j.pending().unwrap()[0].ticket_id, "t");
        assert!(j.claim_ticket("t", now()).unwrap().is_ok());
    }

    #[test]
    fn two_connections_racing_for_one_ticket_yield_one_winner() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("journal.db");
            let ticket = format!("ticket-{round}");
            SqliteJournal::open(&path)
                .unwrap()
                .commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting(&ticket, "c1", i64::MAX)))
                .unwrap();
            let barrier = Arc::new(Barrier::new(2));
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (path, ticket, barrier) = (path.clone(), ticket.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let j = SqliteJournal::open(&path).unwrap();
                        barrier.wait();
                        j.claim_ticket(&ticket, now()).unwrap().map(|c| c.ticket_id().to_owned())
                    })
                })
                .collect();
            let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            let wins = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(wins, 1, "round {round}: {results:?}");
            assert!(results.contains(&Err(TicketError::Used(ticket.clone()))), "round {round}: {results:?}");
        }
    }

    #[test]
    fn unreadable_journal_values_degrade_safely() {
        let j = SqliteJournal::in_memory().unwrap();
        j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t", "c1", i64::MAX))).unwrap();
        j.with(|c| {
            c.execute("UPDATE awaiting SET component_digest = 'zz'", [])?;
            c.execute("UPDATE steps SET outcome = 'mystery'", [])
        })
        .unwrap();
        // An unreadable digest matches no real component; an unknown outcome
        // reads as an executor error (someone must look), never as output.
        assert_eq!(j.pending().unwrap()[0].component_digest, Digest([0; 32]));
        assert_eq!(j.steps(None).unwrap()[0].outcome, OutcomeKind::ExecutorError);
        for k in [
            OutcomeKind::Output,
            OutcomeKind::ToolError,
            OutcomeKind::Blocked,
            OutcomeKind::Awaiting,
            OutcomeKind::ExecutorError,
        ] {
            assert_eq!(OutcomeKind::parse(k.as_str()), k);
        }
    }
}
