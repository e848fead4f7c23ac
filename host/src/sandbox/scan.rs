//! Scan: finding a configured secret in what comes back to a guest, in the
//! encodings servers and HTTP libraries commonly produce.
//!
//! Owns the check behind DESIGN.md invariant 13. For every secret it builds
//! *needles*, the secret as an encoder would write it: raw (in any ASCII
//! letter case, for secrets of [`MIN_SECRET`] bytes or more: servers
//! normalize ids); base64 and base64url at each of the three byte
//! alignments (so a secret inside a larger value encoded whole, like
//! `user:pass` or `Bearer …`, is found; padding does not matter), and base64
//! of that base64; base32; hex in either case, plain and with `:`, `-` or
//! space between bytes; a list of decimal byte values (a Node `Buffer` as
//! JSON); UTF-16 in either byte order. It searches them with one
//! multi-pattern automaton per case rule (aho-corasick, linear in the
//! input) over *views* of the data, each built only when the data holds its
//! escape character:
//!
//! - as sent;
//! - one escape kind undone: JSON/JavaScript backslash escapes (`\/`,
//!   `\uXXXX` with surrogate pairs, `\xHH`), HTML/XML character references,
//!   percent-encoding (with and without `+` as a space), quoted-printable;
//! - every kind undone at once, repeatedly (up to [`MAX_PASSES`] times):
//!   escapes inside escapes, such as percent-encoding twice or an HTML
//!   reference inside a JSON escape (`\u0026#x2F;`), each pass scanned;
//! - as sent and after each repeated pass, with line breaks and blanks
//!   removed (base64 wrapped at 64 or 76 columns, PEM).
//!
//! What it cannot find is written down in SECURITY.md ("Known limits"): a
//! secret split across responses, reversed, encrypted, hashed, compressed
//! inside a field, or in an encoding not listed.
//!
//! Architecture invariant: a finding names the credential, the encoding and
//! the view — never the secret. Secrets shorter than [`MIN_SECRET`] bytes
//! cannot be told apart from ordinary text; the credentials layer refuses
//! to apply them.

use std::borrow::Cow;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use base64::Engine as _;

pub use crate::authority::credentials::MIN_SECRET;

/// How many times the all-kinds view undoes escapes: enough for the
/// layering libraries produce by accident (a value escaped for a URL, then
/// for JSON, then for HTML), bounded so a hostile response costs at most a
/// fixed number of passes over it.
pub const MAX_PASSES: usize = 4;

/// Where a secret was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The credential's name.
    pub credential: String,
    /// How the secret was encoded: `raw`, `base64`, `base64url`,
    /// `base64 twice`, `base32`, `hex`, `hex with separators`, `byte list`,
    /// `UTF-16`.
    pub form: &'static str,
    /// Which view found it, e.g. `as sent`, `JSON-unescaped`,
    /// `decoded repeatedly`.
    pub view: &'static str,
}

/// Every configured secret, ready to be searched for.
pub struct SecretScanner {
    /// Case-sensitive needles (every encoded form, short secrets).
    exact: Option<AhoCorasick>,
    /// ASCII-case-insensitive needles (the raw secrets).
    folded: Option<AhoCorasick>,
    /// Per pattern of `exact`, then of `folded`: (credential index, form).
    exact_meta: Vec<(usize, &'static str)>,
    folded_meta: Vec<(usize, &'static str)>,
    names: Vec<String>,
}

impl std::fmt::Debug for SecretScanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the needles: they are the secrets.
        f.debug_struct("SecretScanner").field("credentials", &self.names).finish_non_exhaustive()
    }
}

/// The characters of `encode(secret)` that do not depend on the bytes
/// around it, when it starts `offset` bytes into a group of an encoding of
/// `bits` bits per character (6 for base64, 5 for base32).
fn core(secret: &[u8], offset: usize, bits: usize, encode: impl Fn(&[u8]) -> String) -> Option<Vec<u8>> {
    let mut padded = vec![0u8; offset];
    padded.extend_from_slice(secret);
    let encoded = encode(&padded).into_bytes();
    // Character i covers bits [bits·i, bits·(i+1)) of `padded`; keep those inside the secret.
    let first = (8 * offset).div_ceil(bits);
    let end = (8 * (offset + secret.len())) / bits;
    (end > first + 3).then(|| encoded.get(first..end).map(<[u8]>::to_vec)).flatten()
}

