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
    /// Take over claims whose holder's heartbeat lapsed (`only` that ticket's).
    TakeOver { holder: String, now: i64, lease_secs: i64, only: Option<String> },
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
    /// The step's Commands would grow its Tool's state past its limit: nothing written.
    StateTooLarge {
        size_kib: u64,
        limit_kib: u64,
    },
    Done,
}

impl Written {
    /// A write that was refused and wrote nothing (its savepoint or
    /// transaction is rolled back).
    pub(crate) fn refused(&self) -> bool {
        matches!(
            self,
            Written::Resolved(Err(_))
                | Written::Delivered(None)
                | Written::StateChanged
                | Written::StateTooLarge { .. }
        )
    }

    /// A step refused by [`check_state`], as the caller's error; `None` for any other answer.
    pub(crate) fn state_error(&self, step: &NewStep<'_>) -> Option<super::CommitError> {
        let (agent, tool) = (step.agent.to_owned(), step.tool_id.to_owned());
        match *self {
            Written::StateChanged => Some(super::CommitError::StateChanged { agent, tool }),
            Written::StateTooLarge { size_kib, limit_kib } => {
                Some(super::CommitError::StateTooLarge { agent, tool, size_kib, limit_kib })
            }
            _ => None,
        }
    }
}

/// What a step's Tool state at commit says of its Commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StateCheck {
    /// They commit.
    Holds,
    /// The state is no longer what the call read ([`super::NewStep::state_read`]).
    Changed,
    /// They would grow it past [`super::NewStep::state_limit_kib`].
    TooLarge { size_kib: u64, limit_kib: u64 },
}

impl StateCheck {
    /// The refusal as a committer answers it; `None` when the step commits.
    pub(crate) fn refusal(self) -> Option<Written> {
        match self {
            StateCheck::Holds => None,
            StateCheck::Changed => Some(Written::StateChanged),
            StateCheck::TooLarge { size_kib, limit_kib } => Some(Written::StateTooLarge { size_kib, limit_kib }),
        }
    }

