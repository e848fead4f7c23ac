//! Gate: the permission decision on one exact call, and the only way to an
//! executable call.
//!
//! Owns [`ToolPermissionVerdict`] and [`AllowedCall`]. The gate is pure and
//! synchronous: it reads the agent's policy and narrowing and the call's tool
//! id and arguments, and returns Allow, Deny or RequireConfirmation.
//!
//! Architecture invariant: [`AllowedCall`] has private fields and is built in
//! exactly one place, `GateOutcome::from_verdict` (crate-private), from
//! `ToolPermissionVerdict::Allow`; outside the crate the only way to one is
//! [`GateOutcome::decide`], which runs the gate on the exact call. The
//! executor accepts nothing else, so no other path — visibility,
//! availability, health, a resumed ticket, an embedder — can run a Tool
//! without the gate's Allow:
//!
//! ```compile_fail,E0451
//! // Forging an AllowedCall outside the gate does not compile: its fields are private.
//! fn forge<'a>(
//!     candidate: &'a toolgate::snapshot::Candidate,
//!     call: &'a toolgate::policy::gate::ToolCall,
//! ) -> toolgate::policy::gate::AllowedCall<'a> {
//!     toolgate::policy::gate::AllowedCall { candidate, call, arguments_json: "{}".into() }
//! }
//! ```
//!
//! ```compile_fail,E0624
//! // Nor does turning a verdict written by hand (or decided on another call) into one.
//! fn forge<'a>(
//!     candidate: &'a toolgate::snapshot::Candidate,
//!     call: &'a toolgate::policy::gate::ToolCall,
//! ) -> toolgate::policy::gate::GateOutcome<'a> {
//!     toolgate::policy::gate::GateOutcome::from_verdict(toolgate::policy::gate::ToolPermissionVerdict::Allow, candidate, call)
//! }
//! ```

use std::sync::Arc;

use serde_json::Value;

use crate::authority::narrowing::ToolCapabilityNarrowing;
use crate::policy::Behavior;
use crate::snapshot::{Candidate, ExecutableAgentSnapshot};
use crate::store::ClaimedTicket;

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
        return ToolPermissionVerdict::Deny { reason: "tools are disabled for this run (narrowing deny-all)".into() };
    }
    if let Some(skill) = snapshot.skill_excluding(&call.tool_id) {
        return ToolPermissionVerdict::Deny {
            reason: format!("`{}` is not in the allowed-tools of skill `{skill}`, active in this run", call.tool_id),
        };
    }
    let d = candidate.descriptor();
    let policy = snapshot.policy();
    let (behavior, rule) =
        policy.decide(&call.tool_id, candidate.rules(policy), d.primary_argument.as_deref(), &call.arguments);
    match behavior {
        Behavior::Allow => ToolPermissionVerdict::Allow,
        Behavior::Deny => {
            let by = match rule {
                Some(rule) => format!("rule `{rule}`"),
                None => "the agent's default".to_owned(),
            };
            ToolPermissionVerdict::Deny {
                reason: format!("`{}` is denied by {by} of agent `{}`", call.tool_id, snapshot.agent()),
            }
        }
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

/// A call the gate allowed. Only `GateOutcome::from_verdict` builds one;
/// it borrows the call and the Tool it was decided on, so it cannot outlive
/// either.
#[derive(Debug)]
pub struct AllowedCall<'a> {
    candidate: &'a Candidate,
    call: &'a ToolCall,
    /// `call.arguments` as JSON text, as the guest receives them and the journal keeps them.
    arguments_json: Arc<str>,
}

impl<'a> AllowedCall<'a> {
    /// The call.
    pub fn call(&self) -> &'a ToolCall {
        self.call
    }
    /// The Tool and the authority it may hold.
    pub fn candidate(&self) -> &'a Candidate {
        self.candidate
    }
    /// The call's arguments as JSON text.
    pub fn arguments_json(&self) -> &Arc<str> {
        &self.arguments_json
    }
}

/// What the runtime does next.
#[derive(Debug)]
pub enum GateOutcome<'a> {
    /// Run it.
    Execute(AllowedCall<'a>),
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

impl<'a> GateOutcome<'a> {
    /// The gate on `call` of `candidate` in `snapshot` ([`decide`]), and what
    /// follows from its verdict: for an embedder that runs the executor
    /// itself, the only way to an [`AllowedCall`]. `candidate` must be what
    /// `snapshot.candidate(&call.tool_id, …)` returned; anything else is
    /// blocked.
    pub fn decide(snapshot: &ExecutableAgentSnapshot, candidate: &'a Candidate, call: &'a ToolCall) -> Self {
        // The snapshot's own candidate for the call's Tool, not a copy with
        // another Tool's component or grant put in (a `Candidate` is `Clone`
        // with public fields), nor one of another Tool.
        let own = snapshot.kept(&call.tool_id).and_then(Result::ok).is_some_and(|c| std::ptr::eq(&*c, candidate));
        if !own {
            return GateOutcome::Blocked {
                reason: format!(
                    "`{}`: the candidate given is not the one this snapshot found for the call's Tool",
                    call.tool_id
                ),
            };
        }
        Self::from_verdict(decide(snapshot, candidate, call), candidate, call)
    }

    /// The only place an [`AllowedCall`] is made: from `Allow`. Crate-private:
    /// a verdict is not bound to its call, so one written by hand, or decided
    /// on a harmless call, must not become another's `AllowedCall`.
    pub(crate) fn from_verdict(verdict: ToolPermissionVerdict, candidate: &'a Candidate, call: &'a ToolCall) -> Self {
        match verdict {
            ToolPermissionVerdict::Allow => {
                let arguments_json = with_json(&call.arguments, |t| Arc::from(t));
                GateOutcome::Execute(AllowedCall { candidate, call, arguments_json })
            }
            ToolPermissionVerdict::Deny { reason } => GateOutcome::Blocked { reason },
            ToolPermissionVerdict::RequireConfirmation { correlation_id } => {
                GateOutcome::AwaitConfirmation { correlation_id }
            }
        }
    }
}

/// `value` as compact JSON text, handed to `f`: written into a buffer this
/// thread keeps, so the caller's own copy is the only allocation.
pub(crate) fn with_json<R>(value: &Value, f: impl FnOnce(&str) -> R) -> R {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUF.with(|b| match b.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            // Writing a `Value` into memory cannot fail, and its text is UTF-8.
            let _ = serde_json::to_writer(&mut *buf, value);
            let r = match std::str::from_utf8(&buf) {
                Ok(text) => f(text),
                Err(_) => f(&value.to_string()),
            };
            if buf.capacity() > 64 << 10 {
                // A huge value does not stay behind in every thread.
                *buf = Vec::new();
            }
            r
        }
        Err(_) => f(&value.to_string()),
    })
}

