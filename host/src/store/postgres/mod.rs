//! PostgreSQL: the journal several hosts share.
//!
//! Owns the PostgreSQL schema and its versioned migrations (`V*.sql`, applied
//! in order in one transaction under an advisory lock, so hosts starting
//! together do not race; each statement waits for a table's lock only
//! briefly, then the migration is tried again, and unique indexes over
//! existing rows are built afterwards, `CONCURRENTLY`), and the write discipline of a shared journal: every
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
//! Nothing waits without a bound: every toolgate transaction (reads too)
//! begins by setting `lock_timeout`, `statement_timeout` and
//! `idle_in_transaction_session_timeout` for itself (`SET LOCAL`: nothing is
//! sent at startup, which PgBouncer and hosted poolers refuse, and nothing
//! outlives the transaction, so transaction pooling works where the pooler
//! keeps prepared statements) — each only where nobody else set it: not
//! named by the connection string's `options`, and not set for the role,
//! the database, the server or the session, `0` included (its
//! `pg_settings.source` is still `default`). TCP keepalives with a user
//! timeout find a server that stopped answering, so a host frozen
//! mid-transaction or a dead server fails commits with an error naming the
//! limit, not stalls them; waiting
//! for a pooled connection, for the committer and for one group's commit are
//! bounded too. None of that ends a wait on a server that hangs while its
//! TCP stack still answers (a stopped postmaster, a frozen VM whose kernel
//! still acknowledges, a proxy that black-holes the stream): it runs no
//! `statement_timeout`, and keepalives succeed. So every operation — a
//! read, a page of a listing, a group commit with its attempts, a migration
//! — is also bounded on this host's clock ([`DEADLINE`], [`Db::bounded`]):
//! past it the operation fails naming the limit, and the connection it used
//! is closed, never back in the pool ([`Conn`]); a write whose COMMIT was
//! sent is reported unknown, never failed. Only an index build
//! ([`build_indexes`]) runs as long as it takes.
//!
//! Times that decide between hosts — claims, heartbeats, take-over, expiry —
//! are the server's: a host's clock reading (`now`) is translated by that
//! host's offset from the server clock, measured once per transaction by
//! its first statement (which never waits for a lock), so a
//! host whose clock is skewed neither takes over a live claim nor sees a
//! live ticket expired.
//!
//! A group whose COMMIT was sent but not answered (the connection dropped)
//! is committed again: each write carries a key (a step keeps it, unique; a
//! claim keeps its claim's), and the retry finds what the lost attempt wrote
//! instead of writing it twice. Before it looks, the lost attempt is settled:
//! its server process (recorded when its transaction began) is terminated
//! and waited for, so the lost COMMIT is either applied or never will be,
//! and neither its locks nor its late commit can mislead the retry.
//!
//! PostgreSQL text cannot hold NUL characters; a NUL in a step's text (a Tool
//! can return one) is stored as U+FFFD, so the commit never fails on it.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;

use super::write::{Committer, OwnedStep, PendingRun, PendingRuns, StateCheck, Write, Written};
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
    include_str!("V5__write_keys.sql"),
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The advisory lock migrations hold (any constant: "toolgate" in ASCII).
const MIGRATION_LOCK: i64 = 0x746f_6f6c_6761_7465;

/// Most writes one group commit holds.
const MAX_GROUP: usize = 256;

/// How often a transaction that lost a deadlock or serialization race, or
/// whose connection was lost, is retried.
const RETRIES: usize = 5;

/// Settings every toolgate transaction makes for itself (`SET LOCAL`),
/// each unless the connection string's `options` names it or it is set for
/// the role, database or server: how long a statement waits for a lock
/// another transaction holds (the SQLite journal's busy timeout is 10 s
/// too), how long one statement may run, and how long the server keeps a
/// transaction whose client stopped sending (it is then rolled back and its
/// locks released).
const SESSION_SETTINGS: &[(&str, &str)] =
    &[("lock_timeout", "10s"), ("statement_timeout", "30s"), ("idle_in_transaction_session_timeout", "30s")];

/// Connecting, unless the connection string sets `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalives (idle, interval, probes) and the TCP user timeout: a
/// server that stops answering is found out within about half a minute,
/// whether the connection is idle or has data unacknowledged.
const KEEPALIVE: (Duration, Duration, u32) = (Duration::from_secs(15), Duration::from_secs(5), 3);
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// Waiting for a free connection of the pool.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// The journal's limit for one operation, on this host's clock, whatever
/// the server's settings: a read (the pooled connection, its statements,
/// its COMMIT), a page of a listing, one group commit with every attempt
/// (past it the group's callers are answered with an error). Only this
/// ends the wait on a server that hangs while its TCP stack still answers;
/// comfortably above `statement_timeout` ([`SESSION_SETTINGS`]), which a
/// role may raise for statements, not past this.
const DEADLINE: Duration = Duration::from_secs(60);

/// Waiting for the server process of a group's lost attempt to end (it is
/// terminated first) before the group is committed again.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Steps read per statement when the journal is listed.
const PAGE: i64 = 5000;

/// A migration's statements wait this long for a table's lock (they hold
/// it exclusively, and every other host's reads and writes of that table
/// queue behind them while they wait); then the migration is tried again.
const MIGRATION_LOCK_WAIT: &str = "2s";
const MIGRATION_ATTEMPTS: u32 = 30;

/// A host starting waits this long for another host's migration (its
/// advisory lock) before it fails; one attempt at the migrations is
/// bounded by this and [`DEADLINE`] together.
const MIGRATION_TURN: Duration = Duration::from_secs(600);

/// A write waiting in the queue for a committer; past it the write is
/// taken out of the queue, not written, and its caller told so.
const QUEUE_WAIT: Duration = Duration::from_secs(60);

/// A job's place: waiting in the queue, taken into a group, or given up by
/// its caller before a committer took it (then never written).
const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

/// The schema a database's version has, as SQL: for tests that build a
/// journal an older toolgate wrote.
pub fn schema_at(version: i64) -> String {
    MIGRATIONS.iter().take(version.max(0) as usize).copied().collect()
}

/// The PostgreSQL journal.
pub struct PostgresJournal {
    db: Db,
    /// How the journal is named in errors: user, hosts and database, never the password.
    shown: String,
    /// The committers' queue. Dropping the journal closes it: the
    /// committers commit what is queued, answer, and end (never cut off
    /// mid-group; a cancelled caller's write is still committed).
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    counts: Arc<(AtomicU64, AtomicU64)>,
    /// Runs begun but not yet written (recorded with their first step).
    pending_runs: PendingRuns,
    /// Added to this host's clock when its offset from the server's is
    /// measured: a test's way to skew the host's clock.
    skew: i64,
}

/// The pool, what each toolgate transaction on it runs first
/// ([`setup_sql`]), and the limit of one operation ([`DEADLINE`]; lower in
/// tests).
#[derive(Clone)]
struct Db {
    pool: Pool,
    setup: Arc<str>,
    deadline: Duration,
}

impl Db {
    /// `op` — taking a connection, its statements, its COMMIT — within the
    /// journal's limit for one operation ([`within`]).
    async fn bounded<T, E: Into<Fail>>(&self, op: impl Future<Output = Result<T, E>>) -> R<T> {
        within(self.deadline, "the journal's limit for one operation", op).await
    }
}

/// `op` within `limit` (`what` names it in the error), on this host's
/// clock. Past it `op` is dropped, and with it the connection it used,
/// closed, never back in the pool ([`Conn`]): what it sent may still be
/// pending on the server.
async fn within<T, E: Into<Fail>>(limit: Duration, what: &str, op: impl Future<Output = Result<T, E>>) -> R<T> {
    match tokio::time::timeout(limit, op).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(no_answer(limit, what)),
    }
}

/// No answer within `limit`: the server hangs (with its TCP stack still
/// answering, or nothing would have noticed before) or the network drops
/// what is sent.
fn no_answer(limit: Duration, what: &str) -> Fail {
    Fail::Timeout(format!(
        "no answer from the PostgreSQL server within {} s ({what}): the server hangs or is overloaded, or \
         the network to it drops what is sent — check the server; the connection was closed",
        limit.as_secs_f64()
    ))
}

/// Where a transaction ran, as `pg_stat_activity` shows it while it is
/// open: its server process and when it began (µs since the epoch). A
/// pooler may hand that process to others afterwards; with the start time
/// it names this transaction only.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    pid: i32,
    began: i64,
}

/// SQL each toolgate transaction runs first (it never waits for a lock):
/// where it runs ([`Attempt`]), this host's offset from the server's clock
/// (`$1`: the host's clock read just before it was sent, [`clock_offset`]),
/// and the [`SESSION_SETTINGS`] for the transaction alone — each unless the
/// connection string's `options` names it ([`named_in_options`]), or it is
/// set anywhere but the built-in default (for the role, the database, the
/// server or the session: that setting wins, `0` included).
fn setup_sql(options: &str) -> String {
    let ours: Vec<String> = SESSION_SETTINGS
        .iter()
        .filter(|(name, _)| !named_in_options(options, name))
        .map(|(name, value)| format!("('{name}', '{value}')"))
        .collect();
    let at = format!(
        "pg_backend_pid(), (extract(epoch FROM now()) * 1000000)::BIGINT,
         set_config('{OFFSET_SETTING}', {}::TEXT, true)",
        clock_offset("$1")
    );
    if ours.is_empty() {
        return format!("SELECT {at}");
    }
    format!(
        "SELECT {at}, (SELECT count(set_config(s.name, s.value, true)) FROM (VALUES {}) s (name, value)
                      WHERE (SELECT p.source FROM pg_settings p WHERE p.name = s.name) = 'default')",
        ours.join(", ")
    )
}

/// Whether the startup `options` (`-c name=value`, `-cname=value` or
/// `--name=value` tokens, as the server reads them) set `name`: a whole
/// name, not a part of one (`deadlock_timeout` is not `lock_timeout`).
fn named_in_options(options: &str, name: &str) -> bool {
    let mut tokens = options.split_ascii_whitespace();
    while let Some(t) = tokens.next() {
        let setting = if t == "-c" {
            tokens.next()
        } else if let Some(rest) = t.strip_prefix("--") {
            Some(rest)
        } else {
            t.strip_prefix("-c")
        };
        if let Some((n, _)) = setting.and_then(|s| s.split_once('='))
            && n.replace('-', "_").eq_ignore_ascii_case(name)
        {
            return true;
        }
    }
    false
}

/// Where the transaction whose setup answered `row` runs.
fn attempt(row: &Row) -> Attempt {
    Attempt { pid: row.get(0), began: row.get(1) }
}

/// One write waiting for a group commit, with where to send its result.
struct Job {
    write: Write,
    reply: tokio::sync::oneshot::Sender<Result<Written, CommitError>>,
    /// This write's own key (kept with what it writes: a retry of its group
    /// finds it).
    key: String,
    /// Added to this host's clock ([`PostgresJournal::skew`]).
    skew: i64,
    /// [`QUEUED`], [`TAKEN`] or [`ABANDONED`].
    place: Arc<AtomicU8>,
}

impl Job {
    fn new(write: Write, skew: i64) -> (Self, tokio::sync::oneshot::Receiver<Result<Written, CommitError>>) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job { write, reply, key: write_key(), skew, place: Arc::new(AtomicU8::new(QUEUED)) };
        (job, answer)
    }
}

