//! PostgreSQL: the journal several hosts share.
//!
//! Owns the PostgreSQL schema and its versioned migrations (`V*.sql`, applied
//! in order in one transaction under an advisory lock, so hosts starting
//! together do not race), and the write discipline of a shared journal: every
//! write goes through a group committer — writes that arrive while a commit
//! is in flight share the next transaction, a savepoint each, so a failing
//! write rolls back alone — and each caller is answered only once the
//! transaction holding its write committed. Several committers per host take
//! turns on one queue, each with its own pooled connection; a transaction
//! that loses a deadlock or serialization race is retried whole.
//!
//! Exactly once across hosts: a claim is `UPDATE … WHERE state = 'pending'
//! … RETURNING`, so of any number of racing transactions exactly one sees the
//! row pending (the others wait for its row lock and then find it claimed);
//! a resolution changes the row only while the same holder still holds it;
//! take-over locks the stale claims it moves (`FOR UPDATE SKIP LOCKED`).
//!
//! Must never: log or store the password (it comes by reference and is set on
//! the connection config only), or write beside the committer.
//!
//! PostgreSQL text cannot hold NUL characters; a NUL in a step's text (a Tool
//! can return one) is stored as U+FFFD, so the commit never fails on it.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;

use super::write::{Committer, OwnedStep, PendingRun, PendingRuns, Write, Written};
use super::{
    ApprovedBy, AskScope, AwaitingRecord, ClaimedTicket, CommitError, NewStep, OutcomeKind, PriorAsk, RunInfo,
    RunRecord, StateChange, StepRecord, StepStore, TicketError, now,
};
use crate::digest::Digest;

/// Migrations in order: version N means the first N are applied.
const MIGRATIONS: &[&str] = &[
    include_str!("V1__journal.sql"),
    include_str!("V2__ask_by_agent.sql"),
    include_str!("V3__ticket_restriction.sql"),
    include_str!("V4__ticket_approvers.sql"),
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The advisory lock migrations hold (any constant: "toolgate" in ASCII).
const MIGRATION_LOCK: i64 = 0x746f_6f6c_6761_7465;

/// Most writes one group commit holds.
const MAX_GROUP: usize = 256;

/// How often a transaction that lost a deadlock or serialization race is retried.
const RETRIES: usize = 5;

/// The schema a database's version has, as SQL: for tests that build a
/// journal an older toolgate wrote.
pub fn schema_at(version: i64) -> String {
    MIGRATIONS.iter().take(version.max(0) as usize).copied().collect()
}

/// The PostgreSQL journal.
pub struct PostgresJournal {
    pool: Pool,
    /// How the journal is named in errors: user, hosts and database, never the password.
    shown: String,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    counts: Arc<(AtomicU64, AtomicU64)>,
    committers: Vec<tokio::task::JoinHandle<()>>,
    /// Runs begun but not yet written (recorded with their first step).
    pending_runs: PendingRuns,
}

impl Drop for PostgresJournal {
    fn drop(&mut self) {
        // Commits in flight finish on their own (their callers wait for
        // them); nothing new is taken after the queue closes.
        for c in &self.committers {
            c.abort();
        }
    }
}

/// One write waiting for a group commit, with where to send its result.
struct Job {
    write: Write,
    reply: tokio::sync::oneshot::Sender<Result<Written, CommitError>>,
}

/// Why a database operation failed.
#[derive(Debug)]
enum Fail {
    Pool(String),
    Db(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Db(e)
    }
}

impl From<deadpool_postgres::PoolError> for Fail {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => Fail::Db(e),
            other => Fail::Pool(other.to_string()),
        }
    }
}

impl Fail {
    /// Lost a race another transaction won: retrying the whole transaction succeeds.
    fn retryable(&self) -> bool {
        matches!(self, Fail::Db(e) if matches!(e.code(), Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED))
    }

    fn message(&self) -> String {
        match self {
            Fail::Pool(m) => m.clone(),
            Fail::Db(e) => match e.as_db_error() {
                Some(db) => {
                    let mut m = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
                    if let Some(d) = db.detail() {
                        m.push_str(&format!("; {d}"));
                    }
                    m
                }
                None => match std::error::Error::source(e) {
                    Some(s) => format!("{e}: {s}"),
                    None => e.to_string(),
                },
            },
        }
    }
}

type R<T> = Result<T, Fail>;

