//! `MemoryJournal`: the journal of `store = ":memory:"`, kept in this
//! process's memory and gone when it exits (demos, tests, benchmarks).
//!
//! Owns the same records as the SQLite journal — runs, steps, Awaiting
//! records with their tickets, Tool state, host heartbeats — with the same
//! semantics, proven by the same conformance suite (`tests/src/conformance.rs`):
//! a write checks everything it depends on (stale Tool state, a duplicate
//! ticket or call id, a ticket's state and holder) before it changes
//! anything, all under one lock, so a refused write changes nothing.
//!
//! Architecture invariant: it is a [`StepStore`] like the others, reached only
//! through the runtime's Step commit; it must never be a second store beside
//! the configured one, and never outlive its process.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    ApprovedBy, AskScope, AwaitingRecord, ClaimedTicket, CommitError, NewStep, OutcomeKind, PriorAsk, RunInfo,
    RunRecord, StateChange, StepRecord, StepStore, TicketError, Verdict,
};

/// What the journal is called in errors.
const NAME: &str = ":memory:";

/// The hasher of the maps every step reads (ids this host made, agents it
/// configured, Tools it installed).
type Fast = foldhash::fast::RandomState;

/// Steps per chunk of [`Inner::steps`].
const CHUNK: usize = 4096;

/// Bytes per chunk of [`Inner::texts`] (a step larger than that gets a chunk of its own size).
const TEXT_CHUNK: usize = 256 << 10;

/// The in-process journal.
#[derive(Default)]
pub struct MemoryJournal {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    runs: HashMap<String, RunInfo>,
    /// Every step, in chunks of [`CHUNK`] (growing never moves a step); a
    /// step's `seq` is its index + 1.
    steps: Vec<Vec<Kept>>,
    /// Steps written.
    len: usize,
    /// The steps' own text (call id, arguments, result) one after another,
    /// in chunks of at least [`TEXT_CHUNK`] bytes (growing never moves text):
    /// no allocation per step.
    texts: Vec<String>,
    /// Indices into `steps`, per run (with the run id its steps share).
    by_run: HashMap<String, (Arc<str>, Vec<usize>), Fast>,
    /// Tool ids steps name, each kept once.
    tool_ids: HashSet<Arc<str>, Fast>,
    /// The captured text of the last step, shared by the next ones that
    /// captured the same (most capture nothing).
    last_captured: Option<Arc<str>>,
    /// Indices into `steps`, per ticket.
    by_ticket: HashMap<String, Vec<usize>>,
    /// Awaiting records in the order they were written.
    awaiting: Vec<Awaiting>,
    /// Index into `awaiting`, per ticket.
    tickets: HashMap<String, usize>,
    /// Call ids that have an Awaiting record (unique, as in the SQL schema).
    asked_calls: HashSet<String>,
    /// Agent → Tool → state (nested, so a lookup by `&str` allocates nothing).
    state: HashMap<String, HashMap<String, BTreeMap<String, String>, Fast>, Fast>,
    /// Host instance → last heartbeat.
    hosts: HashMap<String, i64>,
}

/// A step as this journal keeps it: what repeats from step to step (run,
/// Tool, captured text) is shared rather than copied, and the step's own
/// text (call id, arguments, result) is a place in [`Inner::texts`] — every
/// step stays in memory, so its footprint is the journal's cost per call.
struct Kept {
    seq: i64,
    run_id: Arc<str>,
    tool_id: Arc<str>,
    captured: Arc<str>,
    /// The chunk of [`Inner::texts`] that holds its call id, arguments and result, one after the other.
    text: usize,
    /// Where the call id, the arguments and the result start in that chunk, and where the result ends.
    at: [usize; 4],
    verdict: Verdict,
    outcome: OutcomeKind,
    structured: bool,
    /// The rarer parts: the ticket and who approved it.
    ticket: Option<Box<(Option<String>, Option<ApprovedBy>)>>,
}

