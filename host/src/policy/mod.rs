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
//! - Conservative quantifiers: for `deny` and `ask` rules a condition holds when ANY
//!   reading of the call satisfies it; for `allow` rules only when EVERY reading does
//!   (and there is at least one). Readings are the elements selected by `[*]` and the
//!   readings of a string below.
//! - A path is compared in one normal form (`.` / `..` segments resolved lexically,
//!   see [`normalize_path`]), so `data/../secret` is neither allowed by `data/**`
//!   nor escapes a deny on `secret/**`. Rules see the argument's text, not the
//!   filesystem: a symlink inside a grant gives one file two names, and only the
//!   grant (which directory a Tool holds) bounds the objects it reaches.
//! - A URL (`scheme://…`, in a rule or an argument) is compared as a URL, never as
//!   a path, in one standard form (the private `url` module): scheme and host
//!   lowercase, the host's trailing dot and the scheme's default port dropped, an
//!   empty path `/`, dot segments resolved inside the path only (they never remove
//!   the host). A URL glob in a rule matches only URL readings; a path glob sees a
//!   URL argument's path normal form and its URL form. A URL-shaped argument with
//!   no single reading (user information, a host that is not a plain name or
//!   address, whitespace, a backslash, `https:host`) satisfies every deny or ask
//!   condition on it and no allow condition.
//! - A URL's fragment (`#…`) is in no reading of an argument, a URL literal
//!   or a URL glob: every client drops it before the request. A URL with a
//!   query has a second reading without it, the path the server routes: a
//!   deny or ask condition holds when either reading does (`https://h/admin?`
//!   is caught by a rule on `https://h/admin/**`), an allow only when both do
//!   — unless the allow's URL names a query itself (`https://h/search?q=*`),
//!   then the reading with the query decides.
//! - A glob ending in `/**` also matches its base: `secret/**` matches `secret`
//!   (a Tool given a directory acts on everything under it), for every behavior.
//!   It does not match an ancestor (`.`): see SECURITY.md's known limits.
//! - `=` / `!=` compare JSON values; numbers compare by value (`1` equals `1.0`).
//!   For an allow (and the positive test inside a negated deny / ask) only
//!   the exact same value is equal: a float equals an integer only when it
//!   is integral and exactly that integer (`9007199254740993.0`, read as
//!   2^53, is not `9007199254740993`). A deny or ask `=` also holds when
//!   both are equal as f64.
//!   A string is read as written and in path normal form: for deny / ask either
//!   reading equal is enough (`/secrets/key` is `secrets/key`), an allow needs the
//!   text as written. A URL literal compares in URL standard form.
//! - A missing field satisfies no positive condition (`~`, `=`) and no allow
//!   condition. A negated condition (`!~`, `!=`) of a deny or ask rule holds
//!   exactly when the positive condition, read as an allow would read it, does
//!   not: a missing field, `null`, a non-string for `!~`, an empty `[*]` or one
//!   element failing all match. In an allow rule it needs the value to be there
//!   (a string for `!~`) and no reading of it to satisfy the positive condition.
//! - A primary-argument glob on an exact id whose Tool declares no primary
//!   argument could never match; [`Policy::check_primary_arguments`] refuses it
//!   when the agent's snapshot is built.
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
mod url;

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
    /// A primary-argument glob on a Tool that declares no primary argument:
    /// it could never match, so the rule would do nothing.
    #[error(
        "rule {rule} {pattern:?}: `{tool}` declares no primary argument, so the glob {glob:?} never matches and the rule does nothing; {fix}"
    )]
    NoPrimaryArgument {
        /// 0-based index of the rule.
        rule: usize,
        /// The pattern text as configured.
        pattern: String,
        /// The Tool the rule names.
        tool: String,
        /// The glob text.
        glob: String,
        /// What to write instead.
        fix: String,
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
    /// 0-based index in the configuration.
    index: usize,
    pattern: String,
    behavior: Behavior,
    args: ArgMatch,
}

#[derive(Debug, Clone)]
enum ArgMatch {
    Any,
    Primary(Pattern),
    Conditions(Box<[Condition]>),
}

/// A compiled path or URL glob: the glob as written stands for one or more
/// texts in standard form (a trailing `/**` also stands for its base, a
/// glob port also for the default port), and a value matches when any does.
#[derive(Debug, Clone)]
struct Pattern {
    /// A URL glob (`scheme://…`): it matches only URL readings of a value.
    url: bool,
    /// The glob names a query (a `?` after a URL glob's host): an allow
    /// holds it against a URL's readings with their query only.
    query: bool,
    variants: Box<[Variant]>,
    /// The glob as written in the rule.
    source: Box<str>,
}

#[derive(Debug, Clone)]
enum Variant {
    /// No glob characters: the text itself.
    Literal(Box<str>),
    Glob(GlobMatcher),
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
    Glob(Pattern),
    NotGlob(Pattern),
    Eq(Literal),
    Ne(Literal),
}

#[derive(Debug, Clone, PartialEq)]
enum Literal {
    /// A string that is not URL-shaped, and its path normal form.
    Str {
        raw: Box<str>,
        path: Box<str>,
    },
    /// A URL, in standard form (and its merged-slashes reading, if different).
    Url {
        text: Box<str>,
        merged: Option<Box<str>>,
    },
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

    /// Combine `test` over the readings: any of them, or all of them.
    fn over<'r>(self, readings: impl IntoIterator<Item = &'r str>, test: impl Fn(&str) -> bool) -> bool {
        let mut readings = readings.into_iter();
        match self {
            Quantifier::Any => readings.any(test),
            Quantifier::All => readings.all(test),
        }
    }

    /// What a value whose reading is unknown (an unplain URL) does to a
    /// condition: satisfies it for deny / ask, never for allow.
    fn unknown(self) -> bool {
        self == Quantifier::Any
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
            parsed.push((index, id, Rule { index, pattern: spec.pattern.clone(), behavior: spec.behavior, args }));
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

    /// Refuse a rule that can never match because of the Tool it names: a
    /// primary-argument glob (`notes(op=clear)`) on an exact id whose Tool
    /// declares no primary argument. `declares_primary(id)` says, for an
    /// installed Tool, whether its descriptor names a primary argument
    /// (`None`: not installed, nothing to check). Rules on id globs are not
    /// checked: they may cover Tools with and without one.
    ///
    /// # Errors
    ///
    /// [`PolicyError::NoPrimaryArgument`] for the first such rule in
    /// configuration order, with what to write instead.
    pub fn check_primary_arguments(&self, declares_primary: impl Fn(&str) -> Option<bool>) -> Result<(), PolicyError> {
        let mut found: Option<(&Rule, &str)> = None;
        for (id, indices) in &self.exact {
            if declares_primary(id) != Some(false) {
                continue;
            }
            for rule in indices.iter().filter_map(|&i| self.rules.get(i)) {
                if matches!(rule.args, ArgMatch::Primary(_)) && found.is_none_or(|(f, _)| rule.index < f.index) {
                    found = Some((rule, id));
                }
            }
        }
        let Some((rule, tool)) = found else {
            return Ok(());
        };
        let glob = match &rule.args {
            ArgMatch::Primary(p) => p.source.to_string(),
            _ => String::new(),
        };
        Err(PolicyError::NoPrimaryArgument {
            rule: rule.index,
            pattern: rule.pattern.clone(),
            tool: tool.to_owned(),
            fix: rules::primary_fix(tool, &glob),
            glob,
        })
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
        let readings = Readings::default();
        let rule = rules
            .indices
            .iter()
            .filter_map(|&i| self.rules.get(i))
            .find(|rule| rule.args_match(primary_argument, arguments, &readings));
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

/// Work the policy did on argument strings, counted on this thread in tests
/// so that a test bounds it by the size of the arguments (never by time).
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Work {
    /// URL readings computed (`url::read`).
    urls: u64,
    /// Path normal forms computed (`normalize_path`).
    paths: u64,
    /// Kept readings looked at to find the one of a string.
    probes: u64,
}

#[cfg(test)]
thread_local! {
    static WORK: std::cell::Cell<Work> = const { std::cell::Cell::new(Work { urls: 0, paths: 0, probes: 0 }) };
}

#[cfg(test)]
fn count(f: impl FnOnce(&mut Work)) {
    WORK.with(|w| {
        let mut work = w.get();
        f(&mut work);
        w.set(work);
    });
}

/// The readings of one call's argument strings — as a URL, and in path
/// normal form — each computed at most once per decision however many rules
/// and `[*]` elements look at it. A reading is found again in O(1): by the
/// string's address and length (every string borrows from the one arguments
/// value, so one address is one text), in a hash index once more than
/// [`Kept::FEW`] are kept. A plain path already in normal form, the common
/// case, is told apart on its own bytes and not kept: its readings are
/// itself, and telling it apart costs no more than the match that follows.
#[derive(Default)]
struct Readings<'v> {
    kept: std::cell::RefCell<Kept<'v>>,
}

#[derive(Default)]
struct Kept<'v> {
    /// In the order first looked at.
    readings: Vec<Reading<'v>>,
    /// A string's address and length → its place in `readings`; empty
    /// until more than [`Kept::FEW`] are kept, then holds all of them.
    index: HashMap<(*const u8, usize), usize>,
}

