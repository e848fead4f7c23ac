//! SQLite: the embedded default journal.
//!
//! Owns the SQLite schema and its versioned migrations, and the write
//! discipline of a file journal: WAL with `synchronous = FULL`, and a single
//! writer — the group committer thread — through which every write goes
//! (steps, runs, ticket claims, resolutions, settlements). Writes that arrive
//! while one commit is being made durable share the next transaction, a
//! savepoint each, so a failing write rolls back alone (when its error rolls
//! the whole transaction back — an I/O error, a full disk — the others are
//! applied again in a new one, never outside it); each caller is answered
//! only once the transaction holding its write is durable, and told written
//! only if it is. Reads use their own connection (WAL: never blocked by the
//! writer). An in-memory journal (`store = ":memory:"`) has one connection
//! and no durability.
//!
//! A new journal is built under a temporary name beside it, its schema
//! committed, and renamed into place whole, so a start that dies creating it
//! leaves nothing at the journal's name. A journal file that would be read
//! as a new, empty journal while it is not one — empty (0 bytes), without a
//! schema while a `-wal` SQLite cannot apply lies beside it, or missing
//! while its `-wal` is not — is therefore always a damaged journal: refused,
//! never replaced; so is a listing that could not read the `-wal`.
//!
//! Architecture invariant: no connection but the writer's changes a durable
//! journal, and every transaction that claims a ticket takes the database's
//! write lock first, so claims from threads, processes and hosts sharing the
//! file serialize and exactly one sees a ticket pending.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use super::write::{Committer, PendingRun, PendingRuns, StateCheck, Write, Written};
use super::{
    ApprovedBy, AskScope, AwaitingRecord, ClaimedTicket, CommitError, NewStep, OutcomeKind, PriorAsk, RunInfo,
    RunRecord, StateChange, StepRecord, StepStore, TicketError, now,
};
use crate::digest::Digest;

/// The `store` value that selects an in-memory journal.
pub const IN_MEMORY: &str = ":memory:";

/// Most writes one group commit holds.
const MAX_GROUP: usize = 256;

/// The embedded SQLite journal.
pub struct SqliteJournal {
    /// Reads; and every write of an in-memory journal.
    conn: Mutex<Connection>,
    path: String,
    /// Durable journals write through the group committer only.
    group: Option<GroupCommitter>,
    /// Runs begun but not yet written: a durable journal records a run in the
    /// transaction of its first step (one fsync instead of two for a one-call run).
    pending_runs: PendingRuns,
}

/// Group commit for a durable journal: writes that arrive while a commit is
/// being made durable go together into the next transaction, one fsync for
/// all of them.
struct GroupCommitter {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Transactions and writes committed, for the average group size.
    counts: Arc<(AtomicU64, AtomicU64)>,
}

/// One write waiting for a group commit, with where to send its result.
struct Job {
    write: Write,
    reply: tokio::sync::oneshot::Sender<Result<Written, CommitError>>,
}

