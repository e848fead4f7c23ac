//! Rule grammar: parsing a pattern such as `fs.write(path ~ "out/**")` into a
//! compiled rule, with errors that name the rule, the column and the fix.
//!
//! Owns the grammar documented in [`super`] and the decision order of parsed
//! rules. It never evaluates a call: [`super::Policy`] does.

use std::cmp::Reverse;

use globset::{Glob, GlobBuilder};

use super::{ArgMatch, Behavior, Condition, Literal, Op, Pattern, PolicyError, Rule, RuleSpec, Step, Variant};

pub(super) enum IdPattern {
    Exact(Box<str>),
    Glob { glob: Glob, literal_chars: usize },
}

/// Sort key putting rules in decision order (see `Policy::rules`): every
/// deny rule (configuration order), then every ask rule, then every allow
/// rule — precedence is a floor, so specificity never lets an allow pass an
/// ask. Within asks and within allows the most specific rule comes first
/// (it is the one a decision names), then configuration order.
pub(super) fn decision_rank(index: usize, id: &IdPattern, rule: &Rule) -> (u8, Reverse<(usize, bool, usize)>, usize) {
    let class = match rule.behavior {
        Behavior::Deny => return (0, Reverse((0, false, 0)), index),
        Behavior::Ask => 1,
        Behavior::Allow => 2,
    };
    let constraints = match &rule.args {
        ArgMatch::Any => 0,
        ArgMatch::Primary(_) => 1,
        ArgMatch::Conditions(c) => c.len(),
    };
    let (is_exact, literal_chars) = match id {
        IdPattern::Exact(id) => (true, id.chars().count()),
        IdPattern::Glob { literal_chars, .. } => (false, *literal_chars),
    };
    (class, Reverse((constraints, is_exact, literal_chars)), index)
}

/// A parse problem at a byte offset of the pattern, before the rule index is known.
pub(super) struct Fault {
    at: usize,
    kind: FaultKind,
}

enum FaultKind {
    Empty,
    ToolId(String),
    Unclosed,
    Trailing,
    EmptyArguments,
    Glob { glob: String, reason: String },
    Condition(String),
}

impl Fault {
    fn new(at: usize, kind: FaultKind) -> Self {
        Fault { at, kind }
    }

    fn condition(at: usize, reason: impl Into<String>) -> Self {
        Fault::new(at, FaultKind::Condition(reason.into()))
    }

    pub(super) fn into_error(self, rule: usize, spec: &RuleSpec) -> PolicyError {
        let pattern = spec.pattern.clone();
        let column = spec.pattern.get(..self.at).map_or(self.at, |p| p.chars().count()) + 1;
        match self.kind {
            FaultKind::Empty => PolicyError::EmptyPattern { rule, pattern },
            FaultKind::ToolId(reason) => PolicyError::InvalidToolId { rule, pattern, column, reason },
            FaultKind::Unclosed => PolicyError::UnclosedParenthesis { rule, pattern, column },
            FaultKind::Trailing => PolicyError::TrailingText { rule, pattern, column },
            FaultKind::EmptyArguments => PolicyError::EmptyArguments { rule, pattern, column },
            FaultKind::Glob { glob, reason } => PolicyError::InvalidGlob { rule, pattern, column, glob, reason },
            FaultKind::Condition(reason) => PolicyError::InvalidCondition { rule, pattern, column, reason },
        }
    }
}

fn is_ws(b: u8) -> bool {
    b.is_ascii_whitespace()
}

/// Byte offset of the first non-whitespace byte at or after `from` (or `s.len()`).
fn skip_ws(s: &str, from: usize) -> usize {
    let bytes = s.as_bytes();
    let mut i = from;
    while bytes.get(i).copied().is_some_and(is_ws) {
        i += 1;
    }
    i
}