impl<'v> Kept<'v> {
    /// Up to this many readings are found by a scan, without hashing.
    const FEW: usize = 8;

    /// Where the reading of `s` is, computed now if it is not kept yet.
    fn find(&mut self, s: &'v str) -> usize {
        let key = (s.as_ptr(), s.len());
        let found = if self.index.is_empty() {
            self.readings.iter().position(|r| {
                #[cfg(test)]
                count(|w| w.probes += 1);
                std::ptr::eq(r.text, s)
            })
        } else {
            #[cfg(test)]
            count(|w| w.probes += 1);
            self.index.get(&key).copied()
        };
        if let Some(at) = found {
            return at;
        }
        let at = self.readings.len();
        self.readings.push(Reading::new(s));
        if !self.index.is_empty() {
            self.index.insert(key, at);
        } else if self.readings.len() > Self::FEW {
            self.index = self.readings.iter().enumerate().map(|(i, r)| ((r.text.as_ptr(), r.text.len()), i)).collect();
        }
        at
    }
}

/// The readings of one argument string.
struct Reading<'v> {
    text: &'v str,
    url: url::UrlReading<'v>,
    /// The path normal form, computed when a rule first needs it.
    path: std::cell::OnceCell<std::borrow::Cow<'v, str>>,
}

impl<'v> Reading<'v> {
    fn new(text: &'v str) -> Self {
        #[cfg(test)]
        count(|w| w.urls += 1);
        Reading { text, url: url::read(text), path: std::cell::OnceCell::new() }
    }

    /// A plain path already in normal form: it is its only reading.
    fn plain(text: &'v str) -> Self {
        Reading {
            text,
            url: url::UrlReading::NotUrl,
            path: std::cell::OnceCell::from(std::borrow::Cow::Borrowed(text)),
        }
    }

    /// Its path normal form ([`normalize_path`]).
    fn path(&self) -> &str {
        self.path.get_or_init(|| {
            #[cfg(test)]
            count(|w| w.paths += 1);
            normalize_path(self.text)
        })
    }
}

impl<'v> Readings<'v> {
    /// Apply `f` to the readings of `s`.
    fn of<R>(&self, s: &'v str, f: impl FnOnce(&Reading<'v>) -> R) -> R {
        if !url::url_shaped(s) && is_normal_path(s) {
            return f(&Reading::plain(s));
        }
        let Ok(mut kept) = self.kept.try_borrow_mut() else {
            return f(&Reading::new(s));
        };
        let at = kept.find(s);
        match kept.readings.get(at) {
            Some(reading) => f(reading),
            None => f(&Reading::new(s)),
        }
    }
}

impl Rule {
    fn args_match<'v>(&self, primary_argument: Option<&str>, arguments: &'v Value, readings: &Readings<'v>) -> bool {
        let q = Quantifier::of(self.behavior);
        match &self.args {
            ArgMatch::Any => true,
            ArgMatch::Primary(glob) => primary_argument
                .and_then(|name| arguments.get(name))
                .and_then(Value::as_str)
                .is_some_and(|s| glob.holds(s, q, readings)),
            ArgMatch::Conditions(conds) => conds.iter().all(|c| c.holds(arguments, q, readings)),
        }
    }
}

impl Condition {
    fn holds<'v>(&self, arguments: &'v Value, q: Quantifier, readings: &Readings<'v>) -> bool {
        use Quantifier::{All, Any};
        let path = &self.path;
        match (&self.op, q) {
            (Op::Glob(_) | Op::Eq(_), q) => select(arguments, path, q, &|v| self.op.positive(v, q, readings)),
            // Allow: a value must be there (for `!~`, a string), and no reading
            // of it may satisfy the positive condition.
            (Op::NotGlob(_) | Op::Ne(_), All) => {
                select(arguments, path, All, &|v| self.op.negated_for_allow(v, readings))
            }
            // Deny / ask: the complement of what would satisfy the positive
            // condition as an allow. A missing field, `null`, a non-string, an
            // empty `[*]` or one element failing all match: the Tool sees a
            // value the positive condition does not vouch for.
            (Op::NotGlob(_) | Op::Ne(_), Any) => !select(arguments, path, All, &|v| self.op.positive(v, All, readings)),
        }
    }
}

impl Op {
    /// The condition without its negation (`~` for `!~`, `=` for `!=`), with quantifier `q` over readings.
    fn positive<'v>(&self, value: &'v Value, q: Quantifier, readings: &Readings<'v>) -> bool {
        match self {
            Op::Glob(g) | Op::NotGlob(g) => value.as_str().is_some_and(|s| g.holds(s, q, readings)),
            Op::Eq(lit) | Op::Ne(lit) => lit.equals(value, q, readings),
        }
    }

    /// A negated condition in an allow rule, on one present value.
    fn negated_for_allow<'v>(&self, value: &'v Value, readings: &Readings<'v>) -> bool {
        match self {
            Op::NotGlob(g) => value.as_str().is_some_and(|s| !g.holds(s, Quantifier::Any, readings)),
            Op::Ne(lit) => !lit.equals(value, Quantifier::Any, readings),
            Op::Glob(_) | Op::Eq(_) => false,
        }
    }
}

impl Pattern {
    fn is_match(&self, text: &str) -> bool {
        self.variants.iter().any(|v| match v {
            Variant::Literal(l) => **l == *text,
            Variant::Glob(g) => g.is_match(text),
        })
    }

    /// Whether string `s` matches, over its readings combined by `q`: a URL
    /// glob sees the URL readings of `s` only; a path glob sees its path
    /// normal form and, if `s` is a URL, its URL readings too. A URL-shaped
    /// `s` with no known destination is [`Quantifier::unknown`].
    fn holds<'v>(&self, s: &'v str, q: Quantifier, readings: &Readings<'v>) -> bool {
        readings.of(s, |r| match (self.url, &r.url) {
            (_, url::UrlReading::Unknown) => q.unknown(),
            (true, url::UrlReading::NotUrl) => false,
            (true, url::UrlReading::Known(text, merged)) => {
                q.over(url_readings(text, merged.as_deref(), q, self.query), |r| self.is_match(r))
            }
            (false, url::UrlReading::NotUrl) => self.is_match(r.path()),
            (false, url::UrlReading::Known(text, merged)) => q
                .over(std::iter::once(r.path()).chain(url_readings(text, merged.as_deref(), q, self.query)), |r| {
                    self.is_match(r)
                }),
        })
    }
}