/// The secret as URL and JSON encoders write it, where that differs from
/// the secret itself: percent-encoded (as the host writes a query
/// credential, and with `+` for a space), and JSON-escaped (with and
/// without `\/`).
fn escapings(secret: &[u8]) -> Vec<Vec<u8>> {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
    let percent: Vec<u8> =
        secret.iter().flat_map(|&b| if unreserved(b) { vec![b] } else { format!("%{b:02X}").into_bytes() }).collect();
    let form: Vec<u8> = secret
        .iter()
        .flat_map(|&b| match b {
            b' ' => vec![b'+'],
            b if unreserved(b) => vec![b],
            b => format!("%{b:02X}").into_bytes(),
        })
        .collect();
    let mut out = vec![percent, form];
    if let Ok(text) = std::str::from_utf8(secret)
        && let Ok(json) = serde_json::to_string(text)
    {
        let json = json.trim_matches('"').to_owned();
        out.push(json.replace('/', "\\/").into_bytes());
        out.push(json.into_bytes());
    }
    out.retain(|e| e.as_slice() != secret);
    out.sort();
    out.dedup();
    out
}

/// Collects needles, once each.
#[derive(Default)]
struct Needles {
    patterns: Vec<Vec<u8>>,
    meta: Vec<(usize, &'static str)>,
}

impl Needles {
    fn add(&mut self, needle: Vec<u8>, credential: usize, form: &'static str) {
        if !needle.is_empty() && !self.patterns.contains(&needle) {
            self.patterns.push(needle);
            self.meta.push((credential, form));
        }
    }