/// Apply `write` inside the caller's transaction (or savepoint).
fn apply(write: &Write, c: &Connection) -> rusqlite::Result<Written> {
    match write {
        Write::Step { step, changes, awaiting, run } => {
            let step = step.borrow();
            if let Some(refused) = state_check(c, &step, changes)?.refusal() {
                return Ok(refused);
            }
            if let Some(run) = run {
                insert_run(c, step.run_id, run)?;
            }
            write_step(c, &step, changes, awaiting.as_ref()).map(Written::Seq)
        }
        Write::Run { run_id, run } => insert_run(c, run_id, run).map(|_| Written::Done),
        Write::Claim { ticket_id, now, holder } => claim(c, ticket_id, *now, holder).map(Written::Claim),
        Write::Heartbeat { holder, now } => heartbeat(c, holder, *now).map(|_| Written::Done),
        Write::Resolve { ticket_id, holder, step, changes, delivered } => {
            let step = step.borrow();
            if let Some(refused) = state_check(c, &step, changes)?.refusal() {
                return Ok(refused);
            }
            resolve(c, ticket_id, holder, &step, changes, *delivered).map(Written::Resolved)
        }
        Write::TakeOver { holder, now, lease_secs, only } => {
            take_over(c, holder, *now, *lease_secs, only.as_deref()).map(Written::TakenOver)
        }
        Write::Deliver { ticket_id, step } => deliver(c, ticket_id, &step.borrow()).map(Written::Delivered),
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
                    // The caller may be gone (its task was cancelled): its write is committed regardless.
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

/// Write `batch` in one IMMEDIATE transaction, a savepoint per write; one
/// result per job.
///
/// A failing write usually rolls back only its savepoint. But SQLite rolls
/// the whole transaction back on some errors — an I/O error always, a full
/// disk usually (a quota arrives as an I/O error), `RAISE(ROLLBACK)` — and
/// these can strike mid-statement, when the page cache spills to the WAL.
/// Then nothing applied in the transaction is left: the failing write is
/// answered with its error, and the others are applied again in a new
/// IMMEDIATE transaction (one already rolled back once by another write's
/// error is answered as not written, so a batch takes at most twice its
/// writes' work). No savepoint is opened without the group's transaction:
/// `SAVEPOINT` would start a transaction of its own and `RELEASE` commit it,
/// outside the group and its write lock, while the caller is told the group
/// failed.
fn commit_group(conn: &mut Connection, batch: &[Job], path: &str) -> Vec<Result<Written, CommitError>> {
    let group_error = |message: String| CommitError::Group { path: path.to_owned(), message };
    let mut results: Vec<Option<Result<Written, CommitError>>> = batch.iter().map(|_| None).collect();
    // The jobs the next transaction applies, in order, and those already rolled back once.
    let mut todo: Vec<usize> = (0..batch.len()).collect();
    let mut rolled_back = vec![false; batch.len()];
    while !todo.is_empty() {
        match attempt_group(conn, batch, &todo, path) {
            Attempt::Committed(written) => {
                for (&i, r) in todo.iter().zip(written) {
                    results[i] = Some(r);
                }
                break;
            }
            Attempt::Failed(message) => {
                for &i in &todo {
                    results[i] = Some(Err(group_error(message.clone())));
                }
                break;
            }
            Attempt::RolledBack { at, result } => {
                // What was applied before it is gone with it, and a refusal of it was decided in
                // that transaction: apply them again, unless they were rolled back once already.
                let mut undone = todo[..at].to_vec();
                match result {
                    Err(e) => results[todo[at]] = Some(Err(e)),
                    Ok(_) => undone.push(todo[at]),
                }
                let mut next = Vec::with_capacity(todo.len());
                for i in undone {
                    if rolled_back[i] {
                        results[i] = Some(Err(group_error(
                            "the group commit was rolled back twice by other writes' errors; nothing of this write \
                             was written"
                                .into(),
                        )));
                    } else {
                        rolled_back[i] = true;
                        next.push(i);
                    }
                }
                next.extend_from_slice(&todo[at + 1..]);
                todo = next;
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(group_error("the group commit did not reach this write".into()))))
        .collect()
}

/// How one transaction of a group commit ended.
enum Attempt {
    /// Committed: one result per job applied.
    Committed(Vec<Result<Written, CommitError>>),
    /// It could not begin, or its COMMIT failed: nothing in it was written.
    Failed(String),
    /// SQLite rolled it back while the job at `at` was applied (which
    /// returned `result`): nothing in it was written.
    RolledBack { at: usize, result: Result<Written, CommitError> },
}

/// Apply the jobs `todo` of `batch` in one IMMEDIATE transaction (the write
/// lock first, so claims from other processes serialize with ours), a
/// savepoint each, and commit it.
fn attempt_group(conn: &mut Connection, batch: &[Job], todo: &[usize], path: &str) -> Attempt {
    let mut tx = match conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return Attempt::Failed(e.to_string()),
    };
    let mut results = Vec::with_capacity(todo.len());
    for (at, &i) in todo.iter().enumerate() {
        let r = (|| -> rusqlite::Result<Written> {
            let sp = tx.savepoint()?;
            let written = apply(&batch[i].write, &sp)?;
            // A refused resolution or delivery wrote nothing; roll its savepoint back.
            if written.refused() {
                return Ok(written);
            }
            sp.commit()?;
            Ok(written)
        })()
        .map_err(|source| CommitError::Sqlite { path: path.to_owned(), source });
        // Autocommit again: SQLite rolled the whole transaction back. Not one
        // more statement in it (the next savepoint would begin another).
        if tx.is_autocommit() {
            return Attempt::RolledBack { at, result: r };
        }
        results.push(r);
    }
    match tx.commit() {
        Ok(()) => Attempt::Committed(results),
        Err(e) => Attempt::Failed(format!("the group commit failed, nothing in it was written: {e}")),
    }
}

/// Version 1: the first released journal.
const SCHEMA_V1: &str = r#"
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    narrowing TEXT NOT NULL,
    started_at INTEGER NOT NULL
);
CREATE TABLE steps (
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
CREATE INDEX steps_run ON steps(run_id, seq);
CREATE TABLE awaiting (
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
CREATE TABLE tool_state (
    agent TEXT NOT NULL,
    tool_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (agent, tool_id, key)
);
"#;

/// Version 2: who claimed a ticket and when, to settle claims of hosts that died.
const SCHEMA_V2: &str = r#"
ALTER TABLE awaiting ADD COLUMN claimed_at INTEGER;
ALTER TABLE awaiting ADD COLUMN claimed_by INTEGER;
"#;

/// Version 3: approvals are a human act. Runs keep their restriction (an
/// approval is held to it), steps record who approved and whether the result
/// is JSON, claims are held by a host instance with a heartbeat lease (not a
/// PID), and an ask remembers when it was made and whether its decided
/// result was handed to the agent's retry.
const SCHEMA_V3: &str = r#"
ALTER TABLE runs ADD COLUMN restriction TEXT;
ALTER TABLE steps ADD COLUMN structured INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN approved_by TEXT;
ALTER TABLE steps ADD COLUMN approved_via TEXT;
ALTER TABLE steps ADD COLUMN approved_at INTEGER;
CREATE INDEX steps_ticket ON steps(ticket_id) WHERE ticket_id IS NOT NULL;
ALTER TABLE awaiting ADD COLUMN requested_at INTEGER;
ALTER TABLE awaiting ADD COLUMN holder TEXT;
ALTER TABLE awaiting ADD COLUMN delivered INTEGER NOT NULL DEFAULT 0;
CREATE INDEX awaiting_call ON awaiting(run_id, tool_id, argument_digest);
CREATE TABLE hosts (
    instance_id TEXT PRIMARY KEY,
    heartbeat_at INTEGER NOT NULL
);
"#;

/// Version 4: an ask is found by agent too (stateless requests have no run to share).
const SCHEMA_V4: &str = r#"
CREATE INDEX awaiting_agent_call ON awaiting(agent, tool_id, argument_digest);
"#;

/// Version 5: a ticket keeps the run restrictions its call asked under.
const SCHEMA_V5: &str = r#"
ALTER TABLE awaiting ADD COLUMN restriction TEXT;
"#;

/// Version 6: a ticket keeps who may decide it, as when its call asked
/// (`NULL` for asks made before: they can be denied, not approved).
const SCHEMA_V6: &str = r#"
ALTER TABLE awaiting ADD COLUMN approvers TEXT;
"#;

/// Migrations in order: `user_version` N means the first N are applied.
const MIGRATIONS: &[&str] = &[SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The schema a journal's version has, as SQL: for tests that build a journal
/// an older toolgate wrote.
pub fn schema_at(version: i64) -> String {
    MIGRATIONS.iter().take(version.max(0) as usize).copied().collect()
}

/// Bring `conn`'s journal to [`SCHEMA_VERSION`], in one transaction.
/// `wal_beside`: the length of the `-wal` file that was beside the journal
/// before it was opened.
fn migrate(conn: &mut Connection, path: &str, wal_beside: u64) -> Result<(), CommitError> {
    let err = |source| CommitError::Sqlite { path: path.to_owned(), source };
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(err)?;
    let mut version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(err)?;
    if version == 0 {
        // Journals written before versioning: tell their schema by its tables.
        let has =
            |sql: &str| -> rusqlite::Result<bool> { tx.query_row(sql, [], |r| r.get::<_, i64>(0)).map(|n| n > 0) };
        if has("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'steps'").map_err(err)? {
            version =
                if has("SELECT COUNT(*) FROM pragma_table_info('awaiting') WHERE name = 'claimed_by'").map_err(err)? {
                    2
                } else {
                    1
                };
        } else if wal_beside > 0 {
            // A WAL SQLite did not apply (damaged, cut short, another database's): the
            // journal is in it, and the first write here would start the WAL over.
            return Err(CommitError::Unsupported {
                store: path.to_owned(),
                message: format!(
                    "it holds no journal, while a {wal_beside}-byte `-wal` file beside it does, which SQLite cannot \
                     apply (damaged or cut short, or another database's); opened, it would become a new, empty \
                     journal in place of the steps and pending approvals in that file. {WHAT_TO_DO}"
                ),
            });
        }
    }
    if version > SCHEMA_VERSION {
        return Err(CommitError::NewerSchema { path: path.to_owned(), found: version, known: SCHEMA_VERSION });
    }
    for sql in MIGRATIONS.iter().skip(version as usize) {
        tx.execute_batch(sql).map_err(err)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(err)?;
    die_at("schema-uncommitted");
    tx.commit().map_err(err)
}

impl SqliteJournal {
    /// Open (creating if needed, migrating if older) the journal at `path`.
    pub fn open(path: &Path) -> Result<Self, CommitError> {
        Self::open_with(path, crate::store::Durability::Machine)
    }

    /// [`SqliteJournal::open`] with `durability`: `Machine` fsyncs every
    /// commit (`synchronous = FULL`), `Process` only at checkpoints
    /// (`synchronous = NORMAL`, which in WAL mode survives a crash of the
    /// process but not a power loss).
    pub fn open_with(path: &Path, durability: crate::store::Durability) -> Result<Self, CommitError> {
        let synchronous = match durability {
            crate::store::Durability::Machine => "FULL",
            crate::store::Durability::Process => "NORMAL",
        };
        let shown = path.display().to_string();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true);
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            builder.create(dir).map_err(|source| CommitError::Directory { path: shown.clone(), source })?;
        }
        remove_stale_creations(path);
        // Measured before the journal is looked for (a journal's name, once
        // there, stays), and before SQLite opens it (SQLite may remove it).
        let wal_beside = wal_len(path);
        if std::fs::metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            if wal_beside > 0 {
                return Err(CommitError::Unsupported {
                    store: shown,
                    message: format!(
                        "the journal file is missing, while a {wal_beside}-byte `-wal` file beside its name holds \
                         its latest commits (left as it is); a new journal created here would be read with that \
                         file's pages. Restore the journal from a backup (with its `-wal` file); or, to start a new \
                         journal, remove the `-wal` and `-shm` files"
                    ),
                });
            }
            create_journal(path, &shown)?;
        }
        refuse_emptied(path, &shown)?;
        owner_only(path).map_err(|source| CommitError::Directory { path: shown.clone(), source })?;
        // Never created here: only [`create_journal`] gives a file the journal's name, whole.
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
            | rusqlite::OpenFlags::SQLITE_OPEN_URI
            | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let open = || {
            Connection::open_with_flags(path, flags)
                .map_err(|source| CommitError::Sqlite { path: shown.clone(), source })
        };
        let mut journal = Self::init(open()?, shown.clone(), Some(synchronous), wal_beside)?;
        // The committer writes on its own connection (WAL: readers are not blocked).
        let writer = open()?;
        let err = |source| CommitError::Sqlite { path: shown.clone(), source };
        writer.pragma_update(None, "synchronous", synchronous).map_err(err)?;
        writer.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        let group = GroupCommitter::start(writer, shown.clone()).map_err(|e| CommitError::Group {
            path: shown.clone(),
            message: format!("cannot start the committer: {e}"),
        })?;
        journal.group = Some(group);
        Ok(journal)
    }

    /// Open the existing journal at `path` for reading only (`toolgate
    /// journal`): nothing is created, migrated or switched to WAL, so a
    /// journal this process may not write is read as it is. A journal of
    /// another schema version than this build's is refused (an older one:
    /// any writing command migrates it). When SQLite cannot open a WAL
    /// journal read-only (no `-shm` file, and none can be made beside it: a
    /// read-only directory), it is read as immutable: no process can be
    /// writing it through such a directory's files. But an immutable
    /// journal is read without its `-wal` file: when a non-empty one lies
    /// beside it (the steps committed since the last checkpoint), the journal
    /// is refused rather than listed without them. An empty journal file is
    /// refused as [`SqliteJournal::open`] refuses it.
    pub fn open_read_only(path: &Path) -> Result<Self, CommitError> {
        use rusqlite::OpenFlags;
        let shown = path.display().to_string();
        refuse_emptied(path, &shown)?;
        let err = |source| CommitError::Sqlite { path: shown.clone(), source };
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let version = |c: &Connection| c.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0));
        let mut conn = Connection::open_with_flags(path, flags).map_err(err)?;
        let found = match version(&conn) {
            Ok(v) => v,
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen) => {
                let wal = wal_len(path);
                if wal > 0 {
                    return Err(CommitError::Unsupported {
                        store: shown,
                        message: format!(
                            "its {wal}-byte `-wal` file holds steps committed since the last checkpoint, which SQLite \
                             reads only with a `-shm` file beside it, and there is none and this user cannot create \
                             one ({e}); read without them, the listing would leave them out. List it as a user who \
                             can write its directory (the host's), or once every host using it has stopped (the last \
                             one moves the `-wal` into the journal as it closes it)"
                        ),
                    });
                }
                let mut uri = String::from("file:");
                for b in path.as_os_str().as_encoded_bytes() {
                    if b.is_ascii_alphanumeric() || b"/-_.~".contains(b) {
                        uri.push(char::from(*b));
                    } else {
                        uri.push_str(&format!("%{b:02X}"));
                    }
                }
                uri.push_str("?immutable=1");
                conn = Connection::open_with_flags(&uri, flags | OpenFlags::SQLITE_OPEN_URI).map_err(err)?;
                version(&conn).map_err(err)?
            }
            Err(e) => return Err(err(e)),
        };
        if found > SCHEMA_VERSION {
            return Err(CommitError::NewerSchema { path: shown, found, known: SCHEMA_VERSION });
        }
        if found < SCHEMA_VERSION {
            return Err(CommitError::Unsupported {
                store: shown,
                message: format!(
                    "schema version {found}, older than the {SCHEMA_VERSION} this toolgate reads; it is read only \
                     as it is, so run a command that writes it (`toolgate call`, `toolgate serve`) to migrate it first"
                ),
            });
        }
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        Ok(SqliteJournal { conn: Mutex::new(conn), path: shown, group: None, pending_runs: PendingRuns::default() })
    }

    /// A journal in memory: the same commit path without durability
    /// (benchmarks, tests).
    pub fn in_memory() -> Result<Self, CommitError> {
        let conn =
            Connection::open_in_memory().map_err(|source| CommitError::Sqlite { path: IN_MEMORY.into(), source })?;
        Self::init(conn, IN_MEMORY.into(), None, 0)
    }

    /// `synchronous`: `None` in memory; else the file's WAL sync mode.
    /// `wal_beside`: the length of the `-wal` file beside the journal before it was opened.
    fn init(
        mut conn: Connection,
        path: String,
        synchronous: Option<&str>,
        wal_beside: u64,
    ) -> Result<Self, CommitError> {
        let err = |source| CommitError::Sqlite { path: path.clone(), source };
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        if let Some(synchronous) = synchronous {
            // WAL + FULL: a committed step survives a crash of the host or the
            // machine; WAL + NORMAL: of the host (the `durability` setting).
            // (A journal is created in WAL mode: this is for one created before.)
            conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
            conn.pragma_update(None, "synchronous", synchronous).map_err(err)?;
        }
        // Until the journal is migrated (or refused), closing this connection
        // neither checkpoints nor deletes the `-wal` (as the last one open, it would).
        let no_checkpoint_on_close = |conn: &Connection, on| {
            conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, on).map_err(err)
        };
        no_checkpoint_on_close(&conn, true)?;
        migrate(&mut conn, &path, wal_beside)?;
        no_checkpoint_on_close(&conn, false)?;
        Ok(SqliteJournal { conn: Mutex::new(conn), path, group: None, pending_runs: PendingRuns::default() })
    }

    /// Group commits made and the writes they held (`(0, 0)` for an in-memory journal).
    pub fn group_commits(&self) -> (u64, u64) {
        self.group.as_ref().map_or((0, 0), |g| (g.counts.0.load(Ordering::Relaxed), g.counts.1.load(Ordering::Relaxed)))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T, CommitError> {
        // A poisoned lock only means another thread panicked mid-call; SQLite
        // rolled its transaction back, so the connection is still consistent.
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn).map_err(|source| CommitError::Sqlite { path: self.path.clone(), source })
    }

    /// Run `f` on the read connection (tests inspect the schema with it).
    #[doc(hidden)]
    pub fn read_raw<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, CommitError> {
        self.with(|c| f(c))
    }
}