impl Literal {
    /// Equality with `value`, over the readings of a string combined by `q`:
    /// a plain string as written and in path normal form (so for deny / ask
    /// either reading equal is enough — `./secrets/key` is `secrets/key` —
    /// while an allow needs the text as written); a URL in standard form.
    fn equals<'v>(&self, value: &'v Value, q: Quantifier, readings: &Readings<'v>) -> bool {
        match (self, value) {
            (Literal::Str { raw, path }, Value::String(s)) => {
                **raw == **s
                    || readings.of(s, |r| match (&r.url, q) {
                        // A URL-shaped value never equals a plain literal, unless its destination is unknown.
                        (url::UrlReading::Unknown, _) => q.unknown(),
                        (_, Quantifier::Any) => r.path() == &**path,
                        (_, Quantifier::All) => false,
                    })
            }
            (Literal::Url { text, merged }, Value::String(s)) => readings.of(s, |reading| match &reading.url {
                url::UrlReading::NotUrl => false,
                url::UrlReading::Unknown => q.unknown(),
                url::UrlReading::Known(t, m) => q.over(url_readings(t, m.as_deref(), q, text.contains('?')), |r| {
                    *r == **text || merged.as_deref().is_some_and(|m| *m == *r)
                }),
            }),
            (Literal::Num(a), Value::Number(b)) => numbers_equal(a, b, q),
            (Literal::Bool(a), Value::Bool(b)) => a == b,
            (Literal::Null, Value::Null) => true,
            _ => false,
        }
    }
}

/// The URL readings of an argument that a rule compares, combined by `q`:
/// its standard form and merged-slashes reading (neither holds a
/// fragment, which never leaves the client), and each of those without its
/// query — the path a server routes, so a deny or ask on `https://h/admin`
/// sees `https://h/admin?` — except for an allow whose rule names a query
/// (an allow on `https://h/search?q=1` vouches for that query; every reading
/// with it must still match).
fn url_readings<'r>(
    text: &'r str,
    merged: Option<&'r str>,
    q: Quantifier,
    names_query: bool,
) -> impl Iterator<Item = &'r str> {
    let full = std::iter::once(text).chain(merged);
    let bare = (q == Quantifier::Any || !names_query).then(|| full.clone().filter_map(url::without_query));
    full.chain(bare.into_iter().flatten())
}

/// A JSON number as its exact value.
#[derive(Clone, Copy)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn of(n: &serde_json::Number) -> Option<Num> {
        if let Some(i) = n.as_i64() {
            Some(Num::Int(i128::from(i)))
        } else if let Some(u) = n.as_u64() {
            Some(Num::Int(i128::from(u)))
        } else {
            n.as_f64().map(Num::Float)
        }
    }
}

/// Compare by value so `1` and `1.0` are equal: a model may send either.
/// For an allow (`All`, also the positive test inside a negated deny or
/// ask) only the same value is equal: a float equals an integer only if it
/// is integral and exactly that integer, so `9007199254740992.0` (what
/// `9007199254740993.0` parses to) is not `9007199254740993`. For a deny or
/// ask (`Any`) numbers that are equal as f64 are equal too: catching more is
/// the safe side.
#[allow(clippy::float_cmp)]
fn numbers_equal(a: &serde_json::Number, b: &serde_json::Number, q: Quantifier) -> bool {
    let (Some(x), Some(y)) = (Num::of(a), Num::of(b)) else {
        return false;
    };
    let exact = match (x, y) {
        (Num::Int(i), Num::Int(j)) => i == j,
        // Exact comparison is intended: equality, not closeness, is what a rule says.
        (Num::Float(f), Num::Float(g)) => f == g,
        (Num::Int(i), Num::Float(f)) | (Num::Float(f), Num::Int(i)) => float_is_integer(f, i),
    };
    exact
        || (q == Quantifier::Any
            && (a.is_f64() || b.is_f64())
            && matches!((a.as_f64(), b.as_f64()), (Some(x), Some(y)) if x == y))
}

/// Whether `f` is exactly the integer `i`. Every JSON integer serde_json
/// holds is within ±2^64, where an integral f64 converts to i128 exactly.
#[allow(clippy::float_cmp, clippy::cast_possible_truncation)]
fn float_is_integer(f: f64, i: i128) -> bool {
    // 2^100: far beyond any i64 or u64, and exactly representable.
    const BOUND: f64 = 1_267_650_600_228_229_401_496_703_205_376.0;
    f.is_finite() && f.trunc() == f && f.abs() < BOUND && f as i128 == i
}