    /// The refusal as the caller's error; `Ok` when the step commits.
    pub(crate) fn into_result(self, step: &NewStep<'_>) -> Result<(), super::CommitError> {
        match self.refusal().and_then(|w| w.state_error(step)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// `step`'s Commands against its Tool's state as `current` reads it now,
/// inside the writing transaction (every store: the one place both checks
/// are made). First the compare-and-set: the state the call read must be
/// what is there, cache keys aside ([`super::is_cache_key`]: last writer
/// wins) — only when a change is not a cache key. Then the size: a check
/// against the call's read alone let concurrent calls each add a cache key
/// that fit and together pass the limit, so the state is counted as it is
/// now, cache keys of calls that committed meanwhile included. `current`
/// is called only when a check needs it ([`needs_state`]).
pub(crate) fn check_state<B: std::borrow::Borrow<std::collections::BTreeMap<String, String>>>(
    step: &NewStep<'_>,
    changes: &[StateChange],
    current: impl FnOnce() -> B,
) -> StateCheck {
    if !needs_state(step, changes) {
        return StateCheck::Holds;
    }
    let current = current();
    let current = current.borrow();
    if let Some(read) = step.state_read
        && needs_state_check(step, changes)
    {
        let kept = |(k, _): &(&String, &String)| !super::is_cache_key(k);
        if !read.iter().filter(kept).eq(current.iter().filter(kept)) {
            return StateCheck::Changed;
        }
    }
    if let Some(limit_kib) = step.state_limit_kib
        && let Some(size_kib) = super::state_over_limit(current, changes, limit_kib)
    {
        return StateCheck::TooLarge { size_kib, limit_kib };
    }
    StateCheck::Holds
}

/// Whether committing `changes` must first compare the state (see
/// [`check_state`]): only when one of them is not a cache key.
pub(crate) fn needs_state_check(step: &NewStep<'_>, changes: &[StateChange]) -> bool {
    step.state_read.is_some() && changes.iter().any(|c| !super::is_cache_key(&c.key))
}

/// Whether committing `changes` must read the Tool's state first (see
/// [`check_state`]): to compare it, or to count it against a limit.
pub(crate) fn needs_state(step: &NewStep<'_>, changes: &[StateChange]) -> bool {
    needs_state_check(step, changes) || (step.state_limit_kib.is_some() && !changes.is_empty())
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
    pub(crate) state_limit_kib: Option<u64>,
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
            state_limit_kib: s.state_limit_kib,
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
            state_limit_kib: self.state_limit_kib,
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
            Ok(w) => Err(w.state_error(step).unwrap_or_else(|| self.unexpected("step"))),
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
            w => Err(w.state_error(step).unwrap_or_else(|| self.unexpected("resolution"))),
        }
    }

    async fn queue_take_over(
        &self,
        holder: &str,
        now: i64,
        lease_secs: i64,
        only: Option<&str>,
    ) -> Result<Vec<super::ClaimedTicket>, super::CommitError> {
        let only = only.map(str::to_owned);
        match self.write(Write::TakeOver { holder: holder.to_owned(), now, lease_secs, only }).await? {
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

#[cfg(test)]
pub(crate) mod tests {
    //! The size check every store makes at commit, one body for all of them.
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::super::{CommitError, NewStep, OutcomeKind, StateChange, StepStore, Verdict};

    fn step<'a>(call_id: &'a str, tool_id: &'a str, read: &'a BTreeMap<String, String>) -> NewStep<'a> {
        NewStep {
            run_id: "run-size",
            agent: "main",
            call_id,
            tool_id,
            arguments: "{}",
            verdict: Verdict::Allow,
            outcome: OutcomeKind::Output,
            result: "ok",
            captured: "{}",
            ticket: None,
            structured: false,
            approved_by: None,
            state_read: Some(read),
            state_limit_kib: Some(1),
        }
    }

    fn set(key: &str, value: &str) -> StateChange {
        StateChange { key: key.into(), value: Some(value.into()) }
    }

    /// Calls that read the same (empty) state each add a cache key of ~670
    /// counted bytes under `limits.state_kib = 1`: each fits what its call
    /// read, and cache keys take no part in the compare-and-set, so only the
    /// store's count of the state as it is at commit holds them. The second
    /// is refused and nothing of it is written; a step that shrinks the state
    /// commits even over the limit. Then eight at once: exactly one commits.
    pub(crate) async fn cache_keys_of_calls_from_one_read_cannot_together_pass_the_limit(store: Arc<dyn StepStore>) {
        let read = BTreeMap::new();
        let big = format!("\"{}\"", "x".repeat(600));
        store.commit_step(&step("c1", "notes.add", &read), &[set("cache/c1", &big)], None).await.unwrap();
        match store.commit_step(&step("c2", "notes.add", &read), &[set("cache/c2", &big)], None).await {
            Err(e @ CommitError::StateTooLarge { .. }) => {
                let CommitError::StateTooLarge { size_kib, limit_kib, .. } = &e else { unreachable!() };
                assert_eq!((*size_kib, *limit_kib), (2, 1));
                let text = e.to_string();
                assert!(text.starts_with("`notes.add` returned Commands that would grow its state to 2 KiB"), "{text}");
                assert!(text.contains("over limits.state_kib (1); nothing was changed —"), "{text}");
            }
            other => panic!("the second cache key passed the limit: {other:?}"),
        }
        let state = store.tool_state("main", "notes.add").await.unwrap();
        assert_eq!(state.keys().collect::<Vec<_>>(), ["cache/c1"]);
        let calls: Vec<String> = store.steps(Some("run-size")).await.unwrap().into_iter().map(|s| s.call_id).collect();
        assert_eq!(calls, ["c1"], "nothing of the refused step was written");
        // Over the limit (a step that carries none), a change that shrinks the state commits.
        let unchecked = NewStep { state_limit_kib: None, ..step("c3", "notes.add", &read) };
        store.commit_step(&unchecked, &[set("cache/c3", &big)], None).await.unwrap();
        let shrink = [StateChange { key: "cache/c3".into(), value: None }, set("cache/c4", "1")];
        store.commit_step(&step("c4", "notes.add", &read), &shrink, None).await.unwrap();
        assert!(store.tool_state("main", "notes.add").await.unwrap().contains_key("cache/c4"));

        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let (store, big) = (store.clone(), big.clone());
                tokio::spawn(async move {
                    let (read, call) = (BTreeMap::new(), format!("burst-{i}"));
                    let key = format!("cache/{call}");
                    store.commit_step(&step(&call, "notes.burst", &read), &[set(&key, &big)], None).await
                })
            })
            .collect();
        let mut committed = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => committed += 1,
                Err(CommitError::StateTooLarge { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(committed, 1, "one ~670-byte key fits 1 KiB, two do not");
        assert_eq!(store.tool_state("main", "notes.burst").await.unwrap().len(), 1);
    }
}