impl Kept {
    fn part<'a>(&self, texts: &'a [String], i: usize) -> &'a str {
        texts.get(self.text).and_then(|t| t.get(self.at[i]..self.at[i + 1])).unwrap_or_default()
    }

    fn record(&self, texts: &[String]) -> StepRecord {
        StepRecord {
            seq: self.seq,
            run_id: self.run_id.to_string(),
            call_id: self.part(texts, 0).to_owned(),
            tool_id: self.tool_id.to_string(),
            arguments: self.part(texts, 1).to_owned(),
            verdict: self.verdict.as_str().to_owned(),
            outcome: self.outcome,
            result: self.part(texts, 2).to_owned(),
            captured: self.captured.to_string(),
            ticket_id: self.ticket.as_ref().and_then(|t| t.0.clone()),
            structured: self.structured,
            approved_by: self.ticket.as_ref().and_then(|t| t.1.clone()),
        }
    }
}

struct Awaiting {
    record: AwaitingRecord,
    delivered: bool,
    claimed_at: Option<i64>,
    holder: Option<String>,
}

impl MemoryJournal {
    /// An empty journal.
    pub fn new() -> Self {
        MemoryJournal::default()
    }

    /// [`StepStore::commit_step`]: nothing here waits.
    fn commit(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
        let mut j = self.lock();
        j.check_state(step, changes)?;
        if let Some(a) = awaiting {
            // The SQL schema's keys: one record per ticket and per call.
            if j.tickets.contains_key(&a.ticket_id) || j.asked_calls.contains(&a.call_id) {
                return Err(CommitError::Duplicate {
                    store: NAME.into(),
                    message: format!(
                        "an Awaiting record for ticket `{}` or call `{}` is already written; nothing of step `{}` was kept",
                        a.ticket_id, a.call_id, step.call_id
                    ),
                });
            }
        }
        let seq = j.insert_step(step, step.ticket.or(awaiting.map(|a| a.ticket_id.as_str())));
        j.apply(step.agent, step.tool_id, changes);
        if let Some(a) = awaiting {
            let mut record = a.clone();
            record.state = "pending".into();
            let index = j.awaiting.len();
            j.tickets.insert(record.ticket_id.clone(), index);
            j.asked_calls.insert(record.call_id.clone());
            j.awaiting.push(Awaiting { record, delivered: false, claimed_at: None, holder: None });
        }
        Ok(seq)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked while holding
        // it; every write below checks before it changes anything, so the
        // records are consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn state_of(&self, agent: &str, tool: &str) -> BTreeMap<String, String> {
        self.state.get(agent).and_then(|tools| tools.get(tool)).cloned().unwrap_or_default()
    }

    /// `step`'s Commands against its Tool's state now ([`super::write::check_state`]):
    /// under the journal's lock, so nothing changes it before they apply.
    fn check_state(&self, step: &NewStep<'_>, changes: &[StateChange]) -> Result<(), CommitError> {
        // Borrowed, not copied: the size check reads it on every commit that changes state.
        const NONE: &BTreeMap<String, String> = &BTreeMap::new();
        let current = || self.state.get(step.agent).and_then(|tools| tools.get(step.tool_id)).unwrap_or(NONE);
        super::write::check_state(step, changes, current).into_result(step)
    }

    fn step(&self, index: usize) -> &Kept {
        &self.steps[index / CHUNK][index % CHUNK]
    }

    fn all_steps(&self) -> impl Iterator<Item = &Kept> {
        self.steps.iter().flatten()
    }

