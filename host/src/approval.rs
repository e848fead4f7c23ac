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
//! Architecture invariant: nothing here reads a model's or a Tool's output;
//! a decision is verified against the stored Awaiting record before the
//! ticket is claimed, so a refused approval changes nothing.

use crate::digest::Digest;
use crate::keys::{SecretKey, TrustedKeys, VerifyError};
use crate::store::{ApprovedBy, AwaitingRecord};

/// What an approval signature signs, before the message.
const DOMAIN: &[u8] = b"toolgate-approval-v1\n";

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
/// rewritten call pending.
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
    Ok(ApprovedBy { principal, channel: channel.as_str().to_owned(), at: now })
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
        }
    }

    /// `record()` with one field of the call changed, each way.
    fn others() -> Vec<AwaitingRecord> {
        let mut others = Vec::new();
        for change in 0..8 {
            let mut o = record();
            match change {
                0 => o.ticket_id = "tkt-2".into(),
                1 => o.argument_digest = "b".repeat(64),
                2 => o.component_digest = Digest::of(b"d"),
                3 => o.tool_id = "notes2".into(),
                4 => o.arguments = r#"{"op":"clear"}"#.into(),
                5 => o.restriction = Some("[]".into()),
                6 => o.agent = "other".into(),
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
        let r = record();
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
}