pub(super) fn parse_pattern(pattern: &str) -> Result<(IdPattern, ArgMatch), Fault> {
    let start = skip_ws(pattern, 0);
    if start == pattern.len() {
        return Err(Fault::new(0, FaultKind::Empty));
    }
    let Some(open) = pattern.find('(') else {
        return Ok((parse_tool_id(pattern, start, pattern.len())?, ArgMatch::Any));
    };
    let id = parse_tool_id(pattern, start, open)?;
    // The last `)` closes the list, so `)` may appear inside globs and strings.
    let Some(close) = pattern.rfind(')').filter(|&c| c > open) else {
        return Err(Fault::new(open, FaultKind::Unclosed));
    };
    let after = skip_ws(pattern, close + 1);
    if after < pattern.len() {
        return Err(Fault::new(after, FaultKind::Trailing));
    }
    let content_start = skip_ws(pattern, open + 1);
    let content_end = pattern
        .get(..close)
        .map_or(close, |c| c.trim_end_matches(|ch: char| ch.is_ascii_whitespace()).len())
        .max(content_start);
    if content_start >= close {
        return Err(Fault::new(open, FaultKind::EmptyArguments));
    }
    let mut parser = CondParser { src: pattern, pos: content_start, end: content_end };
    let committed = parser.looks_like_condition();
    parser.pos = content_start;
    match parser.conditions() {
        Ok(conds) => Ok((id, ArgMatch::Conditions(conds.into_boxed_slice()))),
        Err(fault) if committed => Err(fault),
        Err(_) => {
            let glob = pattern.get(content_start..content_end).unwrap_or_default();
            Ok((id, ArgMatch::Primary(compile_path_glob(glob, content_start)?)))
        }
    }
}

fn parse_tool_id(pattern: &str, start: usize, end: usize) -> Result<IdPattern, Fault> {
    let text = pattern.get(start..end).unwrap_or_default().trim_end();
    let Some(first) = text.chars().next() else {
        return Err(Fault::new(
            start,
            FaultKind::ToolId("the tool id before `(` is missing; write e.g. `fs.read(data/**)`".into()),
        ));
    };
    for (i, ch) in text.char_indices() {
        if !(ch.is_ascii_alphanumeric() || matches!(ch, '_' | '.' | '-' | '*' | '?')) {
            return Err(Fault::new(
                start + i,
                FaultKind::ToolId(format!(
                    "{ch:?} is not allowed in a tool id; tool ids use letters, digits, `_`, `.` and `-`, id globs add `*` and `?`, and arguments go in parentheses"
                )),
            ));
        }
    }
    if !(first.is_ascii_alphabetic() || first == '*' || first == '?') {
        return Err(Fault::new(
            start,
            FaultKind::ToolId(format!(
                "a tool id starts with a letter, not {first:?} (an id glob may also start with `*` or `?`)"
            )),
        ));
    }
    if !text.contains(['*', '?']) {
        return Ok(IdPattern::Exact(text.into()));
    }
    // `*` must cross `.`, so no literal separator here.
    let glob = GlobBuilder::new(text)
        .literal_separator(false)
        .backslash_escape(true)
        .build()
        .map_err(|e| Fault::new(start, FaultKind::Glob { glob: text.to_owned(), reason: e.kind().to_string() }))?;
    let literal_chars = text.chars().filter(|c| !matches!(c, '*' | '?')).count();
    Ok(IdPattern::Glob { glob, literal_chars })
}