/// What names a journal in messages: `user@host/dbname`, never the password.
fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    format!(
        "postgres {}@{}/{}",
        config.get_user().unwrap_or("(default user)"),
        if hosts.is_empty() { "(default host)".to_owned() } else { hosts.join(",") },
        config.get_dbname().unwrap_or("(default database)")
    )
}

impl PostgresJournal {
    /// Connect to the journal at `dsn` (a `postgres://` URL or a libpq
    /// `key=value` string) with `password` (given by reference, never in the
    /// DSN), `pool_size` connections, creating or migrating its schema.
    ///
    /// TCP connections use TLS whenever the server offers it (`sslmode`
    /// `prefer`, the default) or must (`require`), through rustls, verifying
    /// the server's certificate and name against the public web roots and
    /// the PEM certificates in `ca_file`; a certificate that does not verify
    /// fails the connection (no fallback to plain text). `sslmode=disable`
    /// turns TLS off. Unix sockets never use TLS.
    pub async fn connect(
        dsn: &str,
        password: Option<&str>,
        pool_size: usize,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, CommitError> {
        let mut config = tokio_postgres::Config::from_str(dsn).map_err(|e| CommitError::Postgres {
            store: "postgres (unparsed)".into(),
            message: format!("`store` is not a PostgreSQL connection string: {e}"),
        })?;
        let shown = describe(&config);
        // Whatever spelling carried it (userinfo, query, key=value, escapes):
        // the parser found a password in the DSN, which belongs in logs and
        // config files no more than in the journal.
        if config.get_password().is_some() {
            return Err(CommitError::Postgres {
                store: shown,
                message: "the connection string carries a password; give it by reference instead \
                          (`[postgres] password = { env = \"VAR\" }` or `{ file = \"path\" }`)"
                    .into(),
            });
        }
        if let Some(p) = password {
            config.password(p);
        }
        if config.get_application_name().is_none() {
            config.application_name("toolgate");
        }
        let tls = tls(ca_file).map_err(|message| CommitError::Postgres { store: shown.clone(), message })?;
        let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager).max_size(pool_size.max(1)).build().map_err(|e| CommitError::Postgres {
            store: shown.clone(),
            message: format!("cannot build the connection pool: {e}"),
        })?;
        // Connects now (a wrong DSN or password fails here, not at the first call).
        migrate(&pool, &shown).await?;

        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        // Half the pool commits; the rest serves reads.
        let committers = (0..(pool_size / 2).max(1))
            .map(|_| tokio::spawn(commit_loop(rx.clone(), pool.clone(), shown.clone(), counts.clone())))
            .collect();
        Ok(PostgresJournal { pool, shown, jobs: tx, counts, committers, pending_runs: PendingRuns::default() })
    }

    /// Group commits made and the writes they held.
    pub fn group_commits(&self) -> (u64, u64) {
        (self.counts.0.load(Ordering::Relaxed), self.counts.1.load(Ordering::Relaxed))
    }