/// Tighten an existing journal file open to others to its owner only (one is
/// created so, [`create_temporary`]; SQLite gives its WAL and shared-memory
/// files the same mode): it holds every call's arguments and results.
fn owner_only(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let file = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let mode = file.metadata()?.permissions().mode();
        if mode & 0o077 != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// What to do with a journal that would be read as a new, empty one.
const WHAT_TO_DO: &str = "Restore it from a backup (with its `-wal` file, if it had one); or, to start a new journal, \
                          remove it and its `-wal` and `-shm` files";

/// The length of the `-wal` file beside the journal at `path` (0 if there is none).
fn wal_len(path: &Path) -> u64 {
    std::fs::metadata(with_suffix(path, "-wal")).map_or(0, |m| m.len())
}

/// Refuse an existing journal file that is empty (0 bytes). SQLite would
/// open it as a new database — deleting a `-wal` file beside it — and the
/// journal be migrated to a new, empty one: every committed step and pending
/// approval gone without a word (a restore or copy that ran out of space, a
/// truncated file). No host leaves one while it creates a journal, nor when
/// it dies doing so ([`create_journal`]): an empty file at the journal's name
/// is always one emptied, refused at once. (One left by a toolgate before
/// journals were created so is refused too: nothing tells the two apart.)
fn refuse_emptied(path: &Path, shown: &str) -> Result<(), CommitError> {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
        return Ok(());
    }
    let wal = wal_len(path);
    let beside =
        if wal > 0 { format!(", with a {wal}-byte `-wal` file beside it (left as it is)") } else { String::new() };
    Err(CommitError::Unsupported {
        store: shown.to_owned(),
        message: format!(
            "the journal file is empty (0 bytes){beside}; opened, it would become a new, empty journal in place of \
             every step and pending approval it held (a restore or copy that ran out of space, or a truncated file). \
             {WHAT_TO_DO}"
        ),
    })
}

/// The start of the temporary names a journal at `path` is created under:
/// `journal.db.new-` for `journal.db`.
fn creation_prefix(path: &Path) -> std::ffi::OsString {
    let mut prefix = path.file_name().unwrap_or_default().to_owned();
    prefix.push(".new-");
    prefix
}

/// Create the journal at `path`, which does not exist, so that no file has
/// its name before it is whole: the schema is made and committed in a file
/// of a temporary name beside it (`journal.db.new-<pid>-<random>`, owner
/// only), in rollback-journal mode — no `-wal` is ever left for it — then
/// switched to WAL, closed, and given the journal's name by a rename that
/// replaces nothing, and the directory synced. A host killed before (or
/// short of space) leaves only its temporary files, which no start reads
/// ([`remove_stale_creations`] removes them after an hour); so an empty
/// journal file, or one without a schema beside a `-wal`, is always a
/// damaged journal, never a first start that did not finish. Two hosts
/// creating the journal at once each build one; the second to rename finds
/// the first's in place, removes its own and opens that one (`Ok` both).
fn create_journal(path: &Path, shown: &str) -> Result<(), CommitError> {
    let io = |source: std::io::Error| CommitError::Directory { path: shown.to_owned(), source };
    let temp = create_temporary(path).map_err(io)?;
    die_at("temporary-created");
    let placed = build_journal(&temp, shown).and_then(|()| {
        die_at("before-placing");
        place(&temp, path).map_err(|e| {
            io(std::io::Error::new(e.kind(), format!("giving the journal built as {} its name: {e}", temp.display())))
        })
    });
    // Its temporary name, and any file SQLite left beside it: gone, whatever
    // happened (after a rename, nothing is left).
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(&temp, suffix));
    }
    if placed? {
        sync_directory(path).map_err(io)?;
    }
    Ok(())
}