    fn insert_step(&mut self, s: &NewStep<'_>, ticket: Option<&str>) -> i64 {
        let index = self.len;
        let seq = i64::try_from(index).unwrap_or(i64::MAX).saturating_add(1);
        let run_id = match self.by_run.get_mut(s.run_id) {
            Some((id, steps)) => {
                steps.push(index);
                id.clone()
            }
            None => {
                let id: Arc<str> = s.run_id.into();
                self.by_run.insert(s.run_id.to_owned(), (id.clone(), vec![index]));
                id
            }
        };
        let tool_id = match self.tool_ids.get(s.tool_id) {
            Some(id) => id.clone(),
            None => {
                let id: Arc<str> = s.tool_id.into();
                self.tool_ids.insert(id.clone());
                id
            }
        };
        let captured = match &self.last_captured {
            Some(last) if **last == *s.captured => last.clone(),
            _ => {
                let c: Arc<str> = s.captured.into();
                self.last_captured = Some(c.clone());
                c
            }
        };
        let len = s.call_id.len() + s.arguments.len() + s.result.len();
        let texts = &mut self.texts;
        if texts.last().is_none_or(|t| t.capacity() - t.len() < len) {
            texts.push(String::with_capacity(len.max(TEXT_CHUNK)));
        }
        let text = texts.len() - 1;
        let mut at = [0; 4];
        if let Some(t) = texts.last_mut() {
            for (i, part) in [s.call_id, s.arguments, s.result].into_iter().enumerate() {
                at[i] = t.len();
                t.push_str(part);
            }
            at[3] = t.len();
        }
        let rare = match (ticket, s.approved_by) {
            (None, None) => None,
            (t, by) => Some(Box::new((t.map(str::to_owned), by.cloned()))),
        };
        let kept = Kept {
            seq,
            run_id,
            tool_id,
            captured,
            text,
            at,
            verdict: s.verdict,
            outcome: s.outcome,
            structured: s.structured,
            ticket: rare,
        };
        match self.steps.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(kept),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(kept);
                self.steps.push(chunk);
            }
        }
        self.len += 1;
        if let Some(t) = ticket {
            self.by_ticket.entry(t.to_owned()).or_default().push(index);
        }
        seq
    }

    fn apply(&mut self, agent: &str, tool: &str, changes: &[StateChange]) {
        if changes.is_empty() {
            return;
        }
        let tools = match self.state.get_mut(agent) {
            Some(tools) => tools,
            None => self.state.entry(agent.to_owned()).or_default(),
        };
        let state = match tools.get_mut(tool) {
            Some(state) => state,
            None => tools.entry(tool.to_owned()).or_default(),
        };
        for c in changes {
            match &c.value {
                Some(v) => {
                    state.insert(c.key.clone(), v.clone());
                }
                None => {
                    state.remove(&c.key);
                }
            }
        }
    }

    fn beat(&mut self, holder: &str, now: i64) {
        let at = self.hosts.entry(holder.to_owned()).or_insert(now);
        *at = (*at).max(now);
    }

    fn ticket_mut(&mut self, ticket_id: &str) -> Option<&mut Awaiting> {
        let i = *self.tickets.get(ticket_id)?;
        self.awaiting.get_mut(i)
    }
}