/// A key no other write has: 128 random bits (without the operating
/// system's randomness: this process, the time and a counter).
fn write_key() -> String {
    let mut key = [0u8; 16];
    if getrandom::fill(&mut key).is_ok() {
        return hex::encode(key);
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{:x}-{nanos:x}-{:x}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// This host's clock, in Unix seconds (fractional), plus `skew`.
fn local_clock(skew: i64) -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
        + skew as f64
}

/// SQL: the server's clock (when the statement began) minus the host's
/// clock reading `local` (a parameter, read just before the statement was
/// sent), in whole seconds rounded down — every offset the same way: the
/// reading is late by the time the statement took to arrive, never early,
/// so a host on the server's machine measures 0 unless that took a second,
/// and two measurements of one host differ by at most one. Measured once
/// per transaction, by its first statement ([`setup_sql`]), which never
/// waits for a lock: measured later, the offset would count the time a
/// statement before it waited (up to `lock_timeout`) as clock skew.
fn clock_offset(local: &str) -> String {
    format!("floor(extract(epoch FROM statement_timestamp())::FLOAT8 - {local}::FLOAT8)::BIGINT")
}

/// Where a transaction keeps the offset its first statement measured
/// (`SET LOCAL`: it ends with the transaction).
const OFFSET_SETTING: &str = "toolgate.clock_offset";

/// SQL: this host's offset from the server's clock, as this transaction's
/// first statement measured it.
fn offset() -> String {
    format!("current_setting('{OFFSET_SETTING}')::BIGINT")
}

/// SQL: `now` (a time the host read from its clock, a parameter) on the
/// server's clock.
fn on_server_clock(now: &str) -> String {
    format!("({now}::BIGINT + {})", offset())
}

/// Why a database operation failed.
#[derive(Debug)]
enum Fail {
    Pool(String),
    Db(tokio_postgres::Error),
    /// No answer within the bound (`what` it was).
    Timeout(String),
    /// A lost attempt's transaction could not be ended (what happened).
    Unsettled(String),
}

impl From<tokio_postgres::Error> for Fail {
    fn from(e: tokio_postgres::Error) -> Self {
        Fail::Db(e)
    }
}

impl From<deadpool_postgres::PoolError> for Fail {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        use deadpool_postgres::{PoolError, TimeoutType};
        match e {
            PoolError::Backend(e) => Fail::Db(e),
            PoolError::Timeout(TimeoutType::Wait) => Fail::Pool(format!(
                "no connection of the pool came free within {} s: every one is busy (a server that stopped \
                 answering, or more load than `[postgres] pool_size` connections serve; raise it)",
                POOL_WAIT.as_secs()
            )),
            PoolError::Timeout(_) => Fail::Pool(format!(
                "connecting to the server took longer than {} s (is it up and reachable? `connect_timeout` in the \
                 connection string sets the limit)",
                CONNECT_TIMEOUT.as_secs()
            )),
            other => Fail::Pool(other.to_string()),
        }
    }
}

impl Fail {
    /// Lost a race another transaction won: retrying the whole transaction succeeds.
    /// Also: a step whose key is already written — the write of an attempt
    /// whose COMMIT was still in flight; the retry finds it.
    fn retryable(&self) -> bool {
        let Fail::Db(e) = self else { return false };
        match e.as_db_error() {
            Some(db) => {
                *db.code() == SqlState::T_R_SERIALIZATION_FAILURE
                    || *db.code() == SqlState::T_R_DEADLOCK_DETECTED
                    || (*db.code() == SqlState::UNIQUE_VIOLATION && db.constraint() == Some("steps_write_key"))
            }
            None => false,
        }
    }

    /// The server's answer never came (the connection broke, or the time
    /// ran out): what was sent may or may not have committed.
    fn lost(&self) -> bool {
        match self {
            Fail::Timeout(_) => true,
            Fail::Db(e) => {
                e.is_closed()
                    || std::error::Error::source(e).is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some())
            }
            Fail::Pool(_) | Fail::Unsettled(_) => false,
        }
    }

    fn message(&self) -> String {
        self.message_after(false)
    }

    /// The message; with `lost_before`, an earlier attempt of this write
    /// got no answer to its COMMIT, so a write this attempt failed may have
    /// been written by that one.
    fn message_after(&self, lost_before: bool) -> String {
        let nothing_kept = if lost_before {
            "this attempt kept nothing, but an earlier attempt of this write got no answer to its COMMIT: \
             whether it was written is unknown (look it up before doing it again)"
        } else {
            "nothing of this write was kept, try again"
        };
        match self {
            Fail::Pool(m) | Fail::Timeout(m) | Fail::Unsettled(m) => m.clone(),
            Fail::Db(e) => match e.as_db_error() {
                Some(db) => {
                    let mut m = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
                    if let Some(d) = db.detail() {
                        m.push_str(&format!("; {d}"));
                    }
                    let setting = |name: &str| {
                        let value = SESSION_SETTINGS.iter().find(|(n, _)| *n == name).map_or("", |(_, v)| v);
                        format!(
                            " — `{name}` ({value} unless set for the role, the database or the server, or by the \
                             connection string's `options`: e.g. `ALTER ROLE … SET {name} = '60s'`, or \
                             `options='-c {name}=60s'` where no pooler is in between)"
                        )
                    };
                    if *db.code() == SqlState::LOCK_NOT_AVAILABLE {
                        m.push_str(&setting("lock_timeout"));
                        m.push_str(": another transaction held the lock that long (a host stalled mid-commit?); ");
                        m.push_str(nothing_kept);
                    } else if *db.code() == SqlState::QUERY_CANCELED {
                        m.push_str(&setting("statement_timeout"));
                        m.push_str(": the statement ran that long; ");
                        m.push_str(nothing_kept);
                    } else if *db.code() == SqlState::INVALID_SQL_STATEMENT_NAME {
                        m.push_str(
                            " — toolgate prepares named statements: a pooler in between must keep them \
                             (PgBouncer's transaction pooling needs 1.21 or later with `max_prepared_statements` \
                             above 0; or use session pooling)",
                        );
                    } else if *db.code() == SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT {
                        m.push_str(&setting("idle_in_transaction_session_timeout"));
                        m.push_str(": the server ended a transaction this host left waiting that long");
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
        Self::open(dsn, password, pool_size, ca_file, DEADLINE).await
    }

    /// [`PostgresJournal::connect`] with `deadline` the limit of one
    /// operation ([`DEADLINE`]; tests set it low).
    async fn open(
        dsn: &str,
        password: Option<&str>,
        pool_size: usize,
        ca_file: Option<&std::path::Path>,
        deadline: Duration,
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
        let setup: Arc<str> = setup_sql(config.get_options().unwrap_or("")).into();
        bound(&mut config);
        let tls = tls(ca_file).map_err(|message| CommitError::Postgres { store: shown.clone(), message })?;
        let own = (config.clone(), tls.clone());
        let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| CommitError::Postgres {
                store: shown.clone(),
                message: format!("cannot build the connection pool: {e}"),
            })?;
        let db = Db { pool, setup, deadline };
        // Connects now (a wrong DSN or password fails here, not at the first call).
        migrate(&db, &own, &shown).await?;

        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        // Half the pool commits; the rest serves reads. Each committer ends
        // once the queue is closed and empty.
        for _ in 0..(pool_size / 2).max(1) {
            tokio::spawn(commit_loop(rx.clone(), db.clone(), shown.clone(), counts.clone()));
        }
        Ok(PostgresJournal { db, shown, jobs: tx, counts, pending_runs: PendingRuns::default(), skew: 0 })
    }

    /// This journal's host clock reads `secs` ahead of the real one (behind
    /// when negative): for tests of a skewed host.
    #[cfg(test)]
    fn skewed(mut self, secs: i64) -> Self {
        self.skew = secs;
        self
    }

    /// Group commits made and the writes they held.
    pub fn group_commits(&self) -> (u64, u64) {
        (self.counts.0.load(Ordering::Relaxed), self.counts.1.load(Ordering::Relaxed))
    }

    fn err(&self, f: Fail) -> CommitError {
        CommitError::Postgres { store: self.shown.clone(), message: f.message() }
    }

    /// One read, in a transaction of its own (its settings made first, all
    /// of it sent at once): `statement_timeout` bounds it on the server, TCP
    /// keepalives and the user timeout find a server that stopped
    /// answering, and the journal's limit for one operation ([`DEADLINE`])
    /// ends it whatever the server does.
    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, CommitError> {
        let run = async {
            let client = Conn::get(&self.db.pool).await?;
            let stmt = client.prepare_cached(sql).await?;
            let setup = client.prepare_cached(&self.db.setup).await?;
            let local = local_clock(self.skew);
            let local: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&local];
            let (begin, set, rows, end) = futures_util::join!(
                client.batch_execute("BEGIN READ ONLY"),
                client.query(&setup, &local),
                client.query(&stmt, params),
                client.batch_execute("COMMIT"),
            );
            // The connection is clean again once COMMIT was answered.
            let clean = begin.is_ok() && end.is_ok();
            let r = begin.and(set).and(rows).and_then(|rows| end.map(|_| rows));
            if clean {
                client.finish();
            }
            Ok::<_, Fail>(r?)
        };
        self.db.bounded(run).await.map_err(|f| self.err(f))
    }

    /// Every step (of `run_id`, if given) in order, read [`PAGE`] at a time
    /// in one read-only snapshot: each statement is bounded by
    /// `statement_timeout`, and each page (the first with the transaction's
    /// start) by the journal's limit for one operation, not the whole
    /// listing.
    async fn all_steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        let db = &self.db;
        let run = async {
            let mut client = db.bounded(Conn::get(&db.pool)).await?;
            let (tx, page) = db
                .bounded(async {
                    let page = client
                        .prepare_cached(&format!(
                            "SELECT {STEP_COLS} FROM steps WHERE ($1::TEXT IS NULL OR run_id = $1) AND seq > $2
                             ORDER BY seq LIMIT $3"
                        ))
                        .await?;
                    let setup = client.prepare_cached(&db.setup).await?;
                    let tx = client
                        .build_transaction()
                        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                        .await?;
                    tx.query(&setup, &[&local_clock(self.skew)]).await?;
                    Ok::<_, Fail>((tx, page))
                })
                .await?;
            let mut steps = Vec::new();
            let mut after = 0i64;
            loop {
                let rows = db.bounded(tx.query(&page, &[&run_id, &after, &PAGE])).await?;
                steps.extend(rows.iter().map(step_from_row));
                match steps.last() {
                    Some(last) if rows.len() as i64 == PAGE => after = last.seq,
                    _ => break,
                }
            }
            db.bounded(tx.commit()).await?;
            client.finish();
            Ok::<_, Fail>(steps)
        };
        run.await.map_err(|f| self.err(f))
    }
}

/// The limits of every connection: TCP keepalives and user timeout, a
/// connect timeout. No startup `options` of toolgate's own (the session
/// settings are made per transaction, [`setup_sql`]): PgBouncer before 1.20
/// refuses the parameter, later ones and hosted poolers refuse the settings
/// it names, and it would override what is set for the role.
fn bound(config: &mut tokio_postgres::Config) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config
        .keepalives(true)
        .keepalives_idle(KEEPALIVE.0)
        .keepalives_interval(KEEPALIVE.1)
        .keepalives_retries(KEEPALIVE.2);
    config.tcp_user_timeout(TCP_USER_TIMEOUT);
}

/// A pooled connection that goes back to the pool only when its work
/// finished ([`Conn::finish`]): one dropped mid-statement (its time ran
/// out) may be stuck on a server that stopped answering, and is closed.
struct Conn(Option<deadpool_postgres::Object>);

impl Conn {
    async fn get(pool: &Pool) -> R<Conn> {
        Ok(Conn(Some(pool.get().await?)))
    }
    /// Its work is done: back to the pool.
    fn finish(mut self) {
        drop(self.0.take());
    }
}