/// `path` with `suffix` after its file name (`journal.db` and `-wal`: `journal.db-wal`).
fn with_suffix(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// Create an empty file of a new temporary name beside `path`, readable by
/// its owner only, and return its path.
fn create_temporary(path: &Path) -> std::io::Result<std::path::PathBuf> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    loop {
        let mut random = [0u8; 8];
        if getrandom::fill(&mut random).is_err() {
            // Unique enough with the pid: the name is taken exclusively below.
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            random = (nanos.as_nanos() as u64).to_le_bytes();
        }
        let mut name = creation_prefix(path);
        name.push(format!("{}-{}", std::process::id(), hex::encode(random)));
        let temp = path.with_file_name(name);
        match options.open(&temp) {
            Ok(_) => return Ok(temp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(std::io::Error::new(e.kind(), format!("creating {}: {e}", temp.display())));
            }
        }
    }
}

/// Make the journal's schema in the empty file `temp`, committed durably in
/// rollback-journal mode, switch it to WAL, and close it.
fn build_journal(temp: &Path, shown: &str) -> Result<(), CommitError> {
    let err = |source| CommitError::Sqlite { path: shown.to_owned(), source };
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn = Connection::open_with_flags(temp, flags).map_err(err)?;
    conn.pragma_update(None, "journal_mode", "DELETE").map_err(err)?;
    // Whatever the `durability`: the file must be whole on disk before it is renamed.
    conn.pragma_update(None, "synchronous", "FULL").map_err(err)?;
    migrate(&mut conn, shown, 0)?;
    // Written in a rollback-journal transaction too; closed, the connection
    // checkpoints and removes the (empty) `-wal` the switch opened.
    conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
    conn.close().map_err(|(_, source)| err(source))
}

/// Give the journal built at `temp` the name `path`, unless a file has it
/// already: `Ok(false)` (another host created the journal first), `temp`
/// left as it is. A rename that replaces nothing (Linux), else a hard link
/// (the caller removes `temp`'s name); on a file system with neither, a
/// rename after looking — there, two hosts creating the journal in the same
/// instant could each rename theirs, the later replacing the earlier.
fn place(temp: &Path, path: &Path) -> std::io::Result<bool> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::io::Errno;
        match rustix::fs::renameat_with(
            rustix::fs::CWD,
            temp,
            rustix::fs::CWD,
            path,
            rustix::fs::RenameFlags::NOREPLACE,
        ) {
            Ok(()) => return Ok(true),
            Err(Errno::EXIST) => return Ok(false),
            // Not supported by the file system or the kernel (or a seccomp filter).
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP | Errno::PERM) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match std::fs::hard_link(temp, path) {
        Ok(()) => return Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(_) => {}
    }
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(false);
    }
    std::fs::rename(temp, path).map(|()| true)
}