    fn err(&self, f: Fail) -> CommitError {
        CommitError::Postgres { store: self.shown.clone(), message: f.message() }
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, CommitError> {
        let run = async {
            let client = self.pool.get().await?;
            let stmt = client.prepare_cached(sql).await?;
            Ok::<_, Fail>(client.query(&stmt, params).await?)
        };
        run.await.map_err(|f| self.err(f))
    }
}

/// The TLS connector: rustls (ring) trusting the public web roots and the
/// certificates in `ca_file`.
fn tls(ca_file: Option<&std::path::Path>) -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("postgres.ca_file {}: {e}", path.display()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("postgres.ca_file {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!("postgres.ca_file {}: no PEM certificate in it", path.display()));
        }
        for c in certs {
            roots.add(c).map_err(|e| format!("postgres.ca_file {}: {e}", path.display()))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Bring the database to [`SCHEMA_VERSION`], in one transaction, holding
/// the migration lock so hosts starting together apply each version once.
async fn migrate(pool: &Pool, shown: &str) -> Result<(), CommitError> {
    let err = |f: Fail| CommitError::Postgres { store: shown.to_owned(), message: f.message() };
    let mut client = pool.get().await.map_err(|e| err(e.into()))?;
    let tx = client.transaction().await.map_err(|e| err(e.into()))?;
    let run = async {
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS toolgate_schema (version BIGINT NOT NULL)").await?;
        let version: i64 = tx.query_opt("SELECT version FROM toolgate_schema", &[]).await?.map_or(0, |r| r.get(0));
        Ok::<_, Fail>(version)
    };
    let version = run.await.map_err(err)?;
    if version > SCHEMA_VERSION {
        return Err(CommitError::NewerSchema { path: shown.to_owned(), found: version, known: SCHEMA_VERSION });
    }
    if version == SCHEMA_VERSION {
        return tx.commit().await.map_err(|e| err(e.into()));
    }
    let run = async {
        for sql in MIGRATIONS.iter().skip(version as usize) {
            tx.batch_execute(sql).await?;
        }
        tx.execute("DELETE FROM toolgate_schema", &[]).await?;
        tx.execute("INSERT INTO toolgate_schema (version) VALUES ($1)", &[&SCHEMA_VERSION]).await?;
        tx.commit().await?;
        Ok::<_, Fail>(())
    };
    run.await.map_err(err)
}

/// One committer: take what is queued (up to [`MAX_GROUP`]), commit it in
/// one transaction, answer each caller; repeat until the queue closes.
async fn commit_loop(
    rx: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Job>>>,
    pool: Pool,
    shown: String,
    counts: Arc<(AtomicU64, AtomicU64)>,
) {
    loop {
        let batch = {
            let mut rx = rx.lock().await;
            let Some(first) = rx.recv().await else { return };
            let mut batch = vec![first];
            while batch.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
            batch
        };
        let results = commit_group(&pool, &batch, &shown).await;
        counts.0.fetch_add(1, Ordering::Relaxed);
        counts.1.fetch_add(batch.len() as u64, Ordering::Relaxed);
        for (job, r) in batch.into_iter().zip(results) {
            // The caller may be gone (its task was cancelled): its write is committed regardless.
            let _ = job.reply.send(r);
        }
    }
}

/// Write `batch` in one transaction, a savepoint per write; one result per
/// job. A transaction that lost a race is retried whole.
async fn commit_group(pool: &Pool, batch: &[Job], shown: &str) -> Vec<Result<Written, CommitError>> {
    let mut attempt = 0;
    loop {
        match try_group(pool, batch).await {
            Ok(results) => {
                return results
                    .into_iter()
                    .map(|r| r.map_err(|f| CommitError::Postgres { store: shown.to_owned(), message: f.message() }))
                    .collect();
            }
            Err(f) if f.retryable() && attempt < RETRIES => attempt += 1,
            Err(f) => {
                let message = format!("the group commit failed, nothing in it was written: {}", f.message());
                return batch
                    .iter()
                    .map(|_| Err(CommitError::Group { path: shown.to_owned(), message: message.clone() }))
                    .collect();
            }
        }
    }
}

async fn try_group(pool: &Pool, batch: &[Job]) -> R<Vec<R<Written>>> {
    // The common case, a group of steps that all succeed: one pipelined
    // transaction (every statement sent at once, one round trip for the
    // lot). If any fails, the transaction is rolled back and the group is
    // written again below, a savepoint each, so the failing one fails alone.
    // Steps whose Commands must find the state they read take the slow path (a check first).
    if batch.iter().all(
        |j| matches!(&j.write, Write::Step { step, changes, .. } if step.state_read.is_none() || changes.is_empty()),
    ) {
        match steps_pipelined(pool, batch).await {
            Ok(seqs) => return Ok(seqs.into_iter().map(|seq| Ok(Written::Seq(seq))).collect()),
            Err(f) if f.retryable() => return Err(f),
            Err(_) => {}
        }
    }
    let mut client = pool.get().await?;
    let mut tx = client.transaction().await?;
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        let sp = tx.savepoint("w").await?;
        match apply(&sp, &job.write).await {
            // A refused resolution or delivery wrote nothing; roll its savepoint back.
            Ok(w) if w.refused() => {
                sp.rollback().await?;
                results.push(Ok(w));
            }
            Ok(w) => {
                sp.commit().await?;
                results.push(Ok(w));
            }
            Err(f) if f.retryable() => return Err(f),
            Err(f) => {
                sp.rollback().await?;
                results.push(Err(f));
            }
        }
    }
    tx.commit().await?;
    Ok(results)
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;

const INSERT_RUN: &str =
    "INSERT INTO runs (run_id, agent, narrowing, started_at, restriction) VALUES ($1, $2, $3, $4, $5)
                          ON CONFLICT (run_id) DO NOTHING";
const INSERT_STEP: &str =
    "INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id,
                        committed_at, structured, approved_by, approved_via, approved_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING seq";
const SET_STATE: &str = "INSERT INTO tool_state (agent, tool_id, key, value) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (agent, tool_id, key) DO UPDATE SET value = excluded.value";
const REMOVE_STATE: &str = "DELETE FROM tool_state WHERE agent = $1 AND tool_id = $2 AND key = $3";

/// Every step of `batch` (all of them `Write::Step`) in one transaction,
/// their statements pipelined in order; the steps' sequence numbers.
async fn steps_pipelined(pool: &Pool, batch: &[Job]) -> R<Vec<i64>> {
    use futures_util::future::{BoxFuture, FutureExt, try_join_all};
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let (run_stmt, step_stmt, set_stmt, remove_stmt, awaiting_stmt) = (
        tx.prepare_cached(INSERT_RUN).await?,
        tx.prepare_cached(INSERT_STEP).await?,
        tx.prepare_cached(SET_STATE).await?,
        tx.prepare_cached(REMOVE_STATE).await?,
        tx.prepare_cached(&insert_awaiting_sql()).await?,
    );
    // Owned values the statements borrow, built before any is sent.
    struct Texts<'a> {
        arguments: std::borrow::Cow<'a, str>,
        result: std::borrow::Cow<'a, str>,
        captured: std::borrow::Cow<'a, str>,
        verdict: &'static str,
        outcome: &'static str,
        principal: Option<std::borrow::Cow<'a, str>>,
        channel: Option<&'a str>,
        approved_at: Option<i64>,
        changes: Vec<(std::borrow::Cow<'a, str>, Option<std::borrow::Cow<'a, str>>)>,
        awaiting_arguments: Option<std::borrow::Cow<'a, str>>,
        component_digest: Option<String>,
        ticket: Option<&'a str>,
    }
    let at = now();
    let mut texts = Vec::with_capacity(batch.len());
    for job in batch {
        let Write::Step { step, changes, awaiting, .. } = &job.write else { unreachable!("checked by the caller") };
        texts.push(Texts {
            arguments: text(&step.arguments),
            result: text(&step.result),
            captured: text(&step.captured),
            verdict: step.verdict.as_str(),
            outcome: step.outcome.as_str(),
            principal: step.approved_by.as_ref().map(|a| text(&a.principal)),
            channel: step.approved_by.as_ref().map(|a| a.channel.as_str()),
            approved_at: step.approved_by.as_ref().map(|a| a.at),
            changes: changes.iter().map(|c| (text(&c.key), c.value.as_deref().map(text))).collect(),
            awaiting_arguments: awaiting.as_ref().map(|a| text(&a.arguments)),
            component_digest: awaiting.as_ref().map(|a| a.component_digest.hex()),
            ticket: step.ticket.as_deref().or(awaiting.as_ref().map(|a| a.ticket_id.as_str())),
        });
    }
    // Each statement with its parameters, in order.
    type Param<'p> = &'p (dyn tokio_postgres::types::ToSql + Sync);
    let mut planned: Vec<(&tokio_postgres::Statement, bool, Vec<Param<'_>>)> = Vec::new();
    for (job, t) in batch.iter().zip(&texts) {
        let Write::Step { step, awaiting, run, .. } = &job.write else { unreachable!("checked by the caller") };
        if let Some(run) = run {
            planned.push((&run_stmt, false, vec![&step.run_id, &run.agent, &run.narrowing, &at, &run.restriction]));
        }
        planned.push((
            &step_stmt,
            true,
            vec![
                &step.run_id,
                &step.call_id,
                &step.tool_id,
                &t.arguments,
                &t.verdict,
                &t.outcome,
                &t.result,
                &t.captured,
                &t.ticket,
                &at,
                &step.structured,
                &t.principal,
                &t.channel,
                &t.approved_at,
            ],
        ));
        for (key, value) in &t.changes {
            match value {
                Some(v) => planned.push((&set_stmt, false, vec![&step.agent, &step.tool_id, key, v])),
                None => planned.push((&remove_stmt, false, vec![&step.agent, &step.tool_id, key])),
            }
        }
        if let (Some(a), Some(arguments), Some(digest)) = (awaiting, &t.awaiting_arguments, &t.component_digest) {
            planned.push((
                &awaiting_stmt,
                false,
                vec![
                    &a.ticket_id,
                    &a.run_id,
                    &a.agent,
                    &a.call_id,
                    &a.tool_id,
                    arguments,
                    &a.argument_digest,
                    digest,
                    &a.expires_at,
                    &a.requested_at,
                    &a.restriction,
                    &a.approvers,
                ],
            ));
        }
    }
    // One future per statement: each sends its statement when first polled,
    // and `try_join_all` polls them in order, so the server runs them in this
    // order (a later step's state change wins, as it would one by one).
    let tx_ref = &tx;
    let statements: Vec<BoxFuture<'_, Result<Option<i64>, tokio_postgres::Error>>> = planned
        .iter()
        .map(|(stmt, returns_seq, params)| {
            if *returns_seq {
                tx_ref.query_one(*stmt, params).map(|r| r.map(|row| Some(row.get::<_, i64>(0)))).boxed()
            } else {
                tx_ref.execute(*stmt, params).map(|r| r.map(|_| None)).boxed()
            }
        })
        .collect();
    let seqs: Vec<i64> = try_join_all(statements).await?.into_iter().flatten().collect();
    tx.commit().await?;
    Ok(seqs)
}

fn insert_awaiting_sql() -> String {
    format!(
        "INSERT INTO awaiting ({AWAITING_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12)"
    )
}

/// Apply `write` inside the caller's transaction (a savepoint).
async fn apply(c: &Tx<'_>, write: &Write) -> R<Written> {
    match write {
        Write::Step { step, changes, awaiting, run } => {
            if !state_is_as_read(c, step, changes).await? {
                return Ok(Written::StateChanged);
            }
            if let Some(run) = run {
                insert_run(c, &step.run_id, run).await?;
            }
            write_step(c, step, changes, awaiting.as_ref()).await.map(Written::Seq)
        }
        Write::Run { run_id, run } => insert_run(c, run_id, run).await.map(|_| Written::Done),
        Write::Claim { ticket_id, now, holder } => claim(c, ticket_id, *now, holder).await.map(Written::Claim),
        Write::Heartbeat { holder, now } => heartbeat(c, holder, *now).await.map(|_| Written::Done),
        Write::Resolve { ticket_id, holder, step, changes, delivered } => {
            if !state_is_as_read(c, step, changes).await? {
                return Ok(Written::StateChanged);
            }
            resolve(c, ticket_id, holder, step, changes, *delivered).await.map(Written::Resolved)
        }
        Write::TakeOver { holder, now, lease_secs } => {
            take_over(c, holder, *now, *lease_secs).await.map(Written::TakenOver)
        }
        Write::Deliver { ticket_id, step } => deliver(c, ticket_id, step).await.map(Written::Delivered),
    }
}

/// Whether `step`'s Tool state is still what its call read (see
/// [`NewStep::state_read`]). Writers of one agent's Tool state take a lock
/// on it (held to the end of the transaction) before they look, so two
/// hosts cannot both find the old state and both write.
async fn state_is_as_read(c: &Tx<'_>, step: &OwnedStep, changes: &[StateChange]) -> R<bool> {
    if !super::write::needs_state_check(&step.borrow(), changes) {
        return Ok(true);
    }
    let lock = c.prepare_cached("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(1) || $2, 0))").await?;
    c.execute(&lock, &[&step.agent, &step.tool_id]).await?;
    let read = c.prepare_cached("SELECT key, value FROM tool_state WHERE agent = $1 AND tool_id = $2").await?;
    let current: BTreeMap<String, String> =
        c.query(&read, &[&step.agent, &step.tool_id]).await?.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok(super::write::state_unchanged(&step.borrow(), changes, || current))
}

/// PostgreSQL text holds no NUL: store U+FFFD in its place.
fn text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') { std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}")) } else { std::borrow::Cow::Borrowed(s) }
}

async fn insert_run(c: &Tx<'_>, run_id: &str, run: &PendingRun) -> R<()> {
    let stmt = c.prepare_cached(INSERT_RUN).await?;
    c.execute(&stmt, &[&run_id, &run.agent, &run.narrowing, &now(), &run.restriction]).await?;
    Ok(())
}

async fn write_step(
    c: &Tx<'_>,
    step: &OwnedStep,
    changes: &[StateChange],
    awaiting: Option<&AwaitingRecord>,
) -> R<i64> {
    let seq = insert_step(c, step, step.ticket.as_deref().or(awaiting.map(|a| a.ticket_id.as_str()))).await?;
    apply_changes(c, &step.agent, &step.tool_id, changes).await?;
    if let Some(a) = awaiting {
        let stmt = c.prepare_cached(&insert_awaiting_sql()).await?;
        c.execute(
            &stmt,
            &[
                &a.ticket_id,
                &a.run_id,
                &a.agent,
                &a.call_id,
                &a.tool_id,
                &text(&a.arguments),
                &a.argument_digest,
                &a.component_digest.hex(),
                &a.expires_at,
                &a.requested_at,
                &a.restriction,
                &a.approvers,
            ],
        )
        .await?;
    }
    Ok(seq)
}

async fn insert_step(c: &Tx<'_>, s: &OwnedStep, ticket: Option<&str>) -> R<i64> {
    let approved = s.approved_by.as_ref();
    let stmt = c.prepare_cached(INSERT_STEP).await?;
    let row = c
        .query_one(
            &stmt,
            &[
                &s.run_id,
                &s.call_id,
                &s.tool_id,
                &text(&s.arguments),
                &s.verdict.as_str(),
                &s.outcome.as_str(),
                &text(&s.result),
                &text(&s.captured),
                &ticket,
                &now(),
                &s.structured,
                &approved.map(|a| text(&a.principal)),
                &approved.map(|a| a.channel.as_str()),
                &approved.map(|a| a.at),
            ],
        )
        .await?;
    Ok(row.get(0))
}

async fn apply_changes(c: &Tx<'_>, agent: &str, tool: &str, changes: &[StateChange]) -> R<()> {
    for change in changes {
        match &change.value {
            Some(v) => {
                let stmt = c.prepare_cached(SET_STATE).await?;
                c.execute(&stmt, &[&agent, &tool, &text(&change.key), &text(v)]).await?;
            }
            None => {
                let stmt = c.prepare_cached(REMOVE_STATE).await?;
                c.execute(&stmt, &[&agent, &tool, &text(&change.key)]).await?;
            }
        }
    }
    Ok(())
}

async fn heartbeat(c: &Tx<'_>, holder: &str, now: i64) -> R<()> {
    let stmt = c
        .prepare_cached(
            "INSERT INTO hosts (instance_id, heartbeat_at) VALUES ($1, $2)
             ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = GREATEST(hosts.heartbeat_at, excluded.heartbeat_at)",
        )
        .await?;
    c.execute(&stmt, &[&holder, &now]).await?;
    Ok(())
}

/// pending → claimed by `holder`, if the ticket is pending and unexpired.
/// Racing transactions wait on the row lock; all but one then find it claimed.
async fn claim(c: &Tx<'_>, ticket_id: &str, now: i64, holder: &str) -> R<Result<AwaitingRecord, TicketError>> {
    let stmt = c
        .prepare_cached(&format!(
            "UPDATE awaiting SET state = 'claimed', claimed_at = $2, holder = $3
             WHERE ticket_id = $1 AND state = 'pending' AND expires_at > $2 RETURNING {AWAITING_COLS}"
        ))
        .await?;
    if let Some(row) = c.query_opt(&stmt, &[&ticket_id, &now, &holder]).await? {
        heartbeat(c, holder, now).await?;
        return Ok(Ok(awaiting_from_row(&row)));
    }
    let stmt = c.prepare_cached(&format!("SELECT {AWAITING_COLS} FROM awaiting WHERE ticket_id = $1")).await?;
    Ok(Err(match c.query_opt(&stmt, &[&ticket_id]).await?.map(|r| awaiting_from_row(&r)) {
        None => TicketError::Unknown(ticket_id.to_owned()),
        Some(r) if r.state != "pending" => TicketError::Used(ticket_id.to_owned()),
        Some(_) => TicketError::Expired(ticket_id.to_owned()),
    }))
}

/// The step resolving `ticket_id`, if `holder` still holds its claim
/// (exactly one row changes); otherwise nothing is written.
async fn resolve(
    c: &Tx<'_>,
    ticket_id: &str,
    holder: &str,
    step: &OwnedStep,
    changes: &[StateChange],
    delivered: bool,
) -> R<Result<i64, TicketError>> {
    let stmt = c
        .prepare_cached(
            "UPDATE awaiting SET state = 'resolved', delivered = $3
             WHERE ticket_id = $1 AND state = 'claimed' AND holder = $2",
        )
        .await?;
    if c.execute(&stmt, &[&ticket_id, &holder, &delivered]).await? != 1 {
        return Ok(Err(TicketError::Settled(ticket_id.to_owned())));
    }
    let seq = insert_step(c, step, Some(ticket_id)).await?;
    apply_changes(c, &step.agent, &step.tool_id, changes).await?;
    Ok(Ok(seq))
}

/// Move to `holder` every claim whose holder's heartbeat (or the claim
/// itself, for a holder that never beat) is older than the lease. Claims
/// another host is taking over right now are skipped, not waited for.
async fn take_over(c: &Tx<'_>, holder: &str, now: i64, lease_secs: i64) -> R<Vec<AwaitingRecord>> {
    let cutoff = now.saturating_sub(lease_secs);
    let stmt = c
        .prepare_cached(&format!(
            "SELECT {AWAITING_COLS} FROM awaiting a
             WHERE a.state = 'claimed' AND (a.holder IS NULL OR a.holder <> $1)
               AND COALESCE((SELECT h.heartbeat_at FROM hosts h WHERE h.instance_id = a.holder), a.claimed_at, 0) < $2
             ORDER BY a.ticket_id FOR UPDATE SKIP LOCKED"
        ))
        .await?;
    let stale: Vec<AwaitingRecord> = c.query(&stmt, &[&holder, &cutoff]).await?.iter().map(awaiting_from_row).collect();
    let update = c
        .prepare_cached("UPDATE awaiting SET holder = $2, claimed_at = $3 WHERE ticket_id = $1 AND state = 'claimed'")
        .await?;
    for r in &stale {
        c.execute(&update, &[&r.ticket_id, &holder, &now]).await?;
    }
    if !stale.is_empty() {
        heartbeat(c, holder, now).await?;
    }
    // Hosts long gone and holding nothing need no row.
    let stmt = c
        .prepare_cached(
            "DELETE FROM hosts WHERE heartbeat_at < $1
             AND instance_id NOT IN (SELECT holder FROM awaiting WHERE state = 'claimed' AND holder IS NOT NULL)",
        )
        .await?;
    c.execute(&stmt, &[&cutoff]).await?;
    Ok(stale)
}

/// A retry's step for a decided ticket, once.
async fn deliver(c: &Tx<'_>, ticket_id: &str, step: &OwnedStep) -> R<Option<i64>> {
    let stmt = c
        .prepare_cached(
            "UPDATE awaiting SET delivered = TRUE WHERE ticket_id = $1 AND state = 'resolved' AND NOT delivered",
        )
        .await?;
    if c.execute(&stmt, &[&ticket_id]).await? != 1 {
        return Ok(None);
    }
    insert_step(c, step, Some(ticket_id)).await.map(Some)
}

const AWAITING_COLS: &str = "ticket_id, run_id, agent, call_id, tool_id, arguments, argument_digest, component_digest, \
                             expires_at, requested_at, state, restriction, approvers";

const STEP_COLS: &str = "seq, run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id, \
                         structured, approved_by, approved_via, approved_at";

fn awaiting_from_row(r: &Row) -> AwaitingRecord {
    let digest: String = r.get(7);
    AwaitingRecord {
        ticket_id: r.get(0),
        run_id: r.get(1),
        agent: r.get(2),
        call_id: r.get(3),
        tool_id: r.get(4),
        arguments: r.get(5),
        argument_digest: r.get(6),
        // Written by us from a Digest; an unreadable one matches no component.
        component_digest: Digest::from_hex(&digest).unwrap_or(Digest([0; 32])),
        expires_at: r.get(8),
        requested_at: r.get::<_, Option<i64>>(9).unwrap_or(0),
        state: r.get(10),
        restriction: r.get(11),
        approvers: r.get(12),
    }
}

fn step_from_row(r: &Row) -> StepRecord {
    let outcome: String = r.get(6);
    let approved_by = match (r.get::<_, Option<String>>(11), r.get::<_, Option<String>>(12)) {
        (Some(principal), Some(channel)) => {
            Some(ApprovedBy { principal, channel, at: r.get::<_, Option<i64>>(13).unwrap_or(0) })
        }
        _ => None,
    };
    StepRecord {
        seq: r.get(0),
        run_id: r.get(1),
        call_id: r.get(2),
        tool_id: r.get(3),
        arguments: r.get(4),
        verdict: r.get(5),
        outcome: OutcomeKind::parse(&outcome),
        result: r.get(7),
        captured: r.get(8),
        ticket_id: r.get(9),
        structured: r.get(10),
        approved_by,
    }
}

#[async_trait::async_trait]
impl Committer for PostgresJournal {
    async fn write(&self, write: Write) -> Result<Written, CommitError> {
        let gone = || CommitError::Postgres { store: self.shown.clone(), message: "the committer stopped".into() };
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.jobs.send(Job { write, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    fn unexpected(&self, what: &str) -> CommitError {
        CommitError::Postgres {
            store: self.shown.clone(),
            message: format!("unexpected result from the writer for a {what}"),
        }
    }

    fn pending_runs(&self) -> &PendingRuns {
        &self.pending_runs
    }
}

#[async_trait::async_trait]
impl StepStore for PostgresJournal {
    async fn begin_run(&self, run: &RunRecord<'_>) -> Result<(), CommitError> {
        self.queue_run(run).await
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunInfo>, CommitError> {
        if let Some(info) = self.pending_runs.info(run_id) {
            return Ok(Some(info));
        }
        let rows = self.query("SELECT agent, narrowing, restriction FROM runs WHERE run_id = $1", &[&run_id]).await?;
        Ok(rows.first().map(|r| RunInfo { agent: r.get(0), narrowing: r.get(1), restriction: r.get(2) }))
    }

    async fn commit_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
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
    ) -> Result<Vec<ClaimedTicket>, CommitError> {
        // A cheap read first: almost always nothing is claimed.
        let any = self.query("SELECT 1 FROM awaiting WHERE state = 'claimed' LIMIT 1", &[]).await?;
        if any.is_empty() {
            return Ok(Vec::new());
        }
        self.queue_take_over(holder, now, lease_secs).await
    }

    async fn prior_ask(
        &self,
        scope: AskScope<'_>,
        tool_id: &str,
        argument_digest: &str,
    ) -> Result<Option<PriorAsk>, CommitError> {
        // `$4` is a prefix of the run id (for a run, the id itself), compared
        // as text: no LIKE wildcards.
        let (column, key, runs) = match scope {
            AskScope::Run(run) => ("run_id", run, run),
            AskScope::StatelessRequests { agent, runs } => ("agent", agent, runs),
        };
        let rows = self
            .query(
                &format!(
                    "SELECT {AWAITING_COLS}, delivered FROM awaiting
                     WHERE {column} = $1 AND tool_id = $2 AND argument_digest = $3
                       AND left(run_id, char_length($4::text)) = $4 ORDER BY ordinal DESC LIMIT 1"
                ),
                &[&key, &tool_id, &argument_digest, &runs],
            )
            .await?;
        let Some(row) = rows.first() else { return Ok(None) };
        let record = awaiting_from_row(row);
        let delivered: bool = row.get(13);
        let resolution = if record.state == "resolved" {
            self.query(
                &format!(
                    "SELECT {STEP_COLS} FROM steps WHERE ticket_id = $1 AND outcome <> 'awaiting' ORDER BY seq LIMIT 1"
                ),
                &[&record.ticket_id],
            )
            .await?
            .first()
            .map(step_from_row)
        } else {
            None
        };
        Ok(Some(PriorAsk { record, delivered, resolution }))
    }

    async fn deliver(&self, ticket_id: &str, step: &NewStep<'_>) -> Result<Option<i64>, CommitError> {
        self.queue_delivery(ticket_id, step).await
    }

    async fn output_tools(&self, run_id: &str) -> Result<Vec<String>, CommitError> {
        let rows = self
            .query(
                "SELECT DISTINCT tool_id FROM steps WHERE run_id = $1 AND outcome = 'output' ORDER BY tool_id",
                &[&run_id],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError> {
        let rows = self
            .query("SELECT key, value FROM tool_state WHERE agent = $1 AND tool_id = $2", &[&agent, &tool_id])
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        let rows = self
            .query(
                &format!("SELECT {STEP_COLS} FROM steps WHERE $1::TEXT IS NULL OR run_id = $1 ORDER BY seq"),
                &[&run_id],
            )
            .await?;
        Ok(rows.iter().map(step_from_row).collect())
    }

    async fn awaiting(&self, ticket_id: &str) -> Result<Option<AwaitingRecord>, CommitError> {
        let rows =
            self.query(&format!("SELECT {AWAITING_COLS} FROM awaiting WHERE ticket_id = $1"), &[&ticket_id]).await?;
        Ok(rows.first().map(awaiting_from_row))
    }

    async fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError> {
        let rows = self
            .query(&format!("SELECT {AWAITING_COLS} FROM awaiting WHERE state = 'pending' ORDER BY ordinal"), &[])
            .await?;
        Ok(rows.iter().map(awaiting_from_row).collect())
    }
}
