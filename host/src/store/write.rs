//! Writes as they queue for a group committer: owned copies of what the
//! [`StepStore`](super::StepStore) methods borrow, shared by every backend
//! that commits through a writer. Nothing here touches a database.

use super::{ApprovedBy, AwaitingRecord, NewStep, OutcomeKind, StateChange, TicketError, Verdict};

/// A run's record before it is written.
#[derive(Debug, Clone)]
pub(crate) struct PendingRun {
    pub(crate) agent: String,
    pub(crate) narrowing: String,
    pub(crate) restriction: Option<String>,
}

/// What a job writes.
#[allow(clippy::large_enum_variant)] // moved once into the committer's channel; boxing buys nothing
pub(crate) enum Write {
    /// A step with its changes and Awaiting record, and the run's record
    /// when this is its first step.
    Step { step: OwnedStep, changes: Vec<StateChange>, awaiting: Option<AwaitingRecord>, run: Option<PendingRun> },
    /// A run record.
    Run { run_id: String, run: PendingRun },
    /// Claim a pending ticket for a host instance.
    Claim { ticket_id: String, now: i64, holder: String },
    /// A host instance is alive.
    Heartbeat { holder: String, now: i64 },
    /// The step that resolves a claimed ticket, if the claim is still the holder's.
    Resolve { ticket_id: String, holder: String, step: OwnedStep, changes: Vec<StateChange>, delivered: bool },
    /// Take over claims whose holder's heartbeat lapsed.
    TakeOver { holder: String, now: i64, lease_secs: i64 },
    /// A retry's step receiving a decided result, once.
    Deliver { ticket_id: String, step: OwnedStep },
}

/// What a write produced.
#[allow(clippy::large_enum_variant)] // sent once over a oneshot; boxing buys nothing
pub(crate) enum Written {
    Seq(i64),
    Claim(Result<AwaitingRecord, TicketError>),
    Resolved(Result<i64, TicketError>),
    TakenOver(Vec<AwaitingRecord>),
    Delivered(Option<i64>),
    /// The step's Tool state is no longer what the call read: nothing written.
    StateChanged,
    Done,
}

impl Written {
    /// A write that was refused and wrote nothing (its savepoint or
    /// transaction is rolled back).
    pub(crate) fn refused(&self) -> bool {
        matches!(self, Written::Resolved(Err(_)) | Written::Delivered(None) | Written::StateChanged)
    }
}

/// Whether the Tool state a step's call read is what `current` holds now,
/// cache keys aside ([`super::is_cache_key`]); a step that changes no
/// non-cache key (or has no recorded read) always passes.
pub(crate) fn state_unchanged(
    step: &NewStep<'_>,
    changes: &[StateChange],
    current: impl FnOnce() -> std::collections::BTreeMap<String, String>,
) -> bool {
    match step.state_read {
        Some(read) if needs_state_check(step, changes) => {
            let kept = |(k, _): &(&String, &String)| !super::is_cache_key(k);
            read.iter().filter(kept).eq(current().iter().filter(kept))
        }
        _ => true,
    }
}

/// Whether committing `changes` must first compare the state (see
/// [`state_unchanged`]): only when one of them is not a cache key.
pub(crate) fn needs_state_check(step: &NewStep<'_>, changes: &[StateChange]) -> bool {
    step.state_read.is_some() && changes.iter().any(|c| !super::is_cache_key(&c.key))
}

/// [`NewStep`], owned, to cross to the committer thread.
pub(crate) struct OwnedStep {
    pub(crate) run_id: String,
    pub(crate) agent: String,
    pub(crate) call_id: String,
    pub(crate) tool_id: String,
    pub(crate) arguments: String,
    pub(crate) verdict: Verdict,
    pub(crate) outcome: OutcomeKind,
    pub(crate) result: String,
    pub(crate) captured: String,
    pub(crate) ticket: Option<String>,
    pub(crate) structured: bool,
    pub(crate) approved_by: Option<ApprovedBy>,
    pub(crate) state_read: Option<std::collections::BTreeMap<String, String>>,
}

impl OwnedStep {
    pub(crate) fn of(s: &NewStep<'_>) -> Self {
        OwnedStep {
            run_id: s.run_id.to_owned(),
            agent: s.agent.to_owned(),
            call_id: s.call_id.to_owned(),
            tool_id: s.tool_id.to_owned(),
            arguments: s.arguments.to_owned(),
            verdict: s.verdict,
            outcome: s.outcome,
            result: s.result.to_owned(),
            captured: s.captured.to_owned(),
            ticket: s.ticket.map(str::to_owned),
            structured: s.structured,
            approved_by: s.approved_by.cloned(),
            state_read: s.state_read.cloned(),
        }
    }
    pub(crate) fn borrow(&self) -> NewStep<'_> {
        NewStep {
            run_id: &self.run_id,
            agent: &self.agent,
            call_id: &self.call_id,
            tool_id: &self.tool_id,
            arguments: &self.arguments,
            verdict: self.verdict,
            outcome: self.outcome,
            result: &self.result,
            captured: &self.captured,
            ticket: self.ticket.as_deref(),
            structured: self.structured,
            approved_by: self.approved_by.as_ref(),
            state_read: self.state_read.as_ref(),
        }
    }
}

/// Runs begun but not yet written: a durable journal records a run in the
/// transaction of its first step (one commit instead of two for a one-call
/// run), up to a bound.
#[derive(Default)]
pub(crate) struct PendingRuns(std::sync::Mutex<std::collections::HashMap<String, PendingRun>>);

