//! Approval: who may decide an Awaiting call, and what proves they did.
//!
//! Owns the approver side of RequireConfirmation (DESIGN.md invariant 11).
//! A ticket is the approver's, never the model's: deciding it takes an
//! [`Approval`] — a decision signed with a key listed in `[approval] keys`,
//! or one made in an approver channel the host vouches for (an interactive
//! terminal when no keys are configured, the MCP client's own elicitation
//! UI unless `[approval] mcp_elicitation` is off — by default whenever keys
//! are configured —, an embedding runtime's dialog). Every approval names the
//! call the approver was shown ([`call_digest`] of the record): a signature
//! covers the ticket, that digest and the decision; a decision from a
//! channel carries the digest. An approval approves that call and nothing
//! else — a journal writer that rewrites the pending record while the human
//! reads it gets the approval refused. The journal records who decided,
//! through which channel, and when.
//!
//! Who may decide an ask is fixed when the call asks ([`Approvers`], kept
//! with its Awaiting record and covered by its call digest): a decision
//! counts only from a principal allowed both then and by the deciding
//! process's own settings. So a process started with another config (its
//! own `[approval] keys`, or none, so a terminal or an MCP client would
//! decide) decides nothing the operator's host asked.
//!
//! Architecture invariant: nothing here reads a model's or a Tool's output;
//! a decision is verified against the stored Awaiting record before the
//! ticket is claimed, so a refused approval changes nothing.

use crate::digest::Digest;
use crate::keys::{SecretKey, TrustedKeys, VerifyError};
use crate::store::{ApprovedBy, AwaitingRecord};

/// What an approval signature signs, before the message.
const DOMAIN: &[u8] = b"toolgate-approval-v1\n";

/// Who may decide an ask, as it was when the call asked: kept with its
/// Awaiting record ([`AwaitingRecord::approvers`], as [`Approvers::to_text`])
/// and covered by its [`call_digest`], so what an approver signs or is shown
/// names it too. A decision counts only from a principal allowed by both
/// this and the deciding process's settings ([`verify`]): a key removed
/// from `[approval] keys` stops deciding at once, a key added later decides
/// only asks made after, and an ask made under keys is decided by no
/// terminal or MCP client (nor, made without keys, by any signature).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approvers {
    /// The approver keys in force (`ed25519:…`), sorted, each once.
    pub keys: Vec<String>,
    /// Whether a confirmation on an interactive terminal decides (no keys).
    pub terminal: bool,
    /// Whether an answer in an MCP client's own UI decides.
    pub mcp_elicitation: bool,
}

impl Approvers {
    /// The approvers a host with `keys` (`[approval] keys`) and
    /// `mcp_elicitation` ([`mcp_elicitation_in_effect`]) asks for.
    pub fn in_force(keys: &TrustedKeys, mcp_elicitation: bool) -> Self {
        let mut keys = keys.publics();
        keys.sort();
        keys.dedup();
        Approvers { terminal: keys.is_empty(), keys, mcp_elicitation }
    }

    /// As the journal keeps it (JSON, one way only: it is part of the call digest).
    pub fn to_text(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Read what [`Approvers::to_text`] wrote; `None` if it is not that.
    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// Who they are, for a human.
    pub fn describe(&self) -> String {
        let mut who = Vec::new();
        if !self.keys.is_empty() {
            who.push(format!("a signature of approver key {}", self.keys.join(" or ")));
        }
        if self.terminal {
            who.push("a confirmation on a terminal".to_owned());
        }
        if self.mcp_elicitation {
            who.push("an answer in an MCP client's UI".to_owned());
        }
        if who.is_empty() { "nobody".to_owned() } else { who.join(", or ") }
    }

    /// Whether the principal `who` deciding through `channel` is one of them.
    fn allow(&self, who: &str, channel: &Channel) -> bool {
        match channel {
            Channel::Signature => TrustedKeys::parse(&self.keys).is_ok_and(|k| k.contains(who)),
            Channel::Terminal => self.terminal,
            Channel::McpElicitation => self.mcp_elicitation,
            // An embedding program's own dialog: the program is the host.
            Channel::Embedder => true,
        }
    }
}

/// What a human decided about an Awaiting call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run exactly the stored call, once.
    Approve,
    /// Do not run it; the reason is what the model reads.
    Deny {
        /// Why.
        reason: String,
    },
}

