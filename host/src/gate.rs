//! Gate: the permission decision on one exact call, and the only way to an
//! executable call.
//!
//! Owns [`ToolPermissionVerdict`] and [`AllowedCall`]. The gate is pure and
//! synchronous: it reads the agent's policy and narrowing and the call's tool
//! id and arguments, and returns Allow, Deny or RequireConfirmation.
//!
//! Architecture invariant: [`AllowedCall`] has private fields and is built in
//! exactly one place, [`GateOutcome::from_verdict`], from
//! `ToolPermissionVerdict::Allow`. The executor accepts nothing else, so no
//! other path — visibility, availability, health, a resumed ticket — can run
//! a Tool without the gate's Allow:
//!
//! ```compile_fail
//! # use toolgate::gate::AllowedCall;
//! // Forging an AllowedCall outside the gate does not compile.
//! let forged = AllowedCall { candidate: todo!(), call: todo!() };
//! ```

use serde_json::Value;

use crate::commit::ClaimedTicket;
use crate::narrowing::ToolCapabilityNarrowing;
use crate::policy::Behavior;
use crate::snapshot::{Candidate, ExecutableAgentSnapshot};

/// One call the model asked for: a Tool id and its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Unique id of this call (journal key).
    pub call_id: String,
    /// The Tool id.
    pub tool_id: String,
    /// Arguments; already validated against the descriptor's schema.
    pub arguments: Value,
}

/// The permission verdict on an exact call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolPermissionVerdict {
    /// Run it.
    Allow,
    /// Do not run it; the reason is model-visible.
    Deny {
        /// Why, naming the rule.
        reason: String,
    },
    /// A human must approve this exact call first.
    RequireConfirmation {
        /// Correlates the Awaiting record with the call.
        correlation_id: String,
    },
}

/// Decide a fresh call.
pub fn decide(snapshot: &ExecutableAgentSnapshot, candidate: &Candidate, call: &ToolCall) -> ToolPermissionVerdict {
    if snapshot.narrowing() == ToolCapabilityNarrowing::DenyAll {
        return ToolPermissionVerdict::Deny {
            reason: "tools are disabled for this run (narrowing deny-all)".into(),
        };
    }
    let d = candidate.descriptor();
    let decision = snapshot.policy().evaluate(&call.tool_id, d.primary_argument.as_deref(), &call.arguments);
    let by = match &decision.rule {
        Some(rule) => format!("rule `{rule}`"),
        None => "the agent's default".to_owned(),
    };
    match decision.behavior {
        Behavior::Allow => ToolPermissionVerdict::Allow,
        Behavior::Deny => ToolPermissionVerdict::Deny {
            reason: format!("`{}` is denied by {by} of agent `{}`", call.tool_id, snapshot.agent()),
        },
        Behavior::Ask => ToolPermissionVerdict::RequireConfirmation { correlation_id: call.call_id.clone() },
    }
}

/// Decide a call a human approved through `ticket`. Approval turns Ask into
/// Allow for exactly the stored call; a Deny rule or a deny-all narrowing in
/// force now still wins.
pub fn decide_resumed(
    snapshot: &ExecutableAgentSnapshot,
    candidate: &Candidate,
    call: &ToolCall,
    ticket: &ClaimedTicket,
) -> ToolPermissionVerdict {
    if ticket.tool_id() != call.tool_id
        || ticket.call_id() != call.call_id
        || ticket.argument_digest() != argument_digest(&call.arguments)
        || ticket.component_digest() != &candidate.installed.component.digest
    {
        return ToolPermissionVerdict::Deny { reason: "the approved ticket does not match this call".into() };
    }
    match decide(snapshot, candidate, call) {
        ToolPermissionVerdict::RequireConfirmation { .. } | ToolPermissionVerdict::Allow => {
            ToolPermissionVerdict::Allow
        }
        deny => deny,
    }
}

/// A call the gate allowed. Only [`GateOutcome::from_verdict`] builds one.
#[derive(Debug)]
pub struct AllowedCall {
    candidate: Candidate,
    call: ToolCall,
}

impl AllowedCall {
    /// The call.
    pub fn call(&self) -> &ToolCall {
        &self.call
    }
    /// The Tool and the authority it may hold.
    pub fn candidate(&self) -> &Candidate {
        &self.candidate
    }
}

/// What the runtime does next.
#[derive(Debug)]
pub enum GateOutcome {
    /// Run it.
    Execute(AllowedCall),
    /// Commit a blocked result.
    Blocked {
        /// Model-visible reason.
        reason: String,
    },
    /// Commit an Awaiting record with a ticket.
    AwaitConfirmation {
        /// From the verdict.
        correlation_id: String,
    },
}

impl GateOutcome {
    /// The only place an [`AllowedCall`] is made: from `Allow`.
    pub fn from_verdict(verdict: ToolPermissionVerdict, candidate: Candidate, call: ToolCall) -> Self {
        match verdict {
            ToolPermissionVerdict::Allow => GateOutcome::Execute(AllowedCall { candidate, call }),
            ToolPermissionVerdict::Deny { reason } => GateOutcome::Blocked { reason },
            ToolPermissionVerdict::RequireConfirmation { correlation_id } => {
                GateOutcome::AwaitConfirmation { correlation_id }
            }
        }
    }
}

/// sha256 of the canonical JSON of `arguments` (object keys sorted), hex.
pub fn argument_digest(arguments: &Value) -> String {
    let mut buf = String::new();
    canonical(arguments, &mut buf);
    crate::catalog::Digest::of(buf.as_bytes()).hex()
}

fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&map[k], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}
