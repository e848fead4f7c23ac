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
    Done,
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
        }
    }
}