    fn build(self, fold: bool) -> (Option<AhoCorasick>, Vec<(usize, &'static str)>) {
        let ac = (!self.patterns.is_empty())
            .then(|| {
                AhoCorasickBuilder::new()
                    .match_kind(MatchKind::Standard)
                    .ascii_case_insensitive(fold)
                    .build(&self.patterns)
                    .ok()
            })
            .flatten();
        (ac, self.meta)
    }
}

impl SecretScanner {
    /// A scanner for `secrets` (credential name, secret bytes). Secrets
    /// shorter than [`MIN_SECRET`] are searched for raw only.
    pub fn new(secrets: &[(String, Vec<u8>)]) -> Self {
        let b64 = |e: &'static base64::engine::GeneralPurpose| move |d: &[u8]| e.encode(d);
        let std = b64(&base64::engine::general_purpose::STANDARD_NO_PAD);
        let url = b64(&base64::engine::general_purpose::URL_SAFE_NO_PAD);
        let b32 = |d: &[u8]| data_encoding::BASE32_NOPAD.encode(d);
        let (mut exact, mut folded) = (Needles::default(), Needles::default());
        for (i, (_, secret)) in secrets.iter().enumerate() {
            if secret.len() < MIN_SECRET {
                exact.add(secret.clone(), i, "raw");
                continue;
            }
            // In any letter case: servers normalize ids and hex keys (a
            // lowercase key or UUID echoed upper-case is the same secret).
            folded.add(secret.clone(), i, "raw");
            // Base64 of the secret as it stands in a URL or a JSON string
            // too: a query credential comes back inside a base64 cursor or
            // signed URL, a header value inside base64 of escaped JSON.
            let escaped = escapings(secret);
            for offset in 0..3 {
                for (encode, form) in [(&std as &dyn Fn(&[u8]) -> String, "base64"), (&url, "base64url")] {
                    for text in std::iter::once(secret).chain(&escaped) {
                        if let Some(c) = core(text, offset, 6, encode) {
                            exact.add(c, i, form);
                        }
                    }
                }
                // base64 of a base64 value that holds the secret.
                if let Some(inner) = core(secret, offset, 6, std) {
                    for outer in 0..3 {
                        if let Some(c) = core(&inner, outer, 6, std) {
                            exact.add(c, i, "base64 twice");
                        }
                    }
                }
            }
            for offset in 0..5 {
                if let Some(c) = core(secret, offset, 5, b32) {
                    // Upper case (RFC 4648) and lower (DNS names, some
                    // libraries), as exact needles: a case-insensitive
                    // needle of letters matches everywhere in text and
                    // makes the search several times slower.
                    exact.add(c.to_ascii_lowercase(), i, "base32");
                    exact.add(c, i, "base32");
                }
            }
            let hex = hex::encode(secret);
            // Hex in lower and in upper case (exact, for the same reason).
            exact.add(hex.to_ascii_uppercase().into_bytes(), i, "hex");
            exact.add(hex.clone().into_bytes(), i, "hex");
            let pairs: Vec<&str> = hex.as_bytes().chunks(2).filter_map(|p| std::str::from_utf8(p).ok()).collect();
            for sep in [":", "-", " "] {
                let joined = pairs.join(sep);
                exact.add(joined.to_ascii_uppercase().into_bytes(), i, "hex with separators");
                exact.add(joined.into_bytes(), i, "hex with separators");
            }
            let decimal: Vec<String> = secret.iter().map(u8::to_string).collect();
            // JSON arrays (`,`, `, `) and Go's `%v` of a byte slice (` `).
            for sep in [",", ", ", " "] {
                exact.add(decimal.join(sep).into_bytes(), i, "byte list");
            }
            if let Ok(text) = std::str::from_utf8(secret) {
                let units: Vec<u16> = text.encode_utf16().collect();
                exact.add(units.iter().flat_map(|u| u.to_le_bytes()).collect(), i, "UTF-16");
                exact.add(units.iter().flat_map(|u| u.to_be_bytes()).collect(), i, "UTF-16");
            }
        }
        let (exact, exact_meta) = exact.build(false);
        let (folded, folded_meta) = folded.build(true);
        SecretScanner {
            exact,
            folded,
            exact_meta,
            folded_meta,
            names: secrets.iter().map(|(n, _)| n.clone()).collect(),
        }
    }

    /// Whether there is nothing to look for.
    pub fn is_empty(&self) -> bool {
        self.exact.is_none() && self.folded.is_none()
    }

    /// The first secret found in `data`, in any view.
    pub fn find(&self, data: &[u8]) -> Option<Finding> {
        if self.is_empty() {
            return None;
        }
        self.find_in(data, "as sent")
            .or_else(|| self.find_unwrapped(data, "as sent, line breaks removed"))
            .or_else(|| {
                // One kind at a time: a secret that holds another kind's
                // escape character (a `%` or `\` of its own) stays whole.
                SINGLE.iter().find_map(|(trigger, kinds, name)| {
                    if !data.contains(trigger) {
                        return None;
                    }
                    self.find_in(&unescape(data, *kinds)?, name)
                })
            })
            .or_else(|| self.find_repeated(data))
            .or_else(|| {
                // Text in UTF-16: with its zero bytes gone, ASCII is ASCII
                // again and every view above applies (a secret's base64 or
                // hex written in UTF-16).
                memchr::memchr(0, data)?;
                let zeros = memchr::memchr_iter(0, data).count();
                (zeros * 4 >= data.len()).then(|| {
                    let narrowed: Vec<u8> = data.iter().copied().filter(|&b| b != 0).collect();
                    self.find(&narrowed).map(|f| Finding { view: "UTF-16 narrowed", ..f })
                })?
            })
    }