/// Resolve `path` against `value` and apply `pred` to every selected value, combined
/// by `q`. A missing field, an out-of-range index or `[*]` on a non-array selects
/// nothing, and selecting nothing never satisfies.
fn select<'v>(value: &'v Value, path: &[Step], q: Quantifier, pred: &dyn Fn(&'v Value) -> bool) -> bool {
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

/// Whether `s` is its own path normal form ([`normalize_path`]).
fn is_normal_path(s: &str) -> bool {
    !s.starts_with('/')
        && !s.ends_with('/')
        && !s.is_empty()
        && s.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// The one spelling of a path that rules and arguments are compared in: a
/// leading `/` or `./` dropped (Tools read paths relative to their grants),
/// empty and `.` segments dropped (so `a//b` and `a/b/` are `a/b`), `..`
/// resolved lexically (a leading `..` kept; at the root it stays at the
/// root). The empty path is `.`. Borrowed when `s` is already normal.
pub fn normalize_path(s: &str) -> std::borrow::Cow<'_, str> {
    if is_normal_path(s) {
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
            case("!~ against number: not a path the glob vouches for", NOT_GLOB, "fs.write", json!({"path": 3}), Ask, Some(NOT_GLOB[0].0)),
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

    /// A missing field satisfies no positive condition and no allow rule's
    /// condition. It satisfies a negated condition (`!~`, `!=`) of a deny or
    /// ask rule: the Tool does not see "nothing" but its default (serde
    /// makes a missing `dir` "" and searches everything), which the positive
    /// condition does not vouch for. Before, the deny missed it (review F3).
    #[test]
    fn a_missing_field_matches_only_negated_deny_and_ask_conditions() {
        for (pattern, behavior, matches) in [
            (r#"t(f ~ "*")"#, Deny, false),
            (r#"t(f = "x")"#, Deny, false),
            (r#"t(a[*].f = "x")"#, Ask, false),
            (r#"t(f !~ "x")"#, Deny, true),
            (r#"t(f != "x")"#, Deny, true),
            ("t(f != null)", Deny, true),
            (r#"t(a.f != "x")"#, Deny, true),
            (r#"t(a[3] != "x")"#, Ask, true),
            (r#"t(a[*].f != "x")"#, Deny, true),
            (r#"t(a[*].f !~ "x")"#, Ask, true),
            (r#"t(f != "x")"#, Allow, false),
            (r#"t(f !~ "x")"#, Allow, false),
            (r#"t(a[*].f != "x")"#, Allow, false),
        ] {
            let p = policy(&[(pattern, behavior)], Ask);
            for args in [json!({}), json!({"a": {"g": 1}}), json!({"a": [{"g": 1}]}), json!(null)] {
                let got = p.evaluate("t", None, &args);
                let want = if matches {
                    Decision { behavior, rule: Some(pattern.to_owned()) }
                } else {
                    Decision { behavior: Ask, rule: None }
                };
                assert_eq!(got, want, "{pattern} on {args}");
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

    /// The tracker's rules of review F1, with its primary argument.
    fn tracker(rules: &[(&str, Behavior)], default: Behavior, url: &str) -> Decision {
        policy(rules, default).evaluate("tracker.issues", Some("base_url"), &json!({"base_url": url}))
    }

    /// Review F1: URL rules were compared as file paths, so `..` removed the
    /// host (`https://internal/..//acme/x` read as `https:/acme/x`, inside an
    /// allow on acme, while the guest connects to internal), and case, the
    /// default port or a missing path dodged a deny or ask. A URL is now read
    /// as a URL, in one standard form on both sides. Fails on the previous code.
    #[test]
    fn a_url_rule_sees_the_destination_a_client_reaches() {
        const ALLOW_PRIMARY: &[(&str, Behavior)] = &[("tracker.issues(https://acme.tracker.example/**)", Allow)];
        const ALLOW_COND: &[(&str, Behavior)] =
            &[(r#"tracker.issues(base_url ~ "https://acme.tracker.example/**")"#, Allow)];
        const ALLOW_PORT: &[(&str, Behavior)] =
            &[(r#"tracker.issues(base_url ~ "HTTPS://Acme.Tracker.Example.:443/**")"#, Allow)];
        for rules in [ALLOW_PRIMARY, ALLOW_COND, ALLOW_PORT] {
            let by = Some(rules[0].0.to_owned());
            for url in [
                "https://internal.tracker.example/..//acme.tracker.example/x",
                "https://internal.tracker.example/../acme.tracker.example/x",
                "https://internal.tracker.example//acme.tracker.example/x",
                "https://acme.tracker.example@internal.tracker.example/x",
                "https://acme.tracker.example:pw@internal.tracker.example/",
                "https://acme.tracker.example.internal.tracker.example/",
                "https://acme.tracker.example:8443/x",
                "http://acme.tracker.example/x",
                "https:acme.tracker.example/x",
                " https://acme.tracker.example/x",
                "https://acme.tracker.example\\@internal.tracker.example/",
                "https://%61cme.tracker.example/x",
                "acme.tracker.example/x",
                "https://acme.tracker.example/a b",
            ] {
                assert_eq!(
                    tracker(rules, Deny, url),
                    Decision { behavior: Deny, rule: None },
                    "{} on {url}",
                    rules[0].0
                );
            }
            for url in [
                "https://acme.tracker.example",
                "https://acme.tracker.example/",
                "https://acme.tracker.example/issues?state=open",
                "HTTPS://ACME.tracker.example:443/x/../y",
                "https://acme.tracker.example.:0443/%78",
                "https://acme.tracker.example/..",
            ] {
                assert_eq!(
                    tracker(rules, Deny, url),
                    Decision { behavior: Allow, rule: by.clone() },
                    "{} on {url}",
                    rules[0].0
                );
            }
        }

        const ASK: &[(&str, Behavior)] =
            &[(r#"tracker.issues(base_url ~ "https://internal.tracker.example/**")"#, Ask), ("tracker.*", Allow)];
        const ASK_PRIMARY: &[(&str, Behavior)] =
            &[("tracker.issues(https://internal.tracker.example/**)", Ask), ("tracker.*", Allow)];
        for rules in [ASK, ASK_PRIMARY] {
            let by = Some(rules[0].0.to_owned());
            for url in [
                "https://internal.tracker.example/x",
                "https://internal.tracker.example/..",
                "https://Internal.tracker.example/x",
                "https://internal.tracker.example:443/x",
                "https://internal.tracker.example",
                "https://internal.tracker.example:",
                "https://internal.tracker.example:00443",
                "HTTPS://INTERNAL.TRACKER.EXAMPLE./x",
                "https://internal.tracker.example/a/%2e%2e/../x",
                "https://internal.tracker.example?x",
                "https://internal.tracker.example#x",
                // No known destination: every deny and ask condition holds.
                "https://acme.tracker.example@internal.tracker.example/",
                "https:internal.tracker.example",
                "https:///internal.tracker.example",
                "\thttps://internal.tracker.example/",
                "https://%69nternal.tracker.example/",
                "https://internal.tracker.example\\x",
                "https://ínternal.tracker.example/",
                // Spellings a Tool's or a library's strip reads as the
                // destination (`requests` strips Unicode whitespace).
                "\u{a0}https://internal.tracker.example/x",
                "\u{3000}https://internal.tracker.example/x",
                "\u{feff}https://internal.tracker.example/x",
                "https://internal.tracker.example/x\u{2009}",
            ] {
                assert_eq!(
                    tracker(rules, Deny, url),
                    Decision { behavior: Ask, rule: by.clone() },
                    "{} on {url}",
                    rules[0].0
                );
            }
            for url in [
                "https://acme.tracker.example/x",
                "https://acme.tracker.example",
                "https://internal.tracker.example:8443/x",
                "https://internal.tracker.example.acme/x",
                "http://internal.tracker.example/x",
                "https://acme.tracker.example/internal.tracker.example/x",
                "https://acme.tracker.example/../internal.tracker.example/x",
                "internal.tracker.example/x",
            ] {
                assert_eq!(
                    tracker(rules, Deny, url),
                    Decision { behavior: Allow, rule: Some("tracker.*".into()) },
                    "{} on {url}",
                    rules[0].0
                );
            }
        }

        // A glob port also stands for the default port; a scheme glob for every scheme.
        const ANY_PORT: &[(&str, Behavior)] = &[(r#"t(u ~ "https://internal.example:*/**")"#, Deny), ("t", Allow)];
        const ANY_SCHEME: &[(&str, Behavior)] = &[(r#"t(u ~ "*://internal.example/**")"#, Deny), ("t", Allow)];
        for rules in [ANY_PORT, ANY_SCHEME] {
            let p = policy(rules, Allow);
            for (u, denied) in [
                ("https://internal.example/x", true),
                ("https://internal.example:443/x", true),
                ("https://internal.example:8443/x", rules == ANY_PORT),
                ("http://internal.example/x", rules == ANY_SCHEME),
                ("https://other.example/x", false),
            ] {
                let got = p.evaluate("t", None, &json!({"u": u})).behavior;
                assert_eq!(got == Deny, denied, "{} on {u}", rules[0].0);
            }
        }
        // A path glob still reads a URL-shaped value as a path too.
        let p = policy(&[("fs.read(secrets/**)", Deny), ("fs.read", Allow)], Deny);
        let got = p.evaluate("fs.read", Some("path"), &json!({"path": "http://x/../../secrets/key"}));
        assert_eq!(got.behavior, Deny);
    }

    /// Review F2: `P/**` did not match `P`, though a Tool acts on `P` as a
    /// whole (searching `secrets` searches everything under it). A trailing
    /// `/**` now also matches its base, for every behavior. Fails on the previous code.
    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn a_trailing_double_star_covers_the_directory_itself() {
        const DENY: &[(&str, Behavior)] = &[(r#"files.search(dir ~ "secrets/**")"#, Deny), ("files.*", Allow)];
        const DENY_PRIMARY: &[(&str, Behavior)] = &[("files.search(secrets/**)", Deny), ("files.*", Allow)];
        const DEEP: &[(&str, Behavior)] = &[(r#"files.search(dir ~ "**/secrets/**")"#, Deny), ("files.*", Allow)];
        const ALLOW: &[(&str, Behavior)] = &[("files.search(data/**)", Allow)];
        const URL: &[(&str, Behavior)] = &[(r#"t(u ~ "https://h.example/admin/**")"#, Deny), ("t", Allow)];
        let search = |rules, dir: &str, want, by| Case { primary: Some("dir"), ..case("search", rules, "files.search", json!({"dir": dir}), want, by) };
        let mut cases = Vec::new();
        for rules in [DENY, DENY_PRIMARY] {
            for dir in ["secrets", "secrets/", "./secrets", "/secrets", "x/../secrets", "secrets/.", "secrets/a"] {
                cases.push(search(rules, dir, Deny, Some(rules[0].0)));
            }
            for dir in ["secretsx", "public", ".", "secrets/.."] {
                cases.push(search(rules, dir, Allow, Some("files.*")));
            }
        }
        for dir in ["secrets", "a/secrets", "a/secrets/b"] {
            cases.push(search(DEEP, dir, Deny, Some(DEEP[0].0)));
        }
        cases.push(search(DEEP, "a/secretsx", Allow, Some("files.*")));
        for dir in ["data", "data/", "data/a"] {
            cases.push(search(ALLOW, dir, Allow, Some(ALLOW[0].0)));
        }
        cases.push(search(ALLOW, "datax", Deny, None));
        run(&cases);
        let p = policy(URL, Allow);
        for (u, want) in [("https://h.example/admin", Deny), ("https://h.example/admin/", Deny), ("https://h.example/x/../admin", Deny), ("https://h.example/administrator", Allow), ("https://h.example/", Allow)] {
            assert_eq!(p.evaluate("t", None, &json!({"u": u})).behavior, want, "{u}");
        }
    }

    /// Review F3: a negated condition in a deny or ask rule never matched a
    /// missing, null or non-string value, so `deny files.search(dir !~
    /// "public/**")` let `{"query": "password"}` search everything (the
    /// Tool's default `dir` is ""). For deny and ask, `!~` / `!=` now match
    /// whenever the positive condition does not hold — as an allow would
    /// read it — for the value the Tool sees. Fails on the previous code.
    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn a_negated_deny_catches_every_value_its_positive_does_not_vouch_for() {
        const NOT_PUBLIC: &[(&str, Behavior)] = &[(r#"files.search(dir !~ "public/**")"#, Deny), ("files.*", Allow)];
        const EACH: &[(&str, Behavior)] = &[(r#"t(dirs[*] !~ "public/**")"#, Deny), ("t", Allow)];
        const NE: &[(&str, Behavior)] = &[(r#"t(mode != "read")"#, Ask), ("t", Allow)];
        const ALLOW_NOT: &[(&str, Behavior)] = &[(r#"t(dir !~ "secrets/**")"#, Allow)];
        let s = |rules, args, want, by| case("search", rules, "files.search", args, want, by);
        let t = |rules, args, want, by| case("t", rules, "t", args, want, by);
        run(&[
            s(NOT_PUBLIC, json!({"query": "password"}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"query": "password", "dir": null}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"dir": 5}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"dir": ["public/a"]}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"dir": ""}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"dir": "secrets"}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"dir": "public/../secrets"}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"dir": "https://h/public/x"}), Deny, Some(NOT_PUBLIC[0].0)),
            s(NOT_PUBLIC, json!({"dir": "public/a"}), Allow, Some("files.*")),
            s(NOT_PUBLIC, json!({"dir": "./public/a/"}), Allow, Some("files.*")),
            s(NOT_PUBLIC, json!({"dir": "public"}), Allow, Some("files.*")),
            t(EACH, json!({"dirs": ["public/a", "secrets"]}), Deny, Some(EACH[0].0)),
            t(EACH, json!({"dirs": ["public/a", null]}), Deny, Some(EACH[0].0)),
            t(EACH, json!({"dirs": []}), Deny, Some(EACH[0].0)),
            t(EACH, json!({"dirs": "public/a"}), Deny, Some(EACH[0].0)),
            t(EACH, json!({}), Deny, Some(EACH[0].0)),
            t(EACH, json!({"dirs": ["public/a", "public/b"]}), Allow, Some("t")),
            t(NE, json!({}), Ask, Some(NE[0].0)),
            t(NE, json!({"mode": null}), Ask, Some(NE[0].0)),
            t(NE, json!({"mode": "write"}), Ask, Some(NE[0].0)),
            t(NE, json!({"mode": "read"}), Allow, Some("t")),
            // Allow keeps its strict reading: a value must be there.
            t(ALLOW_NOT, json!({}), Deny, None),
            t(ALLOW_NOT, json!({"dir": null}), Deny, None),
            t(ALLOW_NOT, json!({"dir": 5}), Deny, None),
            t(ALLOW_NOT, json!({"dir": "secrets"}), Deny, None),
            t(ALLOW_NOT, json!({"dir": "https://h@x/"}), Deny, None),
            t(ALLOW_NOT, json!({"dir": "public"}), Allow, Some(ALLOW_NOT[0].0)),
        ]);
    }

    /// Review F4: `=` / `!=` compared raw text, so `deny files.read(path =
    /// "secrets/key")` missed `/secrets/key`. A deny or ask now compares a
    /// path in its normal form too, a URL in its standard form; an allow `=`
    /// holds for the text as written (a plain `cmd = "ls"` must not allow
    /// `./ls`), or for a URL's standard form. Fails on the previous code.
    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn equality_sees_every_spelling_of_a_path_or_url() {
        const DENY: &[(&str, Behavior)] = &[(r#"files.read(path = "secrets/key")"#, Deny), ("files.*", Allow)];
        const DENY_NE: &[(&str, Behavior)] = &[(r#"t(path != "public/readme")"#, Deny), ("t", Allow)];
        const ALLOW: &[(&str, Behavior)] = &[(r#"t(cmd = "ls")"#, Allow)];
        const ALLOW_NE: &[(&str, Behavior)] = &[(r#"t(path != "secrets/key")"#, Allow)];
        const DENY_URL: &[(&str, Behavior)] = &[(r#"t(u = "https://internal.example/x")"#, Deny), ("t", Allow)];
        const ALLOW_URL: &[(&str, Behavior)] = &[(r#"t(u = "HTTPS://Acme.example:443")"#, Allow)];
        let r = |rules, args, want, by| case("read", rules, "files.read", args, want, by);
        let t = |rules, args, want, by| case("t", rules, "t", args, want, by);
        let mut cases = Vec::new();
        for path in ["secrets/key", "/secrets/key", "./secrets/key", "secrets//key", "secrets/key/", "a/../secrets/key"] {
            cases.push(r(DENY, json!({"path": path}), Deny, Some(DENY[0].0)));
        }
        for path in ["secrets/key2", "secrets", "key"] {
            cases.push(r(DENY, json!({"path": path}), Allow, Some("files.*")));
        }
        cases.extend([
            t(DENY_NE, json!({"path": "public/readme"}), Allow, Some("t")),
            t(DENY_NE, json!({"path": "./public/readme"}), Deny, Some(DENY_NE[0].0)),
            t(ALLOW, json!({"cmd": "ls"}), Allow, Some(ALLOW[0].0)),
            t(ALLOW, json!({"cmd": "./ls"}), Deny, None),
            t(ALLOW, json!({"cmd": "/ls"}), Deny, None),
            t(ALLOW_NE, json!({"path": "data/x"}), Allow, Some(ALLOW_NE[0].0)),
            t(ALLOW_NE, json!({"path": "./secrets/key"}), Deny, None),
            t(ALLOW_NE, json!({"path": "secrets//key"}), Deny, None),
            t(DENY_URL, json!({"u": "HTTPS://Internal.example:443/a/../x"}), Deny, Some(DENY_URL[0].0)),
            t(DENY_URL, json!({"u": "https://internal.example/x"}), Deny, Some(DENY_URL[0].0)),
            t(DENY_URL, json!({"u": "https://a@internal.example/x"}), Deny, Some(DENY_URL[0].0)),
            t(DENY_URL, json!({"u": "https://internal.example/y"}), Allow, Some("t")),
            // A fragment never leaves the client; the server routes the path without the query.
            t(DENY_URL, json!({"u": "https://internal.example/x#"}), Deny, Some(DENY_URL[0].0)),
            t(DENY_URL, json!({"u": "https://internal.example/x?"}), Deny, Some(DENY_URL[0].0)),
            t(DENY_URL, json!({"u": "https://internal.example/x?#/../y"}), Deny, Some(DENY_URL[0].0)),
            t(DENY_URL, json!({"u": "https://internal.example/y#/../x"}), Allow, Some("t")),
            t(ALLOW_URL, json!({"u": "https://acme.example/#x"}), Allow, Some(ALLOW_URL[0].0)),
            t(ALLOW_URL, json!({"u": "https://acme.example/?"}), Deny, None),
            t(ALLOW_URL, json!({"u": "https://acme.example/"}), Allow, Some(ALLOW_URL[0].0)),
            t(ALLOW_URL, json!({"u": "https://ACME.example"}), Allow, Some(ALLOW_URL[0].0)),
            t(ALLOW_URL, json!({"u": "https://acme.example@evil.example"}), Deny, None),
            t(ALLOW_URL, json!({"u": "https://evil.example/..//acme.example"}), Deny, None),
        ]);
        run(&cases);
    }

    /// Review (URL fragment and query): a deny or ask on a URL was dodged by
    /// `#…` or `?`, which the comparison kept while every HTTP client drops
    /// the fragment and the server routes the path without the query. A
    /// fragment is now in no reading; a URL with a query is read without it
    /// too (any reading for deny / ask, every reading for allow, unless the
    /// allow names a query). Fails on the previous code.
    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn a_fragment_or_a_query_does_not_dodge_a_url_rule() {
        const RESET: &[(&str, Behavior)] = &[(r#"t(u = "https://api.example/v1/reset")"#, Deny), (r#"t(u ~ "https://api.example/**")"#, Allow)];
        const ADMIN: &[(&str, Behavior)] = &[(r#"t(u ~ "https://acme.example/admin/**")"#, Ask), (r#"t(u ~ "https://acme.example/**")"#, Allow)];
        const ADMIN_PRIMARY: &[(&str, Behavior)] = &[("t(https://acme.example/admin/**)", Ask), ("t(https://acme.example/**)", Allow)];
        const NE: &[(&str, Behavior)] = &[(r#"t(u != "https://h.example/x")"#, Deny), ("t", Allow)];
        const NOT_GLOB: &[(&str, Behavior)] = &[(r#"t(u !~ "https://h.example/x/**")"#, Ask), ("t", Allow)];
        const ALLOW_NOT: &[(&str, Behavior)] = &[(r#"t(u !~ "https://h.example/admin/**")"#, Allow)];
        const ALLOW_EXACT: &[(&str, Behavior)] = &[(r#"t(u = "https://h.example/x")"#, Allow)];
        const ALLOW_QUERY: &[(&str, Behavior)] = &[(r#"t(u = "https://h.example/search?q=1")"#, Allow)];
        const ALLOW_QUERY_GLOB: &[(&str, Behavior)] = &[(r#"t(u ~ "https://h.example/search?q=*")"#, Allow)];
        const DENY_QUERY: &[(&str, Behavior)] = &[(r#"t(u = "https://h.example/search?q=1")"#, Deny), ("t", Allow)];
        const FRAGMENT_RULE: &[(&str, Behavior)] = &[(r#"t(u = "https://h.example/x#top")"#, Deny), ("t", Allow)];
        let t = |rules: &'static [(&'static str, Behavior)], u: &str, want, by| {
            Case { primary: Some("u"), ..case("t", rules, "t", json!({"u": u}), want, by) }
        };
        let mut cases = Vec::new();
        for u in ["https://api.example/v1/reset#", "https://api.example/v1/reset#x", "https://api.example/v1/reset?", "https://api.example/v1/reset?#", "https://api.example/v1/reset?a=1", "https://api.example/v1/reset#/../other", "https://api.example/v1/x/../reset?#y"] {
            cases.push(t(RESET, u, Deny, Some(RESET[0].0)));
        }
        cases.push(t(RESET, "https://api.example/v1/resets?", Allow, Some(RESET[1].0)));
        for rules in [ADMIN, ADMIN_PRIMARY] {
            for u in ["https://acme.example/admin?", "https://acme.example/admin#x", "https://acme.example/admin?#", "https://acme.example/admin?q=/../x", "https://acme.example/admin/users#", "https://acme.example/x/../admin?"] {
                cases.push(t(rules, u, Ask, Some(rules[0].0)));
            }
            for u in ["https://acme.example/administrator?", "https://acme.example/x?admin", "https://acme.example/x#/../admin", "https://acme.example/?/admin"] {
                cases.push(t(rules, u, Allow, Some(rules[1].0)));
            }
        }
        cases.extend([
            // The fragment stays in the client; an empty query is still a query the rule did not name.
            t(NE, "https://h.example/x#f", Allow, Some("t")),
            t(NE, "https://h.example/x?", Deny, Some(NE[0].0)),
            t(NE, "https://h.example/x?a", Deny, Some(NE[0].0)),
            t(NOT_GLOB, "https://h.example/x/a?b#c", Allow, Some("t")),
            t(NOT_GLOB, "https://h.example/y?/x/", Ask, Some(NOT_GLOB[0].0)),
            t(ALLOW_NOT, "https://h.example/public?x", Allow, Some(ALLOW_NOT[0].0)),
            t(ALLOW_NOT, "https://h.example/admin?", Deny, None),
            t(ALLOW_NOT, "https://h.example/admin#", Deny, None),
            t(ALLOW_EXACT, "https://h.example/x#top", Allow, Some(ALLOW_EXACT[0].0)),
            t(ALLOW_EXACT, "https://h.example/x?", Deny, None),
            t(ALLOW_EXACT, "https://h.example/x?y", Deny, None),
            // A rule that names a query compares the full text, fragment dropped.
            t(ALLOW_QUERY, "https://h.example/search?q=1", Allow, Some(ALLOW_QUERY[0].0)),
            t(ALLOW_QUERY, "https://h.example/search?q=1#x", Allow, Some(ALLOW_QUERY[0].0)),
            t(ALLOW_QUERY, "https://h.example/search", Deny, None),
            t(ALLOW_QUERY, "https://h.example/search?q=2", Deny, None),
            t(ALLOW_QUERY, "https://h.example/search#?q=1", Deny, None),
            t(ALLOW_QUERY_GLOB, "https://h.example/search?q=abc", Allow, Some(ALLOW_QUERY_GLOB[0].0)),
            t(ALLOW_QUERY_GLOB, "https://h.example/search?q=a/../../admin", Deny, None),
            t(DENY_QUERY, "https://h.example/search?q=1#", Deny, Some(DENY_QUERY[0].0)),
            t(DENY_QUERY, "https://h.example/search?q=2", Allow, Some("t")),
            t(DENY_QUERY, "https://h.example/search", Allow, Some("t")),
            t(FRAGMENT_RULE, "https://h.example/x", Deny, Some(FRAGMENT_RULE[0].0)),
            t(FRAGMENT_RULE, "https://h.example/x#other", Deny, Some(FRAGMENT_RULE[0].0)),
        ]);
        run(&cases);
    }

    /// Review (number rounding): `numbers_equal` compared as f64 whenever
    /// either side was a float, so `9007199254740993.0` (which serde_json
    /// reads as 2^53, what the Tool then receives) equalled the integer
    /// `9007199254740993`: a negated deny missed it and an `=` allow
    /// allowed it. For an allow, and the positive test inside a negated
    /// deny or ask, numbers are now equal only when they are the same
    /// value. Fails on the previous code.
    #[test]
    #[rustfmt::skip] // one case per line reads as a table
    fn a_number_is_allowed_only_as_exactly_the_value_the_rule_names() {
        const DENY_NE: &[(&str, Behavior)] = &[("t(n != 9007199254740993)", Deny), ("t", Allow)];
        const ASK_NE: &[(&str, Behavior)] = &[("t(n != 9007199254740993)", Ask), ("t", Allow)];
        const ALLOW_EQ: &[(&str, Behavior)] = &[("t(n = 9007199254740993)", Allow)];
        const DENY_EQ: &[(&str, Behavior)] = &[("t(n = 9007199254740993)", Deny), ("t", Allow)];
        const ALLOW_MAX: &[(&str, Behavior)] = &[("t(n = 18446744073709551615)", Allow)];
        const ALLOW_NEG: &[(&str, Behavior)] = &[("t(n = -9007199254740993)", Allow)];
        const ALLOW_ONE: &[(&str, Behavior)] = &[("t(n = 1)", Allow)];
        const ALLOW_ONE_F: &[(&str, Behavior)] = &[("t(n = 1.0)", Allow)];
        const ALLOW_HALF: &[(&str, Behavior)] = &[("t(n = 1.5)", Allow)];
        const EACH: &[(&str, Behavior)] = &[("t(ns[*] = 9007199254740993)", Allow)];
        let t = |rules: &'static [(&'static str, Behavior)], args: &str, want, by| {
            let args: Value = serde_json::from_str(args).unwrap();
            case("t", rules, "t", args, want, by)
        };
        run(&[
            t(DENY_NE, r#"{"n": 9007199254740993.0}"#, Deny, Some(DENY_NE[0].0)),
            t(DENY_NE, r#"{"n": 9007199254740992}"#, Deny, Some(DENY_NE[0].0)),
            t(DENY_NE, r#"{"n": 9007199254740993}"#, Allow, Some("t")),
            t(ASK_NE, r#"{"n": 9.007199254740993e15}"#, Ask, Some(ASK_NE[0].0)),
            t(ALLOW_EQ, r#"{"n": 9007199254740993.0}"#, Deny, None),
            t(ALLOW_EQ, r#"{"n": 9007199254740993}"#, Allow, Some(ALLOW_EQ[0].0)),
            // Deny and ask keep the lossy reading: catching more is the safe side.
            t(DENY_EQ, r#"{"n": 9007199254740993.0}"#, Deny, Some(DENY_EQ[0].0)),
            t(DENY_EQ, r#"{"n": 9007199254740993}"#, Deny, Some(DENY_EQ[0].0)),
            t(ALLOW_MAX, r#"{"n": 18446744073709551615.0}"#, Deny, None),
            t(ALLOW_MAX, r#"{"n": 18446744073709551615}"#, Allow, Some(ALLOW_MAX[0].0)),
            t(ALLOW_NEG, r#"{"n": -9007199254740993.0}"#, Deny, None),
            t(ALLOW_NEG, r#"{"n": -9007199254740993}"#, Allow, Some(ALLOW_NEG[0].0)),
            t(EACH, r#"{"ns": [9007199254740993, 9007199254740993.0]}"#, Deny, None),
            t(EACH, r#"{"ns": [9007199254740993]}"#, Allow, Some(EACH[0].0)),
            // The same value in another spelling is still equal.
            t(ALLOW_ONE, r#"{"n": 1.0}"#, Allow, Some(ALLOW_ONE[0].0)),
            t(ALLOW_ONE, r#"{"n": 1e0}"#, Allow, Some(ALLOW_ONE[0].0)),
            t(ALLOW_ONE, r#"{"n": 1.0000000000000002}"#, Deny, None),
            t(ALLOW_ONE_F, r#"{"n": 1}"#, Allow, Some(ALLOW_ONE_F[0].0)),
            t(ALLOW_HALF, r#"{"n": 1.5}"#, Allow, Some(ALLOW_HALF[0].0)),
            t(ALLOW_HALF, r#"{"n": 2}"#, Deny, None),
        ]);
    }

    /// A primary-argument glob naming a Tool without a primary argument
    /// (`notes(op=clear)`, meant as a condition) would never match: a deny
    /// that does nothing. The snapshot refuses it, naming the fix.
    #[test]
    fn a_primary_glob_on_a_tool_without_a_primary_argument_is_refused() {
        let p = policy(
            &[("text.*", Allow), ("notes(op=clear)", Deny), ("fs.read(data/**)", Allow), ("*(x/**)", Ask)],
            Deny,
        );
        let declares = |id: &str| match id {
            "notes" => Some(false),
            "fs.read" => Some(true),
            _ => None,
        };
        match p.check_primary_arguments(declares) {
            Err(e @ PolicyError::NoPrimaryArgument { rule: 1, .. }) => assert_eq!(
                e.to_string(),
                "rule 1 \"notes(op=clear)\": `notes` declares no primary argument, so the glob \"op=clear\" never matches and the rule does nothing; to compare the field, write `notes(op = \"clear\")`"
            ),
            other => panic!("{other:?}"),
        }
        let e = policy(&[("notes(data/**)", Ask)], Deny).check_primary_arguments(declares);
        assert!(matches!(&e, Err(e) if e.to_string().ends_with("such as `notes(FIELD ~ \"data/**\")`")), "{e:?}");
        // Installed with a primary argument, not installed, or an id glob: nothing to refuse.
        assert!(p.check_primary_arguments(|id| (id != "notes").then_some(true)).is_ok());
        assert!(policy(&[("*(op=clear)", Deny)], Deny).check_primary_arguments(|_| Some(false)).is_ok());
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
            (r#"t(u ~ "https://user@h.example/**")"#, "InvalidGlob", 7),
            ("t(https://user:pw@h.example/**)", "InvalidGlob", 3),
            (r#"t(u ~ "https://%69nternal.example/**")"#, "InvalidGlob", 7),
            (r#"t(u ~ "https://h.example:99999/**")"#, "InvalidGlob", 7),
            (r#"t(u = "https://user@h.example/")"#, "InvalidCondition", 7),
            (r#"t(u != "https:h.example")"#, "InvalidCondition", 8),
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
            PolicyError::NoPrimaryArgument { .. } => "NoPrimaryArgument",
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

        /// The negation of a deny / ask condition is the complement of its
        /// positive as an allow reads it: `deny f !~ G` matches exactly the
        /// calls `allow f ~ G` does not, `deny f != L` those `allow f = L` does not.
        #[test]
        fn a_negated_deny_is_the_complement_of_the_allow(args in arb_json()) {
            for (positive, negated) in [
                (r#"t(path ~ "data/**")"#, r#"t(path !~ "data/**")"#),
                (r#"t(paths[*] ~ "secret/**")"#, r#"t(paths[*] !~ "secret/**")"#),
                (r#"t(a[*].b = 1)"#, r#"t(a[*].b != 1)"#),
                (r#"t(path = "data/a")"#, r#"t(path != "data/a")"#),
                (r#"t(path ~ "https://h.example/**")"#, r#"t(path !~ "https://h.example/**")"#),
                (r#"t(path = "https://h.example/x")"#, r#"t(path != "https://h.example/x")"#),
                ("t(n = 9007199254740993)", "t(n != 9007199254740993)"),
            ] {
                let allowed = policy(&[(positive, Allow)], Ask).evaluate("t", None, &args).behavior == Allow;
                let denied = policy(&[(negated, Deny)], Ask).evaluate("t", None, &args).behavior == Deny;
                prop_assert_eq!(denied, !allowed, "{} / {} on {}", positive, negated, args);
            }
        }

        /// Every spelling of a URL — scheme and host case, the default port
        /// written or not (with leading zeros), a trailing dot on the host,
        /// dot segments in the path, encoded unreserved characters, a
        /// fragment or a query the rules do not name (`?`, `?x`, `#`,
        /// `#/../y`, `?#`) — gets the verdict of its standard form; and a
        /// `..` never reaches the host.
        #[test]
        fn every_spelling_of_a_url_gets_one_verdict(
            host in prop_oneof![Just("internal.example"), Just("acme.example")],
            segments in prop::collection::vec("(admin|x|a)", 0..4),
            upper in any::<(bool, bool)>(),
            port in prop_oneof![Just(""), Just(":443"), Just(":0443"), Just(":")],
            dot in any::<bool>(),
            detour in prop::option::of(0usize..4),
            encode in any::<bool>(),
            escape in prop::option::of(prop_oneof![Just("/.."), Just("/../.."), Just("//.."), Just("/%2e%2e")]),
            suffix in prop_oneof![Just(""), Just("?"), Just("?x"), Just("#"), Just("#/../y"), Just("?#"), Just("?x=/../admin#z")],
        ) {
            let p = policy(
                &[
                    (r#"t(u ~ "https://internal.example/**")"#, Deny),
                    (r#"t(u ~ "https://acme.example/admin/**")"#, Ask),
                    (r#"t(u ~ "https://acme.example/**")"#, Allow),
                ],
                Deny,
            );
            let verdict = |u: &str| p.evaluate("t", None, &json!({"u": u}));
            let canonical = format!("https://{host}/{}", segments.join("/"));
            let want = verdict(&canonical);
            let mut parts = segments.clone();
            if let Some(at) = detour.filter(|&at| at <= parts.len()) {
                parts.insert(at, "y/..".into());
                parts.insert(at, ".".into());
            }
            let mut path = parts.join("/");
            if encode {
                path = path.replace('a', "%61");
            }
            let scheme = if upper.0 { "HTTPS" } else { "https" };
            let h = if upper.1 { host.to_uppercase() } else { host.to_owned() };
            let trailing = if dot { "." } else { "" };
            let spelled = format!("{scheme}://{h}{trailing}{port}/{path}{suffix}");
            prop_assert_eq!(verdict(&spelled), want.clone(), "{} vs {}", spelled, canonical);
            // Dot segments stay inside the path, whatever follows them.
            if let Some(up) = escape {
                let other = if host == "acme.example" { "internal.example" } else { "acme.example" };
                let sneaky = format!("https://{host}{up}/{other}/x");
                let got = verdict(&sneaky);
                if host == "internal.example" {
                    prop_assert_eq!(got.behavior, Deny, "{}", sneaky);
                } else {
                    prop_assert_ne!(got.rule.as_deref(), Some(r#"t(u ~ "https://internal.example/**")"#), "{}", sneaky);
                }
            }
        }

        /// A float in the arguments is allowed by `n = N` (and spared by
        /// `n != N` in a deny) exactly when it is an integer and that
        /// integer is N, whatever rounding to f64 would say.
        #[test]
        fn a_float_equals_an_integer_only_when_it_is_exactly_that_integer(
            n in prop_oneof![any::<i64>().prop_map(i128::from), any::<u64>().prop_map(i128::from), (-(1i64 << 60)..(1i64 << 60)).prop_map(i128::from)],
            ulps in -3i64..=3,
        ) {
            #[allow(clippy::cast_precision_loss)]
            let near = n as f64;
            let f = f64::from_bits(near.to_bits().wrapping_add_signed(ulps));
            prop_assume!(f.is_finite());
            let exact = if f == 0.0 { n == 0 } else { f.trunc() == f && format!("{f:.0}") == n.to_string() };
            let args = json!({"n": f});
            let (eq, ne) = (format!("t(n = {n})"), format!("t(n != {n})"));
            let allowed = policy(&[(eq.as_str(), Allow)], Ask).evaluate("t", None, &args).behavior == Allow;
            let denied = policy(&[(ne.as_str(), Deny)], Allow).evaluate("t", None, &args).behavior == Deny;
            prop_assert_eq!(allowed, exact, "{} vs {}", f, n);
            prop_assert_eq!(denied, !exact, "{} vs {}", f, n);
        }

        /// An allow rule never matches a path whose resolved form it would not match.
        #[test]
        fn allow_never_matches_escaping_paths(path in "(data|\\.\\.|\\.|secret|a)(/(data|\\.\\.|\\.|secret|a))*") {
            let allow = policy(&[("fs.read(data/**)", Allow)], Deny);
            let allowed = allow.evaluate("fs.read", Some("path"), &json!({"path": path})).behavior == Allow;
            let resolved = normalize_path(&path);
            if allowed {
                // `data/**` covers `data` itself, the subtree's root.
                prop_assert!(resolved == "data" || resolved.starts_with("data/"), "{} -> {}", path, resolved);
            }
        }
    }

    /// One decision and the work it did on argument strings.
    fn work_of(p: &Policy, tool: &str, primary: Option<&str>, args: &Value) -> (Decision, Work) {
        WORK.with(|w| w.set(Work::default()));
        let decision = p.evaluate(tool, primary, args);
        (decision, WORK.with(std::cell::Cell::get))
    }

    /// `[*]` rules over a long array of URLs: each string is read as a URL
    /// once for all rules, and finding its reading again is O(1). Before, the
    /// readings were found by a linear scan, so a model's array of n URLs
    /// cost n²/2 comparisons per rule (minutes of CPU for a 4 MiB body).
    #[test]
    fn wildcard_rules_read_each_url_once_and_find_it_in_constant_time() {
        const DENY: &str = r#"fetch(urls[*] ~ "http://169.254.169.254/**")"#;
        const ASK: &str = r#"fetch(urls[*] !~ "https://**")"#;
        const ALLOW: &str = r#"fetch(urls[*] ~ "https://*.example/**")"#;
        let p = policy(&[(DENY, Deny), (ASK, Ask), (ALLOW, Allow)], Deny);
        // The small array first: a quadratic lookup fails there, not after minutes.
        for n in [2_000u64, 200_000] {
            let mut urls: Vec<Value> = (0..n).map(|i| Value::String(format!("https://h{i}.example/x/{i}"))).collect();
            let (got, work) = work_of(&p, "fetch", None, &json!({ "urls": urls.clone() }));
            assert_eq!(got, Decision { behavior: Allow, rule: Some(ALLOW.to_owned()) }, "n = {n}");
            // Three rules looked at every string: one reading each, a bounded
            // number of kept readings looked at per lookup.
            assert_eq!(work.urls, n, "n = {n}: {work:?}");
            assert!(work.probes <= 3 * 2 * n + 64, "n = {n}: {work:?}");

            urls.push(Value::String("http://169.254.169.254/latest/meta-data/".to_owned()));
            let (got, work) = work_of(&p, "fetch", None, &json!({ "urls": urls }));
            assert_eq!(got, Decision { behavior: Deny, rule: Some(DENY.to_owned()) }, "n = {n}");
            assert_eq!(work.urls, n + 1, "n = {n}: {work:?}");
            assert!(work.probes <= 2 * (n + 1) + 64, "n = {n}: {work:?}");
        }
    }

    /// `[*]` rules over a long array of paths: each string's path normal
    /// form is computed once for all rules that need it.
    #[test]
    fn wildcard_rules_normalize_each_path_once() {
        const DENY: &str = r#"fs.copy(paths[*] ~ "secret/**")"#;
        const ASK: &str = r#"fs.copy(paths[*] = "etc/passwd")"#;
        const ALLOW: &str = r#"fs.copy(paths[*] ~ "data/**")"#;
        let p = policy(&[(DENY, Deny), (ASK, Ask), (ALLOW, Allow)], Deny);
        for n in [2_000u64, 200_000] {
            let paths: Vec<Value> = (0..n).map(|i| Value::String(format!("./data/{i}//x"))).collect();
            let (got, work) = work_of(&p, "fs.copy", None, &json!({ "paths": paths }));
            assert_eq!(got, Decision { behavior: Allow, rule: Some(ALLOW.to_owned()) }, "n = {n}");
            assert_eq!(work.paths, n, "n = {n}: {work:?}");
            assert!(work.probes <= 3 * 2 * n + 64, "n = {n}: {work:?}");
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