/// Make the journal's new name durable: sync the directory holding `path`.
fn sync_directory(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        match std::fs::File::open(dir).and_then(|d| d.sync_all()) {
            // A file system that cannot sync a directory.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => Ok(()),
            r => r,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Remove what a start killed while creating the journal at `path` left
/// (`journal.db.new-…` and its `-journal`, `-wal` and `-shm` files), once an
/// hour old: no start reads them, and none takes an hour to create one.
fn remove_stale_creations(path: &Path) {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let prefix = creation_prefix(path);
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_name().as_encoded_bytes().starts_with(prefix.as_encoded_bytes()) {
            continue;
        }
        let old = entry
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .is_some_and(|t| t.elapsed().is_ok_and(|age| age > std::time::Duration::from_secs(3600)));
        if old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Tests: end this process here, as a kill would (nothing closed, nothing
/// removed), when `TOOLGATE_TEST_DIE_AT` names `point`.
#[cfg(test)]
fn die_at(point: &str) {
    if std::env::var("TOOLGATE_TEST_DIE_AT").is_ok_and(|p| p == point) {
        std::process::exit(86);
    }
}

#[cfg(not(test))]
fn die_at(_: &str) {}

// Statements run on every call are prepared once per connection
// (`prepare_cached`): re-parsing the SQL was about a third of an in-memory
// commit (BENCHMARKS.md).
fn insert_run(c: &Connection, run_id: &str, run: &PendingRun) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT OR IGNORE INTO runs (run_id, agent, narrowing, started_at, restriction) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![run_id, run.agent, run.narrowing, now(), run.restriction])
    .map(|_| ())
}

/// `step`'s Commands against its Tool's state as it is now (see
/// [`NewStep::state_read`] and [`NewStep::state_limit_kib`]); read inside the
/// writing transaction, which holds the database's write lock, so no other
/// writer can change it before commit.
fn state_check(c: &Connection, step: &NewStep<'_>, changes: &[StateChange]) -> rusqlite::Result<StateCheck> {
    if !super::write::needs_state(step, changes) {
        return Ok(StateCheck::Holds);
    }
    let current = read_state(c, step.agent, step.tool_id)?;
    Ok(super::write::check_state(step, changes, || current))
}

fn read_state(c: &Connection, agent: &str, tool: &str) -> rusqlite::Result<BTreeMap<String, String>> {
    let mut stmt = c.prepare_cached("SELECT key, value FROM tool_state WHERE agent = ?1 AND tool_id = ?2")?;
    let rows = stmt.query_map(params![agent, tool], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

/// A step, its state changes and its Awaiting record, inside the caller's transaction.
fn write_step(
    tx: &Connection,
    step: &NewStep<'_>,
    changes: &[StateChange],
    awaiting: Option<&AwaitingRecord>,
) -> rusqlite::Result<i64> {
    let seq = insert_step(tx, step, step.ticket.or(awaiting.map(|a| a.ticket_id.as_str())))?;
    apply_changes(tx, step.agent, step.tool_id, changes)?;
    if let Some(a) = awaiting {
        tx.prepare_cached(&format!(
            "INSERT INTO awaiting ({AWAITING_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'pending', ?11, ?12)"
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
            a.expires_at,
            a.requested_at,
            a.restriction,
            a.approvers
        ])?;
    }
    Ok(seq)
}

fn insert_step(tx: &Connection, s: &NewStep<'_>, ticket: Option<&str>) -> rusqlite::Result<i64> {
    let approved = s.approved_by;
    tx.prepare_cached(
        "INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id,
                            committed_at, structured, approved_by, approved_via, approved_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute(params![
        s.run_id,
        s.call_id,
        s.tool_id,
        s.arguments,
        s.verdict.as_str(),
        s.outcome.as_str(),
        s.result,
        s.captured,
        ticket,
        now(),
        s.structured,
        approved.map(|a| &a.principal),
        approved.map(|a| &a.channel),
        approved.map(|a| a.at),
    ])?;
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

fn heartbeat(c: &Connection, holder: &str, now: i64) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO hosts (instance_id, heartbeat_at) VALUES (?1, ?2)
         ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = max(heartbeat_at, excluded.heartbeat_at)",
    )?
    .execute(params![holder, now])
    .map(|_| ())
}

/// pending → claimed by `holder`, if the ticket is pending and unexpired.
fn claim(
    c: &Connection,
    ticket_id: &str,
    now: i64,
    holder: &str,
) -> rusqlite::Result<Result<AwaitingRecord, TicketError>> {
    let record = c
        .prepare_cached(&format!("SELECT {AWAITING_COLS} FROM awaiting WHERE ticket_id = ?1"))?
        .query_row(params![ticket_id], awaiting_from_row)
        .optional()?;
    Ok(match record {
        None => Err(TicketError::Unknown(ticket_id.to_owned())),
        Some(r) if r.state != "pending" => Err(TicketError::Used(ticket_id.to_owned())),
        Some(r) if r.expires_at <= now => Err(TicketError::Expired(ticket_id.to_owned())),
        Some(mut r) => {
            c.execute(
                "UPDATE awaiting SET state = 'claimed', claimed_at = ?2, holder = ?3
                 WHERE ticket_id = ?1 AND state = 'pending'",
                params![ticket_id, now, holder],
            )?;
            heartbeat(c, holder, now)?;
            r.state = "claimed".into();
            Ok(r)
        }
    })
}

/// The step resolving `ticket_id`, if `holder` still holds its claim
/// (exactly one row changes); otherwise nothing is written.
fn resolve(
    c: &Connection,
    ticket_id: &str,
    holder: &str,
    step: &NewStep<'_>,
    changes: &[StateChange],
    delivered: bool,
) -> rusqlite::Result<Result<i64, TicketError>> {
    let changed = c.execute(
        "UPDATE awaiting SET state = 'resolved', delivered = ?3
         WHERE ticket_id = ?1 AND state = 'claimed' AND holder = ?2",
        params![ticket_id, holder, delivered],
    )?;
    if changed != 1 {
        return Ok(Err(TicketError::Settled(ticket_id.to_owned())));
    }
    let seq = insert_step(c, step, Some(ticket_id))?;
    apply_changes(c, step.agent, step.tool_id, changes)?;
    Ok(Ok(seq))
}

/// Move to `holder` every claim (`only` that ticket's) whose holder's
/// heartbeat (or the claim itself, for a holder that never beat) is older
/// than the lease.
fn take_over(
    c: &Connection,
    holder: &str,
    now: i64,
    lease_secs: i64,
    only: Option<&str>,
) -> rusqlite::Result<Vec<AwaitingRecord>> {
    let cutoff = now.saturating_sub(lease_secs);
    let stale: Vec<AwaitingRecord> = c
        .prepare_cached(&format!(
            "SELECT {AWAITING_COLS} FROM awaiting a
             WHERE a.state = 'claimed' AND (a.holder IS NULL OR a.holder != ?1)
               AND COALESCE((SELECT h.heartbeat_at FROM hosts h WHERE h.instance_id = a.holder), a.claimed_at, 0) < ?2
               AND (?3 IS NULL OR a.ticket_id = ?3)
             ORDER BY a.ticket_id"
        ))?
        .query_map(params![holder, cutoff, only], awaiting_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    for r in &stale {
        c.execute(
            "UPDATE awaiting SET holder = ?2, claimed_at = ?3 WHERE ticket_id = ?1 AND state = 'claimed'",
            params![r.ticket_id, holder, now],
        )?;
    }
    if !stale.is_empty() {
        heartbeat(c, holder, now)?;
    }
    // Hosts long gone and holding nothing need no row.
    c.execute(
        "DELETE FROM hosts WHERE heartbeat_at < ?1
         AND instance_id NOT IN (SELECT holder FROM awaiting WHERE state = 'claimed' AND holder IS NOT NULL)",
        params![cutoff],
    )?;
    Ok(stale)
}

/// A retry's step for a decided ticket, once.
fn deliver(c: &Connection, ticket_id: &str, step: &NewStep<'_>) -> rusqlite::Result<Option<i64>> {
    let changed = c.execute(
        "UPDATE awaiting SET delivered = 1 WHERE ticket_id = ?1 AND state = 'resolved' AND delivered = 0",
        params![ticket_id],
    )?;
    if changed != 1 {
        return Ok(None);
    }
    insert_step(c, step, Some(ticket_id)).map(Some)
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
        // Journals before version 3 did not record it.
        requested_at: r.get::<_, Option<i64>>(9)?.unwrap_or(0),
        state: r.get(10)?,
        restriction: r.get(11)?,
        approvers: r.get(12)?,
    })
}

const AWAITING_COLS: &str = "ticket_id, run_id, agent, call_id, tool_id, arguments, argument_digest, component_digest, \
                             expires_at, requested_at, state, restriction, approvers";

const STEP_COLS: &str = "seq, run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id, \
                         structured, approved_by, approved_via, approved_at";

fn step_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StepRecord> {
    let outcome: String = r.get(6)?;
    let approved_by = match (r.get::<_, Option<String>>(11)?, r.get::<_, Option<String>>(12)?) {
        (Some(principal), Some(channel)) => {
            Some(ApprovedBy { principal, channel, at: r.get::<_, Option<i64>>(13)?.unwrap_or(0) })
        }
        _ => None,
    };
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
        structured: r.get(10)?,
        approved_by,
    })
}

#[async_trait::async_trait]
impl Committer for SqliteJournal {
    /// Through the group committer (answered once durable), or, in memory,
    /// in a transaction of its own.
    async fn write(&self, write: Write) -> Result<Written, CommitError> {
        let Some(group) = &self.group else {
            return self.with(|c| {
                let tx = c.transaction()?;
                let written = apply(&write, &tx)?;
                if written.refused() {
                    return Ok(written); // dropped: rolled back
                }
                tx.commit()?;
                Ok(written)
            });
        };
        let gone = || CommitError::Group { path: self.path.clone(), message: "the committer stopped".into() };
        let jobs = group.jobs.as_ref().ok_or_else(gone)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        jobs.send(Job { write, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    fn unexpected(&self, what: &str) -> CommitError {
        CommitError::Group {
            path: self.path.clone(),
            message: format!("unexpected result from the writer for a {what}"),
        }
    }

    fn pending_runs(&self) -> &PendingRuns {
        &self.pending_runs
    }
}

#[async_trait::async_trait]
impl StepStore for SqliteJournal {
    async fn begin_run(&self, run: &RunRecord<'_>) -> Result<(), CommitError> {
        if self.group.is_none() {
            let pending = PendingRun {
                agent: run.agent.to_owned(),
                narrowing: run.narrowing.to_owned(),
                restriction: run.restriction.map(str::to_owned),
            };
            return self.with(|c| insert_run(c, run.run_id, &pending));
        }
        self.queue_run(run).await
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunInfo>, CommitError> {
        if let Some(info) = self.pending_runs.info(run_id) {
            return Ok(Some(info));
        }
        self.with(|c| {
            c.prepare_cached("SELECT agent, narrowing, restriction FROM runs WHERE run_id = ?1")?
                .query_row(params![run_id], |r| {
                    Ok(RunInfo { agent: r.get(0)?, narrowing: r.get(1)?, restriction: r.get(2)? })
                })
                .optional()
        })
    }

    async fn commit_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
        if self.group.is_none() {
            let seq = self.with(|c| {
                let tx = c.transaction()?;
                let check = state_check(&tx, step, changes)?;
                if check != StateCheck::Holds {
                    return Ok(Err(check));
                }
                let seq = write_step(&tx, step, changes, awaiting)?;
                tx.commit()?;
                Ok(Ok(seq))
            })?;
            return seq.map_err(|refused| refused.into_result(step).err().unwrap_or_else(|| self.unexpected("step")));
        }
        self.queue_step(step, changes, awaiting).await
    }

    async fn claim_ticket(
        &self,
        ticket_id: &str,
        now: i64,
        holder: &str,
    ) -> Result<Result<ClaimedTicket, TicketError>, CommitError> {
        self.queue_claim(ticket_id, now, holder).await
    }

    async fn heartbeat(&self, holder: &str, now: i64) -> Result<(), CommitError> {
        self.queue_heartbeat(holder, now).await
    }

    async fn resolve_ticket(
        &self,
        ticket: ClaimedTicket,
        step: &NewStep<'_>,
        changes: &[StateChange],
        delivered: bool,
    ) -> Result<Result<i64, TicketError>, CommitError> {
        self.queue_resolution(ticket, step, changes, delivered).await
    }

    async fn take_over_stale_claims(
        &self,
        holder: &str,
        now: i64,
        lease_secs: i64,
        only: Option<&str>,
    ) -> Result<Vec<ClaimedTicket>, CommitError> {
        // A cheap read first: almost always nothing is claimed.
        let any: i64 = self.with(|c| {
            c.prepare_cached("SELECT COUNT(*) FROM awaiting WHERE state = 'claimed'")?.query_row([], |r| r.get(0))
        })?;
        if any == 0 {
            return Ok(Vec::new());
        }
        self.queue_take_over(holder, now, lease_secs, only).await
    }

    async fn prior_ask(
        &self,
        scope: AskScope<'_>,
        tool_id: &str,
        argument_digest: &str,
    ) -> Result<Option<PriorAsk>, CommitError> {
        // `?4` is a prefix of the run id (for a run, the id itself), compared
        // as text: no LIKE wildcards.
        let (column, key, runs) = match scope {
            AskScope::Run(run) => ("run_id", run, run),
            AskScope::StatelessRequests { agent, runs } => ("agent", agent, runs),
        };
        self.with(|c| {
            let found = c
                .prepare_cached(&format!(
                    "SELECT {AWAITING_COLS}, delivered FROM awaiting
                     WHERE {column} = ?1 AND tool_id = ?2 AND argument_digest = ?3
                       AND substr(run_id, 1, length(?4)) = ?4 ORDER BY rowid DESC LIMIT 1"
                ))?
                .query_row(params![key, tool_id, argument_digest, runs], |r| Ok((awaiting_from_row(r)?, r.get(13)?)))
                .optional()?;
            let Some((record, delivered)) = found else { return Ok(None) };
            let resolution = if record.state == "resolved" {
                c.prepare_cached(&format!(
                    "SELECT {STEP_COLS} FROM steps WHERE ticket_id = ?1 AND outcome != 'awaiting' ORDER BY seq LIMIT 1"
                ))?
                .query_row(params![record.ticket_id], step_from_row)
                .optional()?
            } else {
                None
            };
            Ok(Some(PriorAsk { record, delivered, resolution }))
        })
    }

    async fn deliver(&self, ticket_id: &str, step: &NewStep<'_>) -> Result<Option<i64>, CommitError> {
        self.queue_delivery(ticket_id, step).await
    }

    async fn skill_activations(&self, run_id: &str) -> Result<Vec<(String, Option<String>)>, CommitError> {
        let rows: Vec<(String, Option<String>)> = self.with(|c| {
            // The captured text only of the steps that journaled a list.
            let mut stmt = c.prepare_cached(
                "SELECT tool_id, CASE WHEN instr(captured, '\"narrowed_to\"') > 0 THEN captured END FROM steps \
                 WHERE run_id = ?1 AND outcome = 'output' ORDER BY seq",
            )?;
            let rows = stmt.query_map(params![run_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })?;
        Ok(super::activations(rows))
    }

    async fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError> {
        self.with(|c| read_state(c, agent, tool_id))
    }

    async fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        self.with(|c| {
            let mut stmt =
                c.prepare(&format!("SELECT {STEP_COLS} FROM steps WHERE ?1 IS NULL OR run_id = ?1 ORDER BY seq"))?;
            let rows = stmt.query_map(params![run_id], step_from_row)?;
            rows.collect()
        })
    }

    async fn awaiting(&self, ticket_id: &str) -> Result<Option<AwaitingRecord>, CommitError> {
        self.with(|c| {
            c.prepare_cached(&format!("SELECT {AWAITING_COLS} FROM awaiting WHERE ticket_id = ?1"))?
                .query_row(params![ticket_id], awaiting_from_row)
                .optional()
        })
    }

    async fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError> {
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
    //! SQLite-specific behaviour; the semantics every store shares are in
    //! the conformance suite (`toolgate_tests::conformance`).
    use super::*;
    use crate::store::Verdict;

    fn step<'a>(call_id: &'a str, outcome: OutcomeKind) -> NewStep<'a> {
        NewStep {
            run_id: "run-1",
            agent: "main",
            call_id,
            tool_id: "notes.add",
            arguments: r#"{"text":"hi"}"#,
            verdict: Verdict::Allow,
            outcome,
            result: "ok",
            captured: "{}",
            ticket: None,
            structured: false,
            approved_by: None,
            state_read: None,
            state_limit_kib: None,
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
            requested_at: 1,
            state: "pending".into(),
            restriction: None,
            approvers: None,
        }
    }

    fn run(run_id: &str, narrowing: &'static str) -> (String, &'static str) {
        (run_id.to_owned(), narrowing)
    }

    async fn begin(j: &SqliteJournal, (run_id, narrowing): (String, &'static str)) {
        j.begin_run(&RunRecord { run_id: &run_id, agent: "main", narrowing, restriction: None }).await.unwrap();
    }

    /// The size limit holds against the state at commit, not the call's
    /// read: in a durable journal (group commit) and an in-memory one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cache_keys_of_calls_from_one_read_cannot_together_pass_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        for j in [SqliteJournal::open(&dir.path().join("j.db")).unwrap(), SqliteJournal::in_memory().unwrap()] {
            super::super::write::tests::cache_keys_of_calls_from_one_read_cannot_together_pass_the_limit(Arc::new(j))
                .await;
        }
    }

    #[tokio::test]
    async fn a_run_is_recorded_with_its_first_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/dir/journal.db");
        let runs = |j: &SqliteJournal| -> Vec<(String, String)> {
            j.read_raw(|c| {
                let mut st = c.prepare("SELECT run_id, narrowing FROM runs ORDER BY run_id")?;
                st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
            })
            .unwrap()
        };
        for (j, durable) in [(SqliteJournal::in_memory().unwrap(), false), (SqliteJournal::open(&path).unwrap(), true)]
        {
            begin(&j, run("run-1", "deny-all")).await;
            begin(&j, run("run-empty", "configured")).await;
            j.commit_step(&step("c1", OutcomeKind::Blocked), &[], None).await.unwrap();
            j.commit_step(&step("c2", OutcomeKind::Blocked), &[], None).await.unwrap();
            let got = runs(&j);
            assert!(got.contains(&("run-1".into(), "deny-all".into())), "{got:?}");
            if durable {
                // Durable: a run is written with its first step; one that made no call leaves no record.
                assert_eq!(got, [("run-1".to_owned(), "deny-all".to_owned())]);
                drop(j);
                let j = SqliteJournal::open(&path).unwrap();
                assert_eq!(runs(&j), [("run-1".to_owned(), "deny-all".to_owned())]);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_steps_share_durable_commits_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let j = Arc::new(SqliteJournal::open(&dir.path().join("j.db")).unwrap());
        j.commit_step(&step("dup", OutcomeKind::Awaiting), &[], Some(&awaiting("taken", "dup", i64::MAX)))
            .await
            .unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let j = j.clone();
                tokio::spawn(async move {
                    let mut seqs = Vec::new();
                    for i in 0..20 {
                        let call = format!("c{t}-{i}");
                        if t == 3 && i == 10 {
                            // Same ticket id as an existing record: this step alone must fail.
                            let r = j
                                .commit_step(
                                    &step(&call, OutcomeKind::Awaiting),
                                    &[set("poison", "1")],
                                    Some(&awaiting("taken", &call, i64::MAX)),
                                )
                                .await;
                            assert!(matches!(r, Err(CommitError::Sqlite { .. })), "{r:?}");
                            continue;
                        }
                        seqs.push(
                            j.commit_step(&step(&call, OutcomeKind::Output), &[set(&call, "1")], None).await.unwrap(),
                        );
                    }
                    seqs
                })
            })
            .collect();
        let mut seqs = Vec::new();
        for t in tasks {
            seqs.extend(t.await.unwrap());
        }
        seqs.sort();
        seqs.dedup();
        assert_eq!(seqs.len(), 16 * 20 - 1, "every other step committed, each with its own seq");
        let state = j.tool_state("main", "notes.add").await.unwrap();
        assert_eq!(state.len(), 16 * 20 - 1);
        assert!(!state.contains_key("poison"), "the failed step's changes rolled back with it");
        let (groups, writes) = j.group_commits();
        assert_eq!(writes, 16 * 20 + 1);
        assert!(groups <= writes, "{groups} groups for {writes} writes");
    }

    /// The commit records in `path`'s WAL (frames of the current WAL
    /// generation whose header gives the database size after a commit).
    fn wal_commits(path: &Path) -> usize {
        let mut wal_path = path.as_os_str().to_owned();
        wal_path.push("-wal");
        let wal = std::fs::read(wal_path).unwrap();
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if wal.len() < 32 {
            return 0;
        }
        let page = be(&wal[8..12]);
        let mut commits = 0;
        let mut at = 32;
        while at + 24 + page <= wal.len() && wal[at + 8..at + 16] == wal[16..24] {
            commits += usize::from(be(&wal[at + 4..at + 8]) != 0);
            at += 24 + page;
        }
        commits
    }

    /// Queue `calls` (steps, each setting the key of its call id; `claim` a
    /// claim of ticket `t1`) as one group behind a first write, held while
    /// another connection holds the write lock; assert that each answer is
    /// what the journal holds and that the group was committed by one
    /// transaction; return which were reported written.
    async fn one_group(j: &SqliteJournal, path: &Path, first: &str, calls: &[&str]) -> BTreeMap<String, bool> {
        let blocker = Connection::open(path).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let group = j.group.as_ref().unwrap();
        let send = |call: &str| {
            let write = match call {
                "claim" => Write::Claim { ticket_id: "t1".into(), now: now(), holder: "host-a".into() },
                _ => Write::Step {
                    step: super::super::write::OwnedStep::of(&step(call, OutcomeKind::Output)),
                    changes: vec![set(call, "1")],
                    awaiting: None,
                    run: None,
                },
            };
            let (reply, answer) = tokio::sync::oneshot::channel();
            group.jobs.as_ref().unwrap().send(Job { write, reply }).unwrap();
            answer
        };
        let first = send(first);
        // The committer takes the first write alone and waits for the lock; the others queue.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (groups_before, _) = j.group_commits();
        let commits_before = wal_commits(path);
        let answers: Vec<_> = calls.iter().map(|c| send(c)).collect();
        blocker.execute_batch("ROLLBACK").unwrap();
        assert!(first.await.unwrap().is_ok());
        let mut reported = BTreeMap::new();
        for (call, answer) in calls.iter().zip(answers) {
            let answer = answer.await.unwrap();
            reported.insert(call.to_string(), matches!(answer, Ok(Written::Seq(_) | Written::Claim(Ok(_)))));
        }
        let steps: Vec<String> = j.steps(None).await.unwrap().into_iter().map(|s| s.call_id).collect();
        let state = j.tool_state("main", "notes.add").await.unwrap();
        let ticket = j.awaiting("t1").await.unwrap().unwrap().state;
        for (call, &written) in &reported {
            let in_journal = match call.as_str() {
                "claim" => ticket == "claimed",
                _ => steps.contains(call) && state.contains_key(call),
            };
            assert_eq!(written, in_journal, "{call}: reported written {written}, in the journal {in_journal}");
        }
        assert_eq!(j.group_commits().0 - groups_before, 2, "the writes queued behind the first form one group");
        assert_eq!(wal_commits(path) - commits_before, 2, "one commit for the first write, one for the group");
        reported
    }

    /// SQLite rolls a whole transaction back on some errors (an I/O error
    /// always, a full disk usually), which can strike mid-statement when the
    /// page cache spills: a `RAISE(ROLLBACK)` trigger does the same. No write
    /// after it commits outside the group's transaction, the others are
    /// written in a new one, and every caller's answer is what the journal
    /// holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_rolls_the_group_back_fails_alone_and_nothing_commits_outside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.db");
        let j = SqliteJournal::open(&path).unwrap();
        j.commit_step(&step("ask", OutcomeKind::Awaiting), &[], Some(&awaiting("t1", "ask", i64::MAX))).await.unwrap();
        j.read_raw(|c| {
            c.execute_batch(
                "CREATE TRIGGER poison BEFORE INSERT ON steps WHEN NEW.call_id LIKE 'poison%'
                 BEGIN SELECT RAISE(ROLLBACK, 'injected: the transaction is rolled back'); END;",
            )
        })
        .unwrap();
        let got = one_group(&j, &path, "first", &["a1", "a2", "poison", "b1", "claim", "b2"]).await;
        let expected = [("a1", true), ("a2", true), ("poison", false), ("b1", true), ("claim", true), ("b2", true)];
        assert_eq!(got, expected.map(|(c, w)| (c.to_owned(), w)).into());
        // Rolled back a second time by another write, a write is answered as not written.
        let got = one_group(&j, &path, "second", &["c1", "poison-1", "c2", "poison-2", "c3"]).await;
        let expected = [("c1", false), ("poison-1", false), ("c2", true), ("poison-2", false), ("c3", true)];
        assert_eq!(got, expected.map(|(c, w)| (c.to_owned(), w)).into());
    }

    fn refusal(r: Result<SqliteJournal, CommitError>) -> String {
        match r {
            Ok(_) => panic!("the journal must be refused"),
            Err(e) => e.to_string(),
        }
    }

    /// A journal file cut to 0 bytes is not replaced by a new, empty journal
    /// (nor its `-wal` deleted): opening it, to write or to list, is refused,
    /// naming the file and what to do. A missing one is still created.
    #[tokio::test]
    async fn an_emptied_journal_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let j = SqliteJournal::open(&path).unwrap();
        j.commit_step(&step("c1", OutcomeKind::Output), &[], None).await.unwrap();
        drop(j);
        std::fs::File::create(&path).unwrap(); // `> journal.db`
        for r in [SqliteJournal::open(&path), SqliteJournal::open_read_only(&path)] {
            let s = refusal(r);
            assert!(s.contains("journal.db") && s.contains("empty (0 bytes)") && s.contains("backup"), "{s}");
        }
        // At once: no host leaves an empty file at the journal's name while creating it.
        let started = std::time::Instant::now();
        refusal(SqliteJournal::open(&path));
        assert!(started.elapsed() < std::time::Duration::from_millis(500), "{:?}", started.elapsed());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "left as it was");

        // With a WAL beside it (the journal's latest commits): the WAL is kept.
        let other = dir.path().join("other.db");
        let j = SqliteJournal::open(&other).unwrap();
        j.commit_step(&step("c1", OutcomeKind::Output), &[], None).await.unwrap();
        let wal = std::fs::read(with_suffix(&other, "-wal")).unwrap();
        assert!(!wal.is_empty());
        std::fs::write(with_suffix(&path, "-wal"), &wal).unwrap();
        drop(j);
        for r in [SqliteJournal::open_read_only(&path), SqliteJournal::open(&path)] {
            let s = refusal(r);
            assert!(s.contains("-wal") && s.contains("remove it and its `-wal` and `-shm` files"), "{s}");
            assert_eq!(std::fs::read(with_suffix(&path, "-wal")).unwrap(), wal, "the WAL is left as it is");
        }

        // Removed, it is created anew.
        for f in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(with_suffix(&path, f));
        }
        let j = SqliteJournal::open(&path).unwrap();
        assert!(j.steps(None).await.unwrap().is_empty());
    }

    /// Set by [`a_first_start_killed_while_creating_the_journal_leaves_nothing_at_its_name`]
    /// for the child it starts: the journal the child opens.
    const CHILD_JOURNAL: &str = "TOOLGATE_TEST_CHILD_JOURNAL";

    /// A first start killed while it creates the journal — its temporary
    /// file just created (0 bytes), its schema written but not committed, or
    /// committed but not yet renamed — leaves nothing at the journal's name
    /// (no empty file, no `-wal`), so the next start is not refused: it
    /// creates the journal as if none had begun, the dead start's temporary
    /// files ignored.
    #[test]
    fn a_first_start_killed_while_creating_the_journal_leaves_nothing_at_its_name() {
        if let Ok(path) = std::env::var(CHILD_JOURNAL) {
            // Dies in there (`die_at`), or says how it got out.
            match SqliteJournal::open(Path::new(&path)) {
                Ok(_) => println!("child: opened"),
                Err(e) => println!("child: {e}"),
            }
            return;
        }
        let name =
            concat!(module_path!(), "::a_first_start_killed_while_creating_the_journal_leaves_nothing_at_its_name");
        let name = name.split_once("::").unwrap().1;
        for point in ["temporary-created", "schema-uncommitted", "before-placing"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("journal.db");
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_JOURNAL, &path)
                .env("TOOLGATE_TEST_DIE_AT", point)
                .output()
                .unwrap();
            assert_eq!(
                out.status.code(),
                Some(86),
                "{point}: the child must die there:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let names = || -> Vec<String> {
                let mut v: Vec<_> = std::fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                v.sort();
                v
            };
            let left = names();
            assert!(
                left.iter().all(|n| n.starts_with("journal.db.new-")) && !left.is_empty(),
                "{point}: only the dead start's temporary files: {left:?}"
            );
            let j = SqliteJournal::open(&path).unwrap_or_else(|e| panic!("{point}: the next start: {e}"));
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                j.commit_step(&step("c1", OutcomeKind::Output), &[], None).await.unwrap();
                assert_eq!(j.steps(None).await.unwrap().len(), 1);
            });
            drop(j);
            let now: Vec<_> = names().into_iter().filter(|n| n.starts_with("journal.db.new-")).collect();
            assert_eq!(now, left, "{point}: an hour old only, what a dead start left is removed");
        }
    }

    /// Several hosts creating one journal at once each build one; one is put
    /// in place, and every host opens that one, writes and reads the same
    /// steps; no temporary file is left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hosts_creating_one_journal_at_once_open_the_same_one() {
        for round in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let path = Arc::new(dir.path().join("state/journal.db"));
            let barrier = Arc::new(std::sync::Barrier::new(4));
            let hosts: Vec<_> = (0..4)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        SqliteJournal::open(&path).unwrap()
                    })
                })
                .collect();
            let journals: Vec<_> = hosts.into_iter().map(|h| h.join().unwrap()).collect();
            for (i, j) in journals.iter().enumerate() {
                j.commit_step(&step(&format!("c{i}"), OutcomeKind::Output), &[], None).await.unwrap();
            }
            for j in &journals {
                assert_eq!(j.steps(None).await.unwrap().len(), 4, "round {round}: one journal");
            }
            drop(journals);
            let left: Vec<_> = std::fs::read_dir(dir.path().join("state"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(".new-"))
                .collect();
            assert!(left.is_empty(), "round {round}: {left:?}");
        }
    }

    /// What a start killed while creating the journal left is removed once
    /// an hour old, nothing else; a journal file missing beside a non-empty
    /// `-wal` (its latest commits) is refused, not created anew beside it.
    #[tokio::test]
    async fn stale_creations_are_removed_and_a_lone_wal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 3600);
        let make = |name: &str, modified| {
            let f = std::fs::File::create(dir.path().join(name)).unwrap();
            f.set_modified(modified).unwrap();
        };
        make("journal.db.new-1-00", old);
        make("journal.db.new-1-00-journal", old);
        make("journal.db.new-2-00", std::time::SystemTime::now());
        make("other.db.new-1-00", old);
        make("journal.dbx.new-1-00", old);
        drop(SqliteJournal::open(&path).unwrap());
        let mut left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".new-"))
            .collect();
        left.sort();
        assert_eq!(left, ["journal.db.new-2-00", "journal.dbx.new-1-00", "other.db.new-1-00"]);

        // The journal removed (or lost), its `-wal` left: refused, the `-wal` kept.
        let j = SqliteJournal::open(&path).unwrap();
        j.commit_step(&step("c1", OutcomeKind::Output), &[], None).await.unwrap();
        let wal = std::fs::read(with_suffix(&path, "-wal")).unwrap();
        assert!(!wal.is_empty());
        std::fs::remove_file(&path).unwrap();
        drop(j);
        std::fs::write(with_suffix(&path, "-wal"), &wal).unwrap();
        let s = refusal(SqliteJournal::open(&path));
        assert!(s.contains("journal.db") && s.contains("missing") && s.contains("-wal"), "{s}");
        assert!(!path.exists(), "nothing created");
        assert_eq!(std::fs::read(with_suffix(&path, "-wal")).unwrap(), wal, "the WAL is left as it is");
        std::fs::remove_file(with_suffix(&path, "-wal")).unwrap();
        let _ = std::fs::remove_file(with_suffix(&path, "-shm"));
        let j = SqliteJournal::open(&path).unwrap();
        assert!(j.steps(None).await.unwrap().is_empty());
    }

    /// A journal whose WAL SQLite cannot apply (here: its first frame
    /// damaged) reads as a database without tables when its schema is in
    /// that WAL too (a journal created in WAL mode, as toolgate did before
    /// it built journals under a temporary name); it is refused, not made a
    /// new journal whose first write would start the WAL over.
    #[tokio::test]
    async fn a_journal_left_in_a_wal_sqlite_cannot_apply_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let c = Connection::open(&path).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.execute_batch(&schema_at(SCHEMA_VERSION)).unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION).unwrap();
        // Copied while open: the schema is in the WAL, not yet in the file.
        let copy = dir.path().join("copy.db");
        std::fs::copy(&path, &copy).unwrap();
        let mut wal = std::fs::read(with_suffix(&path, "-wal")).unwrap();
        drop(c);
        wal[32 + 24 + 100] ^= 0xff;
        std::fs::write(with_suffix(&copy, "-wal"), &wal).unwrap();
        let s = refusal(SqliteJournal::open(&copy));
        assert!(s.contains("copy.db") && s.contains("-wal") && s.contains("backup"), "{s}");
        assert_eq!(std::fs::read(with_suffix(&copy, "-wal")).unwrap(), wal, "the WAL is left as it is");
    }

    /// When SQLite can read a WAL journal only as immutable (no `-shm` beside
    /// it, and none can be created), its `-wal` is not read: with a non-empty
    /// one the listing is refused, not given without the steps in it.
    #[cfg(unix)]
    #[tokio::test]
    async fn a_listing_that_cannot_read_the_wal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.db");
        let j = SqliteJournal::open(&path).unwrap();
        j.commit_step(&step("c1", OutcomeKind::Output), &[], None).await.unwrap();
        j.read_raw(|c| c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))).unwrap();
        j.commit_step(&step("c2", OutcomeKind::Output), &[], None).await.unwrap();
        // A copy of the journal as the host left it, where no `-shm` can be made: SQLite
        // opens it with O_NOFOLLOW, so a symbolic link in its place cannot be opened
        // (a directory this user cannot write does the same, but not for root).
        let ro = dir.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        let copy = ro.join("journal.db");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(with_suffix(&path, "-wal"), with_suffix(&copy, "-wal")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("nowhere"), with_suffix(&copy, "-shm")).unwrap();
        drop(j);
        let s = refusal(SqliteJournal::open_read_only(&copy));
        assert!(s.contains("journal.db") && s.contains("-wal") && s.contains("-shm"), "{s}");
        // Without a `-wal` (checkpointed), it is read as immutable, every step in the file.
        std::fs::remove_file(with_suffix(&copy, "-wal")).unwrap();
        std::fs::copy(&path, &copy).unwrap();
        let listed: Vec<_> = SqliteJournal::open_read_only(&copy)
            .unwrap()
            .steps(None)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.call_id)
            .collect();
        assert_eq!(listed, ["c1", "c2"]);
    }

    #[test]
    fn durability_sets_the_sync_mode_of_the_file_journal() {
        let dir = tempfile::tempdir().unwrap();
        let sync =
            |j: &SqliteJournal| j.with(|c| c.query_row("PRAGMA synchronous", [], |r| r.get::<_, i64>(0))).unwrap();
        let full = SqliteJournal::open(&dir.path().join("a.db")).unwrap();
        let normal = SqliteJournal::open_with(&dir.path().join("b.db"), crate::store::Durability::Process).unwrap();
        // 2 = FULL (fsync per commit), 1 = NORMAL (WAL: fsync at checkpoints).
        assert_eq!((sync(&full), sync(&normal)), (2, 1));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn the_journal_and_its_wal_are_readable_by_their_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/journal.db");
        let j = SqliteJournal::open(&path).unwrap();
        j.commit_step(&step("c1", OutcomeKind::Output), &[set("k", "v")], None).await.unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("state/journal.db-wal")), 0o600, "the WAL follows the journal");
        assert_eq!(mode(&dir.path().join("state")), 0o700);
        drop(j);
        // An existing journal open to others is tightened.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(SqliteJournal::open(&path).unwrap());
        assert_eq!(mode(&path), 0o600);
    }

    #[tokio::test]
    async fn unreadable_journal_values_degrade_safely() {
        let j = SqliteJournal::in_memory().unwrap();
        j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t", "c1", i64::MAX))).await.unwrap();
        j.with(|c| {
            c.execute("UPDATE awaiting SET component_digest = 'zz'", [])?;
            c.execute("UPDATE steps SET outcome = 'mystery'", [])
        })
        .unwrap();
        // An unreadable digest matches no real component; an unknown outcome
        // reads as an executor error (someone must look), never as output.
        assert_eq!(j.pending().await.unwrap()[0].component_digest, Digest([0; 32]));
        assert_eq!(j.steps(None).await.unwrap()[0].outcome, OutcomeKind::ExecutorError);
        for k in [
            OutcomeKind::Output,
            OutcomeKind::ToolError,
            OutcomeKind::Blocked,
            OutcomeKind::Awaiting,
            OutcomeKind::ExecutorError,
            OutcomeKind::Cancelled,
        ] {
            assert_eq!(OutcomeKind::parse(k.as_str()), k);
        }
    }

    #[tokio::test]
    async fn unversioned_and_newer_journals_are_recognized() {
        let dir = tempfile::tempdir().unwrap();
        // A journal written before versioning, at schema 1 (no claim columns), user_version 0.
        let old = dir.path().join("old.db");
        Connection::open(&old).unwrap().execute_batch(&schema_at(1)).unwrap();
        let j = SqliteJournal::open(&old).unwrap();
        let v: i64 = j.read_raw(|c| c.query_row("PRAGMA user_version", [], |r| r.get(0))).unwrap();
        assert_eq!(v, SCHEMA_VERSION);
        j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t", "c1", i64::MAX))).await.unwrap();
        assert!(
            j.claim_ticket("t", now(), "host-a").await.unwrap().is_ok(),
            "the migrated columns are written by a claim"
        );
        drop(j);
        // One from the future is refused, naming the file and both versions.
        let future = dir.path().join("future.db");
        let c = Connection::open(&future).unwrap();
        c.execute_batch(&schema_at(SCHEMA_VERSION)).unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1).unwrap();
        drop(c);
        match SqliteJournal::open(&future) {
            Err(e @ CommitError::NewerSchema { .. }) => {
                let s = e.to_string();
                assert!(s.contains("future.db") && s.contains(&(SCHEMA_VERSION + 1).to_string()), "{s}");
            }
            Err(other) => panic!("expected NewerSchema, got {other}"),
            Ok(_) => panic!("a newer journal must be refused"),
        }
    }
}