    /// Every kind undone at once, pass after pass, each pass scanned; then
    /// the same with `+` as a space, if a `+` showed up on the way.
    fn find_repeated(&self, data: &[u8]) -> Option<Finding> {
        let mut saw_plus = data.contains(&b'+');
        for plus in [false, true] {
            if plus && !saw_plus {
                break;
            }
            let kinds = Kinds { plus, ..ALL };
            let mut current = Cow::Borrowed(data);
            for _ in 0..MAX_PASSES {
                let plus_found = plus && memchr::memchr(b'+', &current).is_some();
                if !plus_found && memchr::memchr3(b'\\', b'&', b'%', &current).is_none() {
                    break;
                }
                let Some(next) = unescape(&current, kinds) else {
                    break;
                };
                saw_plus |= next.contains(&b'+');
                let name = if plus { "form-decoded repeatedly" } else { "decoded repeatedly" };
                let wrapped = if plus {
                    "form-decoded repeatedly, line breaks removed"
                } else {
                    "decoded repeatedly, line breaks removed"
                };
                if let Some(f) = self.find_in(&next, name).or_else(|| self.find_unwrapped(&next, wrapped)) {
                    return Some(f);
                }
                current = Cow::Owned(next);
            }
        }
        None
    }

    /// `data` without blanks, if it has line breaks: base64 and hex
    /// wrapped at a fixed width (MIME, PEM) are contiguous again, and so is
    /// quoted-printable text (its soft line break, `=` at a line's end,
    /// goes with the break; its `=XX` are undone too).
    fn find_unwrapped(&self, data: &[u8], name: &'static str) -> Option<Finding> {
        memchr::memchr2(b'\n', b'\r', data)?;
        let blank = |b: Option<&u8>| matches!(b, Some(b'\n' | b'\r' | b' ' | b'\t'));
        let mut joined = Vec::with_capacity(data.len());
        for (i, b) in data.iter().enumerate() {
            let soft_break = *b == b'=' && matches!(data.get(i + 1), Some(b'\r' | b'\n'));
            if !blank(Some(b)) && !soft_break {
                joined.push(*b);
            }
        }
        self.find_in(&joined, name)
            .or_else(|| self.find_in(&unescape(&joined, Kinds { quoted_printable: true, ..NONE })?, name))
    }