/// Runs begun without a step yet, at most; beyond, a run is written at once.
const MAX_PENDING_RUNS: usize = 4096;

impl PendingRuns {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, PendingRun>> {
        // A poisoned lock only means another thread panicked while holding
        // it; the map itself is always consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// Hold `run` until its first step; gives it back when full (write it now).
    /// A run already held keeps what it began with, as a written one does
    /// (a continued run's begin never replaces its narrowing or restriction).
    fn hold(&self, run_id: &str, run: PendingRun) -> Option<PendingRun> {
        let mut runs = self.lock();
        if runs.contains_key(run_id) {
            None
        } else if runs.len() < MAX_PENDING_RUNS {
            runs.insert(run_id.to_owned(), run);
            None
        } else {
            Some(run)
        }
    }
    /// A held run, as read back.
    pub(crate) fn info(&self, run_id: &str) -> Option<super::RunInfo> {
        self.lock().get(run_id).map(|p| super::RunInfo {
            agent: p.agent.clone(),
            narrowing: p.narrowing.clone(),
            restriction: p.restriction.clone(),
        })
    }
}

/// A store that writes through a group committer: the [`StepStore`](super::StepStore)
/// methods that only queue a write and read its answer, shared by the
/// durable backends.
#[async_trait::async_trait]
pub(crate) trait Committer: Send + Sync {
    /// Commit `write`; answered once it is durable.
    async fn write(&self, write: Write) -> Result<Written, super::CommitError>;
    /// The writer answered a write with another kind of result: a bug,
    /// reported rather than unwrapped.
    fn unexpected(&self, what: &str) -> super::CommitError;
    /// Runs begun but not yet written.
    fn pending_runs(&self) -> &PendingRuns;

    async fn queue_run(&self, run: &super::RunRecord<'_>) -> Result<(), super::CommitError> {
        let pending = PendingRun {
            agent: run.agent.to_owned(),
            narrowing: run.narrowing.to_owned(),
            restriction: run.restriction.map(str::to_owned),
        };
        match self.pending_runs().hold(run.run_id, pending) {
            None => Ok(()),
            Some(run_now) => self.write(Write::Run { run_id: run.run_id.to_owned(), run: run_now }).await.map(|_| ()),
        }
    }

    async fn queue_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, super::CommitError> {
        let run = self.pending_runs().lock().remove(step.run_id);
        let write = Write::Step {
            step: OwnedStep::of(step),
            changes: changes.to_vec(),
            awaiting: awaiting.cloned(),
            run: run.clone(),
        };
        let result = match self.write(write).await {
            Ok(Written::Seq(seq)) => Ok(seq),
            Ok(Written::StateChanged) => {
                Err(super::CommitError::StateChanged { agent: step.agent.to_owned(), tool: step.tool_id.to_owned() })
            }
            Ok(_) => Err(self.unexpected("step")),
            Err(e) => Err(e),
        };
        if let (Err(_), Some(run)) = (&result, run) {
            // Not written with this step: the run's next step records it.
            self.pending_runs().lock().insert(step.run_id.to_owned(), run);
        }
        result
    }

    async fn queue_claim(
        &self,
        ticket_id: &str,
        now: i64,
        holder: &str,
    ) -> Result<Result<super::ClaimedTicket, TicketError>, super::CommitError> {
        let write = Write::Claim { ticket_id: ticket_id.to_owned(), now, holder: holder.to_owned() };
        match self.write(write).await? {
            Written::Claim(r) => Ok(r.map(|record| super::ClaimedTicket::new(record, holder.to_owned()))),
            _ => Err(self.unexpected("claim")),
        }
    }

    async fn queue_heartbeat(&self, holder: &str, now: i64) -> Result<(), super::CommitError> {
        self.write(Write::Heartbeat { holder: holder.to_owned(), now }).await.map(|_| ())
    }

    async fn queue_resolution(
        &self,
        ticket: super::ClaimedTicket,
        step: &NewStep<'_>,
        changes: &[StateChange],
        delivered: bool,
    ) -> Result<Result<i64, TicketError>, super::CommitError> {
        let write = Write::Resolve {
            ticket_id: ticket.record().ticket_id.clone(),
            holder: ticket.holder().to_owned(),
            step: OwnedStep::of(step),
            changes: changes.to_vec(),
            delivered,
        };
        match self.write(write).await? {
            Written::Resolved(r) => Ok(r),
            Written::StateChanged => {
                Err(super::CommitError::StateChanged { agent: step.agent.to_owned(), tool: step.tool_id.to_owned() })
            }
            _ => Err(self.unexpected("resolution")),
        }
    }

    async fn queue_take_over(
        &self,
        holder: &str,
        now: i64,
        lease_secs: i64,
    ) -> Result<Vec<super::ClaimedTicket>, super::CommitError> {
        match self.write(Write::TakeOver { holder: holder.to_owned(), now, lease_secs }).await? {
            Written::TakenOver(records) => {
                Ok(records.into_iter().map(|r| super::ClaimedTicket::new(r, holder.to_owned())).collect())
            }
            _ => Err(self.unexpected("take-over")),
        }
    }

    async fn queue_delivery(&self, ticket_id: &str, step: &NewStep<'_>) -> Result<Option<i64>, super::CommitError> {
        match self.write(Write::Deliver { ticket_id: ticket_id.to_owned(), step: OwnedStep::of(step) }).await? {
            Written::Delivered(r) => Ok(r),
            _ => Err(self.unexpected("delivery")),
        }
    }
}