impl std::ops::Deref for Conn {
    type Target = deadpool_postgres::Object;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("present until finished or dropped")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("present until finished or dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(o) = self.0.take() {
            // Out of the pool; dropping the client closes the connection.
            drop(deadpool_postgres::Object::take(o));
        }
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

/// Unique indexes built after the migrations, outside any transaction
/// (`CREATE … CONCURRENTLY`: other hosts keep reading and writing the table
/// meanwhile): name, statement.
const CONCURRENT_INDEXES: &[(&str, &str)] =
    &[("steps_write_key", "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS steps_write_key ON steps (write_key)")];

/// Bring the database to [`SCHEMA_VERSION`], in one transaction, holding
/// the migration lock so hosts starting together apply each version once;
/// then build the [`CONCURRENT_INDEXES`]. A statement of a migration waits
/// at most [`MIGRATION_LOCK_WAIT`] for a table's lock (while it waits,
/// other hosts' use of that table queues behind it); the migration is then
/// rolled back and tried again, [`MIGRATION_ATTEMPTS`] times. Each attempt
/// waits at most [`MIGRATION_TURN`] for another host's, and is bounded on
/// this host's clock by that and [`DEADLINE`].
async fn migrate(db: &Db, own: &OwnConnection, shown: &str) -> Result<(), CommitError> {
    let err = |f: Fail| CommitError::Postgres { store: shown.to_owned(), message: f.message() };
    let mut attempt = 0;
    loop {
        let limit = MIGRATION_TURN + db.deadline;
        let what = "the journal's limit for one attempt at the migrations, which waits for another host's";
        match within(limit, what, migrate_once(&db.pool)).await {
            Ok(Ok(())) => break,
            Ok(Err(found)) => {
                return Err(CommitError::NewerSchema { path: shown.to_owned(), found, known: SCHEMA_VERSION });
            }
            Err(f) if lock_not_available(&f) && attempt + 1 < MIGRATION_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(250 * u64::from(attempt.min(8)))).await;
            }
            Err(f) if lock_not_available(&f) => {
                return Err(CommitError::Postgres {
                    store: shown.to_owned(),
                    message: format!(
                        "migrating the schema to version {SCHEMA_VERSION}: a table's lock was not free within \
                         {MIGRATION_LOCK_WAIT} in {MIGRATION_ATTEMPTS} tries (a long transaction holds it; \
                         nothing was changed, start again later): {}",
                        f.message()
                    ),
                });
            }
            Err(f) => return Err(err(f)),
        }
    }
    build_indexes(db, own).await.map_err(|f| CommitError::Postgres {
        store: shown.to_owned(),
        message: format!(
            "building the index steps_write_key (CREATE UNIQUE INDEX CONCURRENTLY; the next start tries \
             again): {}",
            f.message()
        ),
    })
}

fn lock_not_available(f: &Fail) -> bool {
    matches!(f, Fail::Db(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE))
}

/// One attempt at the migrations: `Ok(Err(version))` if the database's
/// schema is newer than this build's.
async fn migrate_once(pool: &Pool) -> R<Result<(), i64>> {
    let mut client = Conn::get(pool).await?;
    let tx = client.transaction().await?;
    // Hosts starting together wait for the one migrating (its statements
    // are short: indexes over existing rows are built afterwards).
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = '{}s';
         SET LOCAL idle_in_transaction_session_timeout = '30s'",
        MIGRATION_TURN.as_secs()
    ))
    .await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{MIGRATION_LOCK_WAIT}'")).await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS toolgate_schema (version BIGINT NOT NULL)").await?;
    let version: i64 = tx.query_opt("SELECT version FROM toolgate_schema", &[]).await?.map_or(0, |r| r.get(0));
    if version > SCHEMA_VERSION {
        tx.rollback().await?;
        client.finish();
        return Ok(Err(version));
    }
    if version < SCHEMA_VERSION {
        for sql in MIGRATIONS.iter().skip(version as usize) {
            tx.batch_execute(sql).await?;
        }
        tx.execute("DELETE FROM toolgate_schema", &[]).await?;
        tx.execute("INSERT INTO toolgate_schema (version) VALUES ($1)", &[&SCHEMA_VERSION]).await?;
    }
    tx.commit().await?;
    client.finish();
    Ok(Ok(()))
}

/// Whether index `$1` exists and is valid: no row if absent, false while
/// it is being built or when a build was interrupted.
const INDEX_VALID: &str = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)";

fn valid(row: Option<Row>) -> Option<bool> {
    row.map(|r| r.get(0))
}

/// What opens a connection outside the pool, as the pool's are opened.
type OwnConnection = (tokio_postgres::Config, tokio_postgres_rustls::MakeRustlsConnect);

/// The advisory lock a host holds (for its session) while it builds the
/// [`CONCURRENT_INDEXES`]: one build at a time, and a host that finds it
/// taken knows a build is under way.
const BUILD_LOCK: i64 = MIGRATION_LOCK + 1;

/// Build each of the [`CONCURRENT_INDEXES`] not valid yet, on a connection
/// of its own: `statement_timeout` and `lock_timeout` off for it (a role's
/// or database's limits would cancel a build over a large table, every
/// start), closed afterwards, never back in the pool. Builds take turns by
/// [`BUILD_LOCK`], tried, never waited for: the host holding it drops an
/// index left invalid by an interrupted build (a host stopped mid-way;
/// duplicates) and builds it again — both `CONCURRENTLY`, waiting for the
/// table's SHARE UPDATE EXCLUSIVE lock as long as it takes (autovacuum or
/// ANALYZE holding it gives way); a host that finds the lock taken leaves
/// the index to that build and works without it meanwhile. Everything but
/// the build itself (`DROP`/`CREATE … CONCURRENTLY`, as long as it takes)
/// is bounded by the journal's limit for one operation.
async fn build_indexes(db: &Db, own: &OwnConnection) -> R<()> {
    for (name, create) in CONCURRENT_INDEXES {
        let found = db
            .bounded(async {
                let pooled = Conn::get(&db.pool).await?;
                let found = valid(pooled.query_opt(INDEX_VALID, &[name]).await?);
                pooled.finish();
                Ok::<_, Fail>(found)
            })
            .await?;
        if found == Some(true) {
            continue;
        }
        // Dropped at the end of this iteration, which closes it.
        let (client, held, found) = db
            .bounded(async {
                let (client, connection) = own.0.connect(own.1.clone()).await?;
                tokio::spawn(connection);
                client.batch_execute("SET statement_timeout = 0; SET lock_timeout = 0").await?;
                let held: bool = client.query_one("SELECT pg_try_advisory_lock($1)", &[&BUILD_LOCK]).await?.get(0);
                let found = if held { valid(client.query_opt(INDEX_VALID, &[name]).await?) } else { None };
                Ok::<_, Fail>((client, held, found))
            })
            .await?;
        if !held {
            tracing::warn!("the index {name} is being built by another host; this host does not wait for it");
            continue;
        }
        let built = async {
            match found {
                Some(true) => return Ok(()),
                Some(false) => client.batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}")).await?,
                None => {}
            }
            client.batch_execute(create).await?;
            Ok::<_, Fail>(())
        }
        .await;
        // Undone before closing, should a pooler keep the server's session.
        let _ = db
            .bounded(client.batch_execute(&format!(
                "SELECT pg_advisory_unlock({BUILD_LOCK}); RESET statement_timeout; RESET lock_timeout"
            )))
            .await;
        built?;
    }
    Ok(())
}