impl Decision {
    fn signed_line(&self) -> String {
        match self {
            Decision::Approve => "approve".to_owned(),
            Decision::Deny { reason } => format!("deny {reason}"),
        }
    }
}

/// The channel a decision came through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channel {
    /// Signed with an approver key listed in `[approval] keys`.
    Signature,
    /// Confirmed on an interactive terminal — accepted only when no approver
    /// keys are configured.
    Terminal,
    /// Answered in an MCP client's own UI (elicitation), which the model
    /// cannot answer — but an agent with a shell can run a client of its own,
    /// so this counts only where [`mcp_elicitation_in_effect`] allows it.
    McpElicitation,
    /// An embedding agent runtime's own approval UI.
    Embedder,
}

impl Channel {
    /// The name the journal records.
    pub fn as_str(&self) -> &'static str {
        match self {
            Channel::Signature => "signature",
            Channel::Terminal => "terminal",
            Channel::McpElicitation => "mcp-elicitation",
            Channel::Embedder => "embedder",
        }
    }
}

/// What proves a decision is an approver's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval(Proof);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Proof {
    Signed {
        signature: String,
    },
    Attested {
        principal: String,
        channel: Channel,
        /// [`call_digest`] of the record the approver was shown.
        shown: Digest,
    },
}

impl Approval {
    /// A decision signed with an approver key ([`sign`]); verified against
    /// `[approval] keys` and the stored call (the signature covers its digest).
    pub fn signed(signature: impl Into<String>) -> Self {
        Approval(Proof::Signed { signature: signature.into() })
    }
    /// A decision typed by `os_user` on an interactive terminal about the
    /// call shown there: `shown` is [`AwaitingRecord::call_digest`] of the
    /// record displayed. Refused when `[approval] keys` are configured (then
    /// only a signature counts), and an approval when the record is no
    /// longer the one shown.
    pub fn on_terminal(os_user: impl Into<String>, shown: Digest) -> Self {
        Approval(Proof::Attested { principal: os_user.into(), channel: Channel::Terminal, shown })
    }
    /// A decision the human made in MCP client `client`'s own UI about the
    /// call its prompt showed (`shown`: [`AwaitingRecord::call_digest`] of
    /// the record the prompt was built from). Refused unless
    /// `[approval] mcp_elicitation` is in effect ([`mcp_elicitation_in_effect`]),
    /// and an approval when the record is no longer the one shown.
    pub fn by_mcp_client_for(client: impl Into<String>, shown: Digest) -> Self {
        Approval(Proof::Attested { principal: client.into(), channel: Channel::McpElicitation, shown })
    }
    /// A decision made in an embedding runtime's approval UI by `principal`
    /// about the call it showed: `shown` is [`AwaitingRecord::call_digest`]
    /// of the record it displayed (read with `runtime.store().awaiting(ticket)`).
    /// An approval is refused when the record is no longer the one shown.
    pub fn by_embedder(principal: impl Into<String>, shown: Digest) -> Self {
        Approval(Proof::Attested { principal: principal.into(), channel: Channel::Embedder, shown })
    }

    /// Whether the decision is made inside the agent's conversation (MCP
    /// elicitation, an embedder's dialog), so its result goes straight back
    /// there; out-of-band decisions (a signature, a terminal) leave the result
    /// for the agent's identical retry.
    pub fn in_conversation(&self) -> bool {
        matches!(&self.0, Proof::Attested { channel: Channel::McpElicitation | Channel::Embedder, .. })
    }
}