#[async_trait::async_trait]
impl StepStore for MemoryJournal {
    async fn begin_run(&self, run: &RunRecord<'_>) -> Result<(), CommitError> {
        self.lock().runs.entry(run.run_id.to_owned()).or_insert_with(|| RunInfo {
            agent: run.agent.to_owned(),
            narrowing: run.narrowing.to_owned(),
            restriction: run.restriction.map(str::to_owned),
        });
        Ok(())
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunInfo>, CommitError> {
        Ok(self.lock().runs.get(run_id).cloned())
    }

    async fn commit_step(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Result<i64, CommitError> {
        self.commit(step, changes, awaiting)
    }

    fn commit_step_now(
        &self,
        step: &NewStep<'_>,
        changes: &[StateChange],
        awaiting: Option<&AwaitingRecord>,
    ) -> Option<Result<i64, CommitError>> {
        Some(self.commit(step, changes, awaiting))
    }

    fn tool_state_now(&self, agent: &str, tool_id: &str) -> Option<Result<BTreeMap<String, String>, CommitError>> {
        Some(Ok(self.lock().state_of(agent, tool_id)))
    }

    async fn claim_ticket(
        &self,
        ticket_id: &str,
        now: i64,
        holder: &str,
    ) -> Result<Result<ClaimedTicket, TicketError>, CommitError> {
        let mut j = self.lock();
        let Some(a) = j.ticket_mut(ticket_id) else { return Ok(Err(TicketError::Unknown(ticket_id.to_owned()))) };
        if a.record.state != "pending" {
            return Ok(Err(TicketError::Used(ticket_id.to_owned())));
        }
        if a.record.expires_at <= now {
            return Ok(Err(TicketError::Expired(ticket_id.to_owned())));
        }
        a.record.state = "claimed".into();
        a.claimed_at = Some(now);
        a.holder = Some(holder.to_owned());
        let record = a.record.clone();
        j.beat(holder, now);
        Ok(Ok(ClaimedTicket::new(record, holder.to_owned())))
    }

    async fn heartbeat(&self, holder: &str, now: i64) -> Result<(), CommitError> {
        self.lock().beat(holder, now);
        Ok(())
    }

    async fn resolve_ticket(
        &self,
        ticket: ClaimedTicket,
        step: &NewStep<'_>,
        changes: &[StateChange],
        delivered: bool,
    ) -> Result<Result<i64, TicketError>, CommitError> {
        let mut j = self.lock();
        j.check_state(step, changes)?;
        let ticket_id = ticket.ticket_id();
        match j.ticket_mut(ticket_id) {
            Some(a) if a.record.state == "claimed" && a.holder.as_deref() == Some(ticket.holder()) => {
                a.record.state = "resolved".into();
                a.delivered = delivered;
            }
            _ => return Ok(Err(TicketError::Settled(ticket_id.to_owned()))),
        }
        let seq = j.insert_step(step, Some(ticket_id));
        j.apply(step.agent, step.tool_id, changes);
        Ok(Ok(seq))
    }

    async fn take_over_stale_claims(
        &self,
        holder: &str,
        now: i64,
        lease_secs: i64,
        only: Option<&str>,
    ) -> Result<Vec<ClaimedTicket>, CommitError> {
        let cutoff = now.saturating_sub(lease_secs);
        let mut j = self.lock();
        let hosts = j.hosts.clone();
        let mut stale: Vec<usize> = j
            .awaiting
            .iter()
            .enumerate()
            .filter(|(_, a)| a.record.state == "claimed" && a.holder.as_deref() != Some(holder))
            .filter(|(_, a)| only.is_none_or(|t| a.record.ticket_id == t))
            .filter(|(_, a)| {
                let seen = a.holder.as_ref().and_then(|h| hosts.get(h).copied()).or(a.claimed_at).unwrap_or(0);
                seen < cutoff
            })
            .map(|(i, _)| i)
            .collect();
        stale.sort_by(|x, y| j.awaiting[*x].record.ticket_id.cmp(&j.awaiting[*y].record.ticket_id));
        let mut taken = Vec::with_capacity(stale.len());
        for i in stale {
            let a = &mut j.awaiting[i];
            a.holder = Some(holder.to_owned());
            a.claimed_at = Some(now);
            taken.push(ClaimedTicket::new(a.record.clone(), holder.to_owned()));
        }
        if !taken.is_empty() {
            j.beat(holder, now);
        }
        // Hosts long gone and holding nothing need no entry.
        let holding: BTreeSet<String> =
            j.awaiting.iter().filter(|a| a.record.state == "claimed").filter_map(|a| a.holder.clone()).collect();
        j.hosts.retain(|h, at| *at >= cutoff || holding.contains(h));
        Ok(taken)
    }

    async fn prior_ask(
        &self,
        scope: AskScope<'_>,
        tool_id: &str,
        argument_digest: &str,
    ) -> Result<Option<PriorAsk>, CommitError> {
        let j = self.lock();
        let found = j.awaiting.iter().rev().find(|a| {
            let r = &a.record;
            let in_scope = match scope {
                AskScope::Run(run) => r.run_id == run,
                AskScope::StatelessRequests { agent, runs } => r.agent == agent && r.run_id.starts_with(runs),
            };
            in_scope && r.tool_id == tool_id && r.argument_digest == argument_digest
        });
        let Some(a) = found else { return Ok(None) };
        let resolution = if a.record.state == "resolved" {
            j.by_ticket
                .get(&a.record.ticket_id)
                .and_then(|steps| steps.iter().map(|i| j.step(*i)).find(|s| s.outcome != OutcomeKind::Awaiting))
                .map(|s| s.record(&j.texts))
        } else {
            None
        };
        Ok(Some(PriorAsk { record: a.record.clone(), delivered: a.delivered, resolution }))
    }

    async fn deliver(&self, ticket_id: &str, step: &NewStep<'_>) -> Result<Option<i64>, CommitError> {
        let mut j = self.lock();
        match j.ticket_mut(ticket_id) {
            Some(a) if a.record.state == "resolved" && !a.delivered => a.delivered = true,
            _ => return Ok(None),
        }
        Ok(Some(j.insert_step(step, Some(ticket_id))))
    }

    async fn skill_activations(&self, run_id: &str) -> Result<Vec<(String, Option<String>)>, CommitError> {
        let j = self.lock();
        let steps = j.by_run.get(run_id).into_iter().flat_map(|(_, steps)| steps).map(|i| j.step(*i));
        let outputs = steps.filter(|s| s.outcome == OutcomeKind::Output);
        Ok(super::activations(outputs.map(|s| (s.tool_id.to_string(), Some(&*s.captured)))))
    }

    async fn tool_state(&self, agent: &str, tool_id: &str) -> Result<BTreeMap<String, String>, CommitError> {
        Ok(self.lock().state_of(agent, tool_id))
    }

    async fn steps(&self, run_id: Option<&str>) -> Result<Vec<StepRecord>, CommitError> {
        let j = self.lock();
        Ok(match run_id {
            None => j.all_steps().map(|s| s.record(&j.texts)).collect(),
            Some(run) => j
                .by_run
                .get(run)
                .into_iter()
                .flat_map(|(_, steps)| steps)
                .map(|i| j.step(*i).record(&j.texts))
                .collect(),
        })
    }

    async fn awaiting(&self, ticket_id: &str) -> Result<Option<AwaitingRecord>, CommitError> {
        let j = self.lock();
        Ok(j.tickets.get(ticket_id).map(|i| j.awaiting[*i].record.clone()))
    }

    async fn pending(&self) -> Result<Vec<AwaitingRecord>, CommitError> {
        let j = self.lock();
        Ok(j.awaiting.iter().filter(|a| a.record.state == "pending").map(|a| a.record.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step<'a>(call_id: &'a str, arguments: &'a str, result: &'a str) -> NewStep<'a> {
        NewStep {
            run_id: "run-1",
            agent: "default",
            call_id,
            tool_id: "text.upper",
            arguments,
            verdict: Verdict::Allow,
            outcome: OutcomeKind::Output,
            result,
            captured: "{}",
            ticket: None,
            structured: false,
            approved_by: None,
            state_read: None,
            state_limit_kib: None,
        }
    }

    /// The size limit holds against the state at commit, not the call's read.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cache_keys_of_calls_from_one_read_cannot_together_pass_the_limit() {
        let j = std::sync::Arc::new(MemoryJournal::new());
        super::super::write::tests::cache_keys_of_calls_from_one_read_cannot_together_pass_the_limit(j).await;
    }

    /// Steps' text shares chunks: whatever their sizes, each step reads back
    /// exactly as written, around a chunk's end and larger than a chunk.
    #[tokio::test]
    async fn every_step_reads_back_exactly_across_text_chunks() {
        let j = MemoryJournal::new();
        let mut written = Vec::new();
        for i in 0..40usize {
            // Sizes that cross chunk ends; every seventh larger than a whole chunk.
            let size = if i % 7 == 3 { TEXT_CHUNK + 17 * i } else { (i * 9_973) % (TEXT_CHUNK / 3) };
            let (call, args, result) = (format!("call-{i}"), format!("{{\"n\":{i}}}"), "é".repeat(size / 2));
            let seq = j.commit_step_now(&step(&call, &args, &result), &[], None).unwrap().unwrap();
            assert_eq!(seq, i as i64 + 1);
            written.push((call, args, result));
        }
        let steps = j.steps(Some("run-1")).await.unwrap();
        assert_eq!(steps.len(), written.len());
        for (s, (call, args, result)) in steps.iter().zip(&written) {
            assert_eq!((&s.call_id, &s.arguments, &s.result), (call, args, result));
        }
        assert!(j.lock().texts.len() > 1, "the text spans several chunks");
    }
}