    fn find_in(&self, view: &[u8], name: &'static str) -> Option<Finding> {
        let hit = |ac: &Option<AhoCorasick>, meta: &[(usize, &'static str)]| {
            let m = ac.as_ref()?.find(view)?;
            let (i, form) = *meta.get(m.pattern().as_usize())?;
            Some(Finding { credential: self.names.get(i).cloned().unwrap_or_default(), form, view: name })
        };
        hit(&self.exact, &self.exact_meta).or_else(|| hit(&self.folded, &self.folded_meta))
    }
}

/// Which escape kinds one decoding pass undoes.
#[derive(Debug, Clone, Copy)]
struct Kinds {
    backslash: bool,
    html: bool,
    percent: bool,
    plus: bool,
    quoted_printable: bool,
}

const NONE: Kinds = Kinds { backslash: false, html: false, percent: false, plus: false, quoted_printable: false };
/// The kinds undone together, repeatedly. Quoted-printable is not among
/// them: `=` followed by two hex digits is everyday text in URLs
/// (`?key=de…`), and undoing it would break the secret that follows.
const ALL: Kinds = Kinds { backslash: true, html: true, percent: true, ..NONE };

/// The one-kind views: the byte that triggers each, its kinds, its name.
const SINGLE: &[(u8, Kinds, &str)] = &[
    (b'\\', Kinds { backslash: true, ..NONE }, "JSON-unescaped"),
    (b'&', Kinds { html: true, ..NONE }, "HTML-unescaped"),
    (b'%', Kinds { percent: true, ..NONE }, "percent-decoded"),
    (b'+', Kinds { percent: true, plus: true, ..NONE }, "form-decoded"),
    (b'=', Kinds { quoted_printable: true, ..NONE }, "quoted-printable-decoded"),
];

/// `data` with the escapes of `kinds` undone in one left-to-right pass
/// (what a pass produces is not decoded again in the same pass); anything
/// that is not a well-formed escape stays as it is. `None` when there was
/// nothing to undo: the view would be the data itself.
fn unescape(data: &[u8], kinds: Kinds) -> Option<Vec<u8>> {
    let mut special = [false; 256];
    for (on, b) in [
        (kinds.backslash, b'\\'),
        (kinds.html, b'&'),
        (kinds.percent, b'%'),
        (kinds.quoted_printable, b'='),
        (kinds.plus, b'+'),
    ] {
        special[usize::from(b)] = on;
    }
    let mut out = Vec::new();
    let mut changed = false;
    // Input up to `copied` is in `out`.
    let (mut i, mut copied) = (0, 0);
    while let Some(at) = data[i..].iter().position(|&b| special[usize::from(b)]) {
        i += at;
        if out.capacity() == 0 {
            out.reserve(data.len());
        }
        out.extend_from_slice(&data[copied..i]);
        let rest = &data[i..];
        let used = match rest[0] {
            b'\\' => backslash_at(rest, &mut out),
            b'&' => reference_at(rest, &mut out),
            b'%' => percent_at(rest, &mut out),
            b'=' => quoted_printable_at(rest, &mut out),
            _ => {
                out.push(b' ');
                Some(1)
            }
        };
        match used {
            Some(n) => {
                changed = true;
                i += n;
            }
            // Not an escape: the byte stays as it is.
            None => {
                out.push(rest[0]);
                i += 1;
            }
        }
        copied = i;
    }
    if !changed {
        return None;
    }
    out.extend_from_slice(&data[copied..]);
    Some(out)
}

fn hex_digit(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn push_char(code: u32, out: &mut Vec<u8>) -> bool {
    match char::from_u32(code) {
        Some(c) => {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            true
        }
        None => false,
    }
}

/// A JSON or JavaScript escape at the start of `s` (`\"`, `\\`, `\/`,
/// `\b\f\n\r\t`, `\uXXXX` with surrogate pairs, `\xHH`): decoded into
/// `out`, and how many bytes it took.
fn backslash_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    let hex4 =
        |at: usize| -> Option<u32> { u32::from_str_radix(std::str::from_utf8(s.get(at..at + 4)?).ok()?, 16).ok() };
    let simple = match *s.get(1)? {
        b'"' => b'"',
        b'\\' => b'\\',
        b'/' => b'/',
        b'\'' => b'\'',
        b'b' => 8,
        b'f' => 12,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'x' => {
            let byte = hex_digit(*s.get(2)?)? << 4 | hex_digit(*s.get(3)?)?;
            out.push(byte);
            return Some(4);
        }
        b'u' => {
            let hi = hex4(2)?;
            if (0xD800..0xDC00).contains(&hi)
                && s.get(6..8) == Some(b"\\u")
                && let Some(lo) = hex4(8)
                && (0xDC00..0xE000).contains(&lo)
            {
                return push_char(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00), out).then_some(12);
            }
            return push_char(hi, out).then_some(6);
        }
        _ => return None,
    };
    out.push(simple);
    Some(2)
}

/// HTML5 named references for ASCII punctuation, plus the XML five.
const NAMED: &[(&str, u8)] = &[
    ("amp", b'&'),
    ("lt", b'<'),
    ("gt", b'>'),
    ("quot", b'"'),
    ("apos", b'\''),
    ("excl", b'!'),
    ("num", b'#'),
    ("dollar", b'$'),
    ("percnt", b'%'),
    ("lpar", b'('),
    ("rpar", b')'),
    ("ast", b'*'),
    ("midast", b'*'),
    ("plus", b'+'),
    ("comma", b','),
    ("period", b'.'),
    ("sol", b'/'),
    ("colon", b':'),
    ("semi", b';'),
    ("equals", b'='),
    ("quest", b'?'),
    ("commat", b'@'),
    ("lsqb", b'['),
    ("lbrack", b'['),
    ("bsol", b'\\'),
    ("rsqb", b']'),
    ("rbrack", b']'),
    ("Hat", b'^'),
    ("lowbar", b'_'),
    ("UnderBar", b'_'),
    ("grave", b'`'),
    ("DiacriticalGrave", b'`'),
    ("lcub", b'{'),
    ("lbrace", b'{'),
    ("verbar", b'|'),
    ("vert", b'|'),
    ("VerticalLine", b'|'),
    ("rcub", b'}'),
    ("rbrace", b'}'),
    ("tilde", b'~'),
    ("nbsp", b' '),
    ("Tab", b'\t'),
    ("NewLine", b'\n'),
];

/// A character reference at the start of `s` (`&#NN;`, `&#xHH;` — the `;`
/// optional, as browsers accept — or a named one above).
fn reference_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    let rest = s.get(1..)?;
    if rest.first() == Some(&b'#') {
        let (radix, start) = if matches!(rest.get(1), Some(b'x' | b'X')) { (16, 2) } else { (10, 1) };
        let tail = rest.get(start..)?;
        let digits = tail.iter().take_while(|b| b.is_ascii_hexdigit() && (radix == 16 || b.is_ascii_digit())).count();
        if digits == 0 || digits > 8 {
            return None;
        }
        let code = u32::from_str_radix(std::str::from_utf8(&tail[..digits]).ok()?, radix).ok()?;
        let semi = usize::from(tail.get(digits) == Some(&b';'));
        return push_char(code, out).then_some(1 + start + digits + semi);
    }
    // The longest name is 16 bytes: look for its `;` no further.
    let semi = rest.iter().take(17).position(|&b| b == b';')?;
    let name = &rest[..semi];
    let (_, b) = NAMED.iter().find(|(n, _)| n.as_bytes() == name)?;
    out.push(*b);
    Some(1 + semi + 1)
}

/// `%XX` (either case) at the start of `s`.
fn percent_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    out.push(hex_digit(*s.get(1)?)? << 4 | hex_digit(*s.get(2)?)?);
    Some(3)
}