/// Why an approval was refused. Nothing was claimed or run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalError {
    /// A signature was given but the host trusts no approver key.
    #[error(
        "no approver keys are configured; add `[approval] keys = [\"ed25519:…\"]` (from `toolgate keygen`) to the config"
    )]
    NoApproverKeys,
    /// The signature is not one.
    #[error("the approval signature is malformed; sign again with `toolgate approve TICKET --key FILE`")]
    Malformed,
    /// No trusted approver key signed this decision on this exact call.
    #[error(
        "the approval signature does not verify against any key in `[approval] keys` for this ticket, call and decision"
    )]
    Untrusted,
    /// Approver keys are configured, so a terminal confirmation does not count.
    #[error("`[approval] keys` are configured: decide with an approver key (`--key FILE`)")]
    KeyRequired,
    /// An answer in an MCP client's UI, where `[approval] mcp_elicitation` is
    /// not in effect (off by default when approver keys are configured).
    #[error(
        "an answer in an MCP client's UI does not decide tickets here (`[approval] mcp_elicitation` is off, the \
         default with `[approval] keys`): decide with `toolgate approve TICKET` (`--key FILE` with an approver key), \
         or set `[approval] mcp_elicitation = true` to trust the MCP client's UI as well"
    )]
    ElicitationNotTrusted,
    /// The pending record is not the one the approver was shown: something
    /// wrote the journal while the human read it. Nothing was claimed; the
    /// ticket stays pending, holding what the journal now says.
    #[error(
        "ticket `{ticket}`: the request changed since it was shown to the approver (toolgate never changes a \
         pending request: something else wrote the journal); nothing was approved or run and the request is \
         still pending — look at it again before deciding, and check who can write the journal"
    )]
    ChangedSinceShown {
        /// The ticket.
        ticket: String,
    },
    /// The decider was not an approver of the ask when the call asked
    /// (another config's key or channel, a key added since). Nothing was
    /// claimed; the ticket stays pending.
    #[error(
        "ticket `{ticket}` (request `{request}`) was asked for {raised_for}; {who} was not an approver of it when \
         it was asked, so it decides nothing (who may decide an ask is fixed when the call asks: a key added to \
         `[approval] keys` since, another config's keys, or a terminal or MCP client where keys were configured, \
         decide nothing). Nothing was claimed and the request is still pending: decide it as one of those \
         approvers, with the config it was asked under, or let it expire and make the call again"
    )]
    NotAnApproverOfTheAsk {
        /// The ticket.
        ticket: String,
        /// The request (call id).
        request: String,
        /// [`Approvers::describe`] of the ask's approvers.
        raised_for: String,
        /// Who tried to decide.
        who: String,
    },
    /// The ask was journaled by a toolgate that did not record its approvers
    /// (before the journal was migrated): it can be denied, not approved.
    #[error(
        "ticket `{ticket}` (request `{request}`) was asked before toolgate recorded who may approve an ask, so it \
         cannot be approved: nothing was claimed and the request is still pending. Deny it (`toolgate deny \
         {ticket}`) or let it expire, and make the call again to be asked anew"
    )]
    AskedBeforeApproversWereRecorded {
        /// The ticket.
        ticket: String,
        /// The request (call id).
        request: String,
    },
    /// This process has never read a configured credential, and the Tool
    /// receives something from outside its arguments (a directory, a host,
    /// an `env` grant, pinned data, committed state): no check could vouch
    /// for what it passes, so the approved call would run failed closed and
    /// spend the single-use ticket on that. Nothing was claimed; the ticket
    /// stays pending for a process that can read it.
    #[error(
        "ticket `{ticket}` (request `{request}`): this process cannot read {why}, so the approved call would run \
         with its files and requests refused and its output withheld. Nothing was decided and the request is \
         still pending: approve it from a process that can read the credential (the environment `toolgate \
         serve` runs in)"
    )]
    CredentialUnreadable {
        /// The ticket.
        ticket: String,
        /// The request (call id).
        request: String,
        /// Each credential, why it cannot be read and the fix.
        why: String,
    },
}

