//! Commit: the Step commit and the journal behind it.
//!
//! Owns the one store of run state: runs, steps (call, verdict, outcome,
//! captured output), Awaiting records with their resume tickets, and Tool
//! state. A step's result and its Commands are written in one transaction, or
//! not at all. SQLite is the embedded default; the [`StepStore`] trait is the
//! seam for a shared backend.
//!
//! Architecture invariant: nothing else writes run state. A ticket moves
//! pending → claimed → resolved exactly once; a claimed ticket is never
//! handed out again, so an approved call executes at most once.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
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
    #[error("ticket `{ticket}`: the component of `{tool}` changed since the call was requested (was {was}, now {now}); the approval does not carry over, make the call again")]
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
    /// A Tool's committed state for an agent.
    fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError>;
    /// Steps in journal order, optionally of one run.
    fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError>;
    /// Awaiting records still pending.
    fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError>;
}

/// Unix seconds now.
pub fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// The embedded SQLite journal.
pub struct SqliteJournal {
    conn: Mutex<Connection>,
    path: String,
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    narrowing TEXT NOT NULL,
    started_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
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
    state TEXT NOT NULL CHECK (state IN ('pending', 'claimed', 'resolved'))
);
CREATE TABLE IF NOT EXISTS tool_state (
    agent TEXT NOT NULL,
    tool_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (agent, tool_id, key)
);
"#;

impl SqliteJournal {
    /// Open (creating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<Self, CommitError> {
        let shown = path.display().to_string();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|source| CommitError::Directory { path: shown.clone(), source })?;
        }
        let conn = Connection::open(path).map_err(|source| CommitError::Sqlite { path: shown.clone(), source })?;
        Self::init(conn, shown, true)
    }

    /// A journal in memory: the same commit path without durability
    /// (benchmarks, tests).
    pub fn in_memory() -> Result<Self, CommitError> {
        let conn = Connection::open_in_memory()
            .map_err(|source| CommitError::Sqlite { path: ":memory:".into(), source })?;
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
        Ok(SqliteJournal { conn: Mutex::new(conn), path })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T, CommitError> {
        // A poisoned lock only means another thread panicked mid-call; SQLite
        // rolled its transaction back, so the connection is still consistent.
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn).map_err(|source| CommitError::Sqlite { path: self.path.clone(), source })
    }
}

fn insert_step(tx: &rusqlite::Transaction<'_>, s: &NewStep<'_>, ticket: Option<&str>) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id, committed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![s.run_id, s.call_id, s.tool_id, s.arguments, s.verdict, s.outcome.as_str(), s.result, s.captured, ticket, now()],
    )?;
    Ok(tx.last_insert_rowid())
}

fn apply_changes(tx: &rusqlite::Transaction<'_>, agent: &str, tool: &str, changes: &[StateChange]) -> rusqlite::Result<()> {
    for c in changes {
        match &c.value {
            Some(v) => tx.execute(
                "INSERT INTO tool_state (agent, tool_id, key, value) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (agent, tool_id, key) DO UPDATE SET value = excluded.value",
                params![agent, tool, c.key, v],
            )?,
            None => tx.execute(
                "DELETE FROM tool_state WHERE agent = ?1 AND tool_id = ?2 AND key = ?3",
                params![agent, tool, c.key],
            )?,
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
        self.with(|c| {
            c.execute(
                "INSERT OR IGNORE INTO runs (run_id, agent, narrowing, started_at) VALUES (?1, ?2, ?3, ?4)",
                params![run_id, agent, narrowing, now()],
            )
            .map(|_| ())
        })
    }

    fn commit_step(&self, step: &NewStep<'_>, changes: &[StateChange], awaiting: Option<&AwaitingRecord>) -> Result<i64, CommitError> {
        self.with(|c| {
            let tx = c.transaction()?;
            let seq = insert_step(&tx, step, awaiting.map(|a| a.ticket_id.as_str()))?;
            apply_changes(&tx, step.agent, step.tool_id, changes)?;
            if let Some(a) = awaiting {
                tx.execute(
                    &format!("INSERT INTO awaiting ({AWAITING_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'pending')"),
                    params![a.ticket_id, a.run_id, a.agent, a.call_id, a.tool_id, a.arguments, a.argument_digest, a.component_digest.hex(), a.expires_at],
                )?;
            }
            tx.commit()?;
            Ok(seq)
        })
    }

    fn resolve_ticket(&self, ticket: ClaimedTicket, step: &NewStep<'_>, changes: &[StateChange]) -> Result<i64, CommitError> {
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
                    tx.execute("UPDATE awaiting SET state = 'claimed' WHERE ticket_id = ?1 AND state = 'pending'", params![ticket_id])?;
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
            let mut stmt = c.prepare(&format!("SELECT {AWAITING_COLS} FROM awaiting WHERE state = 'pending' ORDER BY rowid"))?;
            let rows = stmt.query_map([], awaiting_from_row)?;
            rows.collect()
        })
    }
}