/// Quoted-printable at the start of `s`: `=XX`, or a soft line break
/// (`=` before a line end), which stands for nothing.
fn quoted_printable_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    match (s.get(1), s.get(2)) {
        (Some(b'\r'), Some(b'\n')) => Some(3),
        (Some(b'\n'), _) => Some(2),
        _ => percent_at(s, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    const SECRET: &str = "tg/s3+cr=t Zq8v~é";

    fn scanner() -> SecretScanner {
        SecretScanner::new(&[
            ("tracker".into(), SECRET.as_bytes().to_vec()),
            ("other".into(), b"0th3r-s3cret-value".to_vec()),
        ])
    }

    fn json_escape_all(s: &str) -> String {
        s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect()
    }

    /// Every form a server or HTTP library commonly produces.
    fn forms(secret: &str) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("raw", secret.to_owned()),
            ("json \\/", serde_json::to_string(secret).unwrap().replace('/', "\\/")),
            ("json \\u every char", json_escape_all(secret)),
            ("json \\U upper", json_escape_all(secret).to_uppercase().replace("\\U", "\\u")),
            ("html decimal", secret.chars().map(|c| format!("&#{};", c as u32)).collect()),
            ("html hex no semicolon", secret.chars().map(|c| format!("&#x{:X}", c as u32)).collect()),
            ("html named", secret.replace('/', "&sol;").replace('+', "&plus;").replace('=', "&equals;")),
            ("percent upper", secret.bytes().map(|b| format!("%{b:02X}")).collect()),
            ("percent lower", secret.bytes().map(|b| format!("%{b:02x}")).collect()),
            (
                "form (+ for space)",
                secret
                    .bytes()
                    .map(|b| {
                        if b == b' ' {
                            "+".to_owned()
                        } else if b.is_ascii_alphanumeric() {
                            (b as char).to_string()
                        } else {
                            format!("%{b:02X}")
                        }
                    })
                    .collect(),
            ),
            ("hex lower", hex::encode(secret)),
            ("hex upper", hex::encode_upper(secret)),
        ];
        let pct = |s: &str| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
        let b64 = STANDARD.encode(secret);
        v.extend([
            // Escapes inside escapes.
            ("percent twice", pct(secret).replace('%', "%25")),
            ("percent three times", pct(secret).replace('%', "%25").replace('%', "%25")),
            (
                "HTML reference inside a JSON escape",
                secret.chars().map(|c| format!("\\u0026#x{:X};", c as u32)).collect(),
            ),
            ("JSON escape inside percent-encoding", json_escape_all(secret).replace('\\', "%5C")),
            ("percent, then JSON, then HTML", pct(secret).replace('%', "\\u0025").replace('\\', "&#92;")),
            ("base64 percent-encoded twice", b64.replace('+', "%252B").replace('/', "%252F").replace('=', "%253D")),
            ("JavaScript \\x", secret.bytes().map(|b| format!("\\x{b:02x}")).collect()),
            ("quoted-printable", secret.bytes().map(|b| format!("={b:02X}")).collect()),
            ("quoted-printable, soft line breaks", secret.bytes().map(|b| format!("={b:02X}=\r\n")).collect()),
            // Other encoders.
            ("base32", data_encoding::BASE32.encode(secret.as_bytes())),
            ("base32 lower", data_encoding::BASE32.encode(secret.as_bytes()).to_lowercase()),
            ("base64 twice", STANDARD.encode(&b64)),
            ("hex with colons", wrap(&hex::encode(secret), 2, ":")),
            ("hex with spaces, upper", wrap(&hex::encode_upper(secret), 2, " ")),
            ("byte list (Node Buffer as JSON)", secret.bytes().map(|b| b.to_string()).collect::<Vec<_>>().join(",")),
            // Base64 of the secret as a URL or JSON encoder left it.
            (
                "base64 of a URL holding it percent-encoded",
                STANDARD.encode(format!("https://api.example/v1?key={}&page=2", pct_unreserved(secret))),
            ),
            ("base64 of JSON with \\/", STANDARD.encode(serde_json::to_string(secret).unwrap().replace('/', "\\/"))),
            (
                "Go %v of a byte slice",
                format!("[{}]", secret.bytes().map(|b| b.to_string()).collect::<Vec<_>>().join(" ")),
            ),
            (
                "quoted-printable with soft line breaks, in a JSON string",
                secret.bytes().map(|b| format!("={b:02X}=\\r\\n")).collect(),
            ),
            // Wrapped at a fixed width.
            ("base64 wrapped at 8 columns (CRLF)", wrap(&b64, 8, "\r\n")),
            ("base64 wrapped, JSON-escaped", wrap(&b64, 8, "\\n")),
            (
                "base64 wrapped, JSON-escaped, percent-encoded",
                wrap(&b64, 8, "\\n").replace('\\', "%5C").replace('+', "%2B"),
            ),
        ]);
        for prefix in ["", "a", "ab", "Bearer ", "user:"] {
            let whole = format!("{prefix}{secret}");
            v.push(("base64", STANDARD.encode(&whole)));
            v.push(("base64 unpadded", STANDARD_NO_PAD_ENC.encode(&whole)));
            v.push(("base64url", URL_SAFE.encode(&whole)));
            v.push(("base64, then JSON-escaped", STANDARD.encode(&whole).replace('/', "\\/")));
            v.push((
                "base64, then percent-encoded",
                STANDARD.encode(&whole).replace('+', "%2B").replace('/', "%2f").replace('=', "%3D"),
            ));
        }
        v
    }

    use base64::engine::general_purpose::STANDARD_NO_PAD as STANDARD_NO_PAD_ENC;

    fn pct_unreserved(s: &str) -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    fn wrap(s: &str, width: usize, line_end: &str) -> String {
        s.as_bytes().chunks(width).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join(line_end)
    }

    #[test]
    fn every_common_form_is_found_wherever_it_sits() {
        let s = scanner();
        for (name, form) in forms(SECRET) {
            for (prefix, suffix) in [("", ""), ("{\"echo\":\"", "\"}"), ("x", "y"), ("line\n", "\nmore")] {
                let data = format!("{prefix}{form}{suffix}");
                let found = s.find(data.as_bytes());
                assert_eq!(found.as_ref().map(|f| f.credential.as_str()), Some("tracker"), "{name}: {data}");
            }
        }
        // Another configured credential, not only the one a request used.
        assert_eq!(s.find(STANDARD.encode("x0th3r-s3cret-value").as_bytes()).unwrap().credential, "other");
    }

    #[test]
    fn ordinary_data_is_not_flagged_and_a_finding_never_holds_the_secret() {
        let s = scanner();
        for clean in [
            "",
            "tg/s3+cr=t",
            "{\"token\":\"tg\\/s3\"}",
            "%%%&&&\\\\\\u12",
            "&#xFFFFFFFFF;&#;&bogus;",
            "tg/s3+cr=t Zq8v",
        ] {
            assert_eq!(s.find(clean.as_bytes()), None, "{clean}");
        }
        let f = s.find(SECRET.as_bytes()).unwrap();
        assert_eq!((f.form, f.view), ("raw", "as sent"));
        assert!(!format!("{f:?}{s:?}").contains("Zq8v"), "no secret in findings or Debug");
    }

    #[test]
    fn a_secret_echoed_in_another_letter_case_is_found() {
        let key = "3f9a1c7e-55aa-4b2e-9d10-aa44bb66cc88";
        let s = SecretScanner::new(&[("key".into(), key.as_bytes().to_vec())]);
        for echoed in [key.to_ascii_uppercase(), format!("{{\"id\":\"{}\"}}", key.to_ascii_uppercase())] {
            let f = s.find(echoed.as_bytes());
            assert_eq!(f.map(|f| f.form), Some("raw"), "{echoed}");
        }
        // Base64 is case-sensitive: its needles stay exact.
        let upper_b64 = STANDARD.encode(key).to_ascii_uppercase();
        assert_eq!(s.find(upper_b64.as_bytes()), None);
    }

    #[test]
    fn a_secret_in_utf16_is_found_in_either_byte_order() {
        let s = scanner();
        for le in [true, false] {
            let mut data = b"{\"echo\":\"".to_vec();
            for u in SECRET.encode_utf16() {
                data.extend(if le { u.to_le_bytes() } else { u.to_be_bytes() });
            }
            data.extend(b"\"}");
            assert_eq!(s.find(&data).map(|f| f.form), Some("UTF-16"), "little-endian: {le}");
        }
        // Another encoding written in UTF-16: found once the zero bytes are gone.
        let b64: Vec<u8> = STANDARD.encode(SECRET).encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
        assert_eq!(s.find(&b64).map(|f| (f.form, f.view)), Some(("base64", "UTF-16 narrowed")));
    }

    #[test]
    fn decoders_never_panic_on_truncated_escapes() {
        for data in [
            "\\",
            "\\x",
            "\\x4",
            "=",
            "=\r",
            "\\u",
            "\\u12",
            "\\ud800",
            "\\ud800\\u",
            "&",
            "&#",
            "&#x",
            "&#99999999999;",
            "%",
            "%4",
            "%zz",
            "+",
        ] {
            for (_, kinds, _) in SINGLE {
                let _ = unescape(data.as_bytes(), *kinds);
            }
            let _ = unescape(data.as_bytes(), Kinds { plus: true, quoted_printable: true, ..ALL });
        }
    }

    proptest::proptest! {
        #[test]
        fn a_secret_is_found_base64_encoded_inside_any_value(prefix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..7), suffix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..7)) {
            let s = scanner();
            let whole = [prefix.as_slice(), SECRET.as_bytes(), suffix.as_slice()].concat();
            for encoded in [STANDARD.encode(&whole), URL_SAFE.encode(&whole), STANDARD_NO_PAD_ENC.encode(&whole)] {
                proptest::prop_assert!(s.find(encoded.as_bytes()).is_some(), "{}", encoded);
            }
        }

        #[test]
        fn scanning_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = scanner().find(&data);
        }
    }
}
