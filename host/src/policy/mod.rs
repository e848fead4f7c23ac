//! Policy: `allow` / `ask` / `deny` rules and their evaluation against one
//! exact Tool call (tool id + JSON arguments); the [`gate`] turns the result
//! into the one verdict that may execute.
//!
//! This module owns the matching semantics and the choice of the deciding
//! rule; the private `rules` module owns the grammar and parsing. It never executes anything,
//! never looks at component or executor state, and never turns a failed match
//! into `Allow`: with no matching rule the configured default decides.
//! Patterns come from a configuration file and arguments from a model, so
//! neither parsing nor evaluation may panic.
//!
//! # Pattern grammar
//!
//! ```text
//! text.upper                                  exact tool id
//! text.*   *   mcp__github__*   tool.?        tool-id glob (`*` and `?`; `*` crosses `.`)
//! fs.read(data/**)                            primary-argument glob
//! fs.write(path ~ "out/**", mode = "append")  named-field conditions, ANDed
//! ```
//!
//! Tool ids are `[A-Za-z][A-Za-z0-9_.-]*`. A condition is `FIELDPATH OP VALUE` with
//! `OP` one of `~` (glob), `!~` (not glob), `=` (JSON equality), `!=` (not equal), and
//! `VALUE` a double-quoted string (escapes `\"` and `\\`), a JSON number, `true`,
//! `false` or `null`; `~` and `!~` need a string. `FIELDPATH` is a dotted path of
//! identifiers `[A-Za-z_][A-Za-z0-9_-]*` with `[N]` (index) and `[*]` (every element)
//! steps, e.g. `a.b[*].c`. Path globs (primary and `~`) use `literal_separator`: `*`
//! stays within one `/` component, `**` crosses components.
//!
//! **Conditions or primary glob.** The text in parentheses is a condition list when
//! it parses as one (e.g. `n=1`, `path ~ "x"`); otherwise it is a primary-argument
//! glob (e.g. `data/**`, `year=2024/**`, `mode=append`). So that a mistyped condition
//! never silently becomes a glob that matches nothing (a deny rule that quietly stops
//! denying), text that *starts* like a condition — a field path and an operator with
//! whitespace around the operator or a `"` right after it — must parse as conditions
//! or the rule is rejected. To glob a path that reads like a condition, put the
//! operator in a class: `year[=]2024`.
//!
//! # Matching
//!
//! - A missing field never matches, whatever the operator (also `!=` and `!~`). `~` and
//!   `!~` never match a non-string. `=` / `!=` compare JSON values; numbers compare by
//!   value (`1` equals `1.0`).
//! - Conservative quantifiers: for `deny` and `ask` rules a condition holds when ANY
//!   reading of the call satisfies it; for `allow` rules only when EVERY reading does
//!   (and there is at least one). Readings are the elements selected by `[*]`; a
//!   path is compared in one normal form (`.` / `..` segments resolved lexically,
//!   see [`normalize_path`]), so `data/../secret` is neither allowed by `data/**`
//!   nor escapes a deny on `secret/**`. Rules see the argument's text, not the
//!   filesystem: a symlink inside a grant gives one file two names, and only the
//!   grant (which directory a Tool holds) bounds the objects it reaches.
//! - Precedence is a floor, not a contest (DESIGN.md invariant 12): any
//!   matching `deny` rule decides; otherwise any matching `ask` rule decides;
//!   only then a matching `allow` rule; with no matching rule the default
//!   decides. A more specific allow never overrides an ask. Among the
//!   matching rules of the deciding kind, the one named in the decision is
//!   the most specific — more argument constraints, then exact id over id
//!   glob, then more literal characters in the id pattern — then the earlier
//!   rule (for deny rules, simply the earlier rule).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use globset::{GlobMatcher, GlobSet, GlobSetBuilder};
use serde_json::Value;

pub mod gate;
mod rules;

use rules::{IdPattern, decision_rank, parse_pattern};

/// What a rule (or the default) says about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Behavior {
    /// The call may run.
    Allow,
    /// The call needs a human's confirmation first.
    Ask,
    /// The call is refused.
    Deny,
}

/// One configured rule, as written in the configuration file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The pattern text, e.g. `fs.read(data/**)`.
    pub pattern: String,
    /// What the rule decides when it matches.
    pub behavior: Behavior,
}

/// The outcome of evaluating one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// What to do with the call.
    pub behavior: Behavior,
    /// The pattern text of the deciding rule, `None` when the default decided.
    pub rule: Option<String>,
}

/// A configuration error in a permission rule. `rule` is the 0-based index of the rule
/// in the configuration, `column` the 1-based character position in its pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The pattern is empty or only whitespace.
    #[error(
        "rule {rule} {pattern:?}: the pattern is empty; write a tool id such as `text.upper`, a glob such as `text.*`, or remove the rule"
    )]
    EmptyPattern {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
    },
    /// The tool-id part is missing or has a character that is not allowed.
    #[error("rule {rule} {pattern:?}: column {column}: {reason}")]
    InvalidToolId {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
        /// 1-based character position of the problem.
        column: usize,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A `(` has no closing `)`.
    #[error("rule {rule} {pattern:?}: column {column}: `(` is never closed; end the pattern with `)`")]
    UnclosedParenthesis {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
        /// 1-based character position of the `(`.
        column: usize,
    },
    /// Text follows the closing `)`.
    #[error(
        "rule {rule} {pattern:?}: column {column}: unexpected text after `)`; the argument part must end the pattern"
    )]
    TrailingText {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
        /// 1-based character position of the unexpected text.
        column: usize,
    },
    /// `tool()` with nothing between the parentheses.
    #[error(
        "rule {rule} {pattern:?}: column {column}: the parentheses are empty; put a path glob such as `(data/**)` or conditions such as `(path ~ \"out/**\")` inside, or drop the parentheses to match every call"
    )]
    EmptyArguments {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
        /// 1-based character position of the `(`.
        column: usize,
    },
    /// A glob (tool id, primary argument or `~` value) does not compile.
    #[error("rule {rule} {pattern:?}: column {column}: invalid glob {glob:?}: {reason}; fix the glob syntax")]
    InvalidGlob {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
        /// 1-based character position where the glob starts.
        column: usize,
        /// The glob text.
        glob: String,
        /// Why the glob does not compile.
        reason: String,
    },
    /// A condition list is malformed.
    #[error("rule {rule} {pattern:?}: column {column}: {reason}")]
    InvalidCondition {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
        /// 1-based character position of the problem.
        column: usize,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// Parsed, pre-compiled permission rules plus the default behavior.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Rules in decision order: deny rules (config order), then ask rules, then
    /// allow rules, each of the last two by specificity, then config order. The
    /// first rule in this order that matches a call decides it.
    rules: Vec<Rule>,
    /// Exact-id rules: tool id → indices into `rules`, ascending.
    exact: HashMap<Box<str>, Vec<usize>>,
    /// Id globs of the glob-id rules, in decision order.
    globs: GlobSet,
    /// Glob index in `globs` → index into `rules` (ascending).
    glob_rules: Vec<usize>,
    default: Behavior,
    /// Unique per `Policy::new` (clones share it): whose [`ToolRules`] these are.
    id: u64,
}

#[derive(Debug, Clone)]
struct Rule {
    pattern: String,
    behavior: Behavior,
    args: ArgMatch,
}

#[derive(Debug, Clone)]
enum ArgMatch {
    Any,
    Primary(GlobMatcher),
    Conditions(Box<[Condition]>),
}