/// A path or URL glob, in the standard form arguments are compared in: a
/// path glob normalized as paths are (`super::normalize_path`), so
/// `/secret/**`, `./secret/**` and `secret//**` mean `secret/**`; a URL glob
/// (`scheme://…`) in URL standard form (`super::url::glob_variants`). A
/// trailing `/**` also matches its base: `secret/**` matches `secret`, the
/// directory a Tool would act on as a whole.
fn compile_path_glob(glob: &str, at: usize) -> Result<Pattern, Fault> {
    let fault = |reason: String| Fault::new(at, FaultKind::Glob { glob: glob.to_owned(), reason });
    let url = super::url::is_url_glob(glob);
    let texts = if url {
        super::url::glob_variants(glob).map_err(fault)?
    } else {
        let normal = super::normalize_path(glob).into_owned();
        let base = normal.strip_suffix("/**").filter(|b| !b.is_empty()).map(str::to_owned);
        std::iter::once(normal).chain(base).collect()
    };
    let mut variants = Vec::with_capacity(texts.len());
    for text in texts {
        let glob = GlobBuilder::new(&text)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| fault(e.kind().to_string()))?;
        // A glob without glob characters matches its own text only.
        let literal = !text.contains(['*', '?', '[', ']', '{', '}', '\\']);
        variants.push(if literal { Variant::Literal(text.into()) } else { Variant::Glob(glob.compile_matcher()) });
    }
    Ok(Pattern { url, query: super::url::glob_names_query(glob), variants: variants.into(), source: glob.into() })
}

/// What to write instead of primary-argument glob `glob` on `tool`, which
/// has no primary argument: a condition, when the glob reads like one
/// (`op=clear`).
pub(super) fn primary_fix(tool: &str, glob: &str) -> String {
    let mut parser = CondParser { src: glob, pos: 0, end: glob.len() };
    let field = parser.field_path().ok().and_then(|_| glob.get(..parser.pos)).map(str::to_owned);
    let op = field.as_ref().and_then(|_| parser.operator().ok());
    match (field, op) {
        (Some(field), Some(op)) => {
            let value = glob.get(parser.pos..).unwrap_or_default().trim().trim_matches('"');
            format!("to compare the field, write `{tool}({field} {} {value:?})`", op.text())
        }
        _ => format!("name the field the glob is about, such as `{tool}(FIELD ~ {glob:?})`"),
    }
}

/// Recursive-descent parser over `src[pos..end]` (byte offsets into the whole pattern,
/// so faults carry positions in the pattern).
struct CondParser<'a> {
    src: &'a str,
    pos: usize,
    end: usize,
}

#[derive(Clone, Copy)]
enum OpKind {
    Glob,
    NotGlob,
    Eq,
    Ne,
}

impl OpKind {
    fn text(self) -> &'static str {
        match self {
            OpKind::Glob => "~",
            OpKind::NotGlob => "!~",
            OpKind::Eq => "=",
            OpKind::Ne => "!=",
        }
    }
}