/// One committer: take what is queued (up to [`MAX_GROUP`]), commit it in
/// one transaction, answer each caller; repeat until the queue is closed
/// and empty. A write whose caller gave up waiting before it was taken is
/// dropped, unwritten (its caller was told so).
async fn commit_loop(
    rx: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<Job>>>,
    db: Db,
    shown: String,
    counts: Arc<(AtomicU64, AtomicU64)>,
) {
    let take = |j: &Job| j.place.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_ok();
    loop {
        let batch = {
            let mut rx = rx.lock().await;
            let mut batch = Vec::new();
            while batch.is_empty() {
                let Some(first) = rx.recv().await else { return };
                if take(&first) {
                    batch.push(first);
                }
            }
            while batch.len() < MAX_GROUP {
                match rx.try_recv() {
                    Ok(j) if take(&j) => batch.push(j),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            batch
        };
        let results = commit_group(&db, &batch, &shown).await;
        counts.0.fetch_add(1, Ordering::Relaxed);
        counts.1.fetch_add(batch.len() as u64, Ordering::Relaxed);
        for (job, r) in batch.into_iter().zip(results) {
            // The caller may be gone (its task was cancelled): its write is committed regardless.
            let _ = job.reply.send(r);
        }
    }
}

/// What the attempts at one group commit learned.
#[derive(Default)]
struct Attempts {
    /// An attempt sent COMMIT and heard nothing back.
    unanswered: AtomicBool,
    /// Where the latest attempt's transaction runs (known once it began).
    current: std::sync::Mutex<Option<Attempt>>,
}

impl Attempts {
    fn record(&self, a: Attempt) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(a);
    }
    fn latest(&self) -> Option<Attempt> {
        *self.current.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Write `batch` in one transaction, a savepoint per write; one result per
/// job. A transaction that lost a race, or whose connection was lost (its
/// COMMIT may have been applied without the answer arriving), is retried
/// whole on another connection, finding by their keys the writes an earlier
/// attempt committed; all attempts within the journal's limit for one
/// operation ([`DEADLINE`]).
async fn commit_group(db: &Db, batch: &[Job], shown: &str) -> Vec<Result<Written, CommitError>> {
    commit_group_after(db, batch, shown, Attempts::default(), false).await
}

/// [`commit_group`] after `attempts` (with `lost`, the latest of them lost
/// its connection). Before an attempt after a lost one, the lost one is
/// settled ([`settle`]): until its server process ended, its COMMIT may
/// still be applied, and its locks would make the retry skip (take-over)
/// or wait out what it holds.
async fn commit_group_after(
    db: &Db,
    batch: &[Job],
    shown: &str,
    attempts: Attempts,
    mut lost: bool,
) -> Vec<Result<Written, CommitError>> {
    let deadline = tokio::time::Instant::now() + db.deadline;
    let mut attempt = 0;
    // An earlier attempt may have committed: look before writing.
    let mut retry = lost;
    loop {
        let run = async {
            if lost && let Some(a) = attempts.latest() {
                settle(&db.pool, a).await?;
            }
            try_group(db, batch, retry, &attempts).await
        };
        // Past the deadline the attempt is dropped, its connection closed ([`Conn`]).
        let outcome = match tokio::time::timeout_at(deadline, run).await {
            Ok(outcome) => outcome,
            Err(_) => Err(no_answer(db.deadline, "the journal's limit for one group commit, every attempt included")),
        };
        let unanswered = attempts.unanswered.load(Ordering::Acquire);
        match outcome {
            Ok(results) => {
                return results
                    .into_iter()
                    .map(|r| {
                        r.map_err(|f| CommitError::Postgres {
                            store: shown.to_owned(),
                            message: f.message_after(unanswered),
                        })
                    })
                    .collect();
            }
            Err(f)
                if (f.retryable() || f.lost())
                    && attempt < RETRIES
                    && !matches!(f, Fail::Timeout(_))
                    && tokio::time::Instant::now() < deadline =>
            {
                attempt += 1;
                retry = true;
                if f.lost() {
                    lost = true;
                    // A broken connection: give the server (or the network) a moment.
                    tokio::time::sleep(Duration::from_millis(100 << attempt.min(4))).await;
                }
            }
            Err(f) => {
                // An unanswered COMMIT (this attempt's, its answer cut off by
                // the deadline; or an earlier one's, that no retry settled)
                // may have been applied.
                let message = if unanswered {
                    format!(
                        "the group commit got no answer to its COMMIT, and no later attempt found out what it \
                         did: whether it was written is unknown (look it up before doing it again): {}",
                        f.message()
                    )
                } else {
                    format!("the group commit failed, nothing in it was written: {}", f.message())
                };
                return batch
                    .iter()
                    .map(|_| Err(CommitError::Group { path: shown.to_owned(), message: message.clone() }))
                    .collect();
            }
        }
    }
}

/// End the transaction `lost` ran (it lost its connection), so that what
/// it did is final: terminate its server process while it is still in that
/// transaction, and wait (at most [`SETTLE_WAIT`]) until it is not. A COMMIT
/// the server was applying completes first; one not yet received never
/// will be. Terminating needs the same role as the lost connection's (or
/// `pg_signal_backend`); with a pooler in between, a process that moved on
/// to another transaction is left alone (it finished this one). A process
/// whose transaction the server does not show (`track_activities` off for
/// it: no `xact_start`) while it is not idle cannot be told apart from the
/// lost attempt: the outcome is reported unknown, nothing is terminated.
async fn settle(pool: &Pool, lost: Attempt) -> R<()> {
    const OPEN: &str =
        "FROM pg_stat_activity WHERE pid = $1 AND (extract(epoch FROM xact_start) * 1000000)::BIGINT = $2";
    const UNTRACKED: &str = "SELECT 1 FROM pg_stat_activity
                             WHERE pid = $1 AND xact_start IS NULL AND state IS DISTINCT FROM 'idle'";
    let c = Conn::get(pool).await?;
    let end = c.prepare_cached(&format!("SELECT pg_terminate_backend(pid) {OPEN}")).await?;
    let open = c.prepare_cached(&format!("SELECT 1 {OPEN}")).await?;
    let untracked = c.prepare_cached(UNTRACKED).await?;
    let start = tokio::time::Instant::now();
    loop {
        // Each statement its own transaction: a fresh view of the processes.
        c.query(&end, &[&lost.pid, &lost.began]).await?;
        if c.query_opt(&open, &[&lost.pid, &lost.began]).await?.is_none() {
            if c.query_opt(&untracked, &[&lost.pid]).await?.is_some() {
                c.finish();
                return Err(Fail::Unsettled(format!(
                    "the server does not show the transaction of process {} (`track_activities` is off), so \
                     whether the attempt whose COMMIT got no answer is still open cannot be told",
                    lost.pid
                )));
            }
            c.finish();
            return Ok(());
        }
        if start.elapsed() >= SETTLE_WAIT {
            return Err(Fail::Unsettled(format!(
                "the server process {} of the attempt whose COMMIT got no answer was still in that transaction \
                 {} s after it was told to terminate",
                lost.pid,
                SETTLE_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One attempt at `batch`. With `retry`, an earlier attempt may have
/// committed: each write first looks for what it already wrote.
async fn try_group(db: &Db, batch: &[Job], retry: bool, attempts: &Attempts) -> R<Vec<R<Written>>> {
    let mut client = Conn::get(&db.pool).await?;
    // The common case, a group of steps that all succeed: one pipelined
    // transaction (every statement sent at once, one round trip for the
    // lot). If any fails, the transaction is rolled back and the group is
    // written again below, a savepoint each, so the failing one fails alone.
    // Steps whose Commands must find the state they read take the slow path (a check first).
    if !retry
        && batch.iter().all(
            |j| matches!(&j.write, Write::Step { step, changes, .. } if !super::write::needs_state(&step.borrow(), changes)),
        )
    {
        match steps_pipelined(&mut client, &db.setup, batch, attempts).await {
            Ok(seqs) => {
                client.finish();
                return Ok(seqs.into_iter().map(|seq| Ok(Written::Seq(seq))).collect());
            }
            Err(f) if f.retryable() || f.lost() => return Err(f),
            Err(_) => {}
        }
    }
    // Read committed whatever the role's default: the state check reads
    // after its advisory lock, under a snapshot taken then (repeatable read
    // would take it at the first statement, before the lock, and let two
    // hosts' new keys both pass).
    let mut tx =
        client.build_transaction().isolation_level(tokio_postgres::IsolationLevel::ReadCommitted).start().await?;
    let setup = tx.prepare_cached(&db.setup).await?;
    let local = local_clock(batch.first().map_or(0, |j| j.skew));
    attempts.record(attempt(&tx.query_one(&setup, &[&local]).await?));
    let mut results = Vec::with_capacity(batch.len());
    for job in batch {
        let sp = tx.savepoint("w").await?;
        match apply(&sp, job, retry).await {
            // A refused resolution or delivery wrote nothing; roll its savepoint back.
            Ok(w) if w.refused() => {
                sp.rollback().await?;
                results.push(Ok(w));
            }
            Ok(w) => {
                sp.commit().await?;
                results.push(Ok(w));
            }
            Err(f) if f.retryable() || f.lost() => return Err(f),
            Err(f) => {
                sp.rollback().await?;
                results.push(Err(f));
            }
        }
    }
    commit(tx, &attempts.unanswered).await?;
    client.finish();
    Ok(results)
}

/// COMMIT `tx`; if its answer is lost, say so in `unanswered`.
async fn commit(tx: Tx<'_>, unanswered: &AtomicBool) -> R<()> {
    // Until the answer comes (or the time runs out and this is dropped),
    // the COMMIT counts as sent and unanswered.
    let before = unanswered.swap(true, Ordering::AcqRel);
    match tx.commit().await {
        Ok(()) => {
            unanswered.store(before, Ordering::Release);
            Ok(())
        }
        Err(e) => {
            let f = Fail::from(e);
            if !f.lost() {
                // The server answered: it rolled back.
                unanswered.store(before, Ordering::Release);
            }
            Err(f)
        }
    }
}

type Tx<'a> = deadpool_postgres::Transaction<'a>;

const INSERT_RUN: &str =
    "INSERT INTO runs (run_id, agent, narrowing, started_at, restriction) VALUES ($1, $2, $3, $4, $5)
                          ON CONFLICT (run_id) DO NOTHING";
const INSERT_STEP: &str =
    "INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, ticket_id,
                        committed_at, structured, approved_by, approved_via, approved_at, write_key)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING seq";
const SET_STATE: &str = "INSERT INTO tool_state (agent, tool_id, key, value) VALUES ($1, $2, $3, $4)
                         ON CONFLICT (agent, tool_id, key) DO UPDATE SET value = excluded.value";
const REMOVE_STATE: &str = "DELETE FROM tool_state WHERE agent = $1 AND tool_id = $2 AND key = $3";

/// Every step of `batch` (all of them `Write::Step`) in one transaction,
/// their statements pipelined in order; the steps' sequence numbers.
async fn steps_pipelined(client: &mut Conn, setup: &str, batch: &[Job], attempts: &Attempts) -> R<Vec<i64>> {
    use futures_util::future::{BoxFuture, FutureExt, try_join, try_join_all};
    let tx = client.build_transaction().isolation_level(tokio_postgres::IsolationLevel::ReadCommitted).start().await?;
    let setup = tx.prepare_cached(setup).await?;
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
                &job.key,
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
    // First of all, where it runs, this host's clock offset and its
    // settings; the attempt is known as soon as this answers (a connection
    // lost before the COMMIT leaves it to be ended before the retry).
    let local = local_clock(batch.first().map_or(0, |j| j.skew));
    let local: [Param<'_>; 1] = [&local];
    let began = tx_ref.query_one(&setup, &local).map(|r| {
        if let Ok(row) = &r {
            attempts.record(attempt(row));
        }
        r
    });
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
    let (_, seqs) = try_join(began, try_join_all(statements)).await?;
    let seqs: Vec<i64> = seqs.into_iter().flatten().collect();
    commit(tx, &attempts.unanswered).await?;
    Ok(seqs)
}

/// An Awaiting record as the asking host made it, with that host's offset
/// from the server's clock (as its transaction's first statement measured
/// it), so its expiry is compared on the server's clock.
fn insert_awaiting_sql() -> String {
    format!(
        "INSERT INTO awaiting ({AWAITING_COLS}, clock_offset)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, $12, {})",
        offset()
    )
}

/// Apply `job`'s write inside the caller's transaction (a savepoint). With
/// `retry`, an earlier attempt of its group may have committed it: what it
/// wrote is looked up by its key first. A state check that fails looks too
/// (it may have waited for that attempt's COMMIT, whose own change then
/// made the state differ).
async fn apply(c: &Tx<'_>, job: &Job, retry: bool) -> R<Written> {
    let key = job.key.as_str();
    match &job.write {
        Write::Step { step, changes, awaiting, run } => {
            if retry && let Some(seq) = written_by(c, key).await? {
                return Ok(Written::Seq(seq));
            }
            if let Some(refused) = state_check(c, step, changes).await?.refusal() {
                if let Some(seq) = written_by(c, key).await? {
                    return Ok(Written::Seq(seq));
                }
                return Ok(refused);
            }
            if let Some(run) = run {
                insert_run(c, &step.run_id, run).await?;
            }
            write_step(c, step, changes, awaiting.as_ref(), key).await.map(Written::Seq)
        }
        Write::Run { run_id, run } => insert_run(c, run_id, run).await.map(|_| Written::Done),
        Write::Claim { ticket_id, now, holder } => claim(c, ticket_id, *now, holder, key).await.map(Written::Claim),
        Write::Heartbeat { holder, now } => heartbeat(c, holder, *now).await.map(|_| Written::Done),
        Write::Resolve { ticket_id, holder, step, changes, delivered } => {
            if retry && let Some(seq) = written_by(c, key).await? {
                return Ok(Written::Resolved(Ok(seq)));
            }
            if let Some(refused) = state_check(c, step, changes).await?.refusal() {
                if let Some(seq) = written_by(c, key).await? {
                    return Ok(Written::Resolved(Ok(seq)));
                }
                return Ok(refused);
            }
            resolve(c, ticket_id, holder, step, changes, *delivered, key).await.map(Written::Resolved)
        }
        Write::TakeOver { holder, now, lease_secs, only } => {
            take_over(c, holder, (*now, *lease_secs), only.as_deref(), key).await.map(Written::TakenOver)
        }
        Write::Deliver { ticket_id, step } => deliver(c, ticket_id, step, key).await.map(Written::Delivered),
    }
}

/// The step the write with `key` committed, if one did.
async fn written_by(c: &Tx<'_>, key: &str) -> R<Option<i64>> {
    let stmt = c.prepare_cached("SELECT seq FROM steps WHERE write_key = $1").await?;
    Ok(c.query_opt(&stmt, &[&key]).await?.map(|r| r.get(0)))
}

/// `step`'s Commands against its Tool's state as it is now (see
/// [`NewStep::state_read`] and [`NewStep::state_limit_kib`]). Writers of one
/// agent's Tool state take a lock on it (held to the end of the transaction)
/// before they look, so two hosts cannot both find the old state and both
/// write — nor both add a cache key that fits alone and not together.
async fn state_check(c: &Tx<'_>, step: &OwnedStep, changes: &[StateChange]) -> R<StateCheck> {
    if !super::write::needs_state(&step.borrow(), changes) {
        return Ok(StateCheck::Holds);
    }
    let lock = c.prepare_cached("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(1) || $2, 0))").await?;
    c.execute(&lock, &[&step.agent, &step.tool_id]).await?;
    let read = c.prepare_cached("SELECT key, value FROM tool_state WHERE agent = $1 AND tool_id = $2").await?;
    let current: BTreeMap<String, String> =
        c.query(&read, &[&step.agent, &step.tool_id]).await?.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok(super::write::check_state(&step.borrow(), changes, || current))
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
    key: &str,
) -> R<i64> {
    let seq = insert_step(c, step, step.ticket.as_deref().or(awaiting.map(|a| a.ticket_id.as_str())), key).await?;
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

async fn insert_step(c: &Tx<'_>, s: &OwnedStep, ticket: Option<&str>, key: &str) -> R<i64> {
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
                &key,
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

/// `holder` is alive: its heartbeat at `now` (its clock), on the server's clock.
async fn heartbeat(c: &Tx<'_>, holder: &str, now: i64) -> R<()> {
    let stmt = c
        .prepare_cached(&format!(
            "INSERT INTO hosts (instance_id, heartbeat_at) VALUES ($1, {})
             ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = GREATEST(hosts.heartbeat_at, excluded.heartbeat_at)",
            on_server_clock("$2")
        ))
        .await?;
    c.execute(&stmt, &[&holder, &now]).await?;
    Ok(())
}

/// pending → claimed by `holder`, if the ticket is pending and unexpired:
/// its expiry, on the asking host's clock, is translated to the claiming
/// host's clock by the difference of their offsets from the server's —
/// unless those agree within the measurement's second (the same host, or
/// hosts whose clocks are in step), then both are compared as read, so at
/// its expiry a ticket is expired, exactly as on the other journals.
/// Racing transactions wait on the row lock; all but one then find it claimed
/// — and a retry of this very claim (`key`) finds it its own.
async fn claim(
    c: &Tx<'_>,
    ticket_id: &str,
    now: i64,
    holder: &str,
    key: &str,
) -> R<Result<AwaitingRecord, TicketError>> {
    let stmt = c
        .prepare_cached(&format!(
            "WITH o AS (SELECT {} AS off)
             UPDATE awaiting SET state = 'claimed', claimed_at = $2::BIGINT + o.off, holder = $3, claim_key = $4
             FROM o
             WHERE ticket_id = $1 AND state = 'pending'
               AND expires_at > $2::BIGINT + CASE WHEN abs(COALESCE(clock_offset, 0) - o.off) <= 1 THEN 0
                                                  ELSE o.off - COALESCE(clock_offset, 0) END
             RETURNING {AWAITING_COLS}",
            offset()
        ))
        .await?;
    if let Some(row) = c.query_opt(&stmt, &[&ticket_id, &now, &holder, &key]).await? {
        heartbeat(c, holder, now).await?;
        return Ok(Ok(awaiting_from_row(&row)));
    }
    let stmt =
        c.prepare_cached(&format!("SELECT {AWAITING_COLS}, claim_key FROM awaiting WHERE ticket_id = $1")).await?;
    let row = c.query_opt(&stmt, &[&ticket_id]).await?;
    Ok(Err(match row.as_ref().map(|r| (awaiting_from_row(r), r.get::<_, Option<String>>(13))) {
        None => TicketError::Unknown(ticket_id.to_owned()),
        // An earlier attempt of this claim committed.
        Some((r, Some(k))) if r.state == "claimed" && k == key => return Ok(Ok(r)),
        Some((r, _)) if r.state != "pending" => TicketError::Used(ticket_id.to_owned()),
        Some(_) => TicketError::Expired(ticket_id.to_owned()),
    }))
}

/// The step resolving `ticket_id`, if `holder` still holds its claim
/// (exactly one row changes); otherwise nothing is written — unless an
/// earlier attempt of this resolution (`key`) committed it.
async fn resolve(
    c: &Tx<'_>,
    ticket_id: &str,
    holder: &str,
    step: &OwnedStep,
    changes: &[StateChange],
    delivered: bool,
    key: &str,
) -> R<Result<i64, TicketError>> {
    let stmt = c
        .prepare_cached(
            "UPDATE awaiting SET state = 'resolved', delivered = $3
             WHERE ticket_id = $1 AND state = 'claimed' AND holder = $2",
        )
        .await?;
    if c.execute(&stmt, &[&ticket_id, &holder, &delivered]).await? != 1 {
        if let Some(seq) = written_by(c, key).await? {
            return Ok(Ok(seq));
        }
        return Ok(Err(TicketError::Settled(ticket_id.to_owned())));
    }
    let seq = insert_step(c, step, Some(ticket_id), key).await?;
    apply_changes(c, &step.agent, &step.tool_id, changes).await?;
    Ok(Ok(seq))
}

/// Move to `holder` every claim (`only` that ticket's) whose holder's
/// heartbeat (or the claim itself, for a holder that never beat) is older
/// than the lease (`(now, lease_secs)`), on the server's clock. Claims
/// another host is taking over right now are skipped, not waited for. What
/// an earlier attempt of this take-over (`key`) moved is returned with the
/// rest.
async fn take_over(
    c: &Tx<'_>,
    holder: &str,
    (now, lease_secs): (i64, i64),
    only: Option<&str>,
    key: &str,
) -> R<Vec<AwaitingRecord>> {
    let at = on_server_clock("$2");
    let stmt = c
        .prepare_cached(&format!(
            "SELECT {AWAITING_COLS} FROM awaiting a
             WHERE a.state = 'claimed' AND (a.holder IS NULL OR a.holder <> $1)
               AND COALESCE((SELECT h.heartbeat_at FROM hosts h WHERE h.instance_id = a.holder), a.claimed_at, 0)
                   < {at} - $3::BIGINT
               AND ($4::TEXT IS NULL OR a.ticket_id = $4)
             ORDER BY a.ticket_id FOR UPDATE SKIP LOCKED"
        ))
        .await?;
    let stale: Vec<AwaitingRecord> =
        c.query(&stmt, &[&holder, &now, &lease_secs, &only]).await?.iter().map(awaiting_from_row).collect();
    let update = c
        .prepare_cached(&format!(
            "UPDATE awaiting SET holder = $2, claimed_at = {}, claim_key = $4 WHERE ticket_id = $1 AND state = 'claimed'",
            on_server_clock("$3")
        ))
        .await?;
    for r in &stale {
        c.execute(&update, &[&r.ticket_id, &holder, &now, &key]).await?;
    }
    if !stale.is_empty() {
        heartbeat(c, holder, now).await?;
    }
    let stmt = c
        .prepare_cached(&format!(
            "SELECT {AWAITING_COLS} FROM awaiting
             WHERE claim_key = $1 AND holder = $2 AND state = 'claimed' ORDER BY ticket_id"
        ))
        .await?;
    let taken: Vec<AwaitingRecord> = c.query(&stmt, &[&key, &holder]).await?.iter().map(awaiting_from_row).collect();
    // Hosts long gone and holding nothing need no row.
    let stmt = c
        .prepare_cached(&format!(
            "DELETE FROM hosts WHERE heartbeat_at < {at} - $2::BIGINT
             AND instance_id NOT IN (SELECT holder FROM awaiting WHERE state = 'claimed' AND holder IS NOT NULL)",
            at = on_server_clock("$1")
        ))
        .await?;
    c.execute(&stmt, &[&now, &lease_secs]).await?;
    Ok(taken)
}

/// A retry's step for a decided ticket, once (an earlier attempt of this
/// delivery, `key`, that committed counts as that once).
async fn deliver(c: &Tx<'_>, ticket_id: &str, step: &OwnedStep, key: &str) -> R<Option<i64>> {
    let stmt = c
        .prepare_cached(
            "UPDATE awaiting SET delivered = TRUE WHERE ticket_id = $1 AND state = 'resolved' AND NOT delivered",
        )
        .await?;
    if c.execute(&stmt, &[&ticket_id]).await? != 1 {
        return written_by(c, key).await;
    }
    insert_step(c, step, Some(ticket_id), key).await.map(Some)
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
        let fail = |message: String| CommitError::Postgres { store: self.shown.clone(), message };
        let (job, mut answer) = Job::new(write, self.skew);
        let place = job.place.clone();
        // The committers stopped before answering: the runtime running them
        // ended (the host is shutting down). Whether the write was taken
        // into a group says whether it may have been written.
        let stopped = |place: &AtomicU8| {
            fail(if place.load(Ordering::Acquire) == QUEUED {
                "the journal's committers stopped (the runtime that ran them ended) before this write was \
                 taken: it was not written"
                    .into()
            } else {
                "the journal's committers stopped (the runtime that ran them ended) while committing this \
                 write: its transaction was either committed or rolled back whole, and which is unknown here \
                 (look it up before doing it again)"
                    .into()
            })
        };
        self.jobs.send(job).map_err(|_| stopped(&place))?;
        match tokio::time::timeout(QUEUE_WAIT, &mut answer).await {
            Ok(Ok(r)) => return r,
            Ok(Err(_)) => return Err(stopped(&place)),
            Err(_) => {}
        }
        // Waited long: take it back unless a committer has it.
        if place.compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return Err(fail(format!(
                "this write waited {} s for a committer, every one busy with a group the server does not \
                 answer (or more writes than `[postgres] pool_size` serves): it was not written; try again",
                QUEUE_WAIT.as_secs()
            )));
        }
        // Its group commit is bounded ([`DEADLINE`]); this bound only
        // guards against a committer that never answers.
        let bound = self.db.deadline + Duration::from_secs(5);
        match tokio::time::timeout(bound, answer).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(stopped(&place)),
            Err(_) => Err(fail(format!(
                "no answer from the committer within {} s of taking this write: whether it was written is \
                 unknown (look it up before doing it again)",
                bound.as_secs_f64()
            ))),
        }
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
        only: Option<&str>,
    ) -> Result<Vec<ClaimedTicket>, CommitError> {
        // A cheap read first: almost always nothing is claimed.
        let any = self.query("SELECT 1 FROM awaiting WHERE state = 'claimed' LIMIT 1", &[]).await?;
        if any.is_empty() {
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

    async fn skill_activations(&self, run_id: &str) -> Result<Vec<(String, Option<String>)>, CommitError> {
        // The captured text only of the steps that journaled a list.
        let rows = self
            .query(
                "SELECT tool_id, CASE WHEN strpos(captured, '\"narrowed_to\"') > 0 THEN captured END FROM steps \
                 WHERE run_id = $1 AND outcome = 'output' ORDER BY seq",
                &[&run_id],
            )
            .await?;
        let mut out: Vec<(String, Option<String>)> = Vec::new();
        for row in &rows {
            let captured: Option<String> = row.get(1);
            let activation = (row.get(0), captured.as_deref().and_then(super::narrowed_to));
            if !out.contains(&activation) {
                out.push(activation);
            }
        }
        Ok(out)
    }

    async fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError> {
        let rows = self
            .query("SELECT key, value FROM tool_state WHERE agent = $1 AND tool_id = $2", &[&agent, &tool_id])
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        self.all_steps(run_id).await
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

/// Against the PostgreSQL server `TOOLGATE_TEST_PG` names (`scripts/test`
/// starts one); skipped, saying so, without it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Verdict;
    use std::time::Instant;

    /// A journal on a new database, with what drops the database.
    async fn journal(options: &str) -> Option<(PostgresJournal, String, Box<dyn std::any::Any>)> {
        let Some((locator, keep)) = toolgate_tests::conformance::Postgres::fresh_database().await else {
            eprintln!("skipped: set TOOLGATE_TEST_PG (scripts/test does)");
            return None;
        };
        let dsn = format!("{locator} {options}");
        let j = PostgresJournal::connect(&dsn, None, 2, None).await.unwrap();
        Some((j, dsn, Box::new(keep)))
    }

    fn step<'a>(call_id: &'a str, outcome: OutcomeKind) -> NewStep<'a> {
        NewStep {
            run_id: "run-1",
            agent: "main",
            call_id,
            tool_id: "notes.add",
            arguments: "{}",
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

    fn awaiting(ticket: &str, call_id: &str, expires_at: i64) -> AwaitingRecord {
        AwaitingRecord {
            ticket_id: ticket.into(),
            run_id: "run-1".into(),
            agent: "main".into(),
            call_id: call_id.into(),
            tool_id: "notes.add".into(),
            arguments: "{}".into(),
            argument_digest: "d".repeat(64),
            component_digest: Digest::of(b"component"),
            expires_at,
            requested_at: now(),
            state: "pending".into(),
            restriction: None,
            approvers: None,
        }
    }

    fn set(key: &str, value: &str) -> StateChange {
        StateChange { key: key.into(), value: Some(value.into()) }
    }

    /// A job as the committer takes it (its caller's answer unread).
    fn job(write: Write) -> Job {
        let (job, _answer) = Job::new(write, 0);
        job.place.store(TAKEN, Ordering::Release);
        job
    }

    /// A host whose clock runs an hour ahead (its `now` and its clock agree,
    /// as the runtime's do) neither takes over a claim whose holder beats
    /// nor finds a live ticket of another host expired; a claim whose holder
    /// stopped beating is still taken over.
    /// The size limit holds against the state at commit, not the call's
    /// read, under the lock of the Tool's state (concurrent commits on the
    /// pool's connections).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cache_keys_of_calls_from_one_read_cannot_together_pass_the_limit() {
        let Some((j, _dsn, _keep)) = journal("").await else { return };
        super::super::write::tests::cache_keys_of_calls_from_one_read_cannot_together_pass_the_limit(Arc::new(j)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_whose_clock_runs_ahead_takes_over_no_live_claim() {
        let Some((b, dsn, _keep)) = journal("").await else { return };
        let a = PostgresJournal::connect(&dsn, None, 2, None).await.unwrap().skewed(3600);
        let ahead = || now() + 3600;
        for (t, c) in [("t1", "c1"), ("t2", "c2")] {
            b.commit_step(&step(c, OutcomeKind::Awaiting), &[], Some(&awaiting(t, c, now() + 600))).await.unwrap();
        }
        b.claim_ticket("t1", now(), "host-b").await.unwrap().expect("b claims its ticket");
        b.heartbeat("host-b", now()).await.unwrap();
        let taken = a.take_over_stale_claims("host-a", ahead(), 60, None).await.unwrap();
        assert!(taken.is_empty(), "a live claim taken over by a host whose clock is ahead");
        let claimed = a.claim_ticket("t2", ahead(), "host-a").await.unwrap();
        assert!(claimed.is_ok(), "a ticket with ten minutes left is not expired: {claimed:?}");
        // b stops beating: past a (short) lease, on the server's clock, its claim is taken over.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let taken = a.take_over_stale_claims("host-a", ahead(), 1, None).await.unwrap();
        assert_eq!(taken.iter().map(|t| t.ticket_id().to_owned()).collect::<Vec<_>>(), ["t1"]);
    }

    /// A group whose COMMIT's answer was lost is committed again by the
    /// committer: the second attempt finds what the first wrote — one set of
    /// steps, the ask reported raised, the claim, resolution and delivery
    /// reported as the first attempt made them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_committed_again_after_a_lost_answer_writes_once() {
        let Some((j, _dsn, _keep)) = journal("").await else { return };
        let seqs = |r: Vec<Result<Written, CommitError>>| -> Vec<i64> {
            r.into_iter()
                .map(|w| match w {
                    Ok(Written::Seq(s)) => s,
                    Err(e) => panic!("{e}"),
                    Ok(_) => panic!("not a step"),
                })
                .collect()
        };
        // Steps (one of them an ask), as the pipelined path writes them.
        let batch = [
            job(Write::Step {
                step: OwnedStep::of(&step("c1", OutcomeKind::Output)),
                changes: vec![set("n", "1")],
                awaiting: None,
                run: None,
            }),
            job(Write::Step {
                step: OwnedStep::of(&step("c2", OutcomeKind::Awaiting)),
                changes: vec![],
                awaiting: Some(awaiting("t", "c2", now() + 600)),
                run: None,
            }),
        ];
        let first = seqs(commit_group(&j.db, &batch, &j.shown).await);
        let again = seqs(commit_group(&j.db, &batch, &j.shown).await);
        assert_eq!(first, again, "the retry reports the steps the first attempt wrote");
        // A step that checks the state it read (the slow path): its own change does not make it stale.
        let read = BTreeMap::from([("n".to_owned(), "1".to_owned())]);
        let mut checked = OwnedStep::of(&step("c3", OutcomeKind::Output));
        checked.state_read = Some(read.clone());
        let batch = [job(Write::Step { step: checked, changes: vec![set("n", "2")], awaiting: None, run: None })];
        let first = seqs(commit_group(&j.db, &batch, &j.shown).await);
        assert_eq!(first, seqs(commit_group(&j.db, &batch, &j.shown).await));
        assert_eq!(j.steps(None).await.unwrap().len(), 3, "one set of steps");
        assert_eq!(j.pending().await.unwrap().len(), 1);

        // Claim, resolve and deliver, each committed twice.
        let claim = [job(Write::Claim { ticket_id: "t".into(), now: now(), holder: "h".into() })];
        for attempt in 0..2 {
            match commit_group(&j.db, &claim, &j.shown).await.pop() {
                Some(Ok(Written::Claim(Ok(r)))) => assert_eq!(r.ticket_id, "t"),
                Some(Ok(Written::Claim(Err(e)))) => panic!("attempt {attempt}: the claim refused: {e:?}"),
                _ => panic!("attempt {attempt}: not a claim"),
            }
        }
        let mut resolving = OwnedStep::of(&step("c2", OutcomeKind::Output));
        resolving.state_read = Some(BTreeMap::from([("n".to_owned(), "2".to_owned())]));
        let resolve = [job(Write::Resolve {
            ticket_id: "t".into(),
            holder: "h".into(),
            step: resolving,
            changes: vec![set("n", "3")],
            delivered: false,
        })];
        let mut resolved = Vec::new();
        for attempt in 0..2 {
            match commit_group(&j.db, &resolve, &j.shown).await.pop() {
                Some(Ok(Written::Resolved(Ok(seq)))) => resolved.push(seq),
                Some(Ok(Written::Resolved(Err(e)))) => panic!("attempt {attempt}: refused: {e:?}"),
                Some(Ok(Written::StateChanged)) => panic!("attempt {attempt}: found its own change stale"),
                _ => panic!("attempt {attempt}: not a resolution"),
            }
        }
        assert_eq!(resolved[0], resolved[1]);
        let deliver =
            [job(Write::Deliver { ticket_id: "t".into(), step: OwnedStep::of(&step("c9", OutcomeKind::Output)) })];
        let mut delivered = Vec::new();
        for _ in 0..2 {
            match commit_group(&j.db, &deliver, &j.shown).await.pop() {
                Some(Ok(Written::Delivered(d))) => delivered.push(d),
                _ => panic!("not a delivery"),
            }
        }
        assert!(delivered[0].is_some() && delivered[0] == delivered[1], "{delivered:?}");
        assert_eq!(j.steps(None).await.unwrap().len(), 5, "one resolution, one delivery");
        assert_eq!(j.tool_state("main", "notes.add").await.unwrap()["n"], "3");
        // Another delivery (another write) finds it delivered.
        let other =
            [job(Write::Deliver { ticket_id: "t".into(), step: OwnedStep::of(&step("c10", OutcomeKind::Output)) })];
        assert!(matches!(commit_group(&j.db, &other, &j.shown).await.pop(), Some(Ok(Written::Delivered(None)))));
    }

    /// Dropping the journal does not cut off the writes queued: a caller
    /// that stopped waiting (its task cancelled) still has its write committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropping_the_journal_commits_what_is_queued() {
        let Some((j, dsn, _keep)) = journal("").await else { return };
        let calls: Vec<String> = (0..40).map(|i| format!("c{i}")).collect();
        for c in &calls {
            // Queued, then the caller is gone.
            let _ = tokio::time::timeout(Duration::ZERO, j.commit_step(&step(c, OutcomeKind::Output), &[], None)).await;
        }
        drop(j);
        let reader = PostgresJournal::connect(&dsn, None, 2, None).await.unwrap();
        let start = Instant::now();
        loop {
            let n = reader.steps(None).await.unwrap().len();
            if n == calls.len() {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "{n} of {} queued writes committed", calls.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A write whose committers stopped — the runtime that ran them ended
    /// (a host shutting down) — is answered saying so, and whether it can
    /// have been written; never told it was.
    #[test]
    fn a_write_whose_committers_stopped_is_told_what_became_of_it() {
        let callers = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let Some((locator, _keep)) = callers.block_on(toolgate_tests::conformance::Postgres::fresh_database()) else {
            eprintln!("skipped: set TOOLGATE_TEST_PG (scripts/test does)");
            return;
        };
        let committers = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let j = Arc::new(committers.block_on(PostgresJournal::connect(&locator, None, 2, None)).unwrap());
        let calls: Vec<_> = (0..8)
            .map(|i| {
                let j = j.clone();
                callers.spawn(async move {
                    j.commit_step(&step(&format!("c{i}"), OutcomeKind::Output), &[], None).await.map(|_| ())
                })
            })
            .collect();
        committers.shutdown_background();
        let mut refused = 0;
        for call in calls {
            if let Err(e) = callers.block_on(call).unwrap() {
                refused += 1;
                let e = e.to_string();
                // Never told it was written. (A committer the stopping
                // runtime had not yet dropped holds its queue: the write
                // then waits out the queue's bound, also "not written".)
                assert!(
                    (e.contains("committers stopped") || e.contains("for a committer"))
                        && (e.contains("it was not written") || e.contains("which is unknown")),
                    "{e}"
                );
            }
        }
        assert!(refused > 0, "the committers stopped before answering any of them");
    }

    /// Every connection bounds its waits: a host stalled mid-transaction
    /// holding a lock fails another's commit within `lock_timeout` (here
    /// set by the connection string's `options`, which wins), naming the
    /// setting; the defaults are set otherwise; and waiting for a pooled
    /// connection ends, naming `pool_size`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_host_or_a_busy_pool_fails_a_commit_in_bounded_time() {
        let Some((j, dsn, _keep)) = journal("options='-c lock_timeout=2s'").await else { return };
        let settings = j
            .query(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
                        current_setting('idle_in_transaction_session_timeout')",
                &[],
            )
            .await
            .unwrap();
        let got: (String, String, String) = (settings[0].get(0), settings[0].get(1), settings[0].get(2));
        assert_eq!(got, ("2s".into(), "30s".into(), "30s".into()));
        // Another host, stalled while holding the lock of notes.add's state.
        let (stalled, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        stalled
            .batch_execute("BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('main' || chr(1) || 'notes.add', 0))")
            .await
            .unwrap();
        let mut s = step("c1", OutcomeKind::Output);
        let read = BTreeMap::new();
        s.state_read = Some(&read);
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(20), j.commit_step(&s, &[set("n", "1")], None))
            .await
            .expect("the commit waits for the stalled host's lock without end");
        let e = r.expect_err("the lock is held").to_string();
        assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
        assert!(e.contains("lock_timeout") && e.contains("options"), "{e}");
        stalled.batch_execute("ROLLBACK").await.unwrap();
        j.commit_step(&s, &[set("n", "1")], None).await.expect("once released it commits");

        // Every pooled connection busy: a read gives up.
        let held = (j.db.pool.get().await.unwrap(), j.db.pool.get().await.unwrap());
        let start = Instant::now();
        let e = tokio::time::timeout(Duration::from_secs(30), j.steps(None))
            .await
            .expect("waiting for a pooled connection without end")
            .expect_err("no connection is free")
            .to_string();
        assert!(start.elapsed() >= POOL_WAIT && e.contains("pool_size"), "{e}");
        drop(held);
        let (default, _dsn, _keep) = journal("").await.unwrap();
        let r = default.query("SELECT current_setting('lock_timeout')", &[]).await.unwrap();
        assert_eq!(r[0].get::<_, String>(0), "10s");
    }

    /// The server's socket (`TOOLGATE_TEST_PG` names a unix socket
    /// directory and port) and a database's name in its locator.
    fn socket_and_db(locator: &str) -> (String, String) {
        let field =
            |k: &str| locator.split_whitespace().rev().find_map(|f| f.strip_prefix(k)).map(str::to_owned).unwrap();
        (format!("{}/.s.PGSQL.{}", field("host="), field("port=")), field("dbname="))
    }

    /// A TCP proxy to `socket` refusing, as PgBouncer before 1.20 does, a
    /// startup message carrying `options`; its port.
    async fn pooler_refusing_options(socket: String) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let socket = socket.clone();
                tokio::spawn(async move {
                    loop {
                        let Ok(len) = client.read_u32().await else { return };
                        let mut body = vec![0; len as usize - 4];
                        client.read_exact(&mut body).await.unwrap();
                        if body[..4] == 80877103u32.to_be_bytes() {
                            client.write_all(b"N").await.unwrap(); // no TLS here
                            continue;
                        }
                        if body[4..].split(|b| *b == 0).step_by(2).any(|k| k == b"options") {
                            let m = b"SFATAL\0C08P01\0Munsupported startup parameter: options\0\0";
                            let mut out = vec![b'E'];
                            out.extend_from_slice(&(m.len() as u32 + 4).to_be_bytes());
                            out.extend_from_slice(m);
                            client.write_all(&out).await.unwrap();
                            return;
                        }
                        let mut server = tokio::net::UnixStream::connect(&socket).await.unwrap();
                        server.write_all(&len.to_be_bytes()).await.unwrap();
                        server.write_all(&body).await.unwrap();
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                });
            }
        });
        port
    }

    /// What [`black_hole`]'s proxy does with what it reads.
    const FORWARD: u8 = 0;
    /// Forwards nothing either way, discards all it reads, keeps both
    /// sockets open: a server that hangs while its TCP stack answers.
    const SWALLOW: u8 = 1;
    /// Forwards the client's messages; once a connection sent a COMMIT,
    /// forwards none of the server's answers on it: a COMMIT applied and
    /// its answer lost.
    const SWALLOW_ANSWERS_AFTER_COMMIT: u8 = 2;

    /// A TCP proxy on 127.0.0.1 to `socket`, doing what its mode says
    /// ([`FORWARD`] at first); its port and its mode.
    async fn black_hole(socket: String) -> (u16, Arc<AtomicU8>) {
        use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
        /// Copy `from` to `to` while `pass` says so, discarding otherwise;
        /// until either side closes.
        async fn pump(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin, pass: impl Fn(&[u8]) -> bool) {
            let mut buf = vec![0; 64 * 1024];
            loop {
                let n = match from.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if pass(&buf[..n]) && to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(FORWARD));
        let modes = mode.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::UnixStream::connect(&socket).await else { return };
                let (mode, deaf) = (modes.clone(), Arc::new(AtomicBool::new(false)));
                tokio::spawn(async move {
                    let ((client_in, client_out), (server_in, server_out)) = (client.into_split(), server.into_split());
                    let up = pump(client_in, server_out, |bytes| match mode.load(Ordering::Acquire) {
                        FORWARD => true,
                        SWALLOW_ANSWERS_AFTER_COMMIT => {
                            if bytes.windows(7).any(|w| w == b"COMMIT\0") {
                                deaf.store(true, Ordering::Release);
                            }
                            true
                        }
                        _ => false,
                    });
                    let down = pump(server_in, client_out, |_| {
                        mode.load(Ordering::Acquire) != SWALLOW && !deaf.load(Ordering::Acquire)
                    });
                    // Both end when either side closes.
                    futures_util::future::select(Box::pin(up), Box::pin(down)).await;
                });
            }
        });
        (port, mode)
    }

    /// A server that hangs while its TCP stack still answers (here a proxy
    /// that black-holes the stream: keepalives are answered, no statement
    /// ever is) fails a read, a listing and a write within the journal's
    /// limit for one operation, naming it, instead of hanging the call; a
    /// write whose COMMIT was applied but whose answer never came is
    /// reported unknown, never failed; and once the server answers again
    /// the journal works on fresh connections.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_hangs_with_its_tcp_up_fails_each_operation_within_the_limit() {
        let Some((locator, _keep)) = toolgate_tests::conformance::Postgres::fresh_database().await else {
            eprintln!("skipped: set TOOLGATE_TEST_PG (scripts/test does)");
            return;
        };
        let (socket, db) = socket_and_db(&locator);
        let (port, mode) = black_hole(socket).await;
        let dsn = format!("host=127.0.0.1 port={port} user=postgres dbname={db} sslmode=disable");
        let limit = Duration::from_secs(2);
        let j = PostgresJournal::open(&dsn, None, 2, None, limit).await.unwrap();
        j.commit_step(&step("c1", OutcomeKind::Output), &[set("n", "1")], None).await.unwrap();
        // Fails within the limit (with some slack), naming it: never hangs.
        async fn fails_in_time<T: std::fmt::Debug>(
            limit: Duration,
            op: impl Future<Output = Result<T, CommitError>>,
        ) -> String {
            let start = Instant::now();
            let r = tokio::time::timeout(limit * 10, op).await.expect("hangs on a server that does not answer");
            let e = r.expect_err("the server answers nothing").to_string();
            assert!(start.elapsed() >= limit && start.elapsed() < limit * 3, "{:?}: {e}", start.elapsed());
            assert!(e.contains("within 2 s") && e.contains("journal's limit") && e.contains("check the server"), "{e}");
            e
        }

        mode.store(SWALLOW, Ordering::Release);
        fails_in_time(limit, j.tool_state("main", "notes.add")).await;
        fails_in_time(limit, j.steps(None)).await;
        fails_in_time(limit, j.awaiting("t")).await;
        let e = fails_in_time(limit, j.commit_step(&step("c2", OutcomeKind::Output), &[], None)).await;
        assert!(e.contains("nothing in it was written"), "its COMMIT was never sent: {e}");

        mode.store(FORWARD, Ordering::Release);
        let state = j.tool_state("main", "notes.add").await.expect("a fresh connection answers");
        assert_eq!(state.get("n").map(String::as_str), Some("1"));

        mode.store(SWALLOW_ANSWERS_AFTER_COMMIT, Ordering::Release);
        let e = fails_in_time(limit, j.commit_step(&step("c3", OutcomeKind::Output), &[set("n", "3")], None)).await;
        assert!(e.contains("unknown") && !e.contains("nothing in it was written"), "its COMMIT was sent: {e}");

        mode.store(FORWARD, Ordering::Release);
        let calls: Vec<String> = j.steps(None).await.expect("answers again").into_iter().map(|s| s.call_id).collect();
        assert_eq!(calls, ["c1", "c3"], "the write reported unknown was committed; the failed one was not");
        assert_eq!(j.tool_state("main", "notes.add").await.unwrap().get("n").map(String::as_str), Some("3"));
        j.commit_step(&step("c4", OutcomeKind::Output), &[], None).await.expect("commits again");
    }

    /// No startup `options` are sent (a pooler refusing them is connected
    /// through), the limits are set per transaction (nothing outlives it),
    /// and a limit set for the database (as a DBA's `ALTER ROLE … SET`)
    /// wins over toolgate's default.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pooler_refusing_startup_options_connects_and_the_databases_settings_win() {
        let Some((locator, _keep)) = toolgate_tests::conformance::Postgres::fresh_database().await else {
            eprintln!("skipped: set TOOLGATE_TEST_PG (scripts/test does)");
            return;
        };
        let (socket, db) = socket_and_db(&locator);
        let (admin, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        admin.batch_execute(&format!("ALTER DATABASE {db} SET lock_timeout = '3s'")).await.unwrap();
        let port = pooler_refusing_options(socket).await;
        let dsn = format!("host=127.0.0.1 port={port} user=postgres dbname={db} sslmode=disable");
        let j = PostgresJournal::connect(&dsn, None, 2, None).await.expect("connects through the pooler");
        j.commit_step(&step("c1", OutcomeKind::Output), &[], None).await.unwrap();
        let r = j
            .query(
                "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'),
                        current_setting('idle_in_transaction_session_timeout')",
                &[],
            )
            .await
            .unwrap();
        let got: (String, String, String) = (r[0].get(0), r[0].get(1), r[0].get(2));
        assert_eq!(got, ("3s".into(), "30s".into(), "30s".into()));
        // Outside a toolgate transaction the session has the server's values.
        let c = j.db.pool.get().await.unwrap();
        let r = c.query_one("SELECT current_setting('statement_timeout')", &[]).await.unwrap();
        assert_eq!(r.get::<_, String>(0), "0");
    }

    /// A group retried after its COMMIT got no answer first ends the lost
    /// attempt's transaction, still open on the server holding its locks
    /// (a partitioned connection; a COMMIT in flight): the take-over does
    /// not skip the claim that attempt locked, nor does the step wait for
    /// its key; and the lost attempt can no longer commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_ends_the_lost_attempt_before_looking_for_its_writes() {
        let Some((j, dsn, _keep)) = journal("").await else { return };
        j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t1", "c1", now() + 600))).await.unwrap();
        // host-b claimed it long ago and stopped beating.
        j.claim_ticket("t1", now() - 1000, "host-b").await.unwrap().expect("claimed");
        let batch = [
            job(Write::TakeOver { holder: "host-a".into(), now: now(), lease_secs: 60, only: None }),
            job(Write::Step {
                step: OwnedStep::of(&step("c2", OutcomeKind::Output)),
                changes: vec![],
                awaiting: None,
                run: None,
            }),
        ];
        // The lost attempt: both written, not committed, its connection alive.
        let other = PostgresJournal::connect(&dsn, None, 2, None).await.unwrap();
        let mut c = other.db.pool.get().await.unwrap();
        let tx = c.transaction().await.unwrap();
        let lost = attempt(&tx.query_one(&other.db.setup.to_string(), &[&local_clock(0)]).await.unwrap());
        for job in &batch {
            apply(&tx, job, false).await.unwrap();
        }
        let attempts = Attempts::default();
        attempts.unanswered.store(true, Ordering::Release);
        attempts.record(lost);
        let start = Instant::now();
        let mut results = commit_group_after(&j.db, &batch, &j.shown, attempts, true).await;
        assert!(start.elapsed() < Duration::from_secs(8), "waited out the lost attempt's locks");
        assert!(matches!(results.pop(), Some(Ok(Written::Seq(_)))));
        match results.pop() {
            Some(Ok(Written::TakenOver(t))) => {
                assert_eq!(t.iter().map(|r| r.ticket_id.as_str()).collect::<Vec<_>>(), ["t1"])
            }
            Some(Err(e)) => panic!("{e}"),
            _ => panic!("not a take-over"),
        }
        assert!(tx.commit().await.is_err(), "the lost attempt was ended");
        assert_eq!(j.steps(None).await.unwrap().len(), 2);
    }

    /// A migration waits only briefly for a table another transaction holds
    /// (other hosts' reads queue behind it meanwhile), and tries again; an
    /// index whose concurrent build was interrupted (left invalid) is built
    /// again at the next start.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_migration_blocks_no_reader_long_and_an_interrupted_index_is_rebuilt() {
        let Some((locator, _keep)) = toolgate_tests::conformance::Postgres::fresh_database().await else {
            eprintln!("skipped: set TOOLGATE_TEST_PG (scripts/test does)");
            return;
        };
        let connect = || async {
            let (c, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            c
        };
        let admin = connect().await;
        admin
            .batch_execute(&format!(
                "{} CREATE TABLE toolgate_schema (version BIGINT NOT NULL); INSERT INTO toolgate_schema VALUES (4);",
                schema_at(4)
            ))
            .await
            .unwrap();
        // A long read of steps, then a host starting (migrating to V5).
        let long = connect().await;
        long.batch_execute("BEGIN; SELECT count(*) FROM steps").await.unwrap();
        let starting = tokio::spawn({
            let locator = locator.clone();
            async move { PostgresJournal::connect(&locator, None, 2, None).await.map(|_| ()) }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let reader = connect().await;
        let start = Instant::now();
        reader.query_one("SELECT count(*) FROM steps", &[]).await.unwrap();
        let waited = start.elapsed();
        tokio::time::sleep(Duration::from_secs(6).saturating_sub(waited)).await;
        long.batch_execute("COMMIT").await.unwrap();
        starting.await.unwrap().expect("migrates once the long read ended");
        assert!(waited < Duration::from_secs(4), "a reader waited {waited:?} behind the migration");

        // An interrupted build: duplicate keys leave the index invalid.
        admin
            .batch_execute(
                "DROP INDEX steps_write_key;
                 INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured,
                                    committed_at, write_key)
                 SELECT 'r', 'c' || i, 't', '{}', 'allow', 'output', '', '{}', 0, 'k' FROM generate_series(1, 2) i",
            )
            .await
            .unwrap();
        let e = admin.batch_execute("CREATE UNIQUE INDEX CONCURRENTLY steps_write_key ON steps (write_key)").await;
        assert!(e.is_err());
        admin.batch_execute("DELETE FROM steps WHERE call_id = 'c2'").await.unwrap();
        PostgresJournal::connect(&locator, None, 2, None).await.unwrap();
        let valid = admin.query_one(INDEX_VALID, &[&"steps_write_key"]).await.unwrap();
        assert!(valid.get::<_, bool>(0), "the interrupted index is rebuilt");
    }

    /// A listing longer than a page is read whole, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_journal_is_listed_a_page_at_a_time() {
        let Some((j, dsn, _keep)) = journal("").await else { return };
        let (c, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        c.batch_execute(&format!(
            "INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured, committed_at)
             SELECT CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END, 'c' || i, 't', '{{}}', 'allow', 'output', '',
                    '{{}}', 0 FROM generate_series(1, {}) i",
            2 * PAGE + 3
        ))
        .await
        .unwrap();
        let all = j.steps(None).await.unwrap();
        assert_eq!(all.len() as i64, 2 * PAGE + 3);
        assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(j.steps(Some("odd")).await.unwrap().len() as i64, PAGE + 2);
    }

    /// A ticket is expired at its expiry for the host that asked, even when
    /// the ask's statements ran most of a second after it read its clock
    /// (they waited for a lock): its offset and the claim's are measured
    /// alike, and the same clock's readings are compared as they are.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_its_expiry_a_ticket_is_expired_however_late_the_ask_ran() {
        let Some((j, dsn, _keep)) = journal("").await else { return };
        let expiry = now() + 600;
        let batch = [job(Write::Step {
            step: OwnedStep::of(&step("c1", OutcomeKind::Awaiting)),
            changes: vec![],
            awaiting: Some(awaiting("t", "c1", expiry)),
            run: None,
        })];
        // Another transaction holds the step's key for 0.7 s.
        let (raw, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        raw.batch_execute(&format!(
            "BEGIN; INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured,
                                      committed_at, write_key)
             VALUES ('r', 'x', 't', '{{}}', 'allow', 'output', '', '{{}}', 0, '{}')",
            batch[0].key
        ))
        .await
        .unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            raw.batch_execute("ROLLBACK").await.unwrap();
        });
        let r = commit_group(&j.db, &batch, &j.shown).await;
        assert!(matches!(r[0], Ok(Written::Seq(_))), "{:?}", r[0].as_ref().err());
        release.await.unwrap();
        let at = j.claim_ticket("t", expiry, "h").await.unwrap();
        assert!(matches!(at, Err(TicketError::Expired(_))), "claimed at its expiry: {at:?}");
        assert!(j.claim_ticket("t", expiry - 1, "h").await.unwrap().is_ok());
    }

    /// A ticket is expired at its expiry for the host that asked even when
    /// the ask waited seconds for a lock (within `lock_timeout`): its clock
    /// offset is measured by the transaction's first statement, which never
    /// waits, not by the insert that waited.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ticket_is_expired_at_its_expiry_after_its_ask_waited_seconds_for_a_lock() {
        let Some((j, dsn, _keep)) = journal("").await else { return };
        let expiry = now() + 600;
        let batch = [job(Write::Step {
            step: OwnedStep::of(&step("c1", OutcomeKind::Awaiting)),
            changes: vec![],
            awaiting: Some(awaiting("t", "c1", expiry)),
            run: None,
        })];
        let (raw, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        raw.batch_execute(&format!(
            "BEGIN; INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured,
                                      committed_at, write_key)
             VALUES ('r', 'x', 't', '{{}}', 'allow', 'output', '', '{{}}', 0, '{}')",
            batch[0].key
        ))
        .await
        .unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(2600)).await;
            raw.batch_execute("ROLLBACK").await.unwrap();
        });
        let r = commit_group(&j.db, &batch, &j.shown).await;
        assert!(matches!(r[0], Ok(Written::Seq(_))), "{:?}", r[0].as_ref().err());
        release.await.unwrap();
        let offset: Option<i64> =
            j.query("SELECT clock_offset FROM awaiting WHERE ticket_id = 't'", &[]).await.unwrap()[0].get(0);
        assert_eq!(offset, Some(0), "the lock's wait counted as clock skew");
        for late in [0, 1] {
            let at = j.claim_ticket("t", expiry + late, "h").await.unwrap();
            assert!(matches!(at, Err(TicketError::Expired(_))), "claimed {late} s after its expiry: {at:?}");
        }
        assert!(j.claim_ticket("t", expiry - 1, "h").await.unwrap().is_ok());
    }

    #[test]
    fn only_whole_setting_names_in_the_options_count() {
        for (options, named) in [
            ("-c lock_timeout=5s", true),
            ("-clock_timeout=5s", true),
            ("--lock-timeout=5s", true),
            ("-c Lock_Timeout=5s -c work_mem=4MB", true),
            ("-c deadlock_timeout=2s", false),
            ("--deadlock_timeout=2s", false),
            ("-c application_name=lock_timeout=1", false),
            ("", false),
        ] {
            assert_eq!(named_in_options(options, "lock_timeout"), named, "{options}");
        }
    }

    /// A limit set to 0 for the database (turned off on purpose) is kept,
    /// and an option naming a setting whose name contains one of toolgate's
    /// (`deadlock_timeout`) leaves toolgate's own in place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_limit_turned_off_for_the_database_stays_off_and_only_whole_names_in_options_count() {
        let Some((locator, _keep)) = toolgate_tests::conformance::Postgres::fresh_database().await else {
            eprintln!("skipped: set TOOLGATE_TEST_PG (scripts/test does)");
            return;
        };
        let (_, db) = socket_and_db(&locator);
        let (admin, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        admin.batch_execute(&format!("ALTER DATABASE {db} SET statement_timeout = 0")).await.unwrap();
        let dsn = format!("{locator} options='-c deadlock_timeout=2s'");
        let j = PostgresJournal::connect(&dsn, None, 2, None).await.unwrap();
        let r =
            j.query("SELECT current_setting('statement_timeout'), current_setting('lock_timeout')", &[]).await.unwrap();
        let got: (String, String) = (r[0].get(0), r[0].get(1));
        assert_eq!(got, ("0".into(), "10s".into()));
    }

    /// With `track_activities` off for the lost attempt's process, the
    /// server does not show its transaction: the retry reports the outcome
    /// unknown instead of taking the process for settled (and skipping the
    /// claim the lost attempt still locks).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_attempt_the_server_does_not_track_is_not_taken_for_settled() {
        let Some((j, dsn, _keep)) = journal("").await else { return };
        j.commit_step(&step("c1", OutcomeKind::Awaiting), &[], Some(&awaiting("t1", "c1", now() + 600))).await.unwrap();
        j.claim_ticket("t1", now() - 1000, "host-b").await.unwrap().expect("claimed");
        let batch = [job(Write::TakeOver { holder: "host-a".into(), now: now(), lease_secs: 60, only: None })];
        let other = PostgresJournal::connect(&dsn, None, 2, None).await.unwrap();
        let mut c = other.db.pool.get().await.unwrap();
        c.batch_execute("SET track_activities = off").await.unwrap();
        let tx = c.transaction().await.unwrap();
        let lost = attempt(&tx.query_one(&other.db.setup.to_string(), &[&local_clock(0)]).await.unwrap());
        apply(&tx, &batch[0], false).await.unwrap();
        let attempts = Attempts::default();
        attempts.unanswered.store(true, Ordering::Release);
        attempts.record(lost);
        let results = commit_group_after(&j.db, &batch, &j.shown, attempts, true).await;
        match &results[0] {
            Err(e) => assert!(e.to_string().contains("track_activities"), "{e}"),
            Ok(w) => panic!(
                "settled a transaction the server does not show: {:?}",
                matches!(w, Written::TakenOver(t) if t.is_empty())
            ),
        }
        tx.rollback().await.unwrap();
    }

    /// A schema at V4 with rows, and what connects to its database as the
    /// superuser without toolgate.
    async fn at_v4() -> Option<(String, tokio_postgres::Client, String, Box<dyn std::any::Any>)> {
        let Some((locator, keep)) = toolgate_tests::conformance::Postgres::fresh_database().await else {
            eprintln!("skipped: set TOOLGATE_TEST_PG (scripts/test does)");
            return None;
        };
        let (admin, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        admin
            .batch_execute(&format!(
                "{} CREATE TABLE toolgate_schema (version BIGINT NOT NULL); INSERT INTO toolgate_schema VALUES (4);
                 INSERT INTO steps (run_id, call_id, tool_id, arguments, verdict, outcome, result, captured,
                                    committed_at)
                 SELECT 'r', 'c' || i, 't', '{{}}', 'allow', 'output', '', '{{}}', 0 FROM generate_series(1, 1000) i",
                schema_at(4)
            ))
            .await
            .unwrap();
        let (_, db) = socket_and_db(&locator);
        Some((locator, admin, db, Box::new(keep)))
    }

    /// A role's or database's `statement_timeout` shorter than the index
    /// build (here the build waits 1.5 s for an older snapshot) does not
    /// cancel it: the build has limits of its own, and a host starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_index_is_built_whatever_the_databases_statement_timeout() {
        let Some((locator, admin, db, _keep)) = at_v4().await else { return };
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {db} SET statement_timeout = '300ms'; ALTER DATABASE {db} SET lock_timeout = '300ms'"
            ))
            .await
            .unwrap();
        let (old, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        old.batch_execute("SET statement_timeout = 0; BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1").await.unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            old.batch_execute("COMMIT").await.unwrap();
        });
        PostgresJournal::connect(&locator, None, 2, None).await.expect("starts");
        release.await.unwrap();
        let valid = admin.query_one(INDEX_VALID, &[&"steps_write_key"]).await.unwrap();
        assert!(valid.get::<_, bool>(0));
    }

    /// An index left invalid is rebuilt even while another session (as
    /// autovacuum or ANALYZE does) holds the table's SHARE UPDATE EXCLUSIVE
    /// lock: only another host's build, by its advisory lock, is left alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_invalid_index_is_rebuilt_while_a_vacuum_holds_the_table() {
        let Some((locator, admin, _db, _keep)) = at_v4().await else { return };
        PostgresJournal::connect(&locator, None, 2, None).await.unwrap();
        admin
            .batch_execute(
                "DROP INDEX steps_write_key;
                 UPDATE steps SET write_key = 'k' WHERE call_id IN ('c1', 'c2')",
            )
            .await
            .unwrap();
        assert!(
            admin.batch_execute("CREATE UNIQUE INDEX CONCURRENTLY steps_write_key ON steps (write_key)").await.is_err()
        );
        admin.batch_execute("UPDATE steps SET write_key = NULL WHERE call_id = 'c2'").await.unwrap();
        let (vacuum, conn) = tokio_postgres::connect(&locator, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        vacuum.batch_execute("BEGIN; LOCK TABLE steps IN SHARE UPDATE EXCLUSIVE MODE").await.unwrap();
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            vacuum.batch_execute("COMMIT").await.unwrap();
        });
        PostgresJournal::connect(&locator, None, 2, None).await.expect("starts");
        release.await.unwrap();
        let valid = admin.query_one(INDEX_VALID, &[&"steps_write_key"]).await.unwrap();
        assert!(valid.get::<_, bool>(0), "the invalid index was left as it was");
    }
}