#[derive(Debug, Clone)]
struct Condition {
    path: Box<[Step]>,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Field(Box<str>),
    Index(usize),
    Each,
}

#[derive(Debug, Clone)]
enum Op {
    Glob(GlobMatcher),
    NotGlob(GlobMatcher),
    Eq(Literal),
    Ne(Literal),
}

#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Str(Box<str>),
    Num(serde_json::Number),
    Bool(bool),
    Null,
}

/// How the readings of a call (elements under `[*]`, spellings of a path) combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quantifier {
    /// Deny / ask: one satisfying reading is enough to catch the call.
    Any,
    /// Allow: every reading must satisfy, so nothing outside the rule is granted.
    All,
}

impl Quantifier {
    fn of(behavior: Behavior) -> Self {
        match behavior {
            Behavior::Allow => Quantifier::All,
            Behavior::Ask | Behavior::Deny => Quantifier::Any,
        }
    }
}

impl Policy {
    /// Parse all rules; the error names the rule index (0-based, "rule N"), the pattern
    /// text, the column and what is wrong.
    ///
    /// # Errors
    ///
    /// A [`PolicyError`] for the first rule whose pattern does not parse.
    pub fn new(rules: &[RuleSpec], default: Behavior) -> Result<Policy, PolicyError> {
        let mut parsed = Vec::with_capacity(rules.len());
        for (index, spec) in rules.iter().enumerate() {
            let (id, args) = parse_pattern(&spec.pattern).map_err(|f| f.into_error(index, spec))?;
            parsed.push((index, id, Rule { pattern: spec.pattern.clone(), behavior: spec.behavior, args }));
        }
        parsed.sort_by_key(|(index, id, rule)| decision_rank(*index, id, rule));

        let mut exact: HashMap<Box<str>, Vec<usize>> = HashMap::new();
        let mut globs = GlobSetBuilder::new();
        let mut glob_rules = Vec::new();
        let mut glob_sources = Vec::new();
        let mut ordered = Vec::with_capacity(parsed.len());
        for (position, (index, id, rule)) in parsed.into_iter().enumerate() {
            match id {
                IdPattern::Exact(id) => exact.entry(id).or_default().push(position),
                IdPattern::Glob { glob, .. } => {
                    glob_sources.push((index, glob.glob().to_owned()));
                    globs.add(glob);
                    glob_rules.push(position);
                }
            }
            ordered.push(rule);
        }
        // Each glob already compiled on its own; failing here means a globset size
        // limit, reported against the rule whose glob it names.
        let globs = globs.build().map_err(|e| {
            let glob = e.glob().unwrap_or_default().to_owned();
            let rule = glob_sources.iter().find(|(_, g)| *g == glob).or(glob_sources.first()).map_or(0, |(i, _)| *i);
            PolicyError::InvalidGlob {
                rule,
                pattern: rules.get(rule).map(|r| r.pattern.clone()).unwrap_or_default(),
                column: 1,
                glob,
                reason: format!("{} (while combining all tool-id globs; use fewer or simpler id globs)", e.kind()),
            }
        })?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        Ok(Policy { rules: ordered, exact, globs, glob_rules, default, id })
    }

    /// Evaluate the exact call. `primary_argument` is the name of the top-level argument
    /// field that primary-argument globs match, if the tool declares one.
    pub fn evaluate(&self, tool_id: &str, primary_argument: Option<&str>, arguments: &Value) -> Decision {
        let (behavior, rule) = self.decide(tool_id, &self.rules_for(tool_id), primary_argument, arguments);
        Decision { behavior, rule: rule.map(str::to_owned) }
    }

    /// The rules that can decide a call of `tool_id` (its exact-id rules and
    /// the id globs that match it), in decision order: found once per Tool,
    /// so a call only matches their argument parts.
    pub fn rules_for(&self, tool_id: &str) -> ToolRules {
        let mut indices: Vec<usize> = self.exact.get(tool_id).cloned().unwrap_or_default();
        if !self.glob_rules.is_empty() {
            indices.extend(self.globs.matches(tool_id).into_iter().filter_map(|g| self.glob_rules.get(g).copied()));
        }
        // Positions in `rules` are decision order.
        indices.sort_unstable();
        ToolRules { policy: self.id, indices: indices.into() }
    }

    /// Decide a call of `tool_id`, whose rules `rules` are: its behavior and
    /// the pattern of the deciding rule (`None`: the default decided). Rules
    /// found by another policy are found again here rather than trusted.
    pub fn decide(
        &self,
        tool_id: &str,
        rules: &ToolRules,
        primary_argument: Option<&str>,
        arguments: &Value,
    ) -> (Behavior, Option<&str>) {
        if rules.policy != self.id {
            return self.decide(tool_id, &self.rules_for(tool_id), primary_argument, arguments);
        }
        let rule = rules
            .indices
            .iter()
            .filter_map(|&i| self.rules.get(i))
            .find(|rule| rule.args_match(primary_argument, arguments));
        match rule {
            Some(rule) => (rule.behavior, Some(&rule.pattern)),
            None => (self.default, None),
        }
    }
}

/// The rules of one [`Policy`] that name one Tool id, in decision order
/// ([`Policy::rules_for`]).
#[derive(Debug, Clone)]
pub struct ToolRules {
    /// Which policy found them.
    policy: u64,
    indices: Arc<[usize]>,
}

impl Rule {
    fn args_match(&self, primary_argument: Option<&str>, arguments: &Value) -> bool {
        let q = Quantifier::of(self.behavior);
        match &self.args {
            ArgMatch::Any => true,
            ArgMatch::Primary(glob) => primary_argument
                .and_then(|name| arguments.get(name))
                .and_then(Value::as_str)
                .is_some_and(|s| path_readings(s, q, |p| glob.is_match(p))),
            ArgMatch::Conditions(conds) => conds.iter().all(|c| c.holds(arguments, q)),
        }
    }
}

impl Condition {
    fn holds(&self, arguments: &Value, q: Quantifier) -> bool {
        select(arguments, &self.path, q, &|v| self.op.holds(v, q))
    }
}

impl Op {
    fn holds(&self, value: &Value, q: Quantifier) -> bool {
        match self {
            Op::Glob(g) => value.as_str().is_some_and(|s| path_readings(s, q, |p| g.is_match(p))),
            Op::NotGlob(g) => value.as_str().is_some_and(|s| path_readings(s, q, |p| !g.is_match(p))),
            Op::Eq(lit) => lit.equals(value),
            Op::Ne(lit) => !lit.equals(value),
        }
    }
}

impl Literal {
    fn equals(&self, value: &Value) -> bool {
        match (self, value) {
            (Literal::Str(a), Value::String(b)) => **a == **b,
            (Literal::Num(a), Value::Number(b)) => numbers_equal(a, b),
            (Literal::Bool(a), Value::Bool(b)) => a == b,
            (Literal::Null, Value::Null) => true,
            _ => false,
        }
    }
}

/// Compare by value so `1` and `1.0` are equal: a model may send either.
#[allow(clippy::float_cmp)]
fn numbers_equal(a: &serde_json::Number, b: &serde_json::Number) -> bool {
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        return x == y;
    }
    if let (Some(x), Some(y)) = (a.as_u64(), b.as_u64()) {
        return x == y;
    }
    if a.is_f64() || b.is_f64() {
        // Exact comparison is intended: equality, not closeness, is what a rule says.
        return matches!((a.as_f64(), b.as_f64()), (Some(x), Some(y)) if x == y);
    }
    // A negative i64 against a u64 above i64::MAX.
    false
}