impl CondParser<'_> {
    fn peek(&self) -> Option<u8> {
        if self.pos < self.end { self.src.as_bytes().get(self.pos).copied() } else { None }
    }

    /// Skip whitespace; report whether any was skipped.
    fn ws(&mut self) -> bool {
        let before = self.pos;
        self.pos = skip_ws(self.src, self.pos).min(self.end).max(before);
        self.pos > before
    }

    fn found(&self) -> String {
        match self.src.get(self.pos..self.end).and_then(|r| r.chars().next()) {
            Some(ch) => format!("{ch:?}"),
            None => "the end of the list".to_owned(),
        }
    }

    /// True when the text starts with `FIELDPATH OP` and whitespace around the operator
    /// or a `"` after it: clearly meant as a condition, so parse errors are reported.
    fn looks_like_condition(&mut self) -> bool {
        self.ws();
        if self.field_path().is_err() {
            return false;
        }
        let before = self.ws();
        if self.operator().is_err() {
            return false;
        }
        let after = self.ws();
        before || after || self.peek() == Some(b'"')
    }

    fn conditions(&mut self) -> Result<Vec<Condition>, Fault> {
        let mut conds = Vec::new();
        let mut comma;
        loop {
            self.ws();
            conds.push(self.condition()?);
            self.ws();
            match self.peek() {
                None => return Ok(conds),
                Some(b',') => comma = self.pos,
                Some(_) => {
                    return Err(Fault::condition(
                        self.pos,
                        format!(
                            "expected `,` or `)` after a condition, found {}; separate conditions with `,`",
                            self.found()
                        ),
                    ));
                }
            }
            self.pos += 1;
            self.ws();
            if self.peek().is_none() {
                return Err(Fault::condition(comma, "expected a condition after `,`; remove the trailing comma"));
            }
        }
    }

    fn condition(&mut self) -> Result<Condition, Fault> {
        let path = self.field_path()?;
        self.ws();
        let op = self.operator()?;
        self.ws();
        let value_at = self.pos;
        let value = self.value(op)?;
        let op = match (op, value) {
            (OpKind::Glob | OpKind::NotGlob, Literal::Str { raw: glob, .. }) => {
                let matcher = compile_path_glob(&glob, value_at)?;
                if matches!(op, OpKind::Glob) { Op::Glob(matcher) } else { Op::NotGlob(matcher) }
            }
            // A URL compares in standard form, as arguments do.
            (OpKind::Eq | OpKind::Ne, Literal::Str { raw, .. })
                if super::url::read(&raw) != super::url::UrlReading::NotUrl =>
            {
                let (text, merged) = super::url::literal(&raw).map_err(|reason| Fault::condition(value_at, reason))?;
                let lit = Literal::Url { text, merged };
                if matches!(op, OpKind::Eq) { Op::Eq(lit) } else { Op::Ne(lit) }
            }
            (OpKind::Glob | OpKind::NotGlob, _) => {
                return Err(Fault::condition(
                    value_at,
                    format!(
                        "`{}` matches a glob, so its value must be a double-quoted string such as \"out/**\"; use `=` or `!=` to compare other values",
                        op.text()
                    ),
                ));
            }
            (OpKind::Eq, lit) => Op::Eq(lit),
            (OpKind::Ne, lit) => Op::Ne(lit),
        };
        Ok(Condition { path: path.into_boxed_slice(), op })
    }

    fn ident(&mut self) -> Result<&str, Fault> {
        let start = self.pos;
        match self.peek() {
            Some(b) if b.is_ascii_alphabetic() || b == b'_' => self.pos += 1,
            _ => {
                return Err(Fault::condition(
                    start,
                    format!(
                        "expected a field name (letters, digits, `_`, `-`, starting with a letter or `_`), found {}",
                        self.found()
                    ),
                ));
            }
        }
        while self.peek().is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            self.pos += 1;
        }
        Ok(self.src.get(start..self.pos).unwrap_or_default())
    }

    fn field_path(&mut self) -> Result<Vec<Step>, Fault> {
        let mut steps = vec![Step::Field(self.ident()?.into())];
        loop {
            match self.peek() {
                Some(b'.') => {
                    self.pos += 1;
                    steps.push(Step::Field(self.ident()?.into()));
                }
                Some(b'[') => {
                    let open = self.pos;
                    self.pos += 1;
                    let step = if self.peek() == Some(b'*') {
                        self.pos += 1;
                        Step::Each
                    } else {
                        let start = self.pos;
                        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                            self.pos += 1;
                        }
                        let digits = self.src.get(start..self.pos).unwrap_or_default();
                        match digits.parse::<usize>() {
                            Ok(i) => Step::Index(i),
                            Err(_) if digits.is_empty() => {
                                return Err(Fault::condition(
                                    open,
                                    "expected `[*]` or an index such as `[0]` in the field path",
                                ));
                            }
                            Err(_) => {
                                return Err(Fault::condition(
                                    start,
                                    "the index is too large; use a smaller index or `[*]`",
                                ));
                            }
                        }
                    };
                    if self.peek() != Some(b']') {
                        return Err(Fault::condition(
                            self.pos,
                            format!("expected `]` to close `[`, found {}", self.found()),
                        ));
                    }
                    self.pos += 1;
                    steps.push(step);
                }
                _ => return Ok(steps),
            }
        }
    }

    fn operator(&mut self) -> Result<OpKind, Fault> {
        let rest = self.src.get(self.pos..self.end).unwrap_or_default();
        let (op, len) = if rest.starts_with("!~") {
            (OpKind::NotGlob, 2)
        } else if rest.starts_with("!=") {
            (OpKind::Ne, 2)
        } else if rest.starts_with('~') {
            (OpKind::Glob, 1)
        } else if rest.starts_with('=') {
            (OpKind::Eq, 1)
        } else {
            return Err(Fault::condition(
                self.pos,
                format!("expected an operator `~`, `!~`, `=` or `!=` after the field path, found {}", self.found()),
            ));
        };
        self.pos += len;
        Ok(op)
    }

    fn value(&mut self, op: OpKind) -> Result<Literal, Fault> {
        let start = self.pos;
        match self.peek() {
            Some(b'"') => return self.string(),
            Some(b) if b == b'-' || b.is_ascii_digit() => {
                while self.peek().is_some_and(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')) {
                    self.pos += 1;
                }
                let text = self.src.get(start..self.pos).unwrap_or_default();
                return serde_json::from_str::<serde_json::Number>(text).map(Literal::Num).map_err(|_| {
                    Fault::condition(start, format!("{text:?} is not a valid JSON number; write e.g. 42, -1 or 0.5"))
                });
            }
            Some(b) if b.is_ascii_alphabetic() => {
                while self.peek().is_some_and(|b| b.is_ascii_alphanumeric()) {
                    self.pos += 1;
                }
                match self.src.get(start..self.pos).unwrap_or_default() {
                    "true" => return Ok(Literal::Bool(true)),
                    "false" => return Ok(Literal::Bool(false)),
                    "null" => return Ok(Literal::Null),
                    _ => self.pos = start,
                }
            }
            _ => {}
        }
        Err(self.unquoted_value(op))
    }

    /// Explain a value that is neither quoted nor a literal, suggesting the quoted form
    /// of the text up to the next `,`.
    fn unquoted_value(&self, op: OpKind) -> Fault {
        let rest = self.src.get(self.pos..self.end).unwrap_or_default();
        let token = rest.split(',').next().unwrap_or_default().trim_end();
        let reason = if token.is_empty() || token.starts_with(['=', '~', '!']) {
            format!(
                "expected a value after `{}`, found {}; the operators are `~`, `!~`, `=` and `!=`, followed by a double-quoted string, a JSON number, true, false or null",
                op.text(),
                self.found()
            )
        } else if matches!(op, OpKind::Glob | OpKind::NotGlob) {
            format!("the glob after `{}` must be a double-quoted string; write {token:?}", op.text())
        } else {
            format!(
                "the value after `{}` must be a double-quoted string, a JSON number, true, false or null; write {token:?} to compare a string",
                op.text()
            )
        };
        Fault::condition(self.pos, reason)
    }

    fn string(&mut self) -> Result<Literal, Fault> {
        let open = self.pos;
        self.pos += 1;
        let mut out = String::new();
        loop {
            let rest = self.src.get(self.pos..self.end).unwrap_or_default();
            let Some(ch) = rest.chars().next() else {
                return Err(Fault::condition(open, "the string is never closed; end it with `\"`"));
            };
            match ch {
                '"' => {
                    self.pos += 1;
                    let path = super::normalize_path(&out).into_owned().into();
                    return Ok(Literal::Str { raw: out.into(), path });
                }
                '\\' => {
                    let escaped = rest.get(1..).and_then(|r| r.chars().next());
                    match escaped {
                        Some(c @ ('"' | '\\')) => {
                            out.push(c);
                            self.pos += 2;
                        }
                        _ => {
                            return Err(Fault::condition(
                                self.pos,
                                "unsupported escape in string; only `\\\"` and `\\\\` are allowed (write `\\\\` for a backslash)",
                            ));
                        }
                    }
                }
                _ => {
                    out.push(ch);
                    self.pos += ch.len_utf8();
                }
            }
        }
    }
}