/// sha256 of the canonical JSON of `arguments` (object keys sorted), hex.
pub fn argument_digest(arguments: &Value) -> String {
    let mut buf = String::new();
    canonical(arguments, &mut buf);
    crate::digest::Digest::of(buf.as_bytes()).hex()
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn sha256_hex(text: &str) -> String {
        crate::digest::Digest::of(text.as_bytes()).hex()
    }

    #[test]
    fn digest_is_sha256_of_sorted_compact_json() {
        let cases = [
            (json!(null), "null"),
            (json!({}), "{}"),
            (json!([]), "[]"),
            (json!({"b": 1, "a": [true, null, "x"]}), r#"{"a":[true,null,"x"],"b":1}"#),
            (json!({"z": {"y": 1, "x": 2}, "a\"b": "q\"r"}), r#"{"a\"b":"q\"r","z":{"x":2,"y":1}}"#),
            (json!({"B": 1, "a": 2, "é": 3, "10": 4, "9": 5}), r#"{"10":4,"9":5,"B":1,"a":2,"é":3}"#),
            (json!({"n": -1.5, "m": 18446744073709551615u64}), r#"{"m":18446744073709551615,"n":-1.5}"#),
        ];
        for (value, canonical_text) in cases {
            let mut out = String::new();
            canonical(&value, &mut out);
            assert_eq!(out, canonical_text);
            assert_eq!(argument_digest(&value), sha256_hex(canonical_text), "{value}");
            assert_eq!(argument_digest(&value).len(), 64);
        }
    }

    #[test]
    fn digest_separates_lookalike_values() {
        // Pairs that a naive concatenation or a lossy encoding could confuse.
        let pairs = [
            (json!({"a": 1}), json!({"a": "1"})),
            (json!({"a": 1}), json!({"a": 1.0})),
            (json!({"a": [1, 2]}), json!({"a": [2, 1]})),
            (json!({"a": {"b": 1}}), json!({"a.b": 1})),
            (json!(["a,b"]), json!(["a", "b"])),
            (json!({"a": "x", "b": "y"}), json!({"a": "x\",\"b\":\"y"})),
            (json!(null), json!({})),
            (json!({}), json!([])),
            (json!({"a": null}), json!({})),
            (json!(""), json!(null)),
            (json!(true), json!("true")),
            (json!({"path": "data/x"}), json!({"path": "data/x "})),
        ];
        for (a, b) in pairs {
            assert_ne!(argument_digest(&a), argument_digest(&b), "{a} vs {b}");
        }
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// An object's entries (unique keys) and a permutation of them.
    fn entries_and_permutation() -> impl Strategy<Value = (Vec<(String, Value)>, Vec<(String, Value)>)> {
        proptest::collection::btree_map(".{0,6}", json_value(), 0..8).prop_flat_map(|m| {
            let entries: Vec<(String, Value)> = m.into_iter().collect();
            (Just(entries.clone()), Just(entries).prop_shuffle())
        })
    }

    /// JSON text of an object with its keys in exactly the given order.
    fn object_text(entries: &[(String, Value)]) -> String {
        let fields: Vec<String> = entries.iter().map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v)).collect();
        format!("{{{}}}", fields.join(","))
    }

    proptest! {
        #[test]
        fn digest_ignores_key_order((entries, permuted) in entries_and_permutation()) {
            let a: Value = serde_json::from_str(&object_text(&entries)).unwrap();
            let b: Value = serde_json::from_str(&object_text(&permuted)).unwrap();
            prop_assert_eq!(argument_digest(&a), argument_digest(&b));
            // Built in either insertion order, too.
            let c = Value::Object(permuted.into_iter().collect());
            prop_assert_eq!(argument_digest(&a), argument_digest(&c));
            // Nested one level down, as well.
            let outer_a = json!({"x": a, "y": [c]});
            let outer_b = json!({"y": [b.clone()], "x": b});
            prop_assert_eq!(argument_digest(&outer_a), argument_digest(&outer_b));
        }

        #[test]
        fn digest_survives_a_journal_round_trip(v in json_value()) {
            // The runtime stores arguments as JSON text and re-reads them on resume.
            let back: Value = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
            prop_assert_eq!(argument_digest(&back), argument_digest(&v));
            // The canonical text is itself JSON for the same value.
            let mut text = String::new();
            canonical(&v, &mut text);
            prop_assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
        }

        #[test]
        fn digest_differs_for_different_values(a in json_value(), b in json_value()) {
            prop_assume!(a != b);
            prop_assert_ne!(argument_digest(&a), argument_digest(&b));
        }
    }
}