/// Whether an answer in an MCP client's own UI (elicitation) decides tickets:
/// `setting` (`[approval] mcp_elicitation`) when given, else only when no
/// approver keys are configured — keys mean only a key holder decides, since
/// an agent with a shell can run an MCP client of its own and answer its own
/// ask; an operator who trusts the client's UI as well opts in.
pub fn mcp_elicitation_in_effect(setting: Option<bool>, keys: &TrustedKeys) -> bool {
    setting.unwrap_or_else(|| keys.is_empty())
}

/// The digest of the exact call a ticket stands for: what an approver signs,
/// or names when deciding through a channel.
pub fn call_digest(r: &AwaitingRecord) -> Digest {
    let fields = [
        r.ticket_id.as_str(),
        r.run_id.as_str(),
        r.agent.as_str(),
        r.call_id.as_str(),
        r.tool_id.as_str(),
        // The text the approver reads, beside the digest the gate checks.
        r.arguments.as_str(),
        r.argument_digest.as_str(),
        &r.component_digest.hex(),
        &r.expires_at.to_string(),
        // The authority the call asked under is part of what is approved.
        r.restriction.as_deref().unwrap_or(""),
        // And who it was asked of.
        r.approvers.as_deref().unwrap_or(""),
    ];
    // Length-prefixed, so no two different calls share a digest by moving a separator.
    let mut buf = Vec::new();
    for f in fields {
        buf.extend_from_slice(&(f.len() as u64).to_le_bytes());
        buf.extend_from_slice(f.as_bytes());
    }
    Digest::of(&buf)
}

impl AwaitingRecord {
    /// [`call_digest`] of this record: what an approval of the call it
    /// shows names (`Approval::by_embedder(who, record.call_digest())`).
    pub fn call_digest(&self) -> Digest {
        call_digest(self)
    }
}

fn message(r: &AwaitingRecord, decision: &Decision) -> Vec<u8> {
    format!("{}\n{}\n{}", r.ticket_id, call_digest(r).hex(), decision.signed_line()).into_bytes()
}

/// Sign `decision` on the call `record` stands for with an approver key.
pub fn sign(key: &SecretKey, record: &AwaitingRecord, decision: &Decision) -> String {
    key.sign(DOMAIN, &message(record, decision))
}

/// Check `approval` for `decision` on `record`, with `keys` the host's
/// `[approval] keys` and `mcp_elicitation` whether an MCP client's UI
/// decides (see [`mcp_elicitation_in_effect`]); returns who decided, as the journal
/// records it. An approval must name `record` as shown (its signature, or the
/// channel's shown digest); a denial need not: it blocks whatever the ticket
/// holds, never more than the approver wanted, and refusing it would leave a
/// rewritten call pending. Either must come from an approver of the ask as
/// it was asked ([`Approvers`], kept with `record`) as well as of `keys` and
/// `mcp_elicitation`; a record with none kept (asked before they were) can
/// be denied under `keys` and `mcp_elicitation` alone, never approved.
pub fn verify(
    approval: &Approval,
    record: &AwaitingRecord,
    decision: &Decision,
    keys: &TrustedKeys,
    mcp_elicitation: bool,
    now: i64,
) -> Result<ApprovedBy, ApprovalError> {
    let (principal, channel) = match &approval.0 {
        Proof::Signed { signature } => {
            if keys.is_empty() {
                return Err(ApprovalError::NoApproverKeys);
            }
            let key = keys.verify(DOMAIN, &message(record, decision), signature).map_err(|e| match e {
                VerifyError::Malformed => ApprovalError::Malformed,
                VerifyError::Untrusted => ApprovalError::Untrusted,
            })?;
            (key, Channel::Signature)
        }
        Proof::Attested { channel: Channel::Terminal, .. } if !keys.is_empty() => {
            return Err(ApprovalError::KeyRequired);
        }
        Proof::Attested { channel: Channel::McpElicitation, .. } if !mcp_elicitation => {
            return Err(ApprovalError::ElicitationNotTrusted);
        }
        Proof::Attested { principal, channel, shown } => {
            if matches!(decision, Decision::Approve) && *shown != call_digest(record) {
                return Err(ApprovalError::ChangedSinceShown { ticket: record.ticket_id.clone() });
            }
            (principal.clone(), channel.clone())
        }
    };
    asked_of(record, decision, &principal, &channel)?;
    Ok(ApprovedBy { principal, channel: channel.as_str().to_owned(), at: now })
}