/// Resolve `path` against `value` and apply `pred` to every selected value, combined
/// by `q`. A missing field, an out-of-range index or `[*]` on a non-array selects
/// nothing, and selecting nothing never satisfies.
fn select(value: &Value, path: &[Step], q: Quantifier, pred: &dyn Fn(&Value) -> bool) -> bool {
    let Some((step, rest)) = path.split_first() else {
        return pred(value);
    };
    match step {
        Step::Field(name) => value.as_object().and_then(|o| o.get(&**name)).is_some_and(|v| select(v, rest, q, pred)),
        Step::Index(i) => value.as_array().and_then(|a| a.get(*i)).is_some_and(|v| select(v, rest, q, pred)),
        Step::Each => value.as_array().is_some_and(|items| match q {
            Quantifier::Any => items.iter().any(|v| select(v, rest, q, pred)),
            Quantifier::All => !items.is_empty() && items.iter().all(|v| select(v, rest, q, pred)),
        }),
    }
}

/// Apply `test` to the one normalized spelling of path `s` (see [`normalize_path`]),
/// the same normalization rule globs get, so every spelling of a path gets one
/// verdict. (One reading: the quantifier has nothing to combine.)
fn path_readings(s: &str, _q: Quantifier, test: impl Fn(&str) -> bool) -> bool {
    test(&normalize_path(s))
}