/// Whether `principal`, deciding through `channel`, was an approver of the
/// ask `record` when the call asked.
fn asked_of(
    record: &AwaitingRecord,
    decision: &Decision,
    principal: &str,
    channel: &Channel,
) -> Result<(), ApprovalError> {
    let (ticket, request) = (record.ticket_id.clone(), record.call_id.clone());
    let Some(text) = record.approvers.as_deref() else {
        return match decision {
            Decision::Deny { .. } => Ok(()),
            Decision::Approve => Err(ApprovalError::AskedBeforeApproversWereRecorded { ticket, request }),
        };
    };
    let (raised_for, allowed) = match Approvers::parse(text) {
        Some(set) => (set.describe(), set.allow(principal, channel)),
        None => ("approvers this toolgate cannot read".to_owned(), false),
    };
    if allowed {
        return Ok(());
    }
    let who = match channel {
        Channel::Signature => format!("approver key {principal}"),
        Channel::Terminal => "a confirmation on a terminal".to_owned(),
        Channel::McpElicitation => "an answer in an MCP client's UI".to_owned(),
        Channel::Embedder => format!("embedder {principal}"),
    };
    Err(ApprovalError::NotAnApproverOfTheAsk { ticket, request, raised_for, who })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AwaitingRecord {
        AwaitingRecord {
            ticket_id: "tkt-1".into(),
            run_id: "run-1".into(),
            agent: "default".into(),
            call_id: "call-1".into(),
            tool_id: "notes".into(),
            arguments: r#"{"op":"add"}"#.into(),
            argument_digest: "a".repeat(64),
            component_digest: Digest::of(b"c"),
            expires_at: 100,
            requested_at: 1,
            state: "pending".into(),
            restriction: None,
            // Asked of a terminal and an MCP client's UI (no keys).
            approvers: Some(Approvers::in_force(&TrustedKeys::default(), true).to_text()),
        }
    }

    /// `record()` asked of `keys`, and of an MCP client's UI if `mcp`.
    fn asked(keys: &TrustedKeys, mcp: bool) -> AwaitingRecord {
        AwaitingRecord { approvers: Some(Approvers::in_force(keys, mcp).to_text()), ..record() }
    }

    fn approver() -> (SecretKey, String) {
        let (secret, public) = crate::keys::keygen().unwrap();
        (SecretKey::parse(&secret).unwrap(), public)
    }

    /// `record()` with one field of the call changed, each way.
    fn others() -> Vec<AwaitingRecord> {
        let mut others = Vec::new();
        for change in 0..9 {
            let mut o = record();
            match change {
                0 => o.ticket_id = "tkt-2".into(),
                1 => o.argument_digest = "b".repeat(64),
                2 => o.component_digest = Digest::of(b"d"),
                3 => o.tool_id = "notes2".into(),
                4 => o.arguments = r#"{"op":"clear"}"#.into(),
                5 => o.restriction = Some("[]".into()),
                6 => o.agent = "other".into(),
                // The same approvers written otherwise: still another record.
                7 => o.approvers = Some(r#"{"mcp_elicitation":true,"terminal":true,"keys":[]}"#.into()),
                _ => o.run_id = "run-2".into(),
            }
            others.push(o);
        }
        others
    }

    #[test]
    fn a_signature_approves_exactly_its_call_and_decision() {
        let (secret, public) = crate::keys::keygen().unwrap();
        let key = SecretKey::parse(&secret).unwrap();
        let keys = TrustedKeys::parse(std::slice::from_ref(&public)).unwrap();
        let r = asked(&keys, false);
        let sig = sign(&key, &r, &Decision::Approve);
        let by = verify(&Approval::signed(&sig), &r, &Decision::Approve, &keys, true, 7).unwrap();
        assert_eq!(by, ApprovedBy { principal: public, channel: "signature".into(), at: 7 });
        // The same signature does not deny, nor approve another call, ticket or component.
        let deny = Decision::Deny { reason: "no".into() };
        assert_eq!(verify(&Approval::signed(&sig), &r, &deny, &keys, true, 7), Err(ApprovalError::Untrusted));
        for o in others() {
            assert_eq!(
                verify(&Approval::signed(&sig), &o, &Decision::Approve, &keys, true, 7),
                Err(ApprovalError::Untrusted)
            );
        }
        // A key the host does not list.
        let (other, _) = crate::keys::keygen().unwrap();
        let foreign = sign(&SecretKey::parse(&other).unwrap(), &r, &Decision::Approve);
        assert_eq!(
            verify(&Approval::signed(foreign), &r, &Decision::Approve, &keys, true, 7),
            Err(ApprovalError::Untrusted)
        );
        assert_eq!(
            verify(&Approval::signed("x"), &r, &Decision::Approve, &keys, true, 7),
            Err(ApprovalError::Malformed)
        );
        // No keys configured: a signature cannot be checked, so it is refused.
        let none = TrustedKeys::default();
        assert_eq!(
            verify(&Approval::signed(&sig), &r, &Decision::Approve, &none, true, 7),
            Err(ApprovalError::NoApproverKeys)
        );
    }

    #[test]
    fn a_terminal_counts_only_without_keys_and_channels_are_recorded() {
        let r = record();
        let (_, public) = crate::keys::keygen().unwrap();
        let keys = TrustedKeys::parse(&[public]).unwrap();
        let none = TrustedKeys::default();
        let tty = Approval::on_terminal("alice", r.call_digest());
        assert_eq!(verify(&tty, &r, &Decision::Approve, &keys, false, 1), Err(ApprovalError::KeyRequired));
        let by = verify(&tty, &r, &Decision::Approve, &none, true, 1).unwrap();
        assert_eq!((by.principal.as_str(), by.channel.as_str()), ("alice", "terminal"));
        let by =
            verify(&Approval::by_embedder("ui:bob", r.call_digest()), &r, &Decision::Approve, &keys, false, 1).unwrap();
        assert_eq!(by.channel, "embedder");
    }

    #[test]
    fn a_channel_approves_only_the_call_it_showed_and_denies_whatever_the_ticket_holds() {
        let shown = record().call_digest();
        let none = TrustedKeys::default();
        let deny = Decision::Deny { reason: "no".into() };
        let channels = [
            Approval::on_terminal("alice", shown),
            Approval::by_embedder("ui:bob", shown),
            Approval::by_mcp_client_for("stdio", shown),
        ];
        for approval in &channels {
            for o in others() {
                assert_eq!(
                    verify(approval, &o, &Decision::Approve, &none, true, 1),
                    Err(ApprovalError::ChangedSinceShown { ticket: o.ticket_id.clone() }),
                    "{approval:?} on {o:?}"
                );
                // A denial blocks the call the ticket now holds: never more than was wanted.
                assert!(verify(approval, &o, &deny, &none, true, 1).is_ok());
            }
            assert!(verify(approval, &record(), &Decision::Approve, &none, true, 1).is_ok());
        }
        // The error names the ticket and says what happened.
        let e = verify(&channels[0], &others()[1], &Decision::Approve, &none, true, 1).unwrap_err().to_string();
        assert!(e.contains("tkt-1") && e.contains("changed since it was shown") && e.contains("still pending"), "{e}");
    }

    #[test]
    fn with_keys_an_mcp_elicitation_decides_only_when_opted_in() {
        let r = record();
        let (_, public) = crate::keys::keygen().unwrap();
        let keys = TrustedKeys::parse(&[public]).unwrap();
        let none = TrustedKeys::default();
        let deny = Decision::Deny { reason: "no".into() };
        // The effective setting: explicit when given, else on only without keys.
        assert!(mcp_elicitation_in_effect(None, &none));
        assert!(!mcp_elicitation_in_effect(None, &keys));
        assert!(mcp_elicitation_in_effect(Some(true), &keys));
        assert!(!mcp_elicitation_in_effect(Some(false), &none));
        // With keys and no opt-in: whatever client answered (an agent can run
        // its own), neither an approval nor a denial counts.
        let agent = Approval::by_mcp_client_for("Claude Desktop", r.call_digest());
        for d in [&Decision::Approve, &deny] {
            assert_eq!(
                verify(&agent, &r, d, &keys, mcp_elicitation_in_effect(None, &keys), 1),
                Err(ApprovalError::ElicitationNotTrusted)
            );
            assert_eq!(verify(&agent, &r, d, &none, false, 1), Err(ApprovalError::ElicitationNotTrusted));
        }
        // Without keys it decides, and so it does with keys when opted in;
        // the journal records the channel and the client.
        for k in [&none, &keys] {
            let on = mcp_elicitation_in_effect(if k.is_empty() { None } else { Some(true) }, k);
            let by = verify(&agent, &r, &Decision::Approve, k, on, 1).unwrap();
            assert_eq!((by.principal.as_str(), by.channel.as_str()), ("Claude Desktop", "mcp-elicitation"));
        }
    }

    /// F1: a process handed another config (the operator's journal, its own
    /// `[approval] keys`, or none) decides nothing the operator's host asked;
    /// a key added later decides only asks made after; a key removed stops
    /// at once. Fails on the previous code, which checked the deciding
    /// process's keys only.
    #[test]
    fn an_ask_is_decided_only_by_an_approver_in_force_when_it_was_asked() {
        let (operator, operator_pub) = approver();
        let (agent, agent_pub) = approver();
        let (later, later_pub) = approver();
        let keys = |k: &[&String]| TrustedKeys::parse(&k.iter().map(|s| (*s).clone()).collect::<Vec<_>>()).unwrap();
        let deny = Decision::Deny { reason: "no".into() };
        // Asked by the operator's host: its key only, no MCP client.
        let r = asked(&keys(&[&operator_pub]), false);
        let ok = |k: &SecretKey, config: &TrustedKeys, d: &Decision| {
            verify(&Approval::signed(sign(k, &r, d)), &r, d, config, false, 1)
        };
        assert!(ok(&operator, &keys(&[&operator_pub]), &Decision::Approve).is_ok());
        for d in [&Decision::Approve, &deny] {
            // The agent's copy of the config, listing its own key.
            let e = ok(&agent, &keys(&[&agent_pub]), d).unwrap_err();
            assert!(matches!(e, ApprovalError::NotAnApproverOfTheAsk { .. }), "{e:?}");
            let text = e.to_string();
            assert!(
                text.contains("tkt-1")
                    && text.contains("call-1")
                    && text.contains(&operator_pub)
                    && text.contains(&agent_pub)
                    && text.contains("still pending"),
                "{text}"
            );
            // A key added to the operator's config since.
            let e = ok(&later, &keys(&[&operator_pub, &later_pub]), d).unwrap_err();
            assert!(matches!(e, ApprovalError::NotAnApproverOfTheAsk { .. }), "{e:?}");
            // A key removed from the config stops deciding at once.
            assert_eq!(ok(&operator, &keys(&[&later_pub]), d), Err(ApprovalError::Untrusted));
            // A config without keys: a terminal or an MCP client decides nothing asked under keys.
            let none = TrustedKeys::default();
            for channel in
                [Approval::on_terminal("agent", r.call_digest()), Approval::by_mcp_client_for("stdio", r.call_digest())]
            {
                let e = verify(&channel, &r, d, &none, true, 1).unwrap_err();
                assert!(matches!(e, ApprovalError::NotAnApproverOfTheAsk { .. }), "{channel:?}: {e:?}");
            }
            // Nor with keys and the MCP client opted in, where the ask was not.
            let e =
                verify(&Approval::by_mcp_client_for("stdio", r.call_digest()), &r, d, &keys(&[&operator_pub]), true, 1)
                    .unwrap_err();
            assert!(matches!(e, ApprovalError::NotAnApproverOfTheAsk { .. }), "{e:?}");
        }
        // Asked without keys: a config that lists keys since decides it by no
        // signature (the strict rule); the terminal it was asked of, without keys, does.
        let open = asked(&TrustedKeys::default(), true);
        let sig = sign(&operator, &open, &Decision::Approve);
        let e =
            verify(&Approval::signed(sig), &open, &Decision::Approve, &keys(&[&operator_pub]), false, 1).unwrap_err();
        assert!(matches!(e, ApprovalError::NotAnApproverOfTheAsk { .. }), "{e:?}");
        let tty = Approval::on_terminal("alice", open.call_digest());
        assert!(verify(&tty, &open, &Decision::Approve, &TrustedKeys::default(), true, 1).is_ok());
        // Approvers that cannot be read allow nobody.
        let garbled = AwaitingRecord { approvers: Some("{".into()), ..open.clone() };
        let tty = Approval::on_terminal("alice", garbled.call_digest());
        let e = verify(&tty, &garbled, &Decision::Approve, &TrustedKeys::default(), true, 1).unwrap_err();
        assert!(matches!(e, ApprovalError::NotAnApproverOfTheAsk { .. }), "{e:?}");
        // The approvers are part of what is signed and shown: rewriting them voids both.
        let widened =
            AwaitingRecord { approvers: Some(Approvers::in_force(&keys(&[&agent_pub]), true).to_text()), ..r.clone() };
        assert_ne!(widened.call_digest(), r.call_digest());
        let sig = sign(&operator, &r, &Decision::Approve);
        assert_eq!(
            verify(&Approval::signed(sig), &widened, &Decision::Approve, &keys(&[&operator_pub]), false, 1),
            Err(ApprovalError::Untrusted)
        );
    }

    /// An ask journaled before approvers were recorded (a migrated journal)
    /// can be denied under the deciding config, never approved.
    #[test]
    fn an_ask_from_before_approvers_were_recorded_can_be_denied_not_approved() {
        let (operator, operator_pub) = approver();
        let keys = TrustedKeys::parse(&[operator_pub]).unwrap();
        let old = AwaitingRecord { approvers: None, ..asked(&keys, false) };
        let deny = Decision::Deny { reason: "stale".into() };
        let approve = verify(
            &Approval::signed(sign(&operator, &old, &Decision::Approve)),
            &old,
            &Decision::Approve,
            &keys,
            false,
            1,
        );
        assert_eq!(
            approve,
            Err(ApprovalError::AskedBeforeApproversWereRecorded { ticket: "tkt-1".into(), request: "call-1".into() })
        );
        assert!(approve.unwrap_err().to_string().contains("make the call again"));
        assert!(verify(&Approval::signed(sign(&operator, &old, &deny)), &old, &deny, &keys, false, 1).is_ok());
        // Still under the deciding config: a terminal does not deny where keys are configured.
        let tty = Approval::on_terminal("x", old.call_digest());
        assert_eq!(verify(&tty, &old, &deny, &keys, false, 1), Err(ApprovalError::KeyRequired));
    }
}