/// The one spelling of a path that rules and arguments are compared in: a
/// leading `/` or `./` dropped (Tools read paths relative to their grants),
/// empty and `.` segments dropped (so `a//b` and `a/b/` are `a/b`), `..`
/// resolved lexically (a leading `..` kept; at the root it stays at the
/// root). The empty path is `.`. Borrowed when `s` is already normal.
pub fn normalize_path(s: &str) -> std::borrow::Cow<'_, str> {
    let normal = !s.starts_with('/')
        && !s.ends_with('/')
        && !s.is_empty()
        && s.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if normal {
        return std::borrow::Cow::Borrowed(s);
    }
    let rooted = s.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for seg in s.split('/') {
        match seg {
            "" | "." => {}
            ".." => match out.last() {
                Some(&last) if last != ".." => {
                    out.pop();
                }
                // `/..` is `/`; a relative path keeps its leading `..`.
                _ if rooted => {}
                _ => out.push(".."),
            },
            _ => out.push(seg),
        }
    }
    std::borrow::Cow::Owned(if out.is_empty() { ".".to_owned() } else { out.join("/") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    use Behavior::{Allow, Ask, Deny};

    fn specs(rules: &[(&str, Behavior)]) -> Vec<RuleSpec> {
        rules
            .iter()
            .map(|(pattern, behavior)| RuleSpec { pattern: (*pattern).to_owned(), behavior: *behavior })
            .collect()
    }

    fn policy(rules: &[(&str, Behavior)], default: Behavior) -> Policy {
        match Policy::new(&specs(rules), default) {
            Ok(p) => p,
            Err(e) => panic!("rules {rules:?} should parse: {e}"),
        }
    }

    /// One evaluation case: rules, default, call, and the expected decision.
    struct Case {
        name: &'static str,
        rules: &'static [(&'static str, Behavior)],
        default: Behavior,
        tool: &'static str,
        primary: Option<&'static str>,
        args: Value,
        want: Behavior,
        /// Pattern of the deciding rule; `None` for the default.
        by: Option<&'static str>,
    }

    fn run(cases: &[Case]) {
        for c in cases {
            let p = policy(c.rules, c.default);
            let got = p.evaluate(c.tool, c.primary, &c.args);
            let want = Decision { behavior: c.want, rule: c.by.map(str::to_owned) };
            assert_eq!(got, want, "case {:?}: {} {}", c.name, c.tool, c.args);
        }
    }

    fn case(
        name: &'static str,
        rules: &'static [(&'static str, Behavior)],
        tool: &'static str,
        args: Value,
        want: Behavior,
        by: Option<&'static str>,
    ) -> Case {
        Case { name, rules, default: Deny, tool, primary: Some("path"), args, want, by }
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn tool_id_patterns() {
        const EXACT: &[(&str, Behavior)] = &[("text.upper", Allow)];
        const GLOB: &[(&str, Behavior)] = &[("text.*", Allow)];
        const STAR: &[(&str, Behavior)] = &[("*", Ask)];
        const MCP: &[(&str, Behavior)] = &[("mcp__github__*", Allow)];
        const QMARK: &[(&str, Behavior)] = &[("text.?pper", Allow)];
        const SPACED: &[(&str, Behavior)] = &[("  text.upper \t", Allow)];
        let a = json!({});
        run(&[
            case("exact hit", EXACT, "text.upper", a.clone(), Allow, Some("text.upper")),
            case("exact miss", EXACT, "text.lower", a.clone(), Deny, None),
            case("exact is case sensitive", EXACT, "Text.upper", a.clone(), Deny, None),
            case("exact is not a prefix", EXACT, "text.upperx", a.clone(), Deny, None),
            case("glob hit", GLOB, "text.upper", a.clone(), Allow, Some("text.*")),
            case("glob crosses dots", GLOB, "text.a.b", a.clone(), Allow, Some("text.*")),
            case("glob miss", GLOB, "texts.upper", a.clone(), Deny, None),
            case("star matches all", STAR, "anything-1.x", a.clone(), Ask, Some("*")),
            case("mcp prefix", MCP, "mcp__github__create_issue", a.clone(), Allow, Some("mcp__github__*")),
            case("mcp other server", MCP, "mcp__gitlab__x", a.clone(), Deny, None),
            case("question mark", QMARK, "text.upper", a.clone(), Allow, Some("text.?pper")),
            case("question mark is one char", QMARK, "text.uupper", a.clone(), Deny, None),
            case("whitespace around id", SPACED, "text.upper", a.clone(), Allow, Some("  text.upper \t")),
            case("bare id ignores arguments", EXACT, "text.upper", json!([1, "x", null]), Allow, Some("text.upper")),
        ]);
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn primary_argument_glob() {
        const R: &[(&str, Behavior)] = &[("fs.read(data/**)", Allow)];
        const ONE: &[(&str, Behavior)] = &[("fs.read(data/*)", Allow)];
        const SPACED: &[(&str, Behavior)] = &[("fs.read ( data/** )", Allow)];
        const TRICKY: &[(&str, Behavior)] = &[
            ("fs.read(year=2024/**)", Allow),
            ("fs.read(mode=append)", Ask),
        ];
        run(&[
            case("deep match", R, "fs.read", json!({"path": "data/a/b.txt"}), Allow, Some("fs.read(data/**)")),
            case("other dir", R, "fs.read", json!({"path": "etc/passwd"}), Deny, None),
            case("other tool", R, "fs.write", json!({"path": "data/a"}), Deny, None),
            case("missing argument", R, "fs.read", json!({"file": "data/a"}), Deny, None),
            case("not a string", R, "fs.read", json!({"path": 7}), Deny, None),
            case("array is not a string", R, "fs.read", json!({"path": ["data/a"]}), Deny, None),
            case("arguments not an object", R, "fs.read", json!("data/a"), Deny, None),
            case("star within component", ONE, "fs.read", json!({"path": "data/a"}), Allow, Some("fs.read(data/*)")),
            case("star does not cross /", ONE, "fs.read", json!({"path": "data/a/b"}), Deny, None),
            case("whitespace trimmed", SPACED, "fs.read", json!({"path": "data/x"}), Allow, Some("fs.read ( data/** )")),
            case("key=value dir is a glob", TRICKY, "fs.read", json!({"path": "year=2024/q1"}), Allow, Some("fs.read(year=2024/**)")),
            case("unquoted word is a glob", TRICKY, "fs.read", json!({"path": "mode=append", "mode": "append"}), Ask, Some("fs.read(mode=append)")),
        ]);
        // Without a declared primary argument a primary glob never matches.
        let p = policy(R, Deny);
        assert_eq!(
            p.evaluate("fs.read", None, &json!({"path": "data/a"}))
                .behavior,
            Deny
        );
        // The declared primary name is what is looked up.
        let got = p.evaluate("fs.read", Some("file"), &json!({"file": "data/a"}));
        assert_eq!(got.rule.as_deref(), Some("fs.read(data/**)"));
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn condition_operators() {
        const GLOB: &[(&str, Behavior)] = &[(r#"fs.write(path ~ "out/**")"#, Allow)];
        const NOT_GLOB: &[(&str, Behavior)] = &[(r#"fs.write(path !~ "out/**")"#, Ask)];
        const EQ: &[(&str, Behavior)] = &[(r#"fs.write(mode = "append")"#, Allow)];
        const NE: &[(&str, Behavior)] = &[(r#"fs.write(mode != "append")"#, Ask)];
        const TWO: &[(&str, Behavior)] =
            &[(r#"fs.write(path ~ "out/**", mode = "append")"#, Allow)];
        const LITS: &[(&str, Behavior)] =
            &[("t(n = 1, f = -0.5, b = true, c = false, z = null)", Allow)];
        const NUM_NE: &[(&str, Behavior)] = &[("t(n != 3)", Allow)];
        const ESC: &[(&str, Behavior)] = &[(r#"t(s = "say \"hi\" \\o/")"#, Allow)];
        const PAREN: &[(&str, Behavior)] = &[(r#"t(s = "a)b(c", x = 1)"#, Allow)];
        const TIGHT: &[(&str, Behavior)] = &[(r#"t(a~"x*",b!~"y*",c=1,d!=2)"#, Allow)];
        let lits = json!({"n": 1, "f": -0.5, "b": true, "c": false, "z": null});
        run(&[
            case("~ hit", GLOB, "fs.write", json!({"path": "out/a/b"}), Allow, Some(GLOB[0].0)),
            case("~ miss", GLOB, "fs.write", json!({"path": "src/a"}), Deny, None),
            case("~ against number", GLOB, "fs.write", json!({"path": 3}), Deny, None),
            case("!~ hit", NOT_GLOB, "fs.write", json!({"path": "src/a"}), Ask, Some(NOT_GLOB[0].0)),
            case("!~ miss", NOT_GLOB, "fs.write", json!({"path": "out/a"}), Deny, None),
            case("!~ against number", NOT_GLOB, "fs.write", json!({"path": 3}), Deny, None),
            case("= hit", EQ, "fs.write", json!({"mode": "append"}), Allow, Some(EQ[0].0)),
            case("= miss", EQ, "fs.write", json!({"mode": "truncate"}), Deny, None),
            case("= other type", EQ, "fs.write", json!({"mode": ["append"]}), Deny, None),
            case("!= hit", NE, "fs.write", json!({"mode": "truncate"}), Ask, Some(NE[0].0)),
            case("!= other type is not equal", NE, "fs.write", json!({"mode": 5}), Ask, Some(NE[0].0)),
            case("!= miss", NE, "fs.write", json!({"mode": "append"}), Deny, None),
            case("and: both", TWO, "fs.write", json!({"path": "out/x", "mode": "append"}), Allow, Some(TWO[0].0)),
            case("and: one fails", TWO, "fs.write", json!({"path": "out/x", "mode": "truncate"}), Deny, None),
            case("literals", LITS, "t", lits, Allow, Some(LITS[0].0)),
            case("1 equals 1.0", LITS, "t", json!({"n": 1.0, "f": -0.5, "b": true, "c": false, "z": null}), Allow, Some(LITS[0].0)),
            case("bool is not string", LITS, "t", json!({"n": 1, "f": -0.5, "b": "true", "c": false, "z": null}), Deny, None),
            case("null needs null", LITS, "t", json!({"n": 1, "f": -0.5, "b": true, "c": false, "z": 0}), Deny, None),
            case("number != hit", NUM_NE, "t", json!({"n": 4}), Allow, Some(NUM_NE[0].0)),
            case("number != 3.0 miss", NUM_NE, "t", json!({"n": 3.0}), Deny, None),
            case("escapes", ESC, "t", json!({"s": "say \"hi\" \\o/"}), Allow, Some(ESC[0].0)),
            case("parens inside string", PAREN, "t", json!({"s": "a)b(c", "x": 1}), Allow, Some(PAREN[0].0)),
            case("no whitespace", TIGHT, "t", json!({"a": "x1", "b": "z", "c": 1, "d": 1}), Allow, Some(TIGHT[0].0)),
        ]);
    }

    #[test]
    fn missing_field_never_matches() {
        for (pattern, behavior) in [
            (r#"t(f ~ "*")"#, Deny),
            (r#"t(f !~ "x")"#, Deny),
            (r#"t(f = "x")"#, Deny),
            (r#"t(f != "x")"#, Deny),
            ("t(f != null)", Deny),
            (r#"t(a.f != "x")"#, Deny),
            (r#"t(a[3] != "x")"#, Deny),
            (r#"t(a[*].f != "x")"#, Deny),
            (r#"t(f != "x")"#, Allow),
            (r#"t(a[*].f != "x")"#, Allow),
        ] {
            let p = policy(&[(pattern, behavior)], Ask);
            for args in [json!({}), json!({"a": {"g": 1}}), json!({"a": [{"g": 1}]}), json!(null)] {
                let got = p.evaluate("t", None, &args);
                assert_eq!(got, Decision { behavior: Ask, rule: None }, "{pattern} on {args}");
            }
        }
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn nested_paths() {
        const DEEP: &[(&str, Behavior)] = &[(
            r#"http.get(request.url ~ "https://api.github.com/**")"#,
            Allow,
        )];
        const INDEX: &[(&str, Behavior)] = &[(r#"t(argv[0] = "git", argv[1] != "push")"#, Allow)];
        const WILD: &[(&str, Behavior)] = &[(r#"t(files[*].meta.path ~ "out/*")"#, Allow)];
        const DASH: &[(&str, Behavior)] =
            &[(r#"t(headers.content-type = "text/plain", _x = 1)"#, Allow)];
        run(&[
            case("a.b", DEEP, "http.get", json!({"request": {"url": "https://api.github.com/repos/x"}}), Allow, Some(DEEP[0].0)),
            case("a.b miss", DEEP, "http.get", json!({"request": {"url": "https://evil.example/"}}), Deny, None),
            case("a.b parent not object", DEEP, "http.get", json!({"request": "https://api.github.com/x"}), Deny, None),
            case("index hit", INDEX, "t", json!({"argv": ["git", "status"]}), Allow, Some(INDEX[0].0)),
            case("index miss", INDEX, "t", json!({"argv": ["git", "push"]}), Deny, None),
            case("index out of range", INDEX, "t", json!({"argv": ["git"]}), Deny, None),
            case("index on object", INDEX, "t", json!({"argv": {"0": "git", "1": "x"}}), Deny, None),
            case("wildcard deep", WILD, "t", json!({"files": [{"meta": {"path": "out/a"}}, {"meta": {"path": "out/b"}}]}), Allow, Some(WILD[0].0)),
            case("dash and underscore names", DASH, "t", json!({"headers": {"content-type": "text/plain"}, "_x": 1}), Allow, Some(DASH[0].0)),
        ]);
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn wildcard_is_all_for_allow_and_any_for_deny_or_ask() {
        const ALLOW: &[(&str, Behavior)] = &[(r#"fs.copy(paths[*] ~ "data/**")"#, Allow)];
        const DENY: &[(&str, Behavior)] = &[(r#"fs.copy(paths[*] ~ "secret/**")"#, Deny)];
        const ASK: &[(&str, Behavior)] = &[(r#"fs.copy(paths[*] ~ "secret/**")"#, Ask)];
        const ALLOW_NE: &[(&str, Behavior)] = &[(r#"fs.copy(paths[*] != "x")"#, Allow)];
        const NESTED: &[(&str, Behavior)] = &[
            (r#"t(a[*].b[*] = 1)"#, Allow),
            (r#"t(a[*].b[*] = 2)"#, Deny),
        ];
        let mixed = json!({"paths": ["data/a", "secret/k"]});
        let clean = json!({"paths": ["data/a", "data/b/c"]});
        let partial = json!({"paths": ["data/a", 5]});
        let cases = vec![
            case("allow: all inside", ALLOW, "fs.copy", clean.clone(), Allow, Some(ALLOW[0].0)),
            case("allow: one outside", ALLOW, "fs.copy", mixed.clone(), Deny, None),
            case("allow: one not a string", ALLOW, "fs.copy", partial, Deny, None),
            case("allow: empty array", ALLOW, "fs.copy", json!({"paths": []}), Deny, None),
            case("allow: not an array", ALLOW, "fs.copy", json!({"paths": "data/a"}), Deny, None),
            case("allow !=: one equal", ALLOW_NE, "fs.copy", json!({"paths": ["a", "x"]}), Deny, None),
            case("allow !=: none equal", ALLOW_NE, "fs.copy", json!({"paths": ["a", "b"]}), Allow, Some(ALLOW_NE[0].0)),
            case("nested all", NESTED, "t", json!({"a": [{"b": [1, 1]}, {"b": [1]}]}), Allow, Some(NESTED[0].0)),
            case("nested: an empty inner array fails all", NESTED, "t", json!({"a": [{"b": [1]}, {"b": []}]}), Deny, None),
            case("nested: a missing inner field fails all", NESTED, "t", json!({"a": [{"b": [1]}, {"c": [1]}]}), Deny, None),
            case("nested any denies", NESTED, "t", json!({"a": [{"b": [1]}, {"b": [1, 2]}]}), Deny, Some(NESTED[1].0)),
        ];
        run(&cases);
        run(&[
            Case { default: Allow, ..case("deny: one inside", DENY, "fs.copy", mixed.clone(), Deny, Some(DENY[0].0)) },
            Case { default: Allow, ..case("deny: none inside", DENY, "fs.copy", clean.clone(), Allow, None) },
            Case { default: Allow, ..case("deny: empty array", DENY, "fs.copy", json!({"paths": []}), Allow, None) },
            Case { default: Allow, ..case("ask: one inside", ASK, "fs.copy", mixed, Ask, Some(ASK[0].0)) },
            Case { default: Allow, ..case("ask: none inside", ASK, "fs.copy", clean, Allow, None) },
        ]);
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn dot_segments_are_read_both_ways() {
        const ALLOW: &[(&str, Behavior)] = &[("fs.read(data/**)", Allow)];
        const DENY: &[(&str, Behavior)] = &[
            ("fs.read(secret/**)", Deny),
            (r#"fs.write(path ~ "secret/**")"#, Deny),
            ("*", Allow),
        ];
        const NOT: &[(&str, Behavior)] = &[(r#"fs.read(path !~ "secret/**")"#, Allow)];
        run(&[
            case("allow: escape via ..", ALLOW, "fs.read", json!({"path": "data/../secret/k"}), Deny, None),
            case("allow: .. staying inside", ALLOW, "fs.read", json!({"path": "data/a/../b"}), Allow, Some(ALLOW[0].0)),
            case("allow: leading ./ is the same path", ALLOW, "fs.read", json!({"path": "./data/a"}), Allow, Some(ALLOW[0].0)),
            case("allow: leading / is the same path", ALLOW, "fs.read", json!({"path": "/data/a"}), Allow, Some(ALLOW[0].0)),
            case("deny: reached via ..", DENY, "fs.read", json!({"path": "data/../secret/k"}), Deny, Some(DENY[0].0)),
            case("deny: reached via ./", DENY, "fs.write", json!({"path": "./secret/k"}), Deny, Some(DENY[1].0)),
            case("deny: plain other", DENY, "fs.read", json!({"path": "data/k"}), Allow, Some("*")),
            case("allow !~: .. into secret", NOT, "fs.read", json!({"path": "data/../secret/k"}), Deny, None),
            case("allow !~: plain", NOT, "fs.read", json!({"path": "data/k"}), Allow, Some(NOT[0].0)),
        ]);
        let n = |s| normalize_path(s).into_owned();
        for (spelling, normal) in [
            ("a/b", "a/b"),
            ("a/./b", "a/b"),
            ("a/../../b", "../b"),
            ("/../etc", "etc"),
            ("a/..", "."),
            ("a//b/../c", "a/c"),
            ("..", ".."),
            ("/secret/key", "secret/key"),
            ("./secret/key", "secret/key"),
            ("secret//key", "secret/key"),
            ("secret/key/", "secret/key"),
            ("", "."),
            ("/", "."),
        ] {
            assert_eq!(n(spelling), normal, "{spelling}");
        }
        assert!(matches!(normalize_path("data/x.csv"), std::borrow::Cow::Borrowed(_)), "the common case allocates nothing");
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn deny_wins_over_any_specificity() {
        const R: &[(&str, Behavior)] = &[
            (r#"fs.write(path ~ "out/**", mode = "append")"#, Allow),
            ("fs.*", Deny),
            ("fs.write(out/**)", Ask),
        ];
        let mut c = case("deny wins", R, "fs.write", json!({"path": "out/a", "mode": "append"}), Deny, Some("fs.*"));
        c.default = Allow;
        run(&[c]);
        // The first matching deny rule in configuration order is reported.
        let p = policy(&[("*", Deny), ("fs.write", Deny)], Allow);
        assert_eq!(
            p.evaluate("fs.write", None, &json!({})).rule.as_deref(),
            Some("*")
        );
    }

    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn precedence_is_a_floor_and_specificity_names_the_rule() {
        const CONSTRAINTS: &[(&str, Behavior)] = &[
            ("fs.write", Ask),
            (r#"fs.write(path ~ "out/**")"#, Allow),
            (r#"fs.write(path ~ "out/**", mode = "append")"#, Ask),
        ];
        const GLOB_WITH_ARGS: &[(&str, Behavior)] = &[("fs.write", Allow), ("*(out/**)", Ask)];
        const EXACT_ALLOW_GLOB_ASK: &[(&str, Behavior)] = &[("fs.*", Ask), ("fs.write", Allow)];
        const LITERALS: &[(&str, Behavior)] =
            &[("*", Ask), ("f*", Allow), ("fs.w*", Ask), ("fs.wr*", Allow)];
        const ALLOW_LITERALS: &[(&str, Behavior)] = &[("f*", Allow), ("fs.wr*", Allow), ("fs.w*", Allow)];
        const QMARK_LITERALS: &[(&str, Behavior)] = &[("fs.?????", Allow), ("fs.wr*", Allow)];
        let w = |path: &str, mode: &str| json!({"path": path, "mode": mode});
        run(&[
            case("the most specific matching ask is named", CONSTRAINTS, "fs.write", w("out/a", "append"), Ask, Some(CONSTRAINTS[2].0)),
            case("a more specific allow never overrides an ask", CONSTRAINTS, "fs.write", w("out/a", "truncate"), Ask, Some("fs.write")),
            case("bare id when no condition holds", CONSTRAINTS, "fs.write", w("src/a", "append"), Ask, Some("fs.write")),
            case("a glob ask with arguments beats an exact allow", GLOB_WITH_ARGS, "fs.write", w("out/a", ""), Ask, Some("*(out/**)")),
            case("the allow decides where the ask does not match", GLOB_WITH_ARGS, "fs.write", w("src/a", ""), Allow, Some("fs.write")),
            case("an exact allow does not beat a glob ask", EXACT_ALLOW_GLOB_ASK, "fs.write", json!({}), Ask, Some("fs.*")),
            case("any ask beats every allow; the most literal ask is named", LITERALS, "fs.write", json!({}), Ask, Some("fs.w*")),
            case("fewer literals still ask", LITERALS, "fs.wander", json!({}), Ask, Some("fs.w*")),
            case("among allows, more literal characters are named", ALLOW_LITERALS, "fs.write", json!({}), Allow, Some("fs.wr*")),
            case("? does not count as literal", QMARK_LITERALS, "fs.write", json!({}), Allow, Some("fs.wr*")),
        ]);
    }

    #[test]
    fn ask_beats_allow_then_specificity_then_config_order() {
        let tie = policy(&[("fs.write", Allow), ("fs.write", Ask), ("fs.write", Allow)], Deny);
        assert_eq!(
            tie.evaluate("fs.write", None, &json!({})),
            Decision { behavior: Ask, rule: Some("fs.write".into()) }
        );
        let glob_tie = policy(&[("fs.*", Allow), ("fs.?", Ask), ("f?.*", Ask)], Deny);
        // `fs.?` has more literal characters than `f?.*`.
        assert_eq!(glob_tie.evaluate("fs.x", None, &json!({})).rule.as_deref(), Some("fs.?"));
        let cond_tie = policy(&[(r#"t(a = 1)"#, Allow), (r#"t(b = 1)"#, Ask)], Deny);
        assert_eq!(cond_tie.evaluate("t", None, &json!({"a": 1, "b": 1})).behavior, Ask);
        assert_eq!(cond_tie.evaluate("t", None, &json!({"a": 1, "b": 2})).behavior, Allow);
        let allow_order = policy(&[("t(a = 1)", Allow), ("t(b = 1)", Allow)], Deny);
        assert_eq!(allow_order.evaluate("t", None, &json!({"a": 1, "b": 1})).rule.as_deref(), Some("t(a = 1)"));
    }

    #[test]
    fn default_decides_without_a_match() {
        for default in [Allow, Ask, Deny] {
            let p = policy(&[("fs.read(data/**)", Allow), ("text.*", Deny)], default);
            assert_eq!(
                p.evaluate("net.get", Some("url"), &json!({"url": "x"})),
                Decision { behavior: default, rule: None }
            );
            let empty = policy(&[], default);
            assert_eq!(empty.evaluate("fs.read", None, &json!({})), Decision { behavior: default, rule: None });
        }
    }

    #[test]
    fn rule_spec_deserializes_strictly() {
        let ok: Result<Vec<RuleSpec>, _> = serde_json::from_value(json!([
            {"pattern": "fs.read(data/**)", "behavior": "allow"},
            {"pattern": "*", "behavior": "ask"},
            {"pattern": "net.*", "behavior": "deny"},
        ]));
        assert!(matches!(ok.as_deref(), Ok([_, b, _]) if b.behavior == Ask));
        let unknown = serde_json::from_value::<RuleSpec>(json!({"pattern": "x", "behavior": "allow", "why": 1}));
        assert!(unknown.is_err());
        assert!(serde_json::from_value::<RuleSpec>(json!({"pattern": "x", "behavior": "Allow"})).is_err());
    }

    /// Pattern, expected error kind, expected column.
    fn error_cases() -> Vec<(&'static str, &'static str, usize)> {
        vec![
            ("", "EmptyPattern", 1),
            ("   ", "EmptyPattern", 1),
            ("fs read", "InvalidToolId", 3),
            ("1abc", "InvalidToolId", 1),
            ("-abc*", "InvalidToolId", 1),
            ("fs/read", "InvalidToolId", 3),
            ("fs.réad", "InvalidToolId", 5),
            ("(data/**)", "InvalidToolId", 1),
            ("  (data/**)", "InvalidToolId", 3),
            ("fs.read(data/**", "UnclosedParenthesis", 8),
            ("fs.read)", "InvalidToolId", 8),
            ("fs.read(data/**) x", "TrailingText", 18),
            ("fs.read()", "EmptyArguments", 8),
            ("fs.read(   )", "EmptyArguments", 8),
            ("fs.read([a)", "InvalidGlob", 9),
            ("fs.read({a,b)", "InvalidGlob", 9),
            (r#"fs.write(path ~ "[z-a]")"#, "InvalidGlob", 17),
            ("fs.write(path ~ out/**)", "InvalidCondition", 17),
            (r#"fs.write(mode = append)"#, "InvalidCondition", 17),
            (r#"fs.write(path ~ 5)"#, "InvalidCondition", 17),
            (r#"fs.write(path ~ "x", )"#, "InvalidCondition", 20),
            (r#"fs.write(path ~ "x" mode = "y")"#, "InvalidCondition", 21),
            (r#"fs.write(path ~ "x)"#, "InvalidCondition", 17),
            (r#"fs.write(path = "a\nb")"#, "InvalidCondition", 19),
            (r#"fs.write(path == "x")"#, "InvalidCondition", 16),
            (r#"fs.write(path ~ "x", = "y")"#, "InvalidCondition", 22),
            (r#"fs.write(path ~ "x", mode)"#, "InvalidCondition", 26),
            (r#"fs.write(path ~ "x", a[] = 1)"#, "InvalidCondition", 23),
            (r#"fs.write(path ~ "x", a[1 = 1)"#, "InvalidCondition", 25),
            (r#"fs.write(path ~ "x", a[99999999999999999999999] = 1)"#, "InvalidCondition", 24),
            ("fs.write(n = 1.2.3)", "InvalidCondition", 14),
            ("fs.write(n = 1e999x)", "InvalidCondition", 14),
            ("fs.write(n = -)", "InvalidCondition", 14),
            ("fs.write(n = truth)", "InvalidCondition", 14),
            (r#"fs.write(path ~ "x", a. b = 1)"#, "InvalidCondition", 24),
            ("é.x(a = 1)", "InvalidToolId", 1),
        ]
    }

    fn kind(e: &PolicyError) -> &'static str {
        match e {
            PolicyError::EmptyPattern { .. } => "EmptyPattern",
            PolicyError::InvalidToolId { .. } => "InvalidToolId",
            PolicyError::UnclosedParenthesis { .. } => "UnclosedParenthesis",
            PolicyError::TrailingText { .. } => "TrailingText",
            PolicyError::EmptyArguments { .. } => "EmptyArguments",
            PolicyError::InvalidGlob { .. } => "InvalidGlob",
            PolicyError::InvalidCondition { .. } => "InvalidCondition",
        }
    }

    #[test]
    fn parse_errors_name_rule_pattern_and_column() {
        for (pattern, want_kind, want_column) in error_cases() {
            // Put the bad rule at index 2 so the index in the message is checked.
            let rules = [("text.upper", Allow), ("fs.read(data/**)", Ask), (pattern, Deny)];
            let err = match Policy::new(&specs(&rules), Deny) {
                Ok(_) => panic!("{pattern:?} should be rejected"),
                Err(e) => e,
            };
            let msg = err.to_string();
            assert_eq!(kind(&err), want_kind, "{pattern:?}: {msg}");
            assert!(msg.starts_with(&format!("rule 2 {pattern:?}: ")), "{msg}");
            if want_kind != "EmptyPattern" {
                assert!(msg.contains(&format!("column {want_column}:")), "{pattern:?}: {msg}");
            }
            // Lowercase start of the explanation, no final period.
            assert!(!msg.ends_with('.'), "{msg}");
            let reason = msg.rsplit(": ").next().unwrap_or_default();
            assert!(!reason.starts_with(|c: char| c.is_uppercase()), "{msg}");
        }
    }

    #[test]
    fn error_messages_say_what_to_do() {
        let msg = |p: &str| match Policy::new(&specs(&[(p, Allow)]), Deny) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            msg("fs.read()"),
            "rule 0 \"fs.read()\": column 8: the parentheses are empty; put a path glob such as `(data/**)` or conditions such as `(path ~ \"out/**\")` inside, or drop the parentheses to match every call"
        );
        assert!(
            msg("fs.write(path ~ out/**)")
                .ends_with("the glob after `~` must be a double-quoted string; write \"out/**\"")
        );
        assert!(msg("fs.write(path !~ /etc/*, b = 1)").ends_with("write \"/etc/*\""));
        assert!(msg("fs.write(mode = append)").contains("write \"append\" to compare a string"));
        assert!(msg("fs.write(mode == \"x\")").contains("found '='; the operators are"));
        assert!(msg("fs.read([a)").contains("invalid glob \"[a\""));
        assert!(msg("fs.read(data").contains("end the pattern with `)`"));
    }

    #[test]
    fn condition_or_glob_disambiguation() {
        let p = |pattern: &str| match Policy::new(&specs(&[(pattern, Allow)]), Deny) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        };
        let kinds = |pattern: &str| match p(pattern).rules.first().map(|r| &r.args) {
            Some(ArgMatch::Primary(_)) => "glob",
            Some(ArgMatch::Conditions(_)) => "conditions",
            _ => "none",
        };
        assert_eq!(kinds("t(n=1)"), "conditions");
        assert_eq!(kinds("t(a.b[0] ~ \"x\")"), "conditions");
        assert_eq!(kinds("t(a~\"x\")"), "conditions");
        assert_eq!(kinds("t(year=2024/**)"), "glob");
        assert_eq!(kinds("t(mode=append)"), "glob");
        assert_eq!(kinds("t(year[=]2024)"), "glob");
        assert_eq!(kinds("t(~/notes/*)"), "glob");
        assert_eq!(kinds("t(a[x] = 1)"), "glob");
        assert_eq!(kinds("t"), "none");
    }

    #[test]
    fn empty_and_multiple_errors_report_first_bad_rule() {
        let rules = [("ok", Allow), ("bad(", Deny), ("also bad", Deny)];
        match Policy::new(&specs(&rules), Deny) {
            Err(PolicyError::UnclosedParenthesis { rule: 1, column: 4, .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    /// Rough timing; run with `cargo test --release -- --ignored --nocapture`.
    #[test]
    #[ignore = "timing, run in release"]
    fn evaluate_100_rules_timing() {
        let mut rules = Vec::new();
        for i in 0..40 {
            rules.push((format!("tool{i}.*"), Allow));
            rules.push((format!(r#"tool{i}.write(path ~ "out/**", mode = "append")"#), Ask));
        }
        for i in 0..20 {
            rules.push((format!("fs.read{i}(data/**)"), Allow));
        }
        rules.push(("fs.read(data/**)".to_owned(), Allow));
        rules.push(("mcp__*".to_owned(), Deny));
        let specs: Vec<RuleSpec> = rules.iter().map(|(p, b)| RuleSpec { pattern: p.clone(), behavior: *b }).collect();
        let Ok(p) = Policy::new(&specs, Deny) else { panic!("parse") };
        let calls = [
            ("tool7.write", Some("path"), json!({"path": "out/a/b.txt", "mode": "append"})),
            ("fs.read", Some("path"), json!({"path": "data/x/y.csv"})),
            ("unknown.tool", None, json!({"x": 1})),
        ];
        for (tool, primary, args) in &calls {
            let n = 200_000;
            let start = std::time::Instant::now();
            for _ in 0..n {
                std::hint::black_box(p.evaluate(std::hint::black_box(tool), *primary, args));
            }
            let per = start.elapsed().as_nanos() / n;
            println!("{tool}: {per} ns/evaluate");
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            "(data|out|secret|\\.\\.|\\.|x)(/(a|\\.\\.|\\.|b|))*".prop_map(Value::String),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("(path|paths|a|b|c|mode|n|f|\\PC{0,4})", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn behavior() -> impl Strategy<Value = Behavior> {
        prop_oneof![Just(Allow), Just(Ask), Just(Deny)]
    }

    /// Patterns that parse, over the tools and fields the generated calls use.
    fn rule_pattern() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_owned()),
            Just("fs.*".to_owned()),
            Just("fs.write".to_owned()),
            Just("t".to_owned()),
            Just("fs.read(data/**)".to_owned()),
            Just("fs.write(out/**)".to_owned()),
            Just(r#"fs.write(path ~ "out/**", mode = "append")"#.to_owned()),
            Just(r#"*(path !~ "secret/**")"#.to_owned()),
            Just(r#"t(a[*].b = 1)"#.to_owned()),
            Just(r#"*(n = 1)"#.to_owned()),
        ]
    }

    fn fixed_policy(default: Behavior) -> Policy {
        policy(
            &[
                ("fs.read(data/**)", Allow),
                (r#"fs.write(path ~ "out/**", mode = "append")"#, Allow),
                (r#"fs.write(paths[*] !~ "secret/**")"#, Ask),
                (r#"*(a[*].b[*].c != null, n = 1.5)"#, Deny),
                (r#"t(a[0][1].b = true, f = "x")"#, Allow),
                ("text.*", Ask),
                ("*", Allow),
            ],
            default,
        )
    }

    proptest! {
        #[test]
        fn evaluate_never_panics(
            args in arb_json(),
            tool in prop_oneof![Just("fs.read".to_owned()), Just("fs.write".to_owned()), Just("t".to_owned()), "\\PC{0,16}"],
            primary in prop::option::of(prop_oneof![Just("path".to_owned()), "\\PC{0,6}"]),
        ) {
            let p = fixed_policy(Ask);
            let d = p.evaluate(&tool, primary.as_deref(), &args);
            // `*` allows anything no deny or ask rule catches, so some rule always decides.
            prop_assert!(d.rule.is_some());
        }

        /// Invariant 12: adding an ask or deny rule never turns an ask or deny
        /// into allow; a matching deny rule keeps deciding whatever is added.
        #[test]
        fn adding_an_ask_or_deny_rule_never_allows_more(
            base in prop::collection::vec((rule_pattern(), behavior()), 0..6),
            added in (rule_pattern(), prop_oneof![Just(Ask), Just(Deny)]),
            at in any::<prop::sample::Index>(),
            default in behavior(),
            tool in prop_oneof![Just("fs.read"), Just("fs.write"), Just("t")],
            args in arb_json(),
        ) {
            let specs = |rules: &[(String, Behavior)]| -> Vec<RuleSpec> {
                rules.iter().map(|(p, b)| RuleSpec { pattern: p.clone(), behavior: *b }).collect()
            };
            let before = Policy::new(&specs(&base), default).unwrap().evaluate(tool, Some("path"), &args);
            let mut more = base.clone();
            more.insert(at.index(base.len() + 1), added.clone());
            let after = Policy::new(&specs(&more), default).unwrap().evaluate(tool, Some("path"), &args);
            if before.behavior != Allow {
                prop_assert_ne!(after.behavior, Allow, "{:?} + {:?}", base, added);
            }
            // A deny rule that matched still decides; a deny added on top of a deny keeps it.
            if before.behavior == Deny && (before.rule.is_some() || added.1 == Deny) {
                prop_assert_eq!(after.behavior, Deny, "{:?} + {:?}", base, added);
            }
        }

        /// The floor itself: however specific, an added allow rule never turns
        /// an ask or deny that a rule decided into allow.
        #[test]
        fn adding_an_allow_rule_never_overrides_a_rule_that_asks_or_denies(
            base in prop::collection::vec((rule_pattern(), behavior()), 0..6),
            added in rule_pattern(),
            at in any::<prop::sample::Index>(),
            default in behavior(),
            tool in prop_oneof![Just("fs.read"), Just("fs.write"), Just("t")],
            args in arb_json(),
        ) {
            let specs = |rules: &[(String, Behavior)]| -> Vec<RuleSpec> {
                rules.iter().map(|(p, b)| RuleSpec { pattern: p.clone(), behavior: *b }).collect()
            };
            let before = Policy::new(&specs(&base), default).unwrap().evaluate(tool, Some("path"), &args);
            let mut more = base.clone();
            more.insert(at.index(base.len() + 1), (added.clone(), Allow));
            let after = Policy::new(&specs(&more), default).unwrap().evaluate(tool, Some("path"), &args);
            if before.rule.is_some() && before.behavior != Allow {
                prop_assert_eq!(after.behavior, before.behavior, "{:?} + allow {}", base, added);
            }
        }

        #[test]
        fn new_never_panics_on_grammar_like_patterns(
            pattern in "[ a-z0-9_.*?()\\[\\]{}\"'~!=,\\\\/-]{0,40}",
            args in arb_json(),
        ) {
            let spec = [RuleSpec { pattern, behavior: Deny }];
            if let Ok(p) = Policy::new(&spec, Allow) {
                let _ = p.evaluate("a.b", Some("a"), &args);
            }
        }

        #[test]
        fn new_never_panics_on_arbitrary_strings(pattern in "\\PC{0,60}", suffix in "\\PC{0,20}") {
            for p in [pattern.clone(), format!("t({pattern})"), format!("t(a = {pattern}{suffix})"), format!("t(a ~ \"{pattern}\"{suffix}")] {
                let spec = [RuleSpec { pattern: p, behavior: Allow }];
                let _ = Policy::new(&spec, Deny);
            }
        }

        /// Allow with `[*]` holds iff it holds for every element alone (and there is
        /// one); deny holds iff it holds for some element alone.
        #[test]
        fn wildcard_quantifiers_match_elementwise(
            items in prop::collection::vec(prop_oneof![
                "(data|secret)/(a|b)".prop_map(Value::String),
                Just(json!(1)),
                Just(json!({"x": 1})),
            ], 0..5),
        ) {
            let allow = policy(&[(r#"t(p[*] ~ "data/**")"#, Allow)], Ask);
            let deny = policy(&[(r#"t(p[*] ~ "data/**")"#, Deny)], Ask);
            let single = |p: &Policy, v: &Value| p.evaluate("t", None, &json!({"p": [v]})).rule.is_some();
            let all = !items.is_empty() && items.iter().all(|v| single(&allow, v));
            let any = items.iter().any(|v| single(&deny, v));
            let args = json!({"p": items});
            prop_assert_eq!(allow.evaluate("t", None, &args).rule.is_some(), all);
            prop_assert_eq!(deny.evaluate("t", None, &args).rule.is_some(), any);
        }

        /// Invariant of the one normalization: every spelling of a path — a
        /// leading `/` or `./`, doubled slashes, a trailing slash, `x/..`
        /// detours, `.` segments — gets the verdict of its normal form, for
        /// primary-argument globs and `~` conditions, in rules written any of
        /// those ways too.
        #[test]
        fn every_spelling_of_a_path_gets_one_verdict(
            segments in prop::collection::vec("(secret|data|tmp|a|b)", 1..5),
            spellings in prop::collection::vec((any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), 0usize..5), 1..6),
        ) {
            let p = policy(
                &[
                    ("fs.read(/secret/**)", Deny),
                    (r#"fs.read(path ~ "./tmp//*/")"#, Ask),
                    ("fs.read(data/**)", Allow),
                ],
                Deny,
            );
            let canonical = segments.join("/");
            let verdict = |path: &str| p.evaluate("fs.read", Some("path"), &json!({"path": path}));
            let want = verdict(&canonical);
            for (lead_slash, lead_dot, double, trailing, detour_at) in spellings {
                let mut parts: Vec<String> = segments.clone();
                if detour_at < parts.len() {
                    parts.insert(detour_at, "x/..".into());
                    parts.insert(0, ".".into());
                }
                let mut s = parts.join(if double { "//" } else { "/" });
                if lead_dot { s = format!("./{s}"); }
                if lead_slash { s = format!("/{s}"); }
                if trailing { s.push('/'); }
                prop_assert_eq!(verdict(&s), want.clone(), "{} vs {}", s, canonical);
            }
        }

        /// An allow rule never matches a path whose resolved form it would not match.
        #[test]
        fn allow_never_matches_escaping_paths(path in "(data|\\.\\.|\\.|secret|a)(/(data|\\.\\.|\\.|secret|a))*") {
            let allow = policy(&[("fs.read(data/**)", Allow)], Deny);
            let allowed = allow.evaluate("fs.read", Some("path"), &json!({"path": path})).behavior == Allow;
            let resolved = normalize_path(&path);
            if allowed {
                prop_assert!(resolved.starts_with("data/"), "{} -> {}", path, resolved);
            }
        }
    }

    #[test]
    fn rules_found_by_another_policy_are_found_again() {
        let a = policy(&[("x.y", Allow)], Deny);
        // In decision order: `z` (deny) first, then `x.*` (ask).
        let b = policy(&[("x.*", Ask), ("z", Deny)], Allow);
        let foreign = a.rules_for("x.y");
        assert_eq!(b.decide("x.y", &foreign, None, &json!({})), (Ask, Some("x.*")));
        assert_eq!(b.decide("x.y", &b.rules_for("x.y"), None, &json!({})), (Ask, Some("x.*")));
        assert_eq!(a.decide("x.y", &foreign, None, &json!({})), (Allow, Some("x.y")));
    }
}
