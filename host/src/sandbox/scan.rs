//! Scan: finding a configured secret in what comes back to a guest, in the
//! encodings servers and HTTP libraries commonly produce.
//!
//! Owns the check behind DESIGN.md invariant 13. A secret is watched for
//! in each value a destination may read as the credential
//! ([`watched_values`]): as stored, without a byte order mark, trimmed of
//! blanks, and each long enough word of it (the token of a stored
//! `Bearer …`); and what the destination decodes each of those to, when
//! it is stored already encoded ([`decoded_values`]: the bytes of a
//! base64, base64url or hex value, the side of a `Basic` pair that
//! carries the secret), so a server that decodes the credential and
//! echoes it in another encoding, or echoes that side alone, is found.
//! For every value it builds *needles*, the value as an encoder would
//! write it: raw (in any ASCII letter case, for secrets of
//! [`MIN_SECRET`] bytes or more: servers normalize ids; its letters beyond
//! ASCII lower-, upper-cased and mixed, [`case_variants`]), and in Latin-1
//! and Windows-1252 when every character fits a byte there; for a value
//! with escape-like sequences of its own (`%41`, `\$`, `&lt;`, `+`, `=`),
//! raw as the views over-decode it under two layers of escaping and
//! quoted-printable ([`over_decoded`]);
//! base64 and base64url at each of the three byte alignments (so a secret
//! inside a larger value encoded whole, like `user:pass` or `Bearer …`, is
//! found; padding does not matter), and base64 of that base64; base32; hex
//! in either case, plain and with `:`, `-`, `,`, `.` or space between
//! bytes (Python's `bytes.hex(sep)`; UTF-16's with `:`, `-` or space); a list
//! of decimal byte values (a Node `Buffer` as JSON); UTF-16 in either byte
//! order, raw and in base64, base32 and hex (.NET's
//! `ToBase64String(Encoding.Unicode…)`, SQL Server's `VARBINARY`).
//! It searches them with one multi-pattern automaton per case rule
//! (aho-corasick, linear in the input; the case-insensitive needles as
//! lower case over the data lower-cased) over *views* of the data, each
//! built only when the data holds its escape character:
//!
//! - as sent;
//! - one escape kind undone: JSON/JavaScript backslash escapes (`\/`,
//!   `\uXXXX` and `\u{H…}` with surrogate pairs, `\xHH`, octal `\163`;
//!   any ASCII punctuation or blank escaped, as Markdown, `re.escape` and
//!   JavaScript write it; a line continuation, `\` before a line break),
//!   HTML/XML character references (every HTML5 named one, the legacy
//!   names without `;`: [`named_at`]), percent-encoding (with and without
//!   `+` as a space, and JavaScript's `%uXXXX`), quoted-printable;
//! - every kind undone at once, repeatedly (up to [`MAX_PASSES`] times):
//!   escapes inside escapes, such as percent-encoding twice or an HTML
//!   reference inside a JSON escape (`\u0026#x2F;`), each pass scanned;
//! - the same with the data lower-cased first, if it holds an escape
//!   upper-cased after it was written (`\U002B`, `&SOL;`:
//!   [`SecretScanner::find_case_changed`]);
//! - as sent and after each repeated pass, with line breaks and blanks
//!   removed (base64 wrapped at 64 or 76 columns, PEM, blanks put into the
//!   secret on one line), and with a list of hex byte values joined into
//!   plain hex (`[]byte{0x73, 0x33}`, `[73, 33]`, `{ 0x73, 0x33 }`);
//! - base64-decoded ([`SecretScanner::find_base64`]): every run of base64
//!   or base64url characters (line breaks inside it skipped, and blanks
//!   around them: MIME, PEM, a folded header, an indented YAML block) of
//!   the data as sent and of its last repeated pass, decoded at each of the
//!   four character offsets, and what it decodes to (where it runs long
//!   enough in bytes a form can be written with) searched with this whole
//!   list of views, base64 included, down to [`MAX_BASE64_DEPTH`]
//!   decodings. So every escape above is found inside base64 too, whatever
//!   library wrote it (`\u002B` from System.Text.Json, `%2b` from
//!   `HttpUtility`, `encodeURIComponent`'s `!'()*`), with no needle for
//!   each escaper. What one check decodes is bounded by [`BASE64_FACTOR`]
//!   times the data; data that needs more is reported, as a finding of its
//!   own, rather than passed unread. What the view holds is bounded too: a
//!   run is decoded a [`WINDOW`] at a time, the windows overlapping by
//!   whatever a form can span, so a few windows a depth whatever the
//!   data's size;
//! - hex-decoded: the same for every run of hex digits (either case, line
//!   breaks inside skipped, a `0x` or `\x` before it no part of it), decoded
//!   at both digit offsets and searched with every view, charged to the
//!   same budget and depth: hex of the secret percent-encoded (a query
//!   credential as the host sends it) or JSON-escaped, hex of its base64;
//! - UTF-16 narrowed ([`narrow_utf16`]): each run of its ASCII and Latin-1
//!   characters, in either byte order, written as single bytes, with
//!   every view above, whatever else the text holds.
//!
//! A view with blanks is searched once, blanks removed, with every needle,
//! and once as it is with the few needles that hold a blank (or end in the
//! `=` of a soft line break): a needle without one is in the view exactly
//! when it is in the view with blanks removed too, so searching both with
//! every needle would find nothing more. For the same reason hex with
//! spaces between bytes and a byte list with `, ` need no needles of their
//! own: without their blanks they are plain hex and the `,` list.
//!
//! What it cannot find is written down in SECURITY.md ("Known limits"): a
//! secret split across responses, reversed, encrypted, hashed, compressed
//! inside a field, in an encoding not listed, escaped inside base64
//! nested deeper than [`MAX_BASE64_DEPTH`], or in base64 whose letters
//! changed case.
//!
//! Architecture invariant: a finding names the credential, the encoding and
//! the view — never the secret. Secrets shorter than [`MIN_SECRET`] bytes
//! cannot be told apart from ordinary text; the credentials layer refuses
//! to apply them.

use std::borrow::Cow;
use std::collections::HashMap;

mod html_names;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind, packed};
use base64::Engine as _;

pub use crate::authority::credentials::MIN_SECRET;

/// How many base64 decodings deep the base64 view reads: base64 inside
/// base64 inside base64 (a state token inside a base64 envelope inside a
/// base64 field). Runs deeper than that are not decoded (SECURITY.md, Known
/// limits); the base64 and base64-twice needles still find the raw secret
/// there.
pub const MAX_BASE64_DEPTH: usize = 3;

/// What the base64 view may decode in one check, over every run at every
/// depth: this many times the data's length, plus [`BASE64_SLACK`]. One
/// level costs at most 3× its runs (four offsets, ¾ of a byte a
/// character), 6× when the unescaped view joins runs the data as sent
/// splits; a base64 file costs 3×, base64 three deep about 7×. Past it
/// the check reports [`OVER_BOUND`] instead of a secret: the host does not
/// vouch for what it did not decode, and a hostile response cannot make
/// the check cost more.
pub const BASE64_FACTOR: usize = 16;

/// What the base64 view may decode whatever the data's length: a header or
/// a short value nested three deep is decoded whole.
const BASE64_SLACK: usize = 64 << 10;

/// The form of the finding for data whose base64 decodes past the bound
/// ([`BASE64_FACTOR`]): it is withheld like a secret, naming every
/// credential, since it may hold any of them.
pub const OVER_BOUND: &str = "more base64 than the check decodes";

/// Fewest characters of a run the base64 view decodes: fewer than
/// base64 of [`MIN_SECRET`] bytes cannot hold any form of a watched value
/// of that length (a shorter one is watched raw only). A scanner whose
/// shortest needle is longer decodes only runs that can hold it
/// ([`SecretScanner::run_shortest`]).
const MIN_RUN: usize = (MIN_SECRET * 8).div_ceil(6);

/// Characters of a run the base64 view decodes at a time (more when the
/// secrets' forms are long: [`SecretScanner::base64_window`]). What the
/// view holds is a few windows a depth, whatever the data's size: a 16 MiB
/// run is read as it is by a 16 KiB one, the windows overlapping so that
/// a form across a boundary is whole in one of them.
const WINDOW: usize = 16 << 10;

/// Bytes of form bytes the view gathers, over runs and windows, before it
/// searches them one level deeper and lets them go: many short runs are
/// searched together, not one by one.
const KEPT_BATCH: usize = 32 << 10;

/// How many bytes of the data around it a character of a base64 run inside
/// decoded base64 may take ([`SecretScanner::span`]): line breaks and
/// indentation between lines, `\/` or `%2F` for some of its characters.
const RUN_GROWTH: usize = 2;

/// Slots of the table of runs one level decoded ([`SeenRuns`]): 32 KiB.
const SEEN_SLOTS: usize = 4096;

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
    /// How the secret was encoded: `raw`, `raw, blanks removed`, `raw,
    /// letters in another case`, `raw, its own escapes decoded`,
    /// `quoted-printable`, `Latin-1`, `Windows-1252`, `base64`,
    /// `base64url`, `base64 twice`, `base32`, `hex`, `hex with separators`,
    /// `byte list`, `UTF-16`, and `base64 of UTF-16` (and so on for
    /// base64url, base32, hex, hex with separators).
    pub form: &'static str,
    /// Which view found it, e.g. `as sent`, `backslash-unescaped`,
    /// `decoded repeatedly`, `as sent, hex list joined`, `base64-decoded`
    /// or `hex-decoded` (then the form is the one found inside, or
    /// [`OVER_BOUND`]).
    pub view: &'static str,
}

/// What a record says the data held: the secret of a credential and where,
/// or — past the base64 bound — data the check could not read through.
impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.form == OVER_BOUND {
            write!(f, "{OVER_BOUND} (it could hold the secret of credential `{}`)", self.credential)
        } else {
            write!(f, "the secret of credential `{}` ({}, {})", self.credential, self.form, self.view)
        }
    }
}

/// Every configured secret, ready to be searched for.
pub struct SecretScanner {
    /// Case-sensitive needles (every encoded form, short secrets).
    exact: Option<Matcher>,
    /// ASCII-case-insensitive needles (the raw secrets), in lower case:
    /// searched for in the data lower-cased.
    folded: Option<Matcher>,
    /// Per pattern of `exact`, then of `folded`: (credential index, form).
    exact_meta: Vec<(usize, &'static str)>,
    folded_meta: Vec<(usize, &'static str)>,
    /// The needles of `exact` and `folded` that hold a byte the view
    /// without blanks removes (see [`removes_from`]).
    exact_blank: Option<Matcher>,
    folded_blank: Option<Matcher>,
    /// Bytes of the longest folded needle, and of the longest needle.
    folded_longest: usize,
    needle_longest: usize,
    names: Vec<String>,
    /// Bytes of the longest form searched for, as written.
    longest: usize,
    /// The bytes any form of a secret is written with ([`form_bytes`]),
    /// bytes of the shortest needle, and a byte that is in no form: the
    /// base64 view searches decoded bytes only where form bytes run at
    /// least that long, each such run followed by that byte.
    form_bytes: [bool; 256],
    needle_shortest: usize,
    separator: u8,
    /// Fewest characters of a run the base64 view decodes: [`MIN_RUN`], or
    /// more when a shorter run decodes to fewer bytes than any needle (no
    /// view makes its data longer). Ordinary JSON's identifiers, paths and
    /// hashes are mostly shorter than base64 of a whole secret.
    run_shortest: usize,
}

/// The bytes a form of one of `secrets` (the stored values and the
/// watched values that are text: not a decoded binary key's bytes) can
/// be written with: every ASCII
/// byte (the escapes, encodings, blanks, lists and dumps the views read are
/// ASCII), and each secret's other characters, in either letter case, as
/// UTF-8, Latin-1, Windows-1252 and UTF-16 in either byte order (the forms
/// that write the secret's own characters).
/// A form found in any view is a run of these bytes in the data: the
/// base64 view leaves out the rest of what it decodes, which for base64 of
/// binary (an image, the three wrong offsets of any run) is most of it.
fn form_bytes<'a>(secrets: impl IntoIterator<Item = &'a [u8]>) -> [bool; 256] {
    let mut table = [false; 256];
    for (b, slot) in table.iter_mut().enumerate() {
        *slot = b < 0x80;
    }
    let mut mark = |b: u8| table[usize::from(b)] = true;
    for stored in secrets {
        stored.iter().copied().for_each(&mut mark);
        for own in String::from_utf8_lossy(stored).chars() {
            for c in std::iter::once(own).chain(own.to_lowercase()).chain(own.to_uppercase()) {
                let mut utf8 = [0u8; 4];
                c.encode_utf8(&mut utf8).bytes().for_each(&mut mark);
                if let Ok(b) = u8::try_from(u32::from(c)) {
                    mark(b);
                }
                if let Some(b) = cp1252_byte(c) {
                    mark(b);
                }
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    u.to_le_bytes().into_iter().for_each(&mut mark);
                }
            }
        }
    }
    table
}

/// A multi-pattern searcher: Teddy (SIMD) for a few needles, else an
/// aho-corasick automaton (standard semantics: the first match to end).
enum Matcher {
    Packed(packed::Searcher),
    Automaton(AhoCorasick),
}

impl Matcher {
    fn new(patterns: &[Vec<u8>]) -> Option<Matcher> {
        if patterns.is_empty() {
            return None;
        }
        // Teddy's own limit is 128; past 64 it checks too many candidates.
        if patterns.len() <= 64
            && let Some(p) = packed::Config::new().builder().extend(patterns).build()
        {
            return Some(Matcher::Packed(p));
        }
        AhoCorasickBuilder::new().match_kind(MatchKind::Standard).build(patterns).ok().map(Matcher::Automaton)
    }

    /// The index of a needle in `data`, if any is.
    fn find(&self, data: &[u8]) -> Option<usize> {
        match self {
            Matcher::Packed(p) => p.find(data).map(|m| m.pattern().as_usize()),
            Matcher::Automaton(ac) => ac.find(data).map(|m| m.pattern().as_usize()),
        }
    }

    /// [`Matcher::find`] in `data` lower-cased (ASCII), a piece at a time.
    fn find_lowered(&self, data: &[u8], longest: usize) -> Option<usize> {
        const PIECE: usize = 64 << 10;
        let overlap = longest.saturating_sub(1);
        let mut buf = Vec::with_capacity(PIECE.min(data.len()) + overlap);
        let mut start: usize = 0;
        loop {
            let end = data.len().min(start.saturating_add(PIECE).saturating_add(overlap));
            buf.clear();
            buf.extend_from_slice(data.get(start..end)?);
            buf.make_ascii_lowercase();
            if let Some(i) = self.find(&buf) {
                return Some(i);
            }
            if end >= data.len() {
                return None;
            }
            start += PIECE;
        }
    }
}

/// Whether the view without blanks may not hold `needle` where the view
/// with them does: the needle holds a byte that view removes (a blank or a
/// line break), or ends in a `=` that may be read as a soft line break.
fn removes_from(needle: &[u8]) -> bool {
    needle.iter().any(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) || needle.last() == Some(&b'=')
}

/// Whether `data` holds a blank or a line break.
fn has_blank(data: &[u8]) -> bool {
    memchr::memchr3(b' ', b'\n', b'\t', data).or_else(|| memchr::memchr(b'\r', data)).is_some()
}

/// `data` without blanks and line breaks, and without the `=` of a
/// quoted-printable soft line break (a `=` just before a line break).
fn without_blanks(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    without_blanks_into(data, 0, data.len(), &mut out);
    out
}

/// [`without_blanks`] of `data[start..end]` (a `=` at its end read with
/// the byte after it in `data`), appended to `out`.
fn without_blanks_into(data: &[u8], start: usize, end: usize, out: &mut Vec<u8>) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = ONES * 0x80;
    let end = end.min(data.len());
    let removed = |i: usize| match data.get(i) {
        Some(b' ' | b'\t' | b'\n' | b'\r') => true,
        Some(b'=') => matches!(data.get(i + 1), Some(b'\r' | b'\n')),
        _ => false,
    };
    // Bytes from `kept` to `i` are to be copied.
    let (mut kept, mut i) = (start, start);
    while i < end {
        // Eight bytes at a time, to the first one below `!` or a `=` (the
        // lowest byte flagged is always one: a borrow only runs upward).
        if let Some(word) = data.get(i..i + 8).filter(|_| i + 8 <= end).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
            let w = u64::from_le_bytes(word);
            let eq = w ^ (ONES * u64::from(b'='));
            let candidates = (w.wrapping_sub(ONES * 0x21) & !w & HIGH) | (eq.wrapping_sub(ONES) & !eq & HIGH);
            if candidates == 0 {
                i += 8;
                continue;
            }
            i += (candidates.trailing_zeros() / 8) as usize;
        }
        if removed(i) {
            out.extend_from_slice(data.get(kept..i).unwrap_or_default());
            kept = i + 1;
        }
        i += 1;
    }
    out.extend_from_slice(data.get(kept..end.max(kept)).unwrap_or_default());
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

/// What a finding calls each encoding of one byte string.
struct Forms {
    base64: &'static str,
    base64url: &'static str,
    base32: &'static str,
    hex: &'static str,
    hex_separated: &'static str,
}

/// The secret's own bytes (UTF-8, or whatever the secret holds).
const UTF8: Forms = Forms {
    base64: "base64",
    base64url: "base64url",
    base32: "base32",
    hex: "hex",
    hex_separated: "hex with separators",
};

/// The secret's UTF-16 form, in either byte order.
const UTF16: Forms = Forms {
    base64: "base64 of UTF-16",
    base64url: "base64url of UTF-16",
    base32: "base32 of UTF-16",
    hex: "hex of UTF-16",
    hex_separated: "hex with separators of UTF-16",
};

/// Collects needles, once each.
#[derive(Default)]
struct Needles {
    patterns: Vec<Vec<u8>>,
    meta: Vec<(usize, &'static str)>,
    /// Each needle's index in `patterns`.
    seen: HashMap<Vec<u8>, usize>,
    /// Bytes of the longest form found, needle or not.
    longest: usize,
}

impl Needles {
    /// Adds `needle` if it is new; its index either way.
    fn add(&mut self, needle: Vec<u8>, credential: usize, form: &'static str) -> Option<usize> {
        self.longest = self.longest.max(needle.len());
        if needle.is_empty() {
            return None;
        }
        if let Some(&at) = self.seen.get(&needle) {
            return Some(at);
        }
        let at = self.patterns.len();
        self.seen.insert(needle.clone(), at);
        self.patterns.push(needle);
        self.meta.push((credential, form));
        Some(at)
    }

    /// Base64 and base64url of `bytes` at each of the three byte
    /// alignments (so `bytes` inside a larger value encoded whole is found;
    /// padding does not matter).
    fn add_base64(&mut self, bytes: &[u8], credential: usize, forms: &Forms) {
        let std = |d: &[u8]| base64::engine::general_purpose::STANDARD_NO_PAD.encode(d);
        let url = |d: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(d);
        for offset in 0..3 {
            for (encode, form) in [(&std as &dyn Fn(&[u8]) -> String, forms.base64), (&url, forms.base64url)] {
                if let Some(c) = core(bytes, offset, 6, encode) {
                    self.add(c, credential, form);
                }
            }
        }
    }

    /// Base32 of `bytes` at each of the five alignments, and hex, plain and
    /// with `:` or `-` between bytes (and `,` or `.` for the secret's own
    /// bytes): each in upper and in lower case, as
    /// exact needles (a case-insensitive needle of letters matches
    /// everywhere in text and makes the search several times slower). Hex
    /// with a space between bytes is plain hex in the view without blanks.
    fn add_base32_and_hex(&mut self, bytes: &[u8], credential: usize, forms: &Forms) {
        let b32 = |d: &[u8]| data_encoding::BASE32_NOPAD.encode(d);
        for offset in 0..5 {
            if let Some(c) = core(bytes, offset, 5, b32) {
                // Upper case (RFC 4648) and lower (DNS names, some libraries).
                self.add(c.to_ascii_lowercase(), credential, forms.base32);
                self.add(c, credential, forms.base32);
            }
        }
        let hex = hex::encode(bytes);
        for h in [hex.to_ascii_uppercase(), hex.clone()] {
            self.add(h.into_bytes(), credential, forms.hex);
        }
        let pairs: Vec<&str> = hex.as_bytes().chunks(2).filter_map(|p| std::str::from_utf8(p).ok()).collect();
        // `,` and `.` (Python's `bytes.hex(sep)`) for the secret's own
        // bytes only: each separated form is three times the secret's
        // length, the longest needles there are, and UTF-16 ones would
        // cost the automaton more than the rare form is worth.
        let seps: &[&str] = if forms.hex == UTF8.hex { &[":", "-", ",", "."] } else { &[":", "-"] };
        for sep in seps {
            let joined = pairs.join(sep);
            self.add(joined.to_ascii_uppercase().into_bytes(), credential, forms.hex_separated);
            self.add(joined.into_bytes(), credential, forms.hex_separated);
        }
        // With spaces: as long as with `:`, found as plain hex.
        self.longest = self.longest.max((3 * bytes.len()).saturating_sub(1));
    }

    /// The automaton of every needle.
    fn build(&self) -> Option<Matcher> {
        (!self.patterns.is_empty())
            .then(|| AhoCorasickBuilder::new().match_kind(MatchKind::Standard).build(&self.patterns).ok())
            .flatten()
            .map(Matcher::Automaton)
    }

    /// A searcher for the needles `keep` selects, with their index among all.
    fn subset(&self, keep: impl Fn(usize, &[u8]) -> bool) -> (Option<Matcher>, Vec<usize>) {
        let index: Vec<usize> =
            (0..self.patterns.len()).filter(|&i| self.patterns.get(i).is_some_and(|p| keep(i, p))).collect();
        let some: Vec<Vec<u8>> = index.iter().filter_map(|&i| self.patterns.get(i).cloned()).collect();
        (Matcher::new(&some), index)
    }
}

/// The values watched for one credential's secret as stored: the value
/// itself; trimmed of ASCII whitespace (a header value or form field is
/// read without the blanks around it, so a secret file holding
/// `tok-… ` is sent as `Bearer tok-… ` and is `tok-…` to the server,
/// and to every encoder after it); and each whitespace-separated word of
/// at least [`MIN_SECRET`] bytes (a file holding `Bearer s3cr3t…`,
/// applied with the format `{}`, carries a token the server reads as the
/// word after its scheme). A UTF-8 byte order mark at its start (a file
/// saved by Notepad or PowerShell) is no part of the secret: the value
/// without it is watched too (the credentials layer sends it without).
/// Then what a destination may decode each of those to
/// ([`decoded_values`]): a secret stored already encoded (the base64 of
/// `user:pass` for `Basic {}`, a base64 or hex key) is read by its server
/// as its bytes, which it may echo in any encoding, and a `Basic`
/// credential's secret side alone (its password, or the key sent as its
/// user).
/// Each gets every needle. A value that is all whitespace is no secret:
/// nothing is watched for it.
fn watched_values(stored: &[u8]) -> Vec<Cow<'_, [u8]>> {
    let unmarked = stored.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(stored);
    let trimmed = unmarked.trim_ascii();
    if trimmed.is_empty() {
        return Vec::new();
    }
    let mut values = vec![stored];
    for v in [unmarked, trimmed] {
        if !values.contains(&v) {
            values.push(v);
        }
    }
    for word in trimmed.split(u8::is_ascii_whitespace) {
        if word.len() >= MIN_SECRET && word.len() < trimmed.len() && !values.contains(&word) {
            values.push(word);
        }
    }
    let mut watched: Vec<Cow<'_, [u8]>> = values.iter().copied().map(Cow::Borrowed).collect();
    for v in values {
        for d in decoded_values(v) {
            if !watched.iter().any(|w| **w == *d) {
                watched.push(Cow::Owned(d));
            }
        }
    }
    watched
}

/// What a destination may decode `value` to and read as the credential:
/// its bytes, if `value` decodes cleanly to at least [`MIN_SECRET`] of
/// them as hex (either case; or hex with `-` or `:` between groups of
/// whole bytes, a UUID or a fingerprint), else as base64 or base64url,
/// padded or not (one alphabet; canonical: padding, if any, where it
/// belongs and no stray bits in the last character, as a strict decoder
/// reads it); and, when those bytes are text `user:pass` (a `Basic`
/// credential stored encoded), the side that carries the secret alone
/// ([`basic_secret_side`]). Nothing for a value that does not decode so:
/// an ordinary token is watched as it is, with no more needles. The decoded bytes' forms
/// are the secret's bytes in another encoding (a base64 key echoed as
/// hex, a hex key as base64, either as a JWK's unpadded base64url), so
/// the needles of bytes cover them; one level, not decoded again.
fn decoded_values(value: &[u8]) -> Vec<Vec<u8>> {
    let Some(bytes) = decode_hex_value(value).or_else(|| decode_base64_value(value)) else {
        return Vec::new();
    };
    if bytes.len() < MIN_SECRET {
        return Vec::new();
    }
    let side = std::str::from_utf8(&bytes)
        .ok()
        .filter(|text| !text.chars().any(char::is_control))
        .and_then(|text| text.split_once(':'))
        .and_then(|(user, password)| basic_secret_side(user, password))
        .map(|side| side.as_bytes().to_vec());
    std::iter::once(bytes).chain(side).collect()
}

/// Fewest bytes of the user of a `Basic` pair watched alone: a key, not a
/// name (Stripe's, GitHub's and Toggl's keys are 32 bytes or more,
/// Freshdesk's 20), so a login with digits (`deploy01`) that a server
/// echoes is not taken for one.
const MIN_BASIC_USER_KEY: usize = 16;

/// Constants that `Basic` schemes put beside the key, on either side,
/// that [`looks_like_a_secret`] would not tell from one by their shape:
/// Google registries' `oauth2accesstoken`; the rest are words anyway
/// (GitHub's `x-oauth-basic` and `x-access-token`, Toggl's `api_token`,
/// Bitbucket's `x-token-auth`, PyPI's `__token__`).
const BASIC_CONSTANTS: &[&str] =
    &["oauth2accesstoken", "x-oauth-basic", "x-access-token", "api_token", "x-token-auth", "__token__"];

/// Which side of a decoded `Basic` pair carries the secret, to be watched
/// alone: the password, when it looks like a secret
/// ([`looks_like_a_secret`], [`MIN_SECRET`] bytes or more); else the
/// user, when it does ([`MIN_BASIC_USER_KEY`] bytes or more, no `@`): the
/// schemes that send the key as the user, with an empty password
/// (Stripe's `sk_live_…:`), a placeholder (Freshdesk's `KEY:X`) or a
/// constant (GitHub's `ghp_…:x-oauth-basic`, Toggl's `…:api_token`).
/// Never both: beside a secret password the user is an account name or
/// id that servers echo (Twilio's `AC…` SID in every response). Neither
/// when neither looks like one (`admin:password`, `svc-name:hunter2`):
/// a word alone would withhold every response holding it.
fn basic_secret_side<'a>(user: &'a str, password: &'a str) -> Option<&'a str> {
    // A password of 16 bytes or more is a secret whatever its shape: an app
    // password (`abcd-efgh-ijkl-mnop`, sixteen lower-case letters), a
    // passphrase (`correct-horse-battery-staple`).
    let long =
        password.len() >= MIN_BASIC_USER_KEY && !BASIC_CONSTANTS.iter().any(|c| password.eq_ignore_ascii_case(c));
    if long || looks_like_a_secret(password, MIN_SECRET) {
        Some(password)
    } else if !user.contains('@') && looks_like_a_secret(user, MIN_BASIC_USER_KEY) {
        Some(user)
    } else {
        None
    }
}

/// Whether one side of a `Basic` pair looks like a secret rather than a
/// word or constant: `min` bytes or more, not one of [`BASIC_CONSTANTS`]
/// (in any case), at least two character classes of lower-case,
/// upper-case, digit and other, and not made of words alone (pieces
/// between the characters that are neither letter nor digit each all
/// digits, all upper-case, or words in camel case: `api_token`,
/// `x-oauth-basic`, `Password`, `12345678`, `service-account-name`).
/// A random token of lower-case letters only reads as a word: the pair
/// is still watched.
fn looks_like_a_secret(side: &str, min: usize) -> bool {
    if side.len() < min || BASIC_CONSTANTS.iter().any(|c| side.eq_ignore_ascii_case(c)) {
        return false;
    }
    let classes: [fn(char) -> bool; 4] =
        [char::is_lowercase, char::is_uppercase, |c| c.is_ascii_digit(), |c| !c.is_alphanumeric()];
    let kinds = classes.iter().filter(|class| side.chars().any(class)).count();
    kinds >= 2 && !side.split(|c: char| !c.is_alphanumeric()).all(is_word)
}

/// A piece of text that reads as a word or number: empty, all digits, all
/// upper-case, or words in camel case (each an optional upper-case letter
/// and lower-case ones: `token`, `Token`, `accessToken`).
fn is_word(piece: &str) -> bool {
    if piece.chars().all(|c| c.is_ascii_digit()) || piece.chars().all(char::is_uppercase) {
        return true;
    }
    let mut chars = piece.chars().peekable();
    while let Some(c) = chars.next() {
        if !(c.is_lowercase() || c.is_uppercase() && chars.peek().is_some_and(|n| n.is_lowercase())) {
            return false;
        }
        while chars.next_if(|n| n.is_lowercase()).is_some() {}
    }
    true
}

/// `value` read as hex: all hex digits, an even number of them; or groups
/// of an even number of them between `-` or `:` (one separator kind).
fn decode_hex_value(value: &[u8]) -> Option<Vec<u8>> {
    let sep = [b'-', b':'].into_iter().find(|s| value.contains(s));
    let mut digits = Vec::with_capacity(value.len());
    for group in value.split(|b| Some(*b) == sep) {
        if group.is_empty() || group.len() % 2 != 0 || !group.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        digits.extend_from_slice(group);
    }
    hex::decode(digits).ok()
}

/// `value` read as base64 or base64url, as a strict decoder reads it:
/// one alphabet, padded to a whole group or not padded at all, and no
/// bits set past the last byte.
fn decode_base64_value(value: &[u8]) -> Option<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let url = value.iter().any(|b| matches!(b, b'-' | b'_'));
    let padded = value.last() == Some(&b'=');
    let engine = match (url, padded) {
        (false, true) => &STANDARD,
        (false, false) => &STANDARD_NO_PAD,
        (true, true) => &URL_SAFE,
        (true, false) => &URL_SAFE_NO_PAD,
    };
    engine.decode(value).ok()
}

/// Every needle of one watched value, `secret`, of credential `i`.
/// Values shorter than [`MIN_SECRET`] are searched for raw only.
fn add_needles(secret: &[u8], i: usize, exact: &mut Needles, folded: &mut Needles) {
    let std = |d: &[u8]| base64::engine::general_purpose::STANDARD_NO_PAD.encode(d);
    if secret.len() < MIN_SECRET {
        exact.add(secret.to_vec(), i, "raw");
        return;
    }
    // In any letter case: servers normalize ids and hex keys (a
    // lowercase key or UUID echoed upper-case is the same secret).
    // Folded needles are kept in lower case and searched for in the
    // data lower-cased.
    folded.add(secret.to_ascii_lowercase(), i, "raw");
    // A secret with letters beyond ASCII: in UTF-8 with those letters in
    // another case too (`É` for `é`: ASCII case is folded by searching the
    // data lower-cased, theirs is not), and in each case in Latin-1 and in
    // Windows-1252, where every character fits a byte: a server answering
    // in ISO-8859-1 or cp1252 (`€` is 0x80 there, `–` 0x96, `’` 0x92), and
    // JavaScript's `\xHH` and octal escapes, which stand for characters
    // (the views decode them as bytes, as C and Python write them).
    if let Ok(text) = std::str::from_utf8(secret)
        && !text.is_ascii()
    {
        for variant in case_variants(text) {
            folded.add(variant.to_ascii_lowercase().into_bytes(), i, "raw, letters in another case");
            for (encoded, form) in [(latin1(&variant), "Latin-1"), (windows_1252(&variant), "Windows-1252")] {
                if let Some(bytes) = encoded.filter(|b| b.len() >= MIN_SECRET) {
                    folded.add(bytes.to_ascii_lowercase(), i, form);
                }
            }
        }
    }
    // A secret with blanks of its own, as the view that removes
    // blanks leaves it (more blanks put into it).
    let unblanked: Vec<u8> = secret.iter().copied().filter(|b| !matches!(b, b' ' | b'\t')).collect();
    if unblanked.len() < secret.len() && unblanked.len() >= MIN_SECRET {
        folded.add(unblanked.to_ascii_lowercase(), i, "raw, blanks removed");
    }
    // A secret with escape-like sequences of its own, escaped twice: as
    // the views over-decode it ([`over_decoded`]), and quoted-printable
    // (no view decodes that after another kind).
    for (value, form) in over_decoded(secret) {
        folded.add(value.to_ascii_lowercase(), i, form);
    }
    exact.add_base64(secret, i, &UTF8);
    // Escaped forms inside base64 (a query credential in a base64 cursor)
    // have no needles: the base64 view decodes them and every view reads
    // them. The longest such form pieces must overlap by: base64 of the
    // secret with every character a `\uXXXX` (6 bytes a byte, at most).
    exact.longest = exact.longest.max(secret.len().saturating_mul(8));
    exact.add_base32_and_hex(secret, i, &UTF8);
    for offset in 0..3 {
        // base64 of a base64 value that holds the secret.
        if let Some(inner) = core(secret, offset, 6, std) {
            for outer in 0..3 {
                if let Some(c) = core(&inner, outer, 6, std) {
                    exact.add(c, i, "base64 twice");
                }
            }
        }
    }
    let decimal: Vec<String> = secret.iter().map(u8::to_string).collect();
    // JSON arrays (`,`; `, ` is that without blanks) and Go's `%v`
    // of a byte slice (` `).
    for sep in [",", " "] {
        exact.add(decimal.join(sep).into_bytes(), i, "byte list");
    }
    exact.longest = exact.longest.max(decimal.join(", ").len());
    // UTF-16 in either byte order, raw and through the same
    // encoders (.NET's `Convert.ToBase64String(Encoding.Unicode
    // .GetBytes(s))`, SQL Server's `CAST(N'…' AS VARBINARY)`).
    if let Ok(text) = std::str::from_utf8(secret) {
        let units: Vec<u16> = text.encode_utf16().collect();
        let le: Vec<u8> = units.iter().flat_map(|u| u.to_le_bytes()).collect();
        let be: Vec<u8> = units.iter().flat_map(|u| u.to_be_bytes()).collect();
        for wide in [le, be] {
            exact.add_base64(&wide, i, &UTF16);
            exact.add_base32_and_hex(&wide, i, &UTF16);
            exact.add(wide, i, "UTF-16");
        }
    }
}

/// Most values [`over_decoded`] gives for one watched value: a secret
/// dense with escape-like sequences of several kinds has more ways to be
/// over-decoded than are worth a needle each (SECURITY.md, Known limits).
const MAX_OVER_DECODED: usize = 64;

/// The sets of kinds a view undoes in one pass over a secret's own
/// sequences, as they can show in a view of data escaped in layers: each
/// layer leaves some of the secret's escape characters bare (JSON escapes
/// `\` but not `%` or `&`; HTML `&` alone; percent-encoding all of them),
/// so a pass may decode any of the kinds the repeated views undo
/// ([`ALL`], with `+` only beside `%`: whatever escapes `%` escapes `+`).
const OVER_DECODING: [Kinds; 11] = [
    Kinds { backslash: true, ..NONE },
    Kinds { html: true, ..NONE },
    Kinds { percent: true, ..NONE },
    Kinds { backslash: true, html: true, ..NONE },
    Kinds { backslash: true, percent: true, ..NONE },
    Kinds { html: true, percent: true, ..NONE },
    ALL,
    Kinds { percent: true, plus: true, ..NONE },
    Kinds { backslash: true, percent: true, plus: true, ..NONE },
    Kinds { html: true, percent: true, plus: true, ..NONE },
    Kinds { plus: true, ..ALL },
];

/// `value` as a view may hold it when it has escape-like sequences of its
/// own (`%41`, `\$`, `&lt;`, `+`) and reached the data under two layers
/// of escaping or more: the pass that removes an inner layer decodes the
/// secret's own sequences too, so the secret is never whole in any view
/// (`ab/cd%41ef`, JSON-escaped as PHP writes it and then percent-encoded,
/// is `ab\/cd%41ef` after one pass and `ab/cdAef` after two). Each value
/// is `value` with its own sequences undone by up to [`MAX_PASSES`]
/// passes, each of any of the [`OVER_DECODING`] kinds; and the same from
/// `value` lower-cased with names read in any case (the view of escapes
/// whose case changed, [`SecretScanner::find_case_changed`]). Also
/// `value` quoted-printable, and that over-decoded: the views undo
/// quoted-printable only in the data as sent, never after another kind
/// (a secret holding `=` or bytes beyond ASCII, quoted-printable and then
/// percent-encoded, is whole only so). Values shorter than [`MIN_SECRET`]
/// are left out; at most [`MAX_OVER_DECODED`]. Nothing for a value with
/// none of `\ % & + =` and only printable ASCII: an ordinary token gets
/// no more needles.
fn over_decoded(value: &[u8]) -> Vec<(Vec<u8>, &'static str)> {
    let qp = quoted_printable(value);
    if qp == value && !value.iter().any(|b| matches!(b, b'\\' | b'%' | b'&' | b'+')) {
        return Vec::new();
    }
    let mut seen: Vec<Vec<u8>> = vec![value.to_vec()];
    let mut out = Vec::new();
    let mut keep = |v: Vec<u8>, form: &'static str, seen: &mut Vec<Vec<u8>>| {
        if v.len() < MIN_SECRET || seen.contains(&v) || out.len() >= MAX_OVER_DECODED {
            return false;
        }
        seen.push(v.clone());
        out.push((v, form));
        true
    };
    let mut roots = vec![(value.to_vec(), false)];
    if keep(qp.clone(), "quoted-printable", &mut seen) {
        roots.push((qp, false));
    }
    let lowered: Vec<(Vec<u8>, bool)> = roots.iter().map(|(v, _)| (v.to_ascii_lowercase(), true)).collect();
    roots.extend(lowered);
    for (root, any_case) in roots {
        let mut frontier = vec![root];
        for _ in 0..MAX_PASSES {
            let mut next = Vec::new();
            for node in &frontier {
                for kinds in OVER_DECODING.iter().filter(|k| !(any_case && k.plus)) {
                    let Some(v) = unescape(node, Kinds { any_case, ..*kinds }) else {
                        continue;
                    };
                    if keep(v.clone(), "raw, its own escapes decoded", &mut seen) {
                        next.push(v);
                    }
                }
            }
            frontier = next;
        }
    }
    out
}

/// `value` quoted-printable: `=` and the bytes that are not printable
/// ASCII (those beyond ASCII: a secret's letters in UTF-8) as `=XX`.
fn quoted_printable(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    for &b in value {
        if b == b'=' || !(b' '..=b'~').contains(&b) {
            out.extend_from_slice(format!("={b:02X}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// `text` (first) and its spellings with the letters beyond ASCII in
/// another case: all lower, all upper, and, for up to three such letters,
/// each mix of the two (a server upper-casing part of a value). ASCII
/// letters are left: the search folds their case.
fn case_variants(text: &str) -> Vec<String> {
    let cased: Vec<char> = text.chars().filter(|c| !c.is_ascii() && (c.is_lowercase() || c.is_uppercase())).collect();
    let mut variants = vec![text.to_owned()];
    let mut push = |v: String| {
        if !variants.contains(&v) {
            variants.push(v);
        }
    };
    let spell = |upper: &dyn Fn(usize) -> bool| {
        let mut k = 0;
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if c.is_ascii() || !(c.is_lowercase() || c.is_uppercase()) {
                out.push(c);
                continue;
            }
            if upper(k) {
                out.extend(c.to_uppercase());
            } else {
                out.extend(c.to_lowercase());
            }
            k += 1;
        }
        out
    };
    push(spell(&|_| false));
    push(spell(&|_| true));
    if cased.len() <= 3 {
        for mask in 0..1usize << cased.len() {
            push(spell(&|k| mask >> k & 1 == 1));
        }
    }
    variants
}

/// `text` in Latin-1, if every character fits a byte.
fn latin1(text: &str) -> Option<Vec<u8>> {
    text.chars().map(|c| u8::try_from(u32::from(c)).ok()).collect()
}

/// The characters Windows-1252 writes as 0x80 to 0x9F (the five it leaves
/// undefined as the C1 controls, as WHATWG's decoder reads them).
const CP1252_HIGH: [char; 32] = [
    '\u{20ac}', '\u{81}', '\u{201a}', '\u{192}', '\u{201e}', '\u{2026}', '\u{2020}', '\u{2021}', '\u{2c6}', '\u{2030}',
    '\u{160}', '\u{2039}', '\u{152}', '\u{8d}', '\u{17d}', '\u{8f}', '\u{90}', '\u{2018}', '\u{2019}', '\u{201c}',
    '\u{201d}', '\u{2022}', '\u{2013}', '\u{2014}', '\u{2dc}', '\u{2122}', '\u{161}', '\u{203a}', '\u{153}', '\u{9d}',
    '\u{17e}', '\u{178}',
];

/// The Windows-1252 byte of `c`, if it has one.
fn cp1252_byte(c: char) -> Option<u8> {
    match u32::from(c) {
        0..=0x7F | 0xA0..=0xFF => u8::try_from(u32::from(c)).ok(),
        _ => CP1252_HIGH.iter().position(|&h| h == c).and_then(|p| u8::try_from(0x80 + p).ok()),
    }
}

/// `text` in Windows-1252, if every character has a byte there.
fn windows_1252(text: &str) -> Option<Vec<u8>> {
    text.chars().map(cp1252_byte).collect()
}

impl SecretScanner {
    /// A scanner for `secrets` (credential name, secret bytes as stored),
    /// each watched in the values [`watched_values`] gives. Values shorter
    /// than [`MIN_SECRET`] are searched for raw only.
    pub fn new(secrets: &[(String, Vec<u8>)]) -> Self {
        let (mut exact, mut folded) = (Needles::default(), Needles::default());
        let watched: Vec<Vec<Cow<'_, [u8]>>> = secrets.iter().map(|(_, stored)| watched_values(stored)).collect();
        for (i, values) in watched.iter().enumerate() {
            for secret in values {
                add_needles(secret, i, &mut exact, &mut folded);
            }
        }
        let longest = exact.longest.max(folded.longest);
        let folded_longest = folded.patterns.iter().map(Vec::len).max().unwrap_or(0);
        let needle_longest = exact.patterns.iter().map(Vec::len).max().unwrap_or(0).max(folded_longest);
        let needle_shortest = exact.patterns.iter().chain(&folded.patterns).map(Vec::len).min().unwrap_or(1).max(1);
        // The stored values and the watched values that are text: a
        // decoded binary key's own bytes are no form's (its raw needle
        // finds them as sent, its base64 and hex needles wherever the data
        // encodes them), and marking them would keep most of any decoded
        // binary for the views one level deeper (all of it, for the lines
        // of a stored PEM key, each a word that decodes).
        let textual = watched.iter().flatten().filter(|v| std::str::from_utf8(v).is_ok()).map(|v| &**v);
        let form_bytes = form_bytes(secrets.iter().map(|(_, stored)| &stored[..]).chain(textual));
        let separator = (0..=u8::MAX).rev().find(|&b| !form_bytes[usize::from(b)]).unwrap_or(u8::MAX);
        let (exact_blank, _) = exact.subset(|_, p| removes_from(p));
        let (folded_blank, _) = folded.subset(|_, p| removes_from(p));
        SecretScanner {
            exact: exact.build(),
            // Few needles: Teddy, which an automaton folding case cannot use.
            folded: Matcher::new(&folded.patterns),
            exact_meta: exact.meta,
            folded_meta: folded.meta,
            exact_blank,
            folded_blank,
            folded_longest,
            needle_longest,
            names: secrets.iter().map(|(n, _)| n.clone()).collect(),
            longest,
            form_bytes,
            needle_shortest,
            separator,
            run_shortest: MIN_RUN.max((needle_shortest * 4).div_ceil(3)),
        }
    }

    /// Bytes of the longest form searched for, as written (before any view
    /// undoes escapes): what data checked in pieces must overlap by, at least.
    pub fn longest(&self) -> usize {
        self.longest
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
        self.find_with(data, &mut Base64Budget::for_len(data.len()))
    }

    /// [`SecretScanner::find`], spending the base64 view's `budget`.
    fn find_with(&self, data: &[u8], budget: &mut Base64Budget) -> Option<Finding> {
        budget.searched = budget.searched.saturating_add(data.len());
        let single = || {
            // One kind at a time: a secret that holds another kind's
            // escape character (a `%` or `\` of its own) stays whole.
            SINGLE.iter().find_map(|(trigger, kinds, name)| {
                if !data.contains(trigger) {
                    return None;
                }
                let view = unescape(data, *kinds)?;
                if kinds.quoted_printable {
                    // Hex or a byte list with spaces, quoted-printable
                    // (no other view decodes it): found without blanks.
                    return self.find_spread(&view, name, "quoted-printable-decoded, blanks removed", false);
                }
                self.find_in(&view, name)
            })
        };
        let mut unescaped = None;
        let mut saw_plus = data.contains(&b'+');
        if let Some(f) = self
            .find_joined(data, &AS_SENT)
            .or_else(single)
            .or_else(|| self.find_repeated(data, false, &mut saw_plus, &mut unescaped))
        {
            return Some(f);
        }
        // The base64 view while the last pass is held, which goes before
        // the views after it make copies of their own: the check never
        // holds more copies of the data at once than those views do.
        let found = self
            .find_decoded(data, unescaped.as_deref(), budget, &BASE64)
            .or_else(|| self.find_decoded(data, unescaped.as_deref(), budget, &HEX));
        drop(unescaped);
        if found.is_some() {
            return found;
        }
        if saw_plus && let Some(f) = self.find_repeated(data, true, &mut saw_plus, &mut None) {
            return Some(f);
        }
        if let Some(f) = self.find_case_changed(data) {
            return Some(f);
        }
        // Text in UTF-16: its runs of ASCII, narrowed, are ASCII again and
        // every view applies (a secret's base64, hex or escapes written in
        // UTF-16, whatever else the text holds).
        memchr::memchr(0, data)?;
        let mut narrowed = Vec::new();
        if !narrow_utf16(data, self.needle_shortest, self.separator, &mut narrowed) {
            return None;
        }
        self.find_with(&narrowed, budget).map(|f| Finding { view: "UTF-16 narrowed", ..f })
    }

    /// The base64 view: each run of base64 or base64url characters in
    /// `data` and in `unescaped` (its last repeated pass: base64 that a
    /// response percent-encoded, `\u002B`- or `\/`-escaped or wrapped with
    /// JSON's `\r\n` is whole only there; a run met in both is mostly
    /// taken once, see [`SeenRuns`]), decoded ([`decode_run`]) and
    /// searched with every view, this one included one level deeper. A run
    /// is decoded at all four character offsets, so its start need not be
    /// the encoding's (a version prefix of letters, a path, data cut
    /// mid-token); the secret's own offset inside what was encoded does not
    /// matter. Of what it decodes to, the runs of form bytes are searched
    /// ([`SecretScanner::keep_forms`]), gathered up to [`KEPT_BATCH`] bytes.
    /// A run is decoded a window at a time ([`Level`]), so what the view
    /// holds does not grow with the data. [`OVER_BOUND`] when the runs cost
    /// more than the budget has left.
    ///
    /// The hex view ([`HEX`]) is the same with runs of hex digits, decoded
    /// at both digit offsets, charged to the same budget and depth.
    fn find_decoded(
        &self,
        data: &[u8],
        unescaped: Option<&[u8]>,
        budget: &mut Base64Budget,
        radix: &'static Radix,
    ) -> Option<Finding> {
        if budget.depth >= MAX_BASE64_DEPTH {
            return None;
        }
        let window = if radix.hex { self.hex_window(budget.depth) } else { self.base64_window(budget.depth) };
        let mut level = Level::new(window, unescaped.is_some(), radix);
        let found = self.find_base64_in(data, unescaped, budget, &mut level);
        budget.held = budget.held.saturating_sub(level.held);
        found
    }

    /// [`SecretScanner::find_decoded`] with its buffers, `level`.
    fn find_base64_in(
        &self,
        data: &[u8],
        unescaped: Option<&[u8]>,
        budget: &mut Base64Budget,
        level: &mut Level,
    ) -> Option<Finding> {
        let radix = level.radix;
        let min = if radix.hex { self.hex_run_shortest() } else { self.run_shortest };
        let mut mine = Base64Runs::with_table(data, min, radix.table).peekable();
        if let Some(other) = unescaped {
            // In step: a run of the unescaped pass after the data's runs up
            // to where it can have come from (unescaping only shortens, by
            // `lag` bytes in all), so the two copies of a run meet while
            // the first is still in the table of runs seen.
            let lag = data.len().saturating_sub(other.len());
            for run in Base64Runs::with_table(other, min, radix.table) {
                while let Some(r) = mine.next_if(|r| r.start <= run.start.saturating_add(lag)) {
                    if let Some(f) = self.decode_windows(data, r, level, budget) {
                        return Some(f);
                    }
                }
                if let Some(f) = self.decode_windows(other, run, level, budget) {
                    return Some(f);
                }
            }
        }
        for r in mine {
            if let Some(f) = self.decode_windows(data, r, level, budget) {
                return Some(f);
            }
        }
        self.search_kept(level, budget)
    }

    /// One run of `source`, unless seen before, charged to the budget and
    /// decoded a window at a time at each of the four offsets, its form
    /// bytes kept ([`SecretScanner::keep_forms`]) and searched whenever
    /// [`KEPT_BATCH`] bytes are. Windows overlap so that whatever a form
    /// spans in the decoded run is whole in one of them ([`Window`]).
    fn decode_windows(&self, source: &[u8], run: Run, level: &mut Level, budget: &mut Base64Budget) -> Option<Finding> {
        let bytes = source.get(run.start..run.end).unwrap_or_default();
        if !level.seen.first_time(bytes) {
            return None;
        }
        // The whole run, four offsets, ¾ of a byte a character each (hex:
        // two, ½ each), as if decoded at once: the overlaps' work is not
        // charged (at most ⅓ more).
        let radix = level.radix;
        let Some(left) = budget.left.checked_sub(run.chars.saturating_mul(radix.cost)) else {
            return Some(self.over_bound(radix.view));
        };
        budget.left = left;
        let Window { len, overlap } = level.window;
        let mut chars = bytes.iter().map(|&b| radix.table[usize::from(b)]).filter(|&v| v < radix.base);
        level.sextets.clear();
        level.sextets.reserve_exact(run.chars.min(len));
        let mut first = true;
        loop {
            let before = level.sextets.len();
            level.sextets.extend(chars.by_ref().take(len.saturating_sub(before)));
            if level.sextets.len() == before && !first {
                break;
            }
            first = false;
            for offset in 0..radix.offsets {
                level.piece.clear();
                let digits = level.sextets.get(offset..).unwrap_or_default();
                if radix.hex {
                    level.piece.reserve_exact(digits.len() / 2);
                    decode_hex_run(digits, &mut level.piece);
                } else {
                    level.piece.reserve_exact(level.sextets.len() / 4 * 3 + 2);
                    decode_run(digits, &mut level.piece);
                }
                budget.decoded = budget.decoded.saturating_add(level.piece.len());
                self.keep_forms(&level.piece, &mut level.kept, &mut level.narrowed);
                level.account(budget);
                if level.kept.len() >= KEPT_BATCH
                    && let Some(f) = self.search_kept(level, budget)
                {
                    return Some(f);
                }
            }
            if level.sextets.len() < len {
                break;
            }
            // The next window starts `len - overlap` characters on, a
            // multiple of 4: the offsets read the same groups.
            let next = len.saturating_sub(overlap).min(level.sextets.len());
            level.sextets.drain(..next);
        }
        None
    }

    /// The form bytes `level` gathered, searched with every view one level
    /// deeper (and narrowed, if UTF-16), then let go.
    fn search_kept(&self, level: &mut Level, budget: &mut Base64Budget) -> Option<Finding> {
        if level.kept.is_empty() {
            return None;
        }
        level.account(budget);
        budget.depth += 1;
        let mut found = self.find_with(&level.kept, budget);
        if found.is_none() && !level.narrowed.is_empty() {
            found = self.find_with(&level.narrowed, budget);
        }
        budget.depth -= 1;
        level.kept.clear();
        level.narrowed.clear();
        found.map(|f| if f.form == OVER_BOUND { f } else { Finding { view: level.radix.view, ..f } })
    }

    /// The window a hex run found `depth` decodings deep is read in:
    /// overlapping by two digits a byte of [`SecretScanner::span`] decoded
    /// bytes (and a byte either side), at least four overlaps long.
    fn hex_window(&self, depth: usize) -> Window {
        let overlap = self.span(depth + 1).saturating_add(2).saturating_mul(2).next_multiple_of(4);
        Window { len: WINDOW.max(overlap.saturating_mul(4)), overlap }
    }

    /// Fewest digits of a run the hex view decodes: two a byte of the
    /// shortest needle (and of [`MIN_SECRET`]), as for base64
    /// ([`SecretScanner::run_shortest`]). Commit ids and hashes shorter than
    /// hex of a whole secret are not decoded.
    fn hex_run_shortest(&self) -> usize {
        MIN_SECRET.max(self.needle_shortest).saturating_mul(2)
    }

    /// The window a base64 run found `depth` decodings deep is read in:
    /// overlapping by the characters of [`SecretScanner::span`] decoded
    /// bytes (and a group either side), at least four overlaps long.
    fn base64_window(&self, depth: usize) -> Window {
        let overlap = self.span(depth + 1).div_ceil(3).saturating_add(2).saturating_mul(4);
        Window { len: WINDOW.max(overlap.saturating_mul(4)), overlap }
    }

    /// Bytes the forms found in data decoded `level` times can span: the
    /// longest form as written, or, where the base64 view reads deeper, a
    /// run of base64 that decodes to that span's bytes — its characters
    /// each up to [`RUN_GROWTH`] bytes, and a group either side.
    fn span(&self, level: usize) -> usize {
        let mut span = self.longest.max(1);
        for _ in level..MAX_BASE64_DEPTH {
            let run = span.div_ceil(3).saturating_add(2).saturating_mul(4).saturating_mul(RUN_GROWTH);
            span = span.max(run);
        }
        span
    }

    /// Each run of form bytes in `piece` (what one run decoded to at one
    /// offset) long enough to hold a needle, appended to `kept`, and, if it
    /// holds UTF-16 text, its runs narrowed to `narrowed` ([`narrow_utf16`]);
    /// each followed by the separator, so no form is made of two runs.
    fn keep_forms(&self, piece: &[u8], kept: &mut Vec<u8>, narrowed: &mut Vec<u8>) {
        let min = self.needle_shortest;
        let form = |i: usize| piece.get(i).is_some_and(|&b| self.form_bytes[usize::from(b)]);
        // As [`Base64Runs`]: a byte that is not a form byte `min` bytes on
        // is skipped to, with no look at the bytes before it (the
        // decoded binary is about half form bytes).
        let mut i = 0;
        while i + min <= piece.len() {
            let probe = i + min - 1;
            if !form(probe) {
                i = probe + 1;
                continue;
            }
            let (mut start, mut end) = (probe, probe + 1);
            while start > i && form(start - 1) {
                start -= 1;
            }
            while form(end) {
                end += 1;
            }
            if let Some(run) = piece.get(start..end).filter(|r| r.len() >= min) {
                kept.extend_from_slice(run);
                kept.push(self.separator);
                narrow_utf16(run, min, self.separator, narrowed);
            }
            i = end + 1;
        }
    }

    /// The finding for data whose base64 decodes past the bound: it may
    /// hold any credential's secret, so it names them all.
    fn over_bound(&self, view: &'static str) -> Finding {
        Finding { credential: self.names.join(", "), form: OVER_BOUND, view }
    }

    /// Every kind undone at once, pass after pass, each pass scanned; with
    /// `plus`, `+` read as a space too ([`SecretScanner::find_with`] makes
    /// that pass after the others if a `+` showed up on the way: it sets
    /// `saw_plus`). The last pass goes to `last` (the base64 view reads it;
    /// `+` as a space breaks base64, so only a pass without it).
    fn find_repeated(
        &self,
        data: &[u8],
        plus: bool,
        saw_plus: &mut bool,
        last: &mut Option<Vec<u8>>,
    ) -> Option<Finding> {
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
            *saw_plus |= next.contains(&b'+');
            let stage = if plus { &FORM_DECODED_REPEATEDLY } else { &DECODED_REPEATEDLY };
            if let Some(f) = self.find_joined(&next, stage) {
                return Some(f);
            }
            current = Cow::Owned(next);
        }
        if let Cow::Owned(view) = current {
            *last = Some(view);
        }
        None
    }

    /// The view of an escape whose letters changed case after it was
    /// written (a gateway or logger upper-casing a body turns `\u002b`
    /// into `\U002B`, `&sol;` into `&SOL;`): `data` lower-cased (ASCII),
    /// then every kind undone at once, pass after pass, named references
    /// read in any case ([`named_at`]); each pass searched with every
    /// needle (the case-insensitive ones are the point: the secret's
    /// letters changed case too). Only when `data` holds such an escape
    /// ([`case_changed_escape`]). Base64 upper-cased lost its case, and is
    /// not read (SECURITY.md, Known limits).
    fn find_case_changed(&self, data: &[u8]) -> Option<Finding> {
        if !case_changed_escape(data) {
            return None;
        }
        let mut current = data.to_vec();
        current.make_ascii_lowercase();
        let kinds = Kinds { any_case: true, ..ALL };
        for _ in 0..MAX_PASSES {
            let next = unescape(&current, kinds)?;
            if let Some(f) = self.find_joined(&next, &LOWERED_REPEATEDLY) {
                return Some(f);
            }
            current = next;
        }
        None
    }

    /// `data`, then the views that join what a printer spread out: blanks
    /// removed, a list of hex byte values joined, and a dump's lines joined.
    fn find_joined(&self, data: &[u8], stage: &Stage) -> Option<Finding> {
        self.find_spread(data, stage.name, stage.unwrapped, true)
            .or_else(|| self.find_hex_list(data, stage.list))
            .or_else(|| self.find_char_list(data, stage.chars))
            .or_else(|| self.find_dump(data, stage))
    }

    /// `data` with a list of one-character strings joined, if it may hold
    /// one ([`may_hold_char_list`]): Python's `list(s)` `['s', '3', …]`,
    /// Rust's `{:?}` of a `Vec<char>`, a JSON array of characters, Go's
    /// `%q` `["s" "3" …]`. The view is the character of every quoted
    /// one-character string in order. (The hex-list view reads `"3"` as a
    /// byte and pads it to `03`: a list of characters needs its own view.)
    fn find_char_list(&self, data: &[u8], name: &'static str) -> Option<Finding> {
        if !may_hold_char_list(data) {
            return None;
        }
        let mut view = Vec::new();
        let mut at = 0;
        while let Some(quote) = data.get(at..).and_then(|rest| memchr::memchr2(b'"', b'\'', rest)).map(|q| at + q) {
            match data.get(quote..).and_then(char_item) {
                Some(len) => {
                    view.extend_from_slice(data.get(quote + 1..quote + len - 1).unwrap_or_default());
                    at = quote + len;
                }
                None => at = quote + 1,
            }
        }
        self.find_in(&view, name)
    }

    /// `data` read as a dump — curl's `--trace-ascii` (64 characters a
    /// line) and `--trace`, `xxd`, `hexdump -C`, Go's `hex.Dump`, `od -A x
    /// -t x1z`, `tcpdump -X` (16 bytes a line) — if at least two of its
    /// lines start with an offset ([`dump_offset`]): each such line's
    /// offset dropped and the lines joined, so what the dump cut is whole
    /// again. A hex-dump line gives its ASCII column to that text and its
    /// hex groups, decoded, to a second view (where a secret whose bytes the
    /// ASCII column shows as `.` is whole too). Other lines (curl's `=>
    /// Send header`) are left out. Linear; built only when the data has
    /// those two lines.
    fn find_dump(&self, data: &[u8], stage: &Stage) -> Option<Finding> {
        let (text, bytes) = dump_views(data)?;
        self.find_in(&text, stage.dump).or_else(|| self.find_in(&bytes, stage.dump_hex))
    }

    /// `data` (as `name`), then, if it has blanks or line breaks, `data`
    /// without them (as `unwrapped`): base64 and hex wrapped at a fixed
    /// width (MIME, PEM) are contiguous again, and so is quoted-printable
    /// text (its soft line break, `=` at a line's end, goes with the break;
    /// with `qp`, its `=XX` are undone too), hex and byte lists with spaces,
    /// and a secret with blanks put into it on one line (`s3cr 3t-t oken`).
    ///
    /// Searched as the module doc says: `data` without blanks with every
    /// needle, `data` itself with the needles [`removes_from`] selects.
    /// When either finds a secret, the finding is the one `data`, then the
    /// view without blanks, gives.
    fn find_spread(&self, data: &[u8], name: &'static str, unwrapped: &'static str, qp: bool) -> Option<Finding> {
        if !has_blank(data) {
            return self.find_in(data, name);
        }
        let in_data = self.exact_blank.as_ref().and_then(|m| m.find(data)).is_some()
            || self.folded_blank.as_ref().and_then(|m| m.find_lowered(data, self.folded_longest)).is_some();
        if in_data {
            return self.find_in(data, name);
        }
        if self.found_without_blanks(data) {
            let joined = without_blanks(data);
            return self.find_in(data, name).or_else(|| self.find_in(&joined, unwrapped));
        }
        if !qp {
            return None;
        }
        memchr::memchr(b'=', data)?;
        let joined = without_blanks(data);
        self.find_in(&unescape(&joined, Kinds { quoted_printable: true, ..NONE })?, unwrapped)
    }

    /// Whether [`SecretScanner::find_in`] finds anything in `data` without
    /// blanks, built and searched a piece at a time (pieces overlapping by
    /// the longest needle).
    fn found_without_blanks(&self, data: &[u8]) -> bool {
        const PIECE: usize = 256 << 10;
        let keep = self.needle_longest.saturating_sub(1);
        let mut buf = Vec::with_capacity(PIECE.min(data.len()) + keep);
        let mut start: usize = 0;
        while start < data.len() {
            let end = data.len().min(start.saturating_add(PIECE));
            without_blanks_into(data, start, end, &mut buf);
            if self.find_in(&buf, "").is_some() {
                return true;
            }
            buf.drain(..buf.len().saturating_sub(keep));
            start = end;
        }
        false
    }

    /// `data` with a list of hex byte values joined into plain hex, if it
    /// may hold one: `0x`/`0X` before an item and the list's punctuation
    /// (brackets, braces, commas, quotes, blanks) go, and an item of one
    /// digit gets its leading zero (Go's `%#v` of a byte slice
    /// `[]byte{0x73, 0x9}`, Rust's `{:x?}` `[73, 9]`, C and Java array
    /// literals, Python's `[hex(b) …]`). The hex needles then find it.
    fn find_hex_list(&self, data: &[u8], name: &'static str) -> Option<Finding> {
        if !may_hold_hex_list(data) {
            return None;
        }
        let mut view = Vec::with_capacity(data.len());
        let mut item_start = true;
        let mut i = 0;
        while let Some(&b) = data.get(i) {
            i += 1;
            if list_punctuation(b) {
                item_start = true;
                continue;
            }
            if item_start && hex_prefix(data.get(i - 1..)) {
                // The `0x` goes; the item's digits follow.
                i += 1;
                continue;
            }
            if item_start && b.is_ascii_hexdigit() && data.get(i).is_none_or(|&n| list_punctuation(n)) {
                view.push(b'0');
            }
            view.push(b);
            item_start = false;
        }
        // Every needle: the view joins more than hex — base64, base32 or
        // UTF-16 forms split across the items of a list are joined too.
        self.find_in(&view, name)
    }

    fn find_in(&self, view: &[u8], name: &'static str) -> Option<Finding> {
        let exact = || self.finding(&self.exact_meta, self.exact.as_ref()?.find(view)?, name);
        let folded =
            || self.finding(&self.folded_meta, self.folded.as_ref()?.find_lowered(view, self.folded_longest)?, name);
        exact().or_else(folded)
    }

    fn finding(&self, meta: &[(usize, &'static str)], at: usize, view: &'static str) -> Option<Finding> {
        let (i, form) = *meta.get(at)?;
        Some(Finding { credential: self.names.get(i).cloned().unwrap_or_default(), form, view })
    }
}

/// What a finding calls the views of one stage of decoding (see
/// [`SecretScanner::find_joined`]).
struct Stage {
    name: &'static str,
    unwrapped: &'static str,
    list: &'static str,
    dump: &'static str,
    dump_hex: &'static str,
    chars: &'static str,
}

const AS_SENT: Stage = Stage {
    name: "as sent",
    unwrapped: "as sent, blanks removed",
    list: "as sent, hex list joined",
    dump: "as sent, dump joined",
    dump_hex: "as sent, dump's hex decoded",
    chars: "as sent, character list joined",
};

const DECODED_REPEATEDLY: Stage = Stage {
    name: "decoded repeatedly",
    unwrapped: "decoded repeatedly, blanks removed",
    list: "decoded repeatedly, hex list joined",
    dump: "decoded repeatedly, dump joined",
    dump_hex: "decoded repeatedly, dump's hex decoded",
    chars: "decoded repeatedly, character list joined",
};

const FORM_DECODED_REPEATEDLY: Stage = Stage {
    name: "form-decoded repeatedly",
    unwrapped: "form-decoded repeatedly, blanks removed",
    list: "form-decoded repeatedly, hex list joined",
    dump: "form-decoded repeatedly, dump joined",
    dump_hex: "form-decoded repeatedly, dump's hex decoded",
    chars: "form-decoded repeatedly, character list joined",
};

const LOWERED_REPEATEDLY: Stage = Stage {
    name: "lower-cased, decoded repeatedly",
    unwrapped: "lower-cased, decoded repeatedly, blanks removed",
    list: "lower-cased, decoded repeatedly, hex list joined",
    dump: "lower-cased, decoded repeatedly, dump joined",
    dump_hex: "lower-cased, decoded repeatedly, dump's hex decoded",
    chars: "lower-cased, decoded repeatedly, character list joined",
};

/// Whether `data` holds an escape whose letters are upper case where its
/// encoder writes lower case, that only the lower-cased view decodes: `\U`
/// or `\X` (`\U002B`, and so inside percent-encoding, `%5CU`), or an `&`
/// before an upper-case letter that starts no name the table has in that
/// case (`&SOL;`, `&EACUTE;`; `&AMP;` and `&Eacute;` are read as they are).
fn case_changed_escape(data: &[u8]) -> bool {
    let upper_after = |at: usize| matches!(data.get(at), Some(b'U' | b'X'));
    memchr::memchr3_iter(b'\\', b'&', b'%', data).any(|at| match data.get(at) {
        Some(b'\\') => upper_after(at + 1),
        Some(b'%') => matches!(data.get(at + 1..at + 3), Some(b"5C" | b"5c")) && upper_after(at + 3),
        _ => {
            let rest = data.get(at + 1..).unwrap_or_default();
            rest.first().is_some_and(u8::is_ascii_uppercase) && named_at(rest, false).is_none()
        }
    })
}

/// What the base64 view may still decode in one check, and what it did.
struct Base64Budget {
    /// Bytes it may still decode, over every run at every depth.
    left: usize,
    /// How many base64 decodings deep the data being searched is.
    depth: usize,
    /// Bytes decoded so far, and bytes searched by every view's entry
    /// ([`SecretScanner::find_with`]) at every depth: the check's work.
    decoded: usize,
    searched: usize,
    /// Bytes the view's buffers hold now, at every depth together, and the
    /// most they held at once ([`Level::account`]).
    held: usize,
    peak: usize,
}

impl Base64Budget {
    /// The budget of a check of `len` bytes.
    fn for_len(len: usize) -> Self {
        Base64Budget {
            left: len.saturating_mul(BASE64_FACTOR).saturating_add(BASE64_SLACK),
            depth: 0,
            decoded: 0,
            searched: 0,
            held: 0,
            peak: 0,
        }
    }
}

/// How a run is read: `len` characters at a time, each window starting
/// `len - overlap` characters after the one before (both multiples of 4).
#[derive(Clone, Copy, Debug)]
struct Window {
    len: usize,
    overlap: usize,
}

/// The buffers of the base64 view at one depth, reused from window to
/// window and run to run, so what it holds is bounded by its [`Window`]
/// and [`KEPT_BATCH`], not by the data: the characters of one window, what
/// they decode to at one offset, the form bytes gathered (and narrowed),
/// and the runs seen.
struct Level {
    window: Window,
    radix: &'static Radix,
    sextets: Vec<u8>,
    piece: Vec<u8>,
    kept: Vec<u8>,
    narrowed: Vec<u8>,
    seen: SeenRuns,
    /// Bytes these buffers held when last counted into the budget.
    held: usize,
}

impl Level {
    fn new(window: Window, dedupe: bool, radix: &'static Radix) -> Self {
        Level {
            window,
            radix,
            sextets: Vec::new(),
            piece: Vec::new(),
            kept: Vec::new(),
            narrowed: Vec::new(),
            seen: SeenRuns::new(dedupe),
            held: 0,
        }
    }

    /// Counts what the buffers hold now (their capacity) into `budget`'s
    /// `held` and `peak`.
    fn account(&mut self, budget: &mut Base64Budget) {
        let now = [&self.sextets, &self.piece, &self.kept, &self.narrowed].iter().map(|v| v.capacity()).sum::<usize>()
            + self.seen.held();
        budget.held = budget.held.saturating_sub(self.held).saturating_add(now);
        budget.peak = budget.peak.max(budget.held);
        self.held = now;
    }
}

/// The runs one level of the base64 view decoded, by a keyed hash of their
/// bytes, in a table of [`SEEN_SLOTS`] (a later run may take an earlier
/// one's slot: then a run met again is decoded again, which costs work,
/// never a miss). Used only when the view reads two copies of the data (as
/// sent and unescaped), where most runs are in both.
struct SeenRuns {
    keys: std::hash::RandomState,
    slots: Vec<u64>,
    on: bool,
}

impl SeenRuns {
    fn new(on: bool) -> Self {
        SeenRuns { keys: std::hash::RandomState::new(), slots: Vec::new(), on }
    }

    /// Whether `run` is met for the first time (always, when not on).
    fn first_time(&mut self, run: &[u8]) -> bool {
        use std::hash::BuildHasher as _;
        if !self.on {
            return true;
        }
        if self.slots.is_empty() {
            self.slots = vec![0; SEEN_SLOTS];
        }
        // 0 marks an empty slot: no key is 0.
        let key = self.keys.hash_one(run) | 1;
        let at = usize::try_from(key % SEEN_SLOTS as u64).unwrap_or(0);
        match self.slots.get_mut(at) {
            Some(slot) if *slot == key => false,
            Some(slot) => {
                *slot = key;
                true
            }
            None => true,
        }
    }

    fn held(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u64>()
    }
}

/// The text of UTF-16 in `data`, as single bytes: each run of 16-bit units
/// whose high byte is zero (ASCII and Latin-1 characters), in either byte
/// order and at either alignment, of at least `min` characters, appended
/// to `out` as its low bytes, each run followed by `separator` (so no form
/// is made of two runs). No byte order mark or charset is needed, and the
/// rest of the text may be anything: Cyrillic or CJK prose written by
/// PowerShell's `>`, `bcp -w` or .NET around a header or a URL is read for
/// those. A run is a stretch where zero and other bytes alternate one by
/// one: its other bytes are the characters of both readings (little-endian
/// pairs `x 0`, big-endian `0 x`), and at most one byte either end that
/// belongs to the character beside the run. Found from the zero bytes
/// (memchr), so data with few costs little; what it appends is less than
/// `data`'s length. Whether it appended anything.
fn narrow_utf16(data: &[u8], min: usize, separator: u8, out: &mut Vec<u8>) -> bool {
    let min = min.max(2);
    let before = out.len();
    let nonzero = |i: usize| data.get(i).is_some_and(|&b| b != 0);
    let emit = |first: usize, last: usize, out: &mut Vec<u8>| {
        // Zeros at `first`, `first + 2`, …, `last`, a character between each two.
        let lead = first.checked_sub(1).filter(|&i| nonzero(i));
        let tail = Some(last + 1).filter(|&i| nonzero(i));
        let chars = (last - first) / 2 + usize::from(lead.is_some()) + usize::from(tail.is_some());
        if chars < min {
            return;
        }
        out.extend(lead.and_then(|i| data.get(i)));
        out.extend(data.get(first + 1..last).unwrap_or_default().iter().step_by(2));
        out.extend(tail.and_then(|i| data.get(i)));
        out.push(separator);
    };
    let mut run: Option<(usize, usize)> = None;
    for z in memchr::memchr_iter(0, data) {
        run = match run {
            Some((first, last)) if z == last + 2 && nonzero(last + 1) => Some((first, z)),
            Some((first, last)) => {
                emit(first, last, out);
                Some((z, z))
            }
            None => Some((z, z)),
        };
    }
    if let Some((first, last)) = run {
        emit(first, last, out);
    }
    out.len() > before
}

/// [`BASE64_VALUE`] of a line break and of a blank (space, tab). A run goes
/// on across blanks and line breaks together when they hold a line break:
/// base64 wrapped at a fixed width (MIME's 76 columns with CRLF, PEM's 64
/// with LF), and indented or folded after the break (a YAML block scalar,
/// an HTTP or mail header folded with `CRLF` and a blank). Blanks on a line
/// of their own end it: prose is words between blanks, so joining across
/// them would make every line one run (SECURITY.md, Known limits).
const LINE_BREAK: u8 = 0xFE;
const BLANK: u8 = 0xFD;
/// [`BASE64_VALUE`] of any other byte that is not base64: it ends a run
/// (`=` too: padding ends an encoding).
const NOT_BASE64: u8 = 0xFF;

/// The 6-bit value of each base64 character in either alphabet (standard
/// `+/`, URL-safe `-_`: one run may be read as either), or [`LINE_BREAK`],
/// [`BLANK`] or [`NOT_BASE64`].
static BASE64_VALUE: [u8; 256] = {
    let mut table = [NOT_BASE64; 256];
    let mut i = 0;
    while i < 64 {
        table[b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i] as usize] = i as u8;
        i += 1;
    }
    table[b'-' as usize] = 62;
    table[b'_' as usize] = 63;
    table[b'\r' as usize] = LINE_BREAK;
    table[b'\n' as usize] = LINE_BREAK;
    table[b' ' as usize] = BLANK;
    table[b'\t' as usize] = BLANK;
    table
};

/// A run of base64 characters: its bytes (the line breaks and blanks
/// inside included) and how many base64 characters it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    start: usize,
    end: usize,
    chars: usize,
}

/// The runs of base64 characters in `data` that hold at least `min`
/// characters (at least 1), in order; inside a run, blanks and line
/// breaks that hold a line break ([`LINE_BREAK`]). Looks at every `min`-th
/// byte first: where that byte is in no run no long enough run can hold
/// it, so text with short words and no base64 costs about one lookup in
/// `min` bytes; each byte is read a few times at most. An iterator: the
/// view holds one run at a time, however many the data has.
struct Base64Runs<'a> {
    data: &'a [u8],
    min: usize,
    /// [`BASE64_VALUE`], or [`HEX_CLASS`] for the runs of the hex view.
    table: &'static [u8; 256],
    /// Where to look on; no run holds the byte before it.
    at: usize,
}

impl<'a> Base64Runs<'a> {
    #[cfg(test)]
    fn new(data: &'a [u8], min: usize) -> Self {
        Self::with_table(data, min, &BASE64_VALUE)
    }

    /// The runs of the characters `table` gives a value below 64.
    fn with_table(data: &'a [u8], min: usize, table: &'static [u8; 256]) -> Self {
        Base64Runs { data, min: min.max(1), table, at: 0 }
    }

    fn class(&self, i: usize) -> u8 {
        self.data.get(i).map_or(NOT_BASE64, |&b| self.table[usize::from(b)])
    }

    fn is_gap(&self, i: usize) -> bool {
        matches!(self.class(i), LINE_BREAK | BLANK)
    }

    /// The end of the blanks and line breaks from `from` on, and whether a
    /// line break is among them.
    fn gap_forward(&self, from: usize) -> (usize, bool) {
        let (mut end, mut broken) = (from, false);
        while self.is_gap(end) {
            broken |= self.class(end) == LINE_BREAK;
            end += 1;
        }
        (end, broken)
    }

    /// The start of the blanks and line breaks before `to`, not before
    /// `floor`, and whether a line break is among them.
    fn gap_backward(&self, floor: usize, to: usize) -> (usize, bool) {
        let (mut start, mut broken) = (to, false);
        while start > floor && self.is_gap(start - 1) {
            start -= 1;
            broken |= self.class(start) == LINE_BREAK;
        }
        (start, broken)
    }
}

impl Iterator for Base64Runs<'_> {
    type Item = Run;

    fn next(&mut self) -> Option<Run> {
        while self.at.saturating_add(self.min) <= self.data.len() {
            let floor = self.at;
            let probe = floor + self.min - 1;
            let (mut start, mut end, mut chars) = match self.class(probe) {
                NOT_BASE64 => {
                    self.at = probe + 1;
                    continue;
                }
                v if v < 64 => (probe, probe + 1, 1),
                _ => {
                    // A blank or line break: in a run only if its gap holds
                    // a line break (the gap cannot reach before `floor`).
                    let (gap_start, back) = self.gap_backward(floor, probe);
                    let (gap_end, fore) = self.gap_forward(probe);
                    if !(back || fore) {
                        self.at = gap_end;
                        continue;
                    }
                    (gap_start, gap_end, 0)
                }
            };
            while start > floor {
                match self.class(start - 1) {
                    NOT_BASE64 => break,
                    v if v < 64 => {
                        start -= 1;
                        chars += 1;
                    }
                    _ => match self.gap_backward(floor, start) {
                        (gap_start, true) => start = gap_start,
                        _ => break,
                    },
                }
            }
            // Where to look on: past the byte that ended the run, or past
            // the blanks that did (no run holds them either).
            self.at = loop {
                match self.class(end) {
                    NOT_BASE64 => break end + 1,
                    v if v < 64 => {
                        end += 1;
                        chars += 1;
                    }
                    _ => match self.gap_forward(end) {
                        (gap_end, true) => end = gap_end,
                        (gap_end, false) => break gap_end,
                    },
                }
            };
            if chars >= self.min {
                return Some(Run { start, end, chars });
            }
        }
        None
    }
}

/// `sextets` (6-bit values) decoded as base64 from their first, appended to
/// `out`: 3 bytes a 4 characters, and what a last 2 or 3 characters hold
/// (padding or none, as an unpadded decoder reads it; a last lone character
/// holds no whole byte).
fn decode_run(sextets: &[u8], out: &mut Vec<u8>) {
    let groups = sextets.chunks_exact(4);
    let rest = groups.remainder();
    let start = out.len();
    // Sized once and filled in place: most of what is decoded is binary
    // that the view then drops, so this loop is most of the view's cost.
    out.resize(start + groups.len() * 3, 0);
    let slots = out.get_mut(start..).unwrap_or_default().chunks_exact_mut(3);
    for (g, slot) in groups.zip(slots) {
        if let (&[a, b, c, d], [x, y, z]) = (g, slot) {
            let n = u32::from(a) << 18 | u32::from(b) << 12 | u32::from(c) << 6 | u32::from(d);
            (*x, *y, *z) = ((n >> 16) as u8, (n >> 8) as u8, n as u8);
        }
    }
    match *rest {
        [a, b] => out.push(a << 2 | b >> 4),
        [a, b, c] => out.extend_from_slice(&[a << 2 | b >> 4, b << 4 | c >> 2]),
        _ => {}
    }
}

/// `nibbles` (4-bit values) decoded as hex from their first, appended to
/// `out`: a byte a two digits (a last lone digit holds no whole byte).
fn decode_hex_run(nibbles: &[u8], out: &mut Vec<u8>) {
    out.extend(nibbles.chunks_exact(2).map(|p| match *p {
        [hi, lo] => hi << 4 | lo,
        _ => 0,
    }));
}

/// The value of each hex digit (either case), or [`LINE_BREAK`],
/// [`BLANK`] or [`NOT_BASE64`], as [`BASE64_VALUE`] for base64: the hex
/// view's runs go on across line breaks as base64's do (`xxd -p`, hex
/// wrapped at a fixed width). A `0x` or `\x` before a run is no part of
/// it (`x` ends a run), nor is a separator between bytes (`:`, `-`, a
/// blank within a line: hex with separators has needles of its own).
static HEX_CLASS: [u8; 256] = {
    let mut table = BASE64_VALUE;
    let mut i = 0;
    while i < 256 {
        if table[i] < 64 {
            table[i] = NOT_BASE64;
        }
        i += 1;
    }
    let mut d = 0;
    while d < 16 {
        table[b"0123456789abcdef"[d] as usize] = d as u8;
        table[b"0123456789ABCDEF"[d] as usize] = d as u8;
        d += 1;
    }
    table
};

/// How one decoding view reads its runs.
struct Radix {
    /// Each byte's value ([`BASE64_VALUE`], [`HEX_CLASS`]).
    table: &'static [u8; 256],
    /// Values a character has (64, 16), and the character offsets a run
    /// is decoded at (4, 2).
    base: u8,
    offsets: usize,
    /// Bytes decoded a character of a run, at all the offsets together.
    cost: usize,
    hex: bool,
    /// What a finding calls the view.
    view: &'static str,
}

/// The base64 view ([`SecretScanner::find_decoded`]).
static BASE64: Radix =
    Radix { table: &BASE64_VALUE, base: 64, offsets: 4, cost: 3, hex: false, view: "base64-decoded" };

/// The hex view: runs of hex digits, decoded at both digit offsets, what
/// they decode to searched with every view. Hex of the secret itself has
/// needles; this reads hex of any form the views undo (hex of the
/// percent-encoded or JSON-escaped secret, hex of its base64 escaped).
static HEX: Radix = Radix { table: &HEX_CLASS, base: 16, offsets: 2, cost: 1, hex: true, view: "hex-decoded" };

/// [`HEX_VALUE`] of a byte that is not a hex digit.
const NOT_HEX: u8 = 0xFF;

/// The value of each byte as a hex digit (either case), or [`NOT_HEX`].
static HEX_VALUE: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut i = 0;
    while i < 16 {
        table[b"0123456789abcdef"[i] as usize] = i as u8;
        table[b"0123456789ABCDEF"[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// Where the rest of a dump line begins, if it starts with an offset:
/// blanks, an optional `0x`, 4 to 16 hex digits, an optional `:`, and a
/// blank (`0040: ` curl, `00000040: ` xxd, `00000040  ` hexdump and Go,
/// `\t0x0040:  ` tcpdump). The one blank after the offset is the
/// separator; a text line of curl's `--trace-ascii` starts right after it.
fn dump_offset(line: &[u8]) -> Option<usize> {
    let mut at = line.iter().take_while(|&&b| matches!(b, b' ' | b'\t')).count();
    if matches!(line.get(at..at + 2), Some([b'0', b'x' | b'X'])) {
        at += 2;
    }
    let digits = line.get(at..)?.iter().take(17).take_while(|b| b.is_ascii_hexdigit()).count();
    if !(4..=16).contains(&digits) {
        return None;
    }
    at += digits;
    if line.get(at) == Some(&b':') {
        at += 1;
    }
    matches!(line.get(at), Some(b' ' | b'\t')).then_some(at + 1)
}

/// The lines of `data` that start with an offset, each after it (without
/// a `\r` ending it).
fn dump_lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    memchr::memchr_iter(b'\n', data).map(Some).chain(std::iter::once(None)).filter_map(move |newline| {
        let end = newline.unwrap_or(data.len());
        let line = data.get(start..end);
        start = end + 1;
        let line = line?;
        let rest = line.get(dump_offset(line)?..)?;
        Some(rest.strip_suffix(b"\r").unwrap_or(rest))
    })
}

/// [`SecretScanner::find_dump`]'s two views of `data`: the text of its
/// offset lines joined (a hex-dump line's ASCII column, any other line's
/// rest), and the bytes of its hex-dump lines' hex groups. `None` when
/// fewer than two lines start with an offset.
fn dump_views(data: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    memchr::memchr(b'\n', data)?;
    if dump_lines(data).nth(1).is_none() {
        return None;
    }
    let (mut text, mut bytes) = (Vec::with_capacity(data.len() / 4), Vec::with_capacity(data.len() / 4));
    for rest in dump_lines(data) {
        match hex_dump_line(rest, &mut bytes) {
            Some(ascii) => text.extend_from_slice(ascii),
            None => text.extend_from_slice(rest),
        }
    }
    Some((text, bytes))
}

/// A hex-dump line after its offset: hex groups of whole bytes (`7b 22`,
/// xxd's `7b22`), blanks, and an ASCII column of as many characters as the
/// groups hold bytes, at the line's end (inside `|…|` or `>…<` if the line
/// ends in one). The groups' bytes are appended to `bytes` and the ASCII
/// column returned. A line of hex groups only gives its bytes and `None`;
/// a line that is neither (curl's `--trace-ascii` text), `None`.
fn hex_dump_line<'a>(rest: &'a [u8], bytes: &mut Vec<u8>) -> Option<&'a [u8]> {
    let len = rest.len();
    let blank = |i: usize| matches!(rest.get(i), Some(b' ' | b'\t'));
    let digit = |i: usize| rest.get(i).map_or(NOT_HEX, |&b| HEX_VALUE[usize::from(b)]);
    // Each group: where it starts and ends, and the bytes up to its end.
    let mut groups = [(0usize, 0usize, 0usize); 64];
    let (mut count, mut i, mut held) = (0, 0, 0);
    // Where the first non-blank after the last group starts.
    let after = loop {
        while blank(i) {
            i += 1;
        }
        let Some(slot) = groups.get_mut(count) else { break i };
        let start = i;
        while digit(i) != NOT_HEX {
            i += 1;
        }
        if i == start || (i - start) % 2 != 0 || (i < len && !blank(i)) {
            break start;
        }
        held += (i - start) / 2;
        *slot = (start, i, held);
        count += 1;
    };
    let decode = |through: usize, bytes: &mut Vec<u8>| {
        for &(start, end, _) in groups.get(..through).unwrap_or_default() {
            for at in (start..end).step_by(2) {
                bytes.push(digit(at) << 4 | digit(at + 1));
            }
        }
    };
    if count > 0 && after == len {
        decode(count, bytes);
        return None;
    }
    // The delimiter that opens an ASCII column the line ends in (`|…|`, `>…<`).
    let open = match rest.last() {
        Some(b'|') => Some(b'|'),
        Some(b'<') => Some(b'>'),
        _ => None,
    };
    // The most groups whose bytes the end of the line spells as a column,
    // right after blanks that follow them.
    for k in (0..count).rev() {
        let Some(&(_, end, held)) = groups.get(k) else { continue };
        let next = groups.get(k + 1).filter(|_| k + 1 < count).map_or(after, |g| g.0);
        let column = |s: usize| (end < s && s <= next).then_some(s);
        let delimited = open.and_then(|open| {
            let o = column(len.checked_sub(held + 2)?)?;
            (rest.get(o) == Some(&open)).then_some(o + 1..len - 1)
        });
        let ascii = delimited.or_else(|| len.checked_sub(held).and_then(column).map(|s| s..len));
        if let Some(range) = ascii {
            decode(k + 1, bytes);
            return rest.get(range);
        }
    }
    None
}

/// The length of the quoted one-character string at the start of `s`
/// (`'s'`, `"3"`, `'é'`), if one is there.
fn char_item(s: &[u8]) -> Option<usize> {
    let quote = *s.first()?;
    if !matches!(quote, b'"' | b'\'') {
        return None;
    }
    let width = match *s.get(1)? {
        0x00..=0x7F => 1,
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return None,
    };
    std::str::from_utf8(s.get(1..1 + width)?).ok()?;
    (s.get(1 + width) == Some(&quote)).then_some(width + 2)
}

/// Whether `data` may hold a list of one-character strings, cheaply: a
/// `[` or `(` opening one whose first two items are such strings, apart
/// by a `,` or blanks.
fn may_hold_char_list(data: &[u8]) -> bool {
    let blanks = |s: &[u8]| s.iter().take(16).take_while(|b| b.is_ascii_whitespace()).count();
    memchr::memchr2_iter(b'[', b'(', data).any(|at| {
        let Some(rest) = data.get(at + 1..) else { return false };
        let first = blanks(rest);
        let Some(len) = rest.get(first..).and_then(char_item) else { return false };
        let mut next = first + len;
        next += blanks(rest.get(next..).unwrap_or_default());
        if rest.get(next) == Some(&b',') {
            next += 1;
            next += blanks(rest.get(next..).unwrap_or_default());
        }
        next > first + len && rest.get(next..).and_then(char_item).is_some()
    })
}

/// What separates the items of a list as printers write one.
fn list_punctuation(b: u8) -> bool {
    matches!(b, b'[' | b']' | b'{' | b'}' | b',' | b'\'' | b'"' | b' ' | b'\t' | b'\n' | b'\r')
}

/// Whether `s` starts with `0x` or `0X` and a hex digit.
fn hex_prefix(s: Option<&[u8]>) -> bool {
    matches!(s, Some([b'0', b'x' | b'X', d, ..]) if d.is_ascii_hexdigit())
}

/// Whether `data` may hold a list of hex byte values, cheaply: a `0x`
/// before a hex digit, or a `[` opening an item of one or two hex digits
/// (after blanks or a quote). Data with neither is not given the view.
fn may_hold_hex_list(data: &[u8]) -> bool {
    let opens_item = |at: usize| {
        let Some(after) = data.get(at + 1..) else {
            return false;
        };
        let blanks = after.iter().take(16).take_while(|&&b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')).count();
        let item = after.get(blanks..).unwrap_or_default();
        let item = item.strip_prefix(b"\"").or_else(|| item.strip_prefix(b"'")).unwrap_or(item);
        let digits = item.iter().take(3).take_while(|b| b.is_ascii_hexdigit()).count();
        (1..=2).contains(&digits) && item.get(digits).is_some_and(|&b| list_punctuation(b))
    };
    memchr::memchr_iter(b'[', data).any(opens_item)
        || [&b"0x"[..], b"0X"].iter().any(|p| memchr::memmem::find_iter(data, p).any(|at| hex_prefix(data.get(at..))))
}

/// Which escape kinds one decoding pass undoes.
#[derive(Debug, Clone, Copy)]
struct Kinds {
    backslash: bool,
    html: bool,
    percent: bool,
    plus: bool,
    quoted_printable: bool,
    /// Named references in any letter case (data lower-cased first:
    /// [`SecretScanner::find_case_changed`]).
    any_case: bool,
}

const NONE: Kinds =
    Kinds { backslash: false, html: false, percent: false, plus: false, quoted_printable: false, any_case: false };
/// The kinds undone together, repeatedly. Quoted-printable is not among
/// them: `=` followed by two hex digits is everyday text in URLs
/// (`?key=de…`), and undoing it would break the secret that follows.
const ALL: Kinds = Kinds { backslash: true, html: true, percent: true, ..NONE };

/// The one-kind views: the byte that triggers each, its kinds, its name.
const SINGLE: &[(u8, Kinds, &str)] = &[
    (b'\\', Kinds { backslash: true, ..NONE }, "backslash-unescaped"),
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
    let on: Vec<u8> = (0..=255u8).filter(|&b| special[usize::from(b)]).collect();
    // The next escape character: memchr's vector search for one or two
    // (for three, dense in escaped text, a table is faster).
    let next = |hay: &[u8]| match on.as_slice() {
        [] => None,
        [a] => memchr::memchr(*a, hay),
        [a, b] => memchr::memchr2(*a, *b, hay),
        _ => hay.iter().position(|&b| special[usize::from(b)]),
    };
    let mut out = Vec::new();
    let mut changed = false;
    // Input up to `copied` is in `out`.
    let (mut i, mut copied) = (0, 0);
    while let Some(at) = next(&data[i..]) {
        i += at;
        if out.capacity() == 0 {
            out.reserve(data.len());
        }
        out.extend_from_slice(&data[copied..i]);
        let rest = &data[i..];
        let used = match rest[0] {
            b'\\' => backslash_at(rest, &mut out),
            b'&' => reference_at(rest, kinds.any_case, &mut out),
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

/// The value of the `n` hex digits at `at` in `s`.
fn hex_at(s: &[u8], at: usize, n: usize) -> Option<u32> {
    let digits = s.get(at..at + n)?;
    if !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

/// A character written as one or two escaped UTF-16 units at the start of
/// `s`: `unit` reads one escape (its value and length); a high surrogate
/// followed by an escaped low one is the pair's character. Decoded into
/// `out`, and how many bytes it took; a lone surrogate is not a character.
fn utf16_escape_at(s: &[u8], out: &mut Vec<u8>, unit: impl Fn(&[u8]) -> Option<(u32, usize)>) -> Option<usize> {
    let (hi, used) = unit(s)?;
    if (0xD800..0xDC00).contains(&hi)
        && let Some((lo, more)) = s.get(used..).and_then(&unit)
        && (0xDC00..0xE000).contains(&lo)
    {
        return push_char(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00), out).then_some(used + more);
    }
    push_char(hi, out).then_some(used)
}

/// `\uXXXX` or `\u{H…}` (ES2015: hex digits, any number of leading
/// zeros) at the start of `s`: its value and length.
fn js_unicode_unit(s: &[u8]) -> Option<(u32, usize)> {
    if s.get(..2) != Some(b"\\u") {
        return None;
    }
    if s.get(2) != Some(&b'{') {
        return Some((hex_at(s, 2, 4)?, 6));
    }
    let (zeros, significant) = leading_zeros_and_digits(s.get(3..)?, 16);
    let digits = zeros + significant;
    if digits == 0 || significant > 8 || s.get(3 + digits) != Some(&b'}') {
        return None;
    }
    let value = if significant == 0 { 0 } else { hex_at(s, 3 + zeros, significant)? };
    Some((value, 4 + digits))
}

/// The leading zeros of the digits (of `radix`, 10 or 16) at the start of
/// `s`, and how many digits follow them (up to 9: more is no character).
/// A browser reads `&#0000000115;` and JavaScript `\u{000000073}` with any
/// number of zeros.
fn leading_zeros_and_digits(s: &[u8], radix: u32) -> (usize, usize) {
    let zeros = s.iter().take_while(|&&b| b == b'0').count();
    let digit = |b: &&u8| if radix == 16 { b.is_ascii_hexdigit() } else { b.is_ascii_digit() };
    let significant = s.get(zeros..).unwrap_or_default().iter().take(9).take_while(digit).count();
    (zeros, significant)
}

/// A backslash escape at the start of `s`: JSON's and JavaScript's (`\"`,
/// `\\`, `\/`, `\b\f\n\r\t`, `\uXXXX` and `\u{H…}` with surrogate pairs,
/// `\xHH`, octal `\O` to `\377`); any other ASCII punctuation or a blank
/// escaped, read as itself (Markdown's `sk\_live\_…` from Google Docs,
/// turndown or markdownify, Python's `re.escape` `sk\-proj\-…`,
/// JavaScript's identity escapes, a shell's `\ `); and a line continuation,
/// `\` before LF or CRLF, read as nothing (shell, Dockerfile, C and Python
/// source; indentation after it goes in the views without blanks).
/// Decoded into `out`, and how many bytes it took. `\xHH` and octal are
/// taken as bytes (C, Python); JavaScript's reading, a character each, is
/// the secret's Latin-1 needle.
fn backslash_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
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
        b'u' => return utf16_escape_at(s, out, js_unicode_unit),
        b'0'..=b'7' => {
            // Up to three octal digits, as long as the value is a byte
            // (`\477` is `\47` then `7`, as JavaScript reads it).
            let mut value = 0u32;
            let mut used = 1;
            for &d in s.iter().skip(1).take(3) {
                let next = value * 8 + u32::from(d.wrapping_sub(b'0'));
                if !(b'0'..=b'7').contains(&d) || next > 0xFF {
                    break;
                }
                value = next;
                used += 1;
            }
            out.push(u8::try_from(value).ok()?);
            return Some(used);
        }
        b'\n' => return Some(2),
        b'\r' if s.get(2) == Some(&b'\n') => return Some(3),
        c if c.is_ascii_punctuation() || c == b' ' || c == b'\t' => c,
        _ => return None,
    };
    out.push(simple);
    Some(2)
}

/// The characters the named reference at the start of `rest` (what follows
/// an `&`) stands for, and the bytes of its name (its `;` included): any of
/// the HTML5 named character references ([`html_names`], the WHATWG table:
/// `&eacute;`, `&euro;`, `&sol;`, `&NewLine;`), the longest name with its
/// `;`, else the longest legacy name, read without one (`&eacute`, `&ampx`
/// is `&x`), as browsers read them. Names are case-sensitive, except with
/// `any_case` (the view of data lower-cased: `&sol;` there may have been
/// `&SOL;`, and `&hat;` `&Hat;`); there a name the table spells in both
/// cases is read as its lower-case one.
fn named_at(rest: &[u8], any_case: bool) -> Option<(&'static str, usize)> {
    let len = rest.iter().take(html_names::LONGEST).take_while(|b| b.is_ascii_alphanumeric()).count();
    if len == 0 {
        return None;
    }
    let lookup = |name: &[u8]| if any_case { named_any_case(name) } else { named_exact(name) };
    if rest.get(len) == Some(&b';')
        && let Some(chars) = rest.get(..=len).and_then(lookup)
    {
        return Some((chars, len + 1));
    }
    // Legacy names are at most 6 bytes.
    (2..=len.min(6)).rev().find_map(|n| rest.get(..n).and_then(lookup).map(|chars| (chars, n)))
}

/// The characters of `name` (its `;` included, if it has one) in the table.
fn named_exact(name: &[u8]) -> Option<&'static str> {
    let at = html_names::NAMES.binary_search_by(|(n, _)| n.as_bytes().cmp(name)).ok()?;
    html_names::NAMES.get(at).map(|&(_, chars)| chars)
}

/// [`named_exact`] whatever the letter case of `name` (its lower-case
/// spelling's characters where the table has one).
fn named_any_case(name: &[u8]) -> Option<&'static str> {
    static FOLDED: std::sync::OnceLock<HashMap<Vec<u8>, &'static str>> = std::sync::OnceLock::new();
    let table = FOLDED.get_or_init(|| {
        let mut table = HashMap::with_capacity(html_names::NAMES.len());
        for &(n, chars) in html_names::NAMES {
            let lower = n.to_ascii_lowercase().into_bytes();
            if lower == n.as_bytes() {
                table.insert(lower, chars);
            } else {
                table.entry(lower).or_insert(chars);
            }
        }
        table
    });
    let mut buf = [0u8; html_names::LONGEST];
    let lowered = buf.get_mut(..name.len())?;
    lowered.copy_from_slice(name);
    lowered.make_ascii_lowercase();
    table.get(&*lowered).copied()
}

/// A character reference at the start of `s`: `&#NN;` or `&#xHH;` (the
/// `;` optional, as browsers accept), or a named one ([`named_at`]). A
/// no-break space (`&nbsp;`) is read as a space: an encoder writes the
/// secret's blank so.
fn reference_at(s: &[u8], any_case: bool, out: &mut Vec<u8>) -> Option<usize> {
    let rest = s.get(1..)?;
    if rest.first() == Some(&b'#') {
        let (radix, start) = if matches!(rest.get(1), Some(b'x' | b'X')) { (16, 2) } else { (10, 1) };
        let tail = rest.get(start..)?;
        let (zeros, significant) = leading_zeros_and_digits(tail, radix);
        let digits = zeros + significant;
        if digits == 0 || significant > 8 {
            return None;
        }
        let code = match tail.get(zeros..digits)? {
            [] => 0,
            d => u32::from_str_radix(std::str::from_utf8(d).ok()?, radix).ok()?,
        };
        let semi = usize::from(tail.get(digits) == Some(&b';'));
        return push_char(code, out).then_some(1 + start + digits + semi);
    }
    let (chars, used) = named_at(rest, any_case)?;
    if chars == "\u{a0}" {
        out.push(b' ');
    } else {
        out.extend_from_slice(chars.as_bytes());
    }
    Some(1 + used)
}

/// `%XX` (either case) at the start of `s`, or `%uXXXX` (JavaScript's
/// old `escape()`, with surrogate pairs).
fn percent_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    if matches!(s.get(1), Some(b'u' | b'U')) {
        let unit = |s: &[u8]| match s.get(..2) {
            Some(b"%u" | b"%U") => Some((hex_at(s, 2, 4)?, 6)),
            _ => None,
        };
        return utf16_escape_at(s, out, unit);
    }
    hex_pair_at(s, out)
}

/// Two hex digits (either case) after the byte at the start of `s`.
fn hex_pair_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    out.push(hex_digit(*s.get(1)?)? << 4 | hex_digit(*s.get(2)?)?);
    Some(3)
}

/// Quoted-printable at the start of `s`: `=XX`, or a soft line break
/// (`=` before a line end), which stands for nothing.
fn quoted_printable_at(s: &[u8], out: &mut Vec<u8>) -> Option<usize> {
    match (s.get(1), s.get(2)) {
        (Some(b'\r'), Some(b'\n')) => Some(3),
        (Some(b'\n'), _) => Some(2),
        _ => hex_pair_at(s, out),
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
            "tg/s3+cr",
            "{\"token\":\"tg\\/s3\"}",
            "%%%&&&\\\\\\u12",
            "&#xFFFFFFFFF;&#;&bogus;",
            "tg/s3+cr Zq8v",
            "[1, 2, 3] [0x1F, 0x2] {0xff,0x00} []byte{}",
            "&amp &lt &gt &quot &nbsp &AMP &ampx &QUOT;",
            "\\u{1F600} \\101 \\u{} %u0041%uD83D",
            "t g / s 3 + c r\tZ q 8 v",
            // A word of the secret under 8 bytes is not watched alone.
            "Zq8v~\u{e9}",
        ] {
            assert_eq!(s.find(clean.as_bytes()), None, "{clean}");
        }
        // Its word of 8 bytes or more is (`tg/s3+cr=t`: a destination may
        // read the secret as words).
        assert_eq!(s.find(b"tg/s3+cr=t").map(|f| f.credential), Some("tracker".into()));
        let f = s.find(SECRET.as_bytes()).unwrap();
        assert_eq!((f.form, f.view), ("raw", "as sent"));
        assert!(!format!("{f:?}{s:?}").contains("Zq8v"), "no secret in findings or Debug");
    }

    /// A secret stored with blanks around it is sent with them, and read
    /// without them: the trimmed value is watched in every form, not only
    /// the raw echo of it.
    #[test]
    fn a_secret_stored_with_blanks_around_it_is_found_trimmed_in_every_form() {
        let token = "tok-abcdef0123456789";
        for stored in [format!("{token} "), format!("{token}\t"), format!(" {token}"), format!("\t{token} \r")] {
            let s = SecretScanner::new(&[("t".into(), stored.as_bytes().to_vec())]);
            for (name, data) in [
                ("base64 of the header value, trimmed", STANDARD.encode(format!("Bearer {token}"))),
                ("base64", STANDARD.encode(token)),
                ("hex", hex::encode(token)),
                ("base32", data_encoding::BASE32.encode(token.as_bytes())),
                ("base64 of UTF-16", STANDARD.encode(utf16(token, true))),
                ("JSON \\u", json_escape_all(token)),
            ] {
                let data = format!("{{\"v\":\"{data}\"}}");
                assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{stored:?}, {name}: {data}");
            }
        }
    }

    /// A secret stored as `Bearer <token>`, applied with the format `{}`:
    /// the server reads the token as the word after the scheme, and echoes
    /// that. Each word of 8 bytes or more is watched in every form; the
    /// scheme alone, shorter, is not.
    #[test]
    fn each_long_word_of_a_stored_secret_is_found_alone() {
        let s = SecretScanner::new(&[("t".into(), b"Bearer s3cr3t-t0ken-value\n".to_vec())]);
        for data in [
            r#"{"token":"s3cr3t-t0ken-value"}"#.to_owned(),
            format!("{{\"token\":\"{}\"}}", STANDARD.encode("s3cr3t-t0ken-value")),
            format!("{{\"token\":\"{}\"}}", hex::encode_upper("s3cr3t-t0ken-value")),
            format!("{{\"token\":\"{}\"}}", STANDARD.encode("user:s3cr3t-t0ken-value")),
        ] {
            assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{data}");
        }
        assert_eq!(found(&s, b"Authorization: Bearer another-token-0000"), None);
        // Blanks only are no secret: nothing is watched for them.
        assert!(SecretScanner::new(&[("t".into(), b" \t \r".to_vec())]).is_empty());
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
            "\\u{",
            "\\u{1",
            "\\u{12345678",
            "\\u{d83d}\\u{",
            "\\1",
            "\\37",
            "%u",
            "%uD83D%u",
            "%uD83D%uDE0",
            "&am",
            "&QUO",
            "&#x;",
            "\\\r",
            "\\\r\n",
            "\\\n",
            "\\_",
        ] {
            for (_, kinds, _) in SINGLE {
                let _ = unescape(data.as_bytes(), *kinds);
            }
            let _ = unescape(data.as_bytes(), Kinds { plus: true, quoted_printable: true, ..ALL });
        }
    }

    fn utf16(s: &str, le: bool) -> Vec<u8> {
        s.encode_utf16().flat_map(|u| if le { u.to_le_bytes() } else { u.to_be_bytes() }).collect()
    }

    /// Whether `data` is found, naming the credential.
    fn found(s: &SecretScanner, data: &[u8]) -> Option<String> {
        s.find(data).map(|f| f.credential)
    }

    /// The narrowed view is built from the zero bytes, holds less than the
    /// data whatever it is, and reads both byte orders at both alignments.
    #[test]
    fn utf16_is_narrowed_by_runs_into_less_than_the_data() {
        let prose = "\u{41e}\u{442}\u{447}\u{451}\u{442} \u{670d}\u{52a1}\u{5668}".repeat(50);
        let mixed = format!("{prose}key=tok-abcdef0123456789{prose}");
        let cases: Vec<Vec<u8>> = vec![
            utf16("plain ASCII text in UTF-16, all of it", true),
            utf16("plain ASCII text in UTF-16, all of it", false),
            utf16(&mixed, true),
            utf16(&mixed, false),
            [&b"\x07"[..], &utf16(&mixed, true)].concat(),
            b"a\0".repeat(4096),
            b"\0a".repeat(4096),
            vec![0; 4096],
            (0..65536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect(),
            b"\0a\0b\0c\0".to_vec(),
        ];
        for data in &cases {
            let mut out = Vec::new();
            narrow_utf16(data, 8, 0xFF, &mut out);
            assert!(out.len() < data.len().max(1), "{} → {}", data.len(), out.len());
        }
        for data in &cases[2..5] {
            let mut out = Vec::new();
            assert!(narrow_utf16(data, 8, 0xFF, &mut out));
            assert!(memchr::memmem::find(&out, b"key=tok-abcdef0123456789").is_some());
            assert!(out.len() < 40, "only the ASCII run, not the prose: {}", out.len());
        }
        // Runs shorter than the shortest needle are left out.
        assert!(!narrow_utf16(&utf16("short", true), 8, 0xFF, &mut Vec::new()));
    }

    #[test]
    fn base64_base32_and_hex_of_the_utf16_form_are_found() {
        let secret = "s3cr3t-token-1234";
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        // .NET Convert.ToBase64String(Encoding.Unicode.GetBytes(s)).
        assert_eq!(STANDARD.encode(utf16(secret, true)), "cwAzAGMAcgAzAHQALQB0AG8AawBlAG4ALQAxADIAMwA0AA==");
        for le in [true, false] {
            for prefix in ["", "a", "ab", "Bearer ", "{\"k\":\""] {
                let whole = utf16(&format!("{prefix}{secret}\"}}"), le);
                for (name, form) in [
                    ("base64", STANDARD.encode(&whole)),
                    ("base64url", URL_SAFE.encode(&whole)),
                    ("base32", data_encoding::BASE32.encode(&whole)),
                    ("base32 lower", data_encoding::BASE32.encode(&whole).to_lowercase()),
                    // SQL Server CAST(N'…' AS VARBINARY).
                    ("hex upper", format!("0x{}", hex::encode_upper(&whole))),
                    ("hex lower", hex::encode(&whole)),
                    ("hex with colons", wrap(&hex::encode(&whole), 2, ":")),
                ] {
                    let data = format!("{{\"v\":\"{form}\"}}");
                    assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{name}, LE {le}, {prefix:?}: {data}");
                }
            }
        }
    }

    #[test]
    fn javascript_braced_octal_and_percent_u_escapes_are_decoded() {
        let emoji = "k3y-\u{1F600}-s3cret-v4lu\u{e9}";
        let s =
            SecretScanner::new(&[("t".into(), SECRET.as_bytes().to_vec()), ("e".into(), emoji.as_bytes().to_vec())]);
        for (cred, secret) in [("t", SECRET), ("e", emoji)] {
            let units = || secret.encode_utf16();
            for (name, form) in [
                ("\\u{} of every char", secret.chars().map(|c| format!("\\u{{{:x}}}", c as u32)).collect::<String>()),
                ("\\u{} upper, zero-padded", secret.chars().map(|c| format!("\\u{{{:06X}}}", c as u32)).collect()),
                ("\\u{} of every UTF-16 unit", units().map(|u| format!("\\u{{{u:X}}}")).collect()),
                (
                    "\\u{} and \\uXXXX mixed",
                    units()
                        .enumerate()
                        .map(|(i, u)| if i % 2 == 0 { format!("\\u{u:04x}") } else { format!("\\u{{{u:x}}}") })
                        .collect(),
                ),
                ("octal, 3 digits", secret.bytes().map(|b| format!("\\{b:03o}")).collect()),
                ("octal, shortest", secret.bytes().map(|b| format!("\\{b:o}")).collect()),
                ("JS escape() %uXXXX", units().map(|u| format!("%u{u:04X}")).collect()),
                ("%uxxxx lower", units().map(|u| format!("%u{u:04x}")).collect()),
                ("%u inside a JSON escape", units().map(|u| format!("\\u0025u{u:04X}")).collect()),
            ] {
                let data = format!("{{\"v\":\"{form}\"}}");
                assert_eq!(found(&s, data.as_bytes()).as_deref(), Some(cred), "{name}: {data}");
            }
        }
        // JavaScript reads `\xHH` and octal as characters, not bytes: `é`
        // is `\xe9` (`\351`), as it is in Latin-1.
        let latin1: Vec<u8> = SECRET.chars().map(|c| c as u8).collect();
        for data in [
            SECRET.chars().map(|c| format!("\\x{:02x}", c as u32)).collect::<String>().into_bytes(),
            SECRET.chars().map(|c| format!("\\{:o}", c as u32)).collect::<String>().into_bytes(),
            [&b"{\"v\":\""[..], &latin1, b"\"}"].concat(),
        ] {
            assert_eq!(found(&s, &data).as_deref(), Some("t"), "{}", String::from_utf8_lossy(&data));
        }
        let back = |d: &str| unescape(d.as_bytes(), Kinds { backslash: true, ..NONE });
        // Octal takes at most three digits and stays within a byte.
        assert_eq!(back("\\1631").as_deref(), Some(&b"s1"[..]));
        assert_eq!(back("\\477").as_deref(), Some(&b"'7"[..]));
        assert_eq!(back("\\0").as_deref(), Some(&b"\0"[..]));
        assert_eq!(back("\\8"), None);
        for bad in ["\\u{}", "\\u{110000}", "\\u{123456789}", "\\u{73", "\\u{zz}", "\\u{D800}"] {
            assert_eq!(back(bad), None, "{bad}");
        }
        let pct = |d: &str| unescape(d.as_bytes(), Kinds { percent: true, ..NONE });
        assert_eq!(pct("%u0073%uD83D%uDE00").as_deref(), Some("s\u{1F600}".as_bytes()));
        for bad in ["%u", "%u12", "%uD800", "%u12G4"] {
            assert_eq!(pct(bad), None, "{bad}");
        }
        // `=u0073` is not quoted-printable.
        assert_eq!(unescape(b"=u0073", Kinds { quoted_printable: true, ..NONE }), None);
    }

    /// Backslash escapes other than JSON's: Markdown (every ASCII
    /// punctuation character may be escaped; Google Docs' export, turndown
    /// and markdownify escape `_`, `*`, `-`, `.`, `+`, …), Python's
    /// `re.escape`, JavaScript identity escapes, and a shell or Dockerfile
    /// line continuation, with and without indentation after it.
    #[test]
    fn backslash_escapes_of_markdown_regex_javascript_and_line_continuations_are_undone() {
        let secret = "sk_live_51HxQ-4f9.XqL2+mNv*w";
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        let escape = |set: &str| -> String {
            secret.chars().map(|c| if set.contains(c) { format!("\\{c}") } else { c.to_string() }).collect()
        };
        let markdown = escape("\\`*_{}[]()#+-.!|~<>");
        assert!(markdown.starts_with("sk\\_live\\_51HxQ\\-4f9\\.XqL2\\+"), "{markdown}");
        // Python 3.7+ re.escape: the regex metacharacters and blanks.
        let regex = escape("()[]{}?*+-|^$\\.&~# \t\n\r\x0b\x0c");
        let (head, tail) = secret.split_at(12);
        for (name, data) in [
            ("Markdown", format!("Your key: `{markdown}`\n")),
            ("Markdown, in a JSON string", format!("{{\"body\":\"key {}\"}}", markdown.replace('\\', "\\\\"))),
            ("re.escape", format!("pattern = r'{regex}'")),
            ("JavaScript identity escapes", format!("const k = \"{}\";", escape("-._+*"))),
            ("shell line continuation", format!("export TOKEN={head}\\\n{tail}\n")),
            ("Dockerfile, CRLF and indentation", format!("ENV TOKEN={head}\\\r\n    {tail}\r\n")),
            ("continuation inside escaped JSON", format!("{{\"run\":\"TOKEN={head}\\\\\\n  {tail}\"}}")),
        ] {
            assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{name}: {data}");
        }
        let back = |d: &str| unescape(d.as_bytes(), Kinds { backslash: true, ..NONE });
        assert_eq!(back("a\\_b\\-c\\ d\\\ne\\\r\nf").as_deref(), Some(&b"a_b-c def"[..]));
        // A backslash before a letter or digit it does not know stays.
        assert_eq!(back("\\q\\8\\\r"), None);
    }

    /// The output of curl 7.88.1 `--trace-ascii` for a request carrying a
    /// GitHub token: the header is cut at 64 characters, mid-token.
    const CURL_TRACE_ASCII: &str = "== Info:   Trying 127.0.0.1:18767...
== Info: Connected to 127.0.0.1 (127.0.0.1) port 18767 (#0)
=> Send header, 208 bytes (0xd0)
0000: GET /sess.json HTTP/1.1
0019: Host: 127.0.0.1:18767
0030: User-Agent: curl/7.88.1
0049: Accept: */*
0056: Authorization: Bearer github_pat_11BKQ7Z3A0rT5mWq9xYz2C_h4NfLp8V
0096: bS6dE1gJkR0uXoPw3yTq7sZa2HcMv5nB9LdF4jK8xQe6rU1tY3iO0p
00ce: 
== Info: HTTP 1.0, assume close after body
<= Recv header, 17 bytes (0x11)
0000: HTTP/1.0 200 OK
";

    /// A response body holding a token, as curl 7.88.1 `--trace`, xxd and
    /// `hexdump -C` print it (16 bytes a line: the token across three).
    const CURL_TRACE: &str = r#"<= Recv data, 105 bytes (0x69)
0000: 7b 22 73 65 73 73 69 6f 6e 22 3a 7b 22 75 73 65 {"session":{"use
0010: 72 22 3a 22 62 75 69 6c 64 2d 62 6f 74 22 2c 22 r":"build-bot","
0020: 73 63 6f 70 65 73 22 3a 5b 22 72 65 70 6f 22 2c scopes":["repo",
0030: 22 72 65 61 64 3a 6f 72 67 22 5d 2c 22 74 6f 6b "read:org"],"tok
0040: 65 6e 22 3a 22 73 6b 2d 70 72 6f 6a 2d 34 66 39 en":"sk-proj-4f9
0050: 58 71 4c 32 6d 4e 76 42 37 74 52 31 63 57 38 79 XqL2mNvB7tR1cW8y
0060: 5a 30 61 4b 64 22 7d 7d 0a                      Z0aKd"}}.
== Info: Closing connection 0
"#;
    const XXD: &str = r#"00000000: 7b22 7365 7373 696f 6e22 3a7b 2275 7365  {"session":{"use
00000010: 7222 3a22 6275 696c 642d 626f 7422 2c22  r":"build-bot","
00000020: 7363 6f70 6573 223a 5b22 7265 706f 222c  scopes":["repo",
00000030: 2272 6561 643a 6f72 6722 5d2c 2274 6f6b  "read:org"],"tok
00000040: 656e 223a 2273 6b2d 7072 6f6a 2d34 6639  en":"sk-proj-4f9
00000050: 5871 4c32 6d4e 7642 3774 5231 6357 3879  XqL2mNvB7tR1cW8y
00000060: 5a30 614b 6422 7d7d 0a                   Z0aKd"}}.
"#;
    const HEXDUMP_C: &str = r#"00000000  7b 22 73 65 73 73 69 6f  6e 22 3a 7b 22 75 73 65  |{"session":{"use|
00000010  72 22 3a 22 62 75 69 6c  64 2d 62 6f 74 22 2c 22  |r":"build-bot","|
00000020  73 63 6f 70 65 73 22 3a  5b 22 72 65 70 6f 22 2c  |scopes":["repo",|
00000030  22 72 65 61 64 3a 6f 72  67 22 5d 2c 22 74 6f 6b  |"read:org"],"tok|
00000040  65 6e 22 3a 22 73 6b 2d  70 72 6f 6a 2d 34 66 39  |en":"sk-proj-4f9|
00000050  58 71 4c 32 6d 4e 76 42  37 74 52 31 63 57 38 79  |XqL2mNvB7tR1cW8y|
00000060  5a 30 61 4b 64 22 7d 7d  0a                       |Z0aKd"}}.|
00000069
"#;

    /// The same body as `od -A x -t x1z -v` (GNU coreutils 9.1) prints it.
    const OD: &str = r#"000000 7b 22 73 65 73 73 69 6f 6e 22 3a 7b 22 75 73 65  >{"session":{"use<
000010 72 22 3a 22 62 75 69 6c 64 2d 62 6f 74 22 2c 22  >r":"build-bot","<
000020 73 63 6f 70 65 73 22 3a 5b 22 72 65 70 6f 22 2c  >scopes":["repo",<
000030 22 72 65 61 64 3a 6f 72 67 22 5d 2c 22 74 6f 6b  >"read:org"],"tok<
000040 65 6e 22 3a 22 73 6b 2d 70 72 6f 6a 2d 34 66 39  >en":"sk-proj-4f9<
000050 58 71 4c 32 6d 4e 76 42 37 74 52 31 63 57 38 79  >XqL2mNvB7tR1cW8y<
000060 5a 30 61 4b 64 22 7d 7d 0a                       >Z0aKd"}}.<
000069
"#;

    /// The same bytes in the layout of `tcpdump -X` (its
    /// `hex_and_ascii_print_with_offset`: a tab, `0x%04x: `, ` %02x%02x`
    /// a pair padded to 40, two blanks, the ASCII column).
    const TCPDUMP_X: &str = "\t0x0030:  2272 6561 643a 6f72 6722 5d2c 2274 6f6b  \"read:org\"],\"tok
\t0x0040:  656e 223a 2273 6b2d 7072 6f6a 2d34 6639  en\":\"sk-proj-4f9
\t0x0050:  5871 4c32 6d4e 7642 3774 5231 6357 3879  XqL2mNvB7tR1cW8y
\t0x0060:  5a30 614b 6422 7d7d 0a                    Z0aKd\"}}.
";

    /// A dump with its lines starting at an offset: curl's
    /// `--trace-ascii`, `--trace`, xxd, `hexdump -C`, od, tcpdump (above),
    /// and the same lines with CRLF, inside a JSON string, and in a log
    /// beside other lines.
    #[test]
    fn a_secret_cut_across_the_lines_of_a_dump_is_found() {
        let pat = "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O0p";
        let token = "sk-proj-4f9XqL2mNvB7tR1cW8yZ0aKd";
        let s = SecretScanner::new(&[("pat".into(), pat.as_bytes().to_vec()), ("t".into(), token.as_bytes().to_vec())]);
        for (name, dump, cred) in [
            ("curl --trace-ascii", CURL_TRACE_ASCII, "pat"),
            ("curl --trace", CURL_TRACE, "t"),
            ("xxd", XXD, "t"),
            ("hexdump -C", HEXDUMP_C, "t"),
            ("od -A x -t x1z", OD, "t"),
            ("tcpdump -X", TCPDUMP_X, "t"),
        ] {
            assert!(!dump.contains(if cred == "pat" { pat } else { token }), "{name}: the fixture cuts it");
            let in_json = serde_json::to_string(&serde_json::json!({ "log": dump })).unwrap();
            let in_log = format!("2024-05-01 12:00:00 debug trace follows\n{dump}2024-05-01 12:00:01 done\n");
            for data in [dump.to_owned(), dump.replace('\n', "\r\n"), in_json, in_log] {
                let f = s.find(data.as_bytes());
                assert_eq!(f.as_ref().map(|f| f.credential.as_str()), Some(cred), "{name}: {data}");
            }
        }
        // The hex groups, decoded: a secret whose bytes are not ASCII (the
        // ASCII column shows `.`), at every place a line can cut it.
        let wide = "k\u{e9}y-\u{fc}ber-s3cr3t-\u{263a}-v4lue";
        let s = SecretScanner::new(&[("w".into(), wide.as_bytes().to_vec())]);
        for pad in 0..16 {
            let body = format!("{}{wide}\"}}", "x".repeat(pad));
            for (name, dump) in [("xxd", xxd(body.as_bytes())), ("hexdump -C", hexdump_c(body.as_bytes()))] {
                let f = s.find(dump.as_bytes());
                assert_eq!(f.map(|f| f.view), Some("as sent, dump's hex decoded"), "{name}, {pad}: {dump}");
            }
        }
    }

    /// Dump lines as xxd writes them.
    fn xxd(data: &[u8]) -> String {
        let mut out = String::new();
        for (i, line) in data.chunks(16).enumerate() {
            let hex: Vec<String> = line.chunks(2).map(hex::encode).collect();
            let ascii: String = line.iter().map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '.' }).collect();
            out += &format!("{:08x}: {:<40} {ascii}\n", i * 16, hex.join(" "));
        }
        out
    }

    /// Dump lines as `hexdump -C` (and Go's `hex.Dump`) writes them.
    fn hexdump_c(data: &[u8]) -> String {
        let mut out = String::new();
        for (i, line) in data.chunks(16).enumerate() {
            let mut hex = String::new();
            for (j, b) in line.iter().enumerate() {
                hex += &format!("{}{b:02x} ", if j == 8 { " " } else { "" });
            }
            let ascii: String = line.iter().map(|&b| if (0x20..0x7f).contains(&b) { b as char } else { '.' }).collect();
            out += &format!("{:08x}  {hex:<49} |{ascii}|\n", i * 16);
        }
        out + &format!("{:08x}\n", data.len())
    }

    #[test]
    fn a_dump_line_is_read_by_its_columns() {
        let line = |rest: &str| {
            let mut bytes = Vec::new();
            let ascii = hex_dump_line(rest.as_bytes(), &mut bytes).map(|a| String::from_utf8_lossy(a).into_owned());
            (ascii, String::from_utf8_lossy(&bytes).into_owned())
        };
        // An ASCII column that starts with what looks like hex groups.
        let rest = "63 20 32 30 32 36 20 30 31 3a 31 34 3a 35 33 20 c 2026 01:14:53 ";
        assert_eq!(line(rest), (Some("c 2026 01:14:53 ".into()), "c 2026 01:14:53 ".into()));
        let rest = "32 30 32 36 20 30 31 3a 31 34 3a 35 33 20 61 62 2026 01:14:53 ab";
        assert_eq!(line(rest), (Some("2026 01:14:53 ab".into()), "2026 01:14:53 ab".into()));
        // The last line, padded; ASCII columns in `|…|` and `>…<`; blanks in them.
        assert_eq!(line("7d7d 0a                                  }}.").0.as_deref(), Some("}}."));
        assert_eq!(line(" 20 7c 61 20  | |a |").0.as_deref(), Some(" |a "));
        assert_eq!(line("7b 22 20 20 >{\"  <").0.as_deref(), Some("{\"  "));
        // Hex groups only; text.
        assert_eq!(line("6869 2121"), (None, "hi!!".into()));
        assert_eq!(line("Authorization: Bearer abc"), (None, String::new()));
        assert_eq!(dump_offset(b"\t0x0040:  4500"), Some(9));
        for no in [&b"12:00:00 x"[..], b"2024-05-01 x", b"0123456789abcdef0 x", b"abc x", b"00000069"] {
            assert_eq!(dump_offset(no), None, "{}", String::from_utf8_lossy(no));
        }
        // One offset line is no dump.
        assert!(dump_views(b"0000: abc\nmore\n").is_none());
    }

    /// Browsers read a numeric character reference with any number of
    /// leading zeros, and JavaScript a `\u{…}` escape likewise.
    #[test]
    fn numeric_escapes_with_many_leading_zeros_are_decoded() {
        let s = scanner();
        for (name, data) in [
            ("decimal", SECRET.chars().map(|c| format!("&#{:012};", c as u32)).collect::<String>()),
            ("hex, no semicolon", SECRET.chars().map(|c| format!("&#x{:016X}", c as u32)).collect()),
            ("JavaScript \\u{}", SECRET.chars().map(|c| format!("\\u{{{:020x}}}", c as u32)).collect()),
        ] {
            assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("tracker"), "{name}: {data}");
        }
        let html = |d: &str| unescape(d.as_bytes(), Kinds { html: true, ..NONE });
        assert_eq!(html("&#0000000000;&#x00000000000073;").as_deref(), Some(&b"\0s"[..]));
        assert_eq!(html("&#0000123456789;"), None, "nine digits after the zeros: no character");
        let back = |d: &str| unescape(d.as_bytes(), Kinds { backslash: true, ..NONE });
        assert_eq!(back("\\u{0000000000}\\u{000000000000073}").as_deref(), Some(&b"\0s"[..]));
    }

    /// A secret printed as a list of its characters: Python's `list(s)`,
    /// Rust's `{:?}` of a `Vec<char>`, JSON arrays (compact and pretty),
    /// Go's `%q` of a `[]string`, and one inside a JSON string. Its digits
    /// and `a`-`f` are not hex bytes there.
    #[test]
    fn a_secret_as_a_list_of_its_characters_is_found() {
        let s = scanner();
        let items = |q: char, sep: &str| -> String {
            SECRET.chars().map(|c| format!("{q}{c}{q}")).collect::<Vec<_>>().join(sep)
        };
        let python = format!("[{}]", items('\'', ", "));
        for (name, data) in [
            ("Python list(s)", python.clone()),
            ("a Python tuple", format!("({})", items('\'', ", "))),
            ("JSON, compact", serde_json::to_string(&SECRET.chars().map(String::from).collect::<Vec<_>>()).unwrap()),
            (
                "JSON, pretty",
                serde_json::to_string_pretty(&SECRET.chars().map(String::from).collect::<Vec<_>>()).unwrap(),
            ),
            ("Go %q", format!("[{}]", items('"', " "))),
            ("inside a JSON string", serde_json::to_string(&python).unwrap()),
        ] {
            let data = format!("chars: {data}\n");
            assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("tracker"), "{name}: {data}");
        }
        // Quotes and digits as items; one character of several bytes.
        let odd = "q'u\"0-9a-f\u{263a}-k3y";
        let s = SecretScanner::new(&[("odd".into(), odd.as_bytes().to_vec())]);
        let data = format!("{:?}", odd.chars().collect::<Vec<_>>());
        assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("odd"), "{data}");
        assert!(!may_hold_char_list(b"[\"ab\", \"c\"] ('x') [1, 2]"));
    }

    /// Hex with a separator between bytes and nothing around it, as
    /// Python's `bytes.hex(sep)` writes it: `:`, `-`, `,`, `.` or a space
    /// (of the UTF-16 form: `:`, `-` or a space).
    #[test]
    fn hex_with_any_common_separator_between_bytes_is_found() {
        let secret = "s3cr3t-token-1234";
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        for (bytes, seps) in [
            (secret.as_bytes().to_vec(), &[":", "-", ",", ".", " "][..]),
            (utf16(secret, true), &[":", "-", " "][..]),
            (utf16(secret, false), &[":", "-", " "][..]),
        ] {
            for sep in seps {
                for hex in [hex::encode(&bytes), hex::encode_upper(&bytes)] {
                    let data = format!("{{\"digest\":\"{}\"}}", wrap(&hex, 2, sep));
                    assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{data}");
                }
            }
        }
    }

    #[test]
    fn html_legacy_references_without_semicolon_and_upper_case_are_decoded() {
        let secret = "p4ss&w0rd<2024>\"q\" z";
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        for form in [
            "p4ss&ampw0rd&lt2024&gt&quotq&quot&nbspz",
            "p4ss&AMP;w0rd&LT;2024&GT;&QUOT;q&QUOT; z",
            "p4ss&AMPw0rd&LT2024&GT&QUOTq&QUOT z",
            "p4ss&amp;w0rd&lt2024&gt;&quotq&quot; z",
            // A `;` further on does not make the legacy name unknown.
            "p4ss&ampw0rd&lt2024&gt&quotq&quot z;",
        ] {
            let data = format!("<p>{form}</p>");
            assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{data}");
        }
        let html = |d: &str| unescape(d.as_bytes(), Kinds { html: true, ..NONE });
        assert_eq!(html("&ampx&LTy").as_deref(), Some(&b"&x<y"[..]));
        // Only the legacy names go without `;`, and names are case-sensitive.
        for bad in ["&apos", "&sol", "&Amp;", "&aMp", "&am"] {
            assert_eq!(html(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_form_split_across_list_items_beside_a_hex_list_is_found() {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(SECRET);
        let (a, b) = b64.split_at(b64.len() / 2);
        let data = format!(r#"{{"id":"0x1f","parts":["{a}","{b}"]}}"#);
        let f = scanner().find(data.as_bytes()).expect("base64 split across a list's items, beside a hex item");
        assert_eq!(f.credential, "tracker");
    }

    #[test]
    fn a_list_of_hex_byte_values_is_found() {
        let s = scanner();
        let tab = "tab\there-s3cret";
        let s2 = SecretScanner::new(&[("tab".into(), tab.as_bytes().to_vec())]);
        let list = |secret: &str, item: &dyn Fn(u8) -> String, sep: &str| -> String {
            secret.bytes().map(item).collect::<Vec<_>>().join(sep)
        };
        for (scanner, cred, secret) in [(&s, "tracker", SECRET), (&s2, "tab", tab)] {
            for (name, form) in [
                ("Go %#v", format!("[]byte{{{}}}", list(secret, &|b| format!("{b:#x}"), ", "))),
                ("Rust {:x?}", format!("[{}]", list(secret, &|b| format!("{b:x}"), ", "))),
                ("Rust {:02X?}", format!("[{}]", list(secret, &|b| format!("{b:02X}"), ", "))),
                ("Rust {:#x?}", format!("[\n{}\n]", list(secret, &|b| format!("    {b:#x}"), ",\n"))),
                ("C array", format!("{{ {} }}", list(secret, &|b| format!("0X{b:02X}"), ", "))),
                ("bare 0x list", list(secret, &|b| format!("0x{b:02x}"), ",")),
                ("Python [hex(b)]", format!("[{}]", list(secret, &|b| format!("'{b:#x}'"), ", "))),
                ("JSON array of hex strings", format!("[{}]", list(secret, &|b| format!("\"{b:02x}\""), ","))),
                (
                    "percent-encoded Rust {:x?}",
                    format!("[{}]", list(secret, &|b| format!("{b:x}"), ", "))
                        .bytes()
                        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
                        .collect(),
                ),
            ] {
                let data = format!("{{\"v\":\"{form}\"}}");
                assert_eq!(found(scanner, data.as_bytes()).as_deref(), Some(cred), "{name}: {data}");
            }
        }
    }

    #[test]
    fn blanks_inserted_into_the_secret_on_one_line_are_found() {
        let secret = "s3cr3t-token-1234";
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        for data in [
            "{\"code\":\"s3cr 3t-t oken -123 4\"}",
            "{\"code\":\"s3cr\t3t-t\token\t-123\t4\"}",
            "{\"code\":\"s 3 c r 3 t - t o k e n - 1 2 3 4\"}",
        ] {
            assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{data}");
        }
        // Base64 with blanks on one line too.
        let b64 = wrap(&STANDARD.encode(secret), 4, " ");
        assert_eq!(found(&s, b64.as_bytes()).as_deref(), Some("t"), "{b64}");
        // A secret with a blank of its own, more blanks put into it.
        let spread = format!("{{\"v\":\"{}\"}}", wrap(SECRET, 3, " "));
        assert_eq!(found(&scanner(), spread.as_bytes()).as_deref(), Some("tracker"), "{spread}");
    }

    #[test]
    fn hex_and_byte_lists_with_spaces_are_found_without_blanks() {
        // They have no needles of their own: plain hex and the `,` list
        // find them in the view without blanks, whichever view decoded them.
        let secret = "s3cr3t-token-1234";
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        for bytes in [secret.as_bytes().to_vec(), utf16(secret, true), utf16(secret, false)] {
            let pairs = |h: String| wrap(&h, 2, " ");
            // A byte list is of the secret's own bytes only.
            let decimal = |sep: &str| secret.bytes().map(|b| b.to_string()).collect::<Vec<_>>().join(sep);
            for form in [
                pairs(hex::encode(&bytes)),
                pairs(hex::encode_upper(&bytes)),
                wrap(&hex::encode(&bytes), 2, "  "),
                decimal(", "),
                decimal(" "),
            ] {
                let pct: String = form.bytes().map(|b| format!("%{b:02X}")).collect();
                let qp: String = form.bytes().map(|b| format!("={b:02X}")).collect();
                for data in [form.clone(), format!("{{\"v\":\"{form}\"}}"), pct, form.replace(' ', "+"), qp] {
                    assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{data}");
                }
            }
        }
    }

    #[test]
    fn a_secret_ending_in_equals_is_found_before_a_line_break() {
        // Its `=` before a line break is a soft line break to the view
        // without blanks: the data as sent is searched for it. (Not
        // canonical base64, `R` holding bits past the last byte: a value
        // that decodes is also watched as its bytes, whose base64 needles
        // hold no `=` and find it anyway.)
        let secret = "dGhpcyBpcyBhIGtleR==";
        assert!(decoded_values(secret.as_bytes()).is_empty());
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        for data in [format!("key: {secret}\nnext"), format!("key: {}\r\n", secret.to_ascii_uppercase())] {
            let f = s.find(data.as_bytes());
            assert_eq!(f.map(|f| (f.form, f.view)), Some(("raw", "as sent")), "{data}");
        }
    }

    #[test]
    fn a_secret_in_another_letter_case_is_found_across_pieces() {
        let key = "3f9a1c7e-55aa-4b2e-9d10-aa44bb66cc88";
        let s = SecretScanner::new(&[("key".into(), key.as_bytes().to_vec())]);
        for at in [0, 1, (64 << 10) - 20, (64 << 10) - 1, 64 << 10, (128 << 10) - 5, (200 << 10) - key.len()] {
            let mut data = vec![b'x'; 200 << 10];
            data.splice(at..at + key.len(), key.to_ascii_uppercase().into_bytes());
            assert_eq!(found(&s, &data).as_deref(), Some("key"), "at {at}");
        }
    }

    #[test]
    fn blanks_put_into_a_secret_are_found_across_pieces() {
        let secret = "s3cr3t-token-1234";
        let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
        let spread = wrap(secret, 1, " ");
        let soft: String = secret.bytes().map(|b| format!("={b:02X}=\n")).collect();
        for form in [spread, soft] {
            for at in [0, (256 << 10) - 20, (256 << 10) - 1, 256 << 10, (256 << 10) + 1, (512 << 10) - 7] {
                let mut data = b"a ".repeat(300 << 10);
                data.splice(at..at + form.len(), form.bytes());
                assert_eq!(found(&s, &data).as_deref(), Some("t"), "at {at}: {form}");
            }
        }
    }

    /// `data` without blanks as the view was first written: byte by byte.
    fn without_blanks_bytewise(data: &[u8]) -> Vec<u8> {
        let mut joined = Vec::new();
        for (i, b) in data.iter().enumerate() {
            let soft_break = *b == b'=' && matches!(data.get(i + 1), Some(b'\r' | b'\n'));
            if !matches!(b, b'\n' | b'\r' | b' ' | b'\t') && !soft_break {
                joined.push(*b);
            }
        }
        joined
    }

    proptest::proptest! {
        #[test]
        fn the_view_without_blanks_matches_its_definition(data in proptest::collection::vec(proptest::sample::select(b"ab= \t\r\n\x00\x21\x1f\xff".to_vec()), 0..64)) {
            proptest::prop_assert_eq!(without_blanks(&data), without_blanks_bytewise(&data));
        }

        /// Searching the view without blanks with every needle and the data
        /// with the needles holding a blank finds what searching both views
        /// with every needle finds.
        #[test]
        fn splitting_the_needles_by_blanks_finds_what_both_views_find(pieces in proptest::collection::vec(0usize..12, 0..24)) {
            let s = SecretScanner::new(&[("t".into(), b"p4ss w0rd-x=".to_vec()), ("u".into(), b"k3y-v4lue==".to_vec())]);
            let words: [&[u8]; 12] = [b"p4ss", b" ", b"w0rd-x=", b"\n", b"k3y-v4", b"lue==", b"=", b"\r\n", b"P4SS W0RD", b"\t", b"7034737320", b"x"];
            let data: Vec<u8> = pieces.iter().flat_map(|&i| words[i].to_vec()).collect();
            let both = s.find_in(&data, "as sent").or_else(|| {
                let joined = without_blanks_bytewise(&data);
                s.find_in(&joined, "as sent, blanks removed").or_else(|| {
                    s.find_in(&unescape(&joined, Kinds { quoted_printable: true, ..NONE })?, "as sent, blanks removed")
                })
            });
            proptest::prop_assert_eq!(s.find_spread(&data, "as sent", "as sent, blanks removed", true), both);
        }

        #[test]
        fn a_secret_is_found_base64_encoded_inside_any_value(prefix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..7), suffix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..7)) {
            let s = scanner();
            let whole = [prefix.as_slice(), SECRET.as_bytes(), suffix.as_slice()].concat();
            for encoded in [STANDARD.encode(&whole), URL_SAFE.encode(&whole), STANDARD_NO_PAD_ENC.encode(&whole)] {
                proptest::prop_assert!(s.find(encoded.as_bytes()).is_some(), "{}", encoded);
            }
        }

        #[test]
        fn the_utf16_form_is_found_base64_encoded_inside_any_value(prefix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..7), suffix in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..7), le in proptest::prelude::any::<bool>()) {
            let s = scanner();
            let whole = [prefix.as_slice(), &utf16(SECRET, le), suffix.as_slice()].concat();
            for encoded in [STANDARD.encode(&whole), URL_SAFE.encode(&whole), data_encoding::BASE32.encode(&whole)] {
                proptest::prop_assert!(s.find(encoded.as_bytes()).is_some(), "{}", encoded);
            }
        }

        #[test]
        fn reading_a_dump_never_panics(data in proptest::collection::vec(proptest::sample::select(b"0a7f: |<>\n\r\tx".to_vec()), 0..300)) {
            let (text, bytes) = dump_views(&data).unwrap_or_default();
            proptest::prop_assert!(text.len() <= data.len() && bytes.len() <= data.len());
        }

        #[test]
        fn scanning_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = scanner().find(&data);
        }
    }
}

/// Encodings the review found passing: UTF-16 text mostly beyond Latin,
/// a secret's letters beyond ASCII (named references, another case,
/// Windows-1252), escapes whose case changed after they were written, and
/// a secret stored with a byte order mark. Only the public API.
#[cfg(test)]
mod encoding_gap_tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    const SECRET: &str = "tg/s3+cr=t Zq8v~\u{e9}";
    const TOKEN: &str = "tok-abcdef0123456789";

    fn scanner() -> SecretScanner {
        SecretScanner::new(&[("tracker".into(), SECRET.as_bytes().to_vec()), ("api".into(), TOKEN.as_bytes().to_vec())])
    }

    fn found(s: &SecretScanner, data: &[u8]) -> Option<String> {
        s.find(data).map(|f| f.credential)
    }

    fn utf16(s: &str, le: bool) -> Vec<u8> {
        s.encode_utf16().flat_map(|u| if le { u.to_le_bytes() } else { u.to_be_bytes() }).collect()
    }

    fn json_escape_all(s: &str) -> String {
        s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect()
    }

    fn pct(s: &str) -> String {
        s.bytes().map(|b| format!("%{b:02X}")).collect()
    }

    /// Prose of PowerShell's, `bcp -w`'s or Excel's UTF-16 output: Cyrillic
    /// and CJK, far more of it than of ASCII.
    fn prose() -> String {
        "\u{41e}\u{442}\u{447}\u{451}\u{442} \u{43e} \u{432}\u{44b}\u{43f}\u{43e}\u{43b}\u{43d}\u{435}\u{43d}\u{438}\u{438}: \
         \u{432}\u{441}\u{435} \u{43f}\u{440}\u{43e}\u{432}\u{435}\u{440}\u{43a}\u{438} \u{43f}\u{440}\u{43e}\u{439}\u{434}\u{435}\u{43d}\u{44b}. \
         \u{670d}\u{52a1}\u{5668}\u{8fd4}\u{56de}\u{7684}\u{6570}\u{636e}\u{5982}\u{4e0b}\u{6240}\u{793a}\u{3002}"
            .repeat(6)
    }

    /// A secret's base64 (in `Basic user:secret`), percent-encoding, JSON
    /// escapes or hex, amid UTF-16 prose mostly beyond Latin: in either
    /// byte order, with or without a byte order mark, at either alignment.
    #[test]
    fn utf16_prose_mostly_beyond_latin_is_read_for_its_ascii() {
        let s = scanner();
        for (secret, name) in [(SECRET, "tracker"), (TOKEN, "api")] {
            for (what, payload) in [
                ("Basic", format!("\"auth\":\"Basic {}\"", STANDARD.encode(format!("svc:{secret}")))),
                ("percent", format!("https://h/cb?code={}&x=1", pct(secret))),
                ("JSON escapes", format!("\"v\":\"{}\"", json_escape_all(secret))),
                ("hex", format!("key={}", hex::encode(secret))),
                ("base64 in a JSON string", format!("\"t\":\"{}\"", STANDARD.encode(secret).replace('/', "\\/"))),
            ] {
                let text = format!("{p}\r\n{payload}\r\n{p}", p = prose());
                for le in [true, false] {
                    for (framing, prefix) in [("no mark", &b""[..]), ("a mark", b"\xFE"), ("one byte off", b"\x07")] {
                        let mut data = prefix.to_vec();
                        if framing == "a mark" {
                            data = if le { b"\xFF\xFE".to_vec() } else { b"\xFE\xFF".to_vec() };
                        }
                        data.extend(utf16(&text, le));
                        assert_eq!(found(&s, &data).as_deref(), Some(name), "{name}, {what}, le {le}, {framing}");
                    }
                }
            }
        }
        // The prose alone, and with another value's forms, holds no secret.
        let other =
            format!("{p}\"auth\":\"Basic {}\" %41%42%43 {p}", STANDARD.encode("svc:not-the-secret-1"), p = prose());
        for le in [true, false] {
            assert_eq!(s.find(&utf16(&prose(), le)), None);
            assert_eq!(s.find(&utf16(&other, le)), None);
        }
    }

    /// Secrets with letters beyond ASCII: as PHP's `htmlentities` and
    /// Commons Text's `escapeHtml4` write them (named references, legacy
    /// ones without `;` too), upper-cased (`É`), and in Windows-1252 (`€`
    /// 0x80, `–` 0x96, `“”` 0x93 0x94), which Latin-1 cannot write.
    #[test]
    fn a_secrets_letters_beyond_ascii_are_found_named_in_another_case_and_in_cp1252() {
        let cases: [(&str, Vec<Vec<u8>>); 3] = [
            (
                "caf\u{e9}-s3cr3t-\u{fc}ber",
                vec![
                    b"caf&eacute;-s3cr3t-&uuml;ber".to_vec(),
                    b"caf&eacute-s3cr3t-&uumlber".to_vec(),
                    b"CAF&Eacute;-S3CR3T-&Uuml;BER".to_vec(),
                    "CAF\u{c9}-S3CR3T-\u{dc}BER".as_bytes().to_vec(),
                    "caf\u{e9}-s3cr3t-\u{dc}ber".as_bytes().to_vec(),
                    b"CAF\xC9-S3CR3T-\xDCBER".to_vec(),
                    b"CAF%C3%89-S3CR3T-%C3%9CBER".to_vec(),
                    b"CAF\\u00C9-S3CR3T-\\u00DCBER".to_vec(),
                ],
            ),
            (
                "pr\u{e9}\u{20ac}-k3y\u{2013}\u{201c}x\u{201d}",
                vec![
                    b"pr\xE9\x80-k3y\x96\x93x\x94".to_vec(),
                    b"PR\xC9\x80-K3Y\x96\x93X\x94".to_vec(),
                    b"pr&eacute;&euro;-k3y&ndash;&ldquo;x&rdquo;".to_vec(),
                    b"pr&eacute;&euro;-k3y&ndash;&OpenCurlyDoubleQuote;x&CloseCurlyDoubleQuote;".to_vec(),
                    "PR\u{c9}\u{20ac}-K3Y\u{2013}\u{201c}X\u{201d}".as_bytes().to_vec(),
                ],
            ),
            (
                "Stra\u{df}e-t0ken-\u{e6}\u{f8}\u{e5}",
                vec![
                    b"Stra&szlig;e-t0ken-&aelig;&oslash;&aring;".to_vec(),
                    "STRASSE-T0KEN-\u{c6}\u{d8}\u{c5}".as_bytes().to_vec(),
                    b"STRASSE-T0KEN-\xC6\xD8\xC5".to_vec(),
                    b"stra\xDFe-t0ken-\xE6\xF8\xE5".to_vec(),
                ],
            ),
        ];
        for (secret, forms) in cases {
            let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
            for form in forms {
                for (prefix, suffix) in [(&b""[..], &b""[..]), (b"<p>", b"</p>"), (b"{\"v\":\"", b"\"}")] {
                    let data = [prefix, &form, suffix].concat();
                    assert_eq!(found(&s, &data).as_deref(), Some("t"), "{secret}: {}", String::from_utf8_lossy(&data));
                }
            }
            // Other text with the same letters is not the secret.
            assert_eq!(s.find("caf&eacute; &uuml;ber &euro; &ndash; STRASSE \u{c9}".as_bytes()), None);
        }
    }

    /// A body upper-cased after it was escaped (a gateway, a logger):
    /// `\u002b` is `\U002B`, `&sol;` `&SOL;`, `\x2f` `\X2F`, inside JSON
    /// and percent-encoding too.
    #[test]
    fn escapes_upper_cased_after_they_were_written_are_decoded() {
        let s = scanner();
        let named = |v: &str| {
            v.replace('/', "&sol;")
                .replace('+', "&plus;")
                .replace('=', "&equals;")
                .replace('~', "&tilde;")
                .replace('\u{e9}', "&eacute;")
        };
        for (secret, name) in [(SECRET, "tracker"), (TOKEN, "api")] {
            for (what, escaped) in [
                (
                    "System.Text.Json",
                    secret.replace('+', "\\u002b").replace('~', "\\u007e").replace('\u{e9}', "\\u00e9"),
                ),
                ("every character \\u", json_escape_all(secret)),
                ("braced \\u", secret.chars().map(|c| format!("\\u{{{:x}}}", c as u32)).collect()),
                ("\\x", secret.bytes().map(|b| format!("\\x{b:02x}")).collect()),
                ("named references", named(secret)),
                ("a reference inside a JSON escape", named(secret).replace('&', "\\u0026")),
                ("JSON escapes percent-encoded", json_escape_all(secret).replace('\\', "%5c")),
            ] {
                for upper in [escaped.to_uppercase(), escaped.to_ascii_uppercase()] {
                    let data = format!("{{\"ECHO\":\"{upper}\"}}");
                    assert_eq!(found(&s, data.as_bytes()).as_deref(), Some(name), "{name}, {what}: {data}");
                }
            }
        }
        // Upper-cased escapes of other text hold no secret.
        let other = json_escape_all("another-value-entirely").to_uppercase() + "&SOL;&PLUS;&EQUALS;\\X2F";
        assert_eq!(s.find(other.as_bytes()), None);
    }

    /// A secret file with a UTF-8 byte order mark: the value without it is
    /// watched in every form (it is what is sent), the raw value with it too.
    #[test]
    fn a_secret_stored_with_a_byte_order_mark_is_found_without_it() {
        for stored in [format!("\u{feff}{TOKEN}"), format!("\u{feff}{TOKEN}\n"), format!("\u{feff}Bearer {TOKEN}")] {
            let s = SecretScanner::new(&[("t".into(), stored.as_bytes().to_vec())]);
            for (what, data) in [
                ("raw", TOKEN.to_owned()),
                ("Basic", format!("Basic {}", STANDARD.encode(format!("user:{TOKEN}")))),
                ("base64", STANDARD.encode(TOKEN)),
                ("hex", hex::encode(TOKEN)),
                ("percent", pct(TOKEN)),
            ] {
                let data = format!("{{\"v\":\"{data}\"}}");
                assert_eq!(found(&s, data.as_bytes()).as_deref(), Some("t"), "{stored:?}, {what}: {data}");
            }
            assert_eq!(found(&s, stored.as_bytes()).as_deref(), Some("t"), "{stored:?} as stored");
        }
    }
}

/// Escapes inside base64: what ordinary libraries write into a cursor or
/// state token, decoded and searched with every view. Only the public API,
/// so the same tests run against a scanner without the base64 view.
#[cfg(test)]
mod base64_view_tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

    /// A secret with `+` and `/`, which every URL and many JSON encoders escape.
    const KEY: &str = "Xq7+vR2pL9sK4mTz/8";
    /// One with `!'()*` too, which `encodeURIComponent` leaves as they are.
    const NODE_KEY: &str = "Xq7+vR2!pL9(sK4)mTz*8'/";

    fn scanner_for(secret: &str) -> SecretScanner {
        SecretScanner::new(&[("api".into(), secret.as_bytes().to_vec())])
    }

    /// System.Text.Json's default encoder (`JsonSerializer.SerializeToUtf8Bytes`):
    /// `+` and the HTML-sensitive characters as `\u00XX` in upper case, `/` as it is.
    fn system_text_json(s: &str) -> String {
        s.chars()
            .map(|c| match c {
                '+' | '<' | '>' | '&' | '\'' | '`' | '"' | '\\' => format!("\\u{:04X}", c as u32),
                c => c.to_string(),
            })
            .collect()
    }

    /// System.Web's `HttpUtility.UrlEncode`: lower-case `%xx`, `+` for a
    /// space, `-_.!*()` and letters and digits as they are.
    fn http_utility_url_encode(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b' ' => "+".to_owned(),
                b if b.is_ascii_alphanumeric() || b"-_.!*()".contains(&b) => (b as char).to_string(),
                b => format!("%{b:02x}"),
            })
            .collect()
    }

    /// JavaScript's `encodeURIComponent`: upper-case `%XX`; letters,
    /// digits and `-_.!~*'()` as they are.
    fn encode_uri_component(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) => (b as char).to_string(),
                b => format!("%{b:02X}"),
            })
            .collect()
    }

    /// MIME's base64 (`Base64FormattingOptions.InsertLineBreaks`, RFC 2045):
    /// 76 characters a line, CRLF between lines.
    fn mime(b64: &str) -> String {
        b64.as_bytes().chunks(76).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join("\r\n")
    }

    /// Every way the libraries write `payload` as base64: standard and
    /// URL-safe, padded and not, and MIME-wrapped.
    fn base64_forms(payload: &[u8]) -> Vec<(&'static str, String)> {
        vec![
            ("standard", STANDARD.encode(payload)),
            ("standard unpadded", STANDARD_NO_PAD.encode(payload)),
            ("url-safe padded", URL_SAFE.encode(payload)),
            ("url-safe unpadded", URL_SAFE_NO_PAD.encode(payload)),
            ("MIME, 76 columns, CRLF", mime(&STANDARD.encode(payload))),
        ]
    }

    /// The three library shapes: a state object holding the secret as each
    /// library escapes it (long enough that MIME wraps it).
    fn library_payloads() -> Vec<(&'static str, &'static str, Vec<u8>)> {
        vec![
            (
                "ASP.NET Core: System.Text.Json",
                KEY,
                format!(
                    "{{\"key\":\"{}\",\"page\":2,\"filter\":\"status eq {}open{}\",\"sort\":\"created desc\"}}",
                    system_text_json(KEY),
                    system_text_json("'"),
                    system_text_json("'")
                )
                .into_bytes(),
            ),
            (
                "System.Web: HttpUtility.UrlEncode",
                KEY,
                format!("key={}&page=2&filter=status+eq+open&sort=created+desc", http_utility_url_encode(KEY))
                    .into_bytes(),
            ),
            (
                "Node: encodeURIComponent",
                NODE_KEY,
                format!("key={}&page=2&filter=status%20eq%20open&sort=created%20desc", encode_uri_component(NODE_KEY))
                    .into_bytes(),
            ),
        ]
    }

    /// Where a token sits in a response: bare, a JSON field, a query
    /// parameter (after `=`), a header (after `: `), after a version prefix
    /// of base64 letters (a run whose start is not the encoding's).
    fn placed(token: &str) -> Vec<String> {
        vec![
            token.to_owned(),
            format!("{{\"next\":\"{token}\",\"count\":20}}"),
            format!("https://api.example/items?cursor={token}&limit=20"),
            format!("X-Continuation: {token}\r\n"),
            format!("{{\"next\":\"v2{token}\"}}"),
            format!("/items/next/{token}"),
        ]
    }

    /// Library `which` of [`library_payloads`]: its state in every base64
    /// form, wherever a response puts it.
    fn library_shape_is_found(which: usize) {
        let Some((library, secret, payload)) = library_payloads().into_iter().nth(which) else {
            panic!("no library {which}");
        };
        let s = scanner_for(secret);
        for (form, token) in base64_forms(&payload) {
            for data in placed(&token) {
                assert_eq!(
                    s.find(data.as_bytes()).map(|f| f.credential).as_deref(),
                    Some("api"),
                    "{library}, {form}: {data}"
                );
            }
        }
    }

    #[test]
    fn system_text_json_state_inside_base64_is_found() {
        library_shape_is_found(0);
    }

    #[test]
    fn http_utility_url_encoded_state_inside_base64_is_found() {
        library_shape_is_found(1);
    }

    #[test]
    fn encode_uri_component_state_inside_base64_is_found() {
        library_shape_is_found(2);
    }

    #[test]
    fn a_base64_token_escaped_again_on_its_way_out_is_found() {
        // The token itself escaped by the response: percent-encoded in a
        // link, `\u002B` inside System.Text.Json, `\/` from PHP, wrapped
        // with JSON's `\r\n`. Its `+` and `/` split the run as sent.
        let s = scanner_for(KEY);
        let mut split = 0;
        for pad in 0..3 {
            let payload =
                format!("{{\"key\":\"{}\",\"q\":\"{}~~~???~~~???\"}}", system_text_json(KEY), "a".repeat(pad));
            let token = STANDARD.encode(&payload);
            split += usize::from(token.contains('+') && token.contains('/'));
            for data in [
                format!(
                    "https://api.example/items?cursor={}",
                    token.replace('+', "%2B").replace('/', "%2F").replace('=', "%3D")
                ),
                format!("{{\"next\":\"{}\"}}", token.replace('+', "\\u002B")),
                format!("{{\"next\":\"{}\"}}", token.replace('/', "\\/")),
                format!("{{\"next\":\"{}\"}}", mime(&token).replace("\r\n", "\\r\\n")),
            ] {
                assert_eq!(s.find(data.as_bytes()).map(|f| f.credential).as_deref(), Some("api"), "{data}");
            }
        }
        assert!(split > 0, "some token holds both `+` and `/`");
    }

    #[test]
    fn escapes_inside_base64_inside_base64_are_found() {
        for (library, secret, payload) in library_payloads() {
            let s = scanner_for(secret);
            let once = STANDARD.encode(&payload);
            for (name, data) in [
                ("twice", STANDARD.encode(&once)),
                ("twice, url-safe outside", URL_SAFE_NO_PAD.encode(&once)),
                ("twice, MIME outside", mime(&STANDARD.encode(mime(&once)))),
                ("in JSON, in base64", STANDARD.encode(format!("{{\"state\":\"{once}\"}}"))),
                ("three times", STANDARD.encode(STANDARD.encode(&once))),
            ] {
                assert_eq!(s.find(data.as_bytes()).map(|f| f.credential).as_deref(), Some("api"), "{library}, {name}");
            }
        }
    }

    #[test]
    fn every_escape_the_views_undo_is_found_inside_base64() {
        let s = scanner_for(KEY);
        let every_char_u: String = KEY.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        let html: String = KEY.chars().map(|c| format!("&#x{:X};", c as u32)).collect();
        let utf16_json: Vec<u8> =
            format!("{{\"key\":\"{}\"}}", system_text_json(KEY)).encode_utf16().flat_map(|u| u.to_le_bytes()).collect();
        for (name, payload) in [
            ("JSON \\u of every character", format!("{{\"key\":\"{every_char_u}\"}}").into_bytes()),
            ("HTML references", format!("<input value=\"{html}\">").into_bytes()),
            ("percent-encoded twice", format!("k={}", http_utility_url_encode(KEY).replace('%', "%25")).into_bytes()),
            ("hex", hex::encode(KEY).into_bytes()),
            ("UTF-16 of System.Text.Json", utf16_json),
        ] {
            for (form, token) in base64_forms(&payload) {
                let data = format!("{{\"state\":\"{token}\"}}");
                assert_eq!(s.find(data.as_bytes()).map(|f| f.credential).as_deref(), Some("api"), "{name}, {form}");
            }
        }
    }

    #[test]
    fn the_secret_is_found_at_every_offset_within_the_decoded_run() {
        let s = scanner_for(KEY);
        let escaped = system_text_json(KEY);
        for before in 0..40 {
            for after in [0, 1, 2, 3, 17] {
                let payload = format!("{}{escaped}{}", "a".repeat(before), "z".repeat(after));
                for (form, token) in base64_forms(payload.as_bytes()) {
                    // And with base64 letters before it that are not its encoding.
                    for junk in ["", "A", "v2", "xyz", "next/"] {
                        let data = format!("\"{junk}{token}\"");
                        assert!(s.find(data.as_bytes()).is_some(), "{before} before, {after} after, {form}, {junk:?}");
                    }
                }
            }
        }
    }

    /// A fixed stream of pseudo-random bytes (xorshift).
    fn noise(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn ordinary_base64_without_the_secret_is_not_withheld() {
        let s = scanner_for(KEY);
        let png = [b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".as_slice(), &noise(256 << 10, 7)].concat();
        let json = format!(
            "{{\"key\":\"{}\",\"page\":2,\"note\":\"caf\\u00E9 \\u002B 50%25\"}}",
            system_text_json("Yr8+wS3qM0tL5nUa/9")
        );
        let text = "the quick brown fox jumps over the lazy dog, again and again\n".repeat(2000);
        for (name, payload) in [("a PNG", png.clone()), ("JSON", json.into_bytes()), ("text", text.into_bytes())] {
            for (form, token) in base64_forms(&payload) {
                for data in [token.clone(), format!("{{\"data\":\"{token}\"}}"), STANDARD.encode(&token)] {
                    assert_eq!(s.find(data.as_bytes()), None, "{name}, {form}");
                }
            }
        }
        // Ordinary JSON full of long identifiers, URLs and hashes.
        let github = r#"{"url":"https://api.github.com/repos/octocat/Hello-World/issues/1347","node_id":"MDU6SXNzdWUx","sha":"6dcb09b5b57875f334f61aebed695e2e4193db5e","labels_url":"https://api.github.com/repos/octocat/Hello-World/labels{/name}"}"#;
        assert_eq!(s.find(github.repeat(500).as_bytes()), None);
    }

    /// An AWS-style secret with `/`, which PHP's `json_encode` writes `\/`.
    const AWS_KEY: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    /// `b64` in lines of `width` characters, `sep` between them.
    fn wrapped(b64: &str, width: usize, sep: &str) -> String {
        b64.as_bytes().chunks(width).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join(sep)
    }

    #[test]
    fn base64_folded_or_indented_after_its_line_breaks_is_found() {
        // Base64 of PHP's JSON of the secret (`\/` for `/`: only the base64
        // view finds it), cut at every width that splits it, as a header
        // folds it (RFC 5322/7230 obs-fold: CRLF and a blank) and as a
        // YAML block scalar indents it.
        let s = scanner_for(AWS_KEY);
        let payload = format!("{{\"k\":\"{}\"}}", AWS_KEY.replace('/', "\\/"));
        let token = STANDARD.encode(&payload);
        for width in (4..token.len()).step_by(4) {
            for (shape, data) in [
                ("header folded with CRLF and a space", format!("X-State: {}\r\n", wrapped(&token, width, "\r\n "))),
                ("header folded with CRLF and a tab", format!("X-State: {}\r\n", wrapped(&token, width, "\r\n\t"))),
                ("YAML block scalar", format!("state: |\n  {}\nnext: 1\n", wrapped(&token, width, "\n  "))),
                ("YAML, nested", format!("a:\n  b: |-\n      {}\n  c: 2\n", wrapped(&token, width, "\n      "))),
                ("blanks before the break too", format!("{{\"s\": \"{}\"}}", wrapped(&token, width, " \r\n  "))),
            ] {
                assert_eq!(
                    s.find(data.as_bytes()).map(|f| f.credential).as_deref(),
                    Some("api"),
                    "{shape}, {width} columns: {data}"
                );
            }
        }
    }
}

/// The base64 view's bound and its cost: what one check decodes and
/// searches, counted.
#[cfg(test)]
mod base64_bound_tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};

    fn scanner() -> SecretScanner {
        SecretScanner::new(&[
            ("api".into(), b"Xq7+vR2pL9sK4mTz/8".to_vec()),
            ("other".into(), b"0th3r-s3cret-value".to_vec()),
        ])
    }

    /// A fixed stream of pseudo-random bytes (xorshift).
    fn noise(len: usize, mut seed: u64) -> Vec<u8> {
        (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect()
    }

    fn budget(left: usize) -> Base64Budget {
        Base64Budget { left, ..Base64Budget::for_len(0) }
    }

    /// The runs [`Base64Runs`] gives, as byte ranges.
    fn base64_runs(data: &[u8], min: usize) -> Vec<(usize, usize)> {
        Base64Runs::new(data, min).map(|r| (r.start, r.end)).collect()
    }

    #[test]
    fn a_check_that_costs_exactly_the_budget_is_decoded_and_one_byte_more_is_reported() {
        let s = scanner();
        let nested = STANDARD.encode(STANDARD.encode(STANDARD.encode(noise(3000, 1))));
        let data = format!("{{\"state\":\"{nested}\",\"n\":1}}");
        let mut all = budget(usize::MAX);
        assert_eq!(s.find_with(data.as_bytes(), &mut all), None);
        let cost = usize::MAX - all.left;
        // Three levels decoded: more than the data's own runs.
        assert!(cost > 3 * nested.len() && all.decoded <= cost, "{cost}");
        assert_eq!(s.find_with(data.as_bytes(), &mut budget(cost)), None);
        let over = s.find_with(data.as_bytes(), &mut budget(cost - 1)).expect("reported");
        assert_eq!((over.credential.as_str(), over.form, over.view), ("api, other", OVER_BOUND, "base64-decoded"));
        // A record says what happened: not that the data held a secret.
        assert_eq!(
            over.to_string(),
            "more base64 than the check decodes (it could hold the secret of credential `api, other`)"
        );
        // At the top: a check's budget is 16× the data and more.
        assert_eq!(s.find(data.as_bytes()), None);
    }

    #[test]
    fn base64_that_decodes_past_the_bound_is_withheld() {
        // `V…` decodes to `U…` at every offset, and `U…` is base64 again;
        // the `%41` makes the unescaped view's run another one.
        let data = format!("{}%41", "V".repeat(200 << 10));
        let f = scanner().find(data.as_bytes()).expect("withheld");
        assert_eq!(f.form, OVER_BOUND);
        assert!(!format!("{f:?}").contains("Xq7"));
    }

    /// What the check of `data` decoded and searched in all.
    fn work(data: &[u8]) -> (usize, usize, Option<&'static str>) {
        let mut b = Base64Budget::for_len(data.len());
        let f = scanner().find_with(data, &mut b);
        (b.decoded, b.searched, f.map(|f| f.form))
    }

    #[test]
    fn many_short_runs_or_one_huge_run_cost_work_linear_in_the_data() {
        type Hostile = fn(usize) -> Vec<u8>;
        let hostile: [(&str, Hostile); 5] = [
            // Distinct runs (a run met twice is decoded once), each as
            // short as the view decodes for these secrets (base64 of 18 bytes).
            ("many runs just long enough", |n| {
                let unit = |i: usize| STANDARD_NO_PAD.encode(format!("{i:018}"));
                (0..n / 25).flat_map(|i| unit(i).into_bytes().into_iter().chain([b' '])).collect()
            }),
            ("many runs, each base64 of base64", |n| {
                let unit = |i: usize| STANDARD.encode(STANDARD.encode(format!("{i:018}")));
                (0..n / 33).flat_map(|i| unit(i).into_bytes().into_iter().chain([b' '])).collect()
            }),
            ("one run of noise", |n| STANDARD.encode(noise(n * 3 / 4, 2)).into_bytes()),
            ("one run, base64 three deep", |n| {
                STANDARD.encode(STANDARD.encode(STANDARD.encode(noise(n * 27 / 64, 3)))).into_bytes()
            }),
            ("one run that decodes to base64 at every offset", |n| b"V".repeat(n)),
        ];
        assert_eq!(scanner().run_shortest, 24);
        for (name, make) in hostile {
            let mut last = None;
            for n in [64 << 10, 256 << 10] {
                let data = make(n);
                let (decoded, searched, form) = work(&data);
                assert!(form.is_none() || form == Some(OVER_BOUND), "{name}: {form:?}");
                let len = data.len();
                assert!(decoded >= len, "{name}: the runs are decoded ({decoded} of {len})");
                assert!(decoded <= BASE64_FACTOR * len + BASE64_SLACK, "{name}: decoded {decoded} of {len}");
                // Each byte decoded is searched at most twice (as decoded,
                // narrowed), the data itself twice.
                assert!(searched <= 2 * (len + decoded + BASE64_SLACK), "{name}: searched {searched} of {len}");
                if let Some((small, small_len)) = last {
                    // Four times the data, about four times the work.
                    assert!(searched * small_len <= 5 * small * len, "{name}: {small} → {searched}");
                }
                last = Some((searched, len));
            }
        }
    }

    /// The most the base64 view's buffers hold in one check of `s`: at
    /// each depth a window of characters, what one offset decodes it to,
    /// a batch and a piece kept and narrowed (twice: a vector grows by
    /// doubling), and the table of runs seen.
    fn held_bound(s: &SecretScanner) -> usize {
        (0..MAX_BASE64_DEPTH)
            .map(|depth| {
                let window = s.base64_window(depth).len;
                let piece = window / 4 * 3 + 2;
                window + piece + 2 * 2 * (KEPT_BATCH + 2 * piece) + SEEN_SLOTS * 8
            })
            .sum()
    }

    /// The check of `data`: what it found, and the most the view held.
    fn peak_held(s: &SecretScanner, data: &[u8]) -> (Option<&'static str>, usize) {
        let mut b = Base64Budget::for_len(data.len());
        let found = s.find_with(data, &mut b).map(|f| f.form);
        assert_eq!(b.held, 0, "every buffer counted in was counted out");
        (found, b.peak)
    }

    #[test]
    fn what_the_view_holds_is_bounded_whatever_the_runs_size() {
        let s = scanner();
        let bound = held_bound(&s);
        assert!(bound < 1 << 20, "{bound}");
        type Data = fn(usize) -> Vec<u8>;
        // Each at two sizes (KiB), the larger sixteen times the smaller.
        let cases: [(&str, [usize; 2], Data); 4] = [
            // What a 16 KiB gzip body may inflate to (4 × 4 MiB): zero bytes
            // at every offset, all form bytes, all kept.
            ("`A`s", [1 << 10, 16 << 10], |kib| b"A".repeat(kib << 10)),
            ("base64 of text three deep", [256, 4 << 10], |kib| {
                let text = "the quick brown fox jumps over the lazy dog, again and again\n";
                let text = text.repeat((kib << 10) / 150);
                STANDARD.encode(STANDARD.encode(STANDARD.encode(text))).into_bytes()
            }),
            ("base64 of noise", [256, 4 << 10], |kib| STANDARD.encode(noise((kib << 10) / 4 * 3, 11)).into_bytes()),
            // Escaped: the unescaped copy is read too, with the table of runs seen.
            ("many runs, escaped", [256, 4 << 10], |kib| {
                (0..(kib << 10) / 40).flat_map(|i| format!("{:024}\\/{i:08},", i * 7).into_bytes()).collect()
            }),
        ];
        for (name, [small, large], make) in cases {
            let (small_found, small) = peak_held(&s, &make(small));
            let (large_found, large) = peak_held(&s, &make(large));
            assert_eq!((small_found, large_found), (None, None), "{name}");
            assert!(large <= bound, "{name}: the view held {large} bytes, over {bound}");
            // Not more for sixteen times the data: O(window × depth).
            assert!(large <= small + small / 8, "{name}: {small} → {large}");
        }
    }

    #[test]
    fn a_secret_across_a_window_boundary_is_found() {
        // System.Text.Json's `\u002B` inside base64: only the view finds it.
        let s = scanner();
        let form = format!("{{\"key\":\"{}\"}}", "Xq7+vR2pL9sK4mTz/8".replace('+', "\\u002B"));
        let Window { len, overlap } = s.base64_window(0);
        // Where the first two windows end, in bytes decoded at offset 0.
        let ends = [len / 4 * 3, (2 * len - overlap) / 4 * 3];
        for end in ends {
            for before in end.saturating_sub(form.len() + 3)..=end + 3 {
                let payload = [noise(before, 9), form.clone().into_bytes(), noise(2 * len, 10)].concat();
                let data = format!("{{\"state\":\"{}\"}}", STANDARD.encode(&payload));
                assert_eq!(s.find(data.as_bytes()).map(|f| f.credential).as_deref(), Some("api"), "at {before}");
            }
        }
        // A level deeper: the token's run inside base64, cut by the outer
        // windows at every place; every character an HTML reference with
        // leading zeros, so its run is longer than the longest form (the
        // overlap has room for more).
        let escaped: String = "Xq7+vR2pL9sK4mTz/8".chars().map(|c| format!("&#x{:06x};", u32::from(c))).collect();
        let form = format!("{{\"key\":\"{escaped}\"}}");
        assert!(form.len() * 4 / 3 > s.longest());
        let inner_at = "{\"blob\":\"".len();
        let at_end = (len / 4 * 3 - inner_at) * 3 / 4;
        for before in at_end.saturating_sub(form.len() + 3)..=at_end + 3 {
            let payload = [noise(before, 12), form.clone().into_bytes(), noise(len, 13)].concat();
            let inner = format!("{{\"blob\":\"{}\"}}", STANDARD.encode(&payload));
            let data = STANDARD.encode(&inner);
            assert!(data.len() > len, "the outer run is read in windows");
            assert_eq!(s.find(data.as_bytes()).map(|f| f.credential).as_deref(), Some("api"), "inner at {before}");
        }
    }

    #[test]
    fn runs_go_on_across_blanks_around_a_line_break_and_end_at_other_blanks() {
        let runs = |data: &[u8]| -> Vec<String> {
            base64_runs(data, 4)
                .iter()
                .filter_map(|&(a, b)| data.get(a..b))
                .map(|r| String::from_utf8_lossy(r).into_owned())
                .collect()
        };
        // Folded, indented, blanks before the break, a blank line between.
        for joined in ["QUJD\r\n REVG", "QUJD\n\t\tREVG", "QUJD  \r\n  REVG", "QUJD\n\n    REVG"] {
            assert_eq!(runs(format!("k: {joined}; x").as_bytes()), [joined], "{joined:?}");
        }
        // Blanks within a line end a run: words are not joined.
        assert_eq!(runs(b"QUJD REVG\tSElK ab"), ["QUJD", "REVG", "SElK"]);
        assert_eq!(runs(b"   \n   "), Vec::<String>::new());
        // Counted in characters, blanks and breaks left out.
        let run = Base64Runs::new(b"x; QUJD\r\n  RE\n", 6).next();
        assert_eq!(run, Some(Run { start: 3, end: 14, chars: 6 }));
    }

    #[test]
    fn runs_are_found_whole_with_line_breaks_and_not_in_short_words() {
        let text = b"the quick brown fox, jumps over\r\nthe lazy dog; QUJDREVGR0hJSktM\r\nTU5PUFFS=x ab-cd_ef/gh+ij";
        let runs: Vec<&[u8]> = base64_runs(text, MIN_RUN).iter().filter_map(|&(a, b)| text.get(a..b)).collect();
        assert_eq!(runs, [&b"QUJDREVGR0hJSktM\r\nTU5PUFFS"[..], b"ab-cd_ef/gh+ij"]);
        // A run of exactly MIN_RUN characters, at the start and the end; one less is not one.
        for len in [MIN_RUN - 1, MIN_RUN] {
            let run = "A".repeat(len);
            for data in [run.clone(), format!("{run}."), format!(".{run}"), format!("..{run}\r\n")] {
                assert_eq!(base64_runs(data.as_bytes(), MIN_RUN).len(), usize::from(len == MIN_RUN), "{data:?}");
            }
        }
        let mut out = Vec::new();
        decode_run(&b"QUJDRA"[..].iter().map(|&b| BASE64_VALUE[usize::from(b)]).collect::<Vec<_>>(), &mut out);
        assert_eq!(out, b"ABCD");
    }

    #[test]
    fn a_secrets_own_bytes_beyond_ascii_are_searched_inside_base64_beside_binary() {
        // Its é as UTF-8 (serde_json leaves it), as Latin-1 and in UTF-16;
        // a secret that is not UTF-8 percent-encoded. Binary around each.
        let text = "tg/s3+cr=t Zq8v~\u{e9}";
        let binary = b"\x01\xfe\xfft0k\x80\x00\x9cSECRETbytes".to_vec();
        let s = SecretScanner::new(&[("text".into(), text.as_bytes().to_vec()), ("bin".into(), binary.clone())]);
        let latin1: Vec<u8> = text.chars().map(|c| c as u8).collect();
        let utf16: Vec<u8> = format!("k={}", serde_json::to_string(text).unwrap_or_default())
            .encode_utf16()
            .flat_map(|u| u.to_le_bytes())
            .collect();
        let percent: String = binary.iter().map(|b| format!("%{b:02x}")).collect();
        for (name, form, who) in [
            ("JSON, é raw", serde_json::to_string(text).unwrap_or_default().replace('/', "\\/").into_bytes(), "text"),
            (
                "Latin-1, percent-encoded",
                latin1.iter().map(|b| format!("%{b:02X}")).collect::<String>().into_bytes(),
                "text",
            ),
            ("UTF-16 JSON", utf16, "text"),
            ("a binary secret, percent-encoded", percent.into_bytes(), "bin"),
        ] {
            for at in [0, 1, 2, 100] {
                let payload = [noise(at, 4), form.clone(), noise(50, 5)].concat();
                let data = format!("{{\"blob\":\"{}\"}}", STANDARD.encode(&payload));
                assert_eq!(s.find(data.as_bytes()).map(|f| f.credential).as_deref(), Some(who), "{name} at {at}");
            }
        }
    }

    /// [`SecretScanner::keep_forms`] as defined: each maximal run of form
    /// bytes at least as long as the shortest needle, in order.
    fn kept_by_definition(s: &SecretScanner, piece: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for run in piece.split(|b| !s.form_bytes[usize::from(*b)]).filter(|r| r.len() >= s.needle_shortest) {
            out.extend_from_slice(run);
            out.push(s.separator);
        }
        out
    }

    proptest::proptest! {
        #[test]
        fn keeping_form_bytes_skips_only_what_cannot_hold_a_form(piece in proptest::collection::vec(proptest::sample::select(vec![b'a', b'%', 0, 0x80, 0xc3, 0xa9, 0xe9, 0xff]), 0..200)) {
            let s = SecretScanner::new(&[("t".into(), "short\u{e9}".as_bytes().to_vec()), ("u".into(), b"k3y-v4lue-0123456".to_vec())]);
            let (mut kept, mut narrowed) = (Vec::new(), Vec::new());
            s.keep_forms(&piece, &mut kept, &mut narrowed);
            proptest::prop_assert_eq!(kept, kept_by_definition(&s, &piece));
            // 0xff is in no form here: it separates.
            proptest::prop_assert_eq!(s.separator, 0xff);
        }

        #[test]
        fn base64_like_data_never_panics_and_stays_in_its_budget(data in proptest::collection::vec(proptest::sample::select(b"QUJDVz0123+/-_=\r\n%2B\\u00\"A".to_vec()), 0..600)) {
            let (decoded, _, _) = work(&data);
            proptest::prop_assert!(decoded <= BASE64_FACTOR * data.len() + BASE64_SLACK);
        }
    }
}

/// A secret stored already encoded is watched as its destination decodes
/// it, and hex is decoded like base64 and read with every view.
#[cfg(test)]
mod decoded_secret_tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};

    fn found(s: &SecretScanner, data: &[u8]) -> Option<String> {
        s.find(data).map(|f| f.credential)
    }

    fn needles(s: &SecretScanner) -> usize {
        s.exact_meta.len() + s.folded_meta.len()
    }

    fn pct(s: &str) -> String {
        s.bytes().map(|b| format!("%{b:02X}")).collect()
    }

    fn json_escape_all(s: &str) -> String {
        s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect()
    }

    /// 32 bytes of a key, with bytes whose base64 holds `+` and `/`.
    const KEY: [u8; 32] = [
        0xfb, 0xef, 0xbe, 0x3f, 0xff, 0x01, 0x9a, 0x42, 0x7c, 0x88, 0x10, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x13, 0x37,
        0xc0, 0xff, 0xee, 0x55, 0xaa, 0x21, 0x0f, 0xf0, 0x3c, 0xc3, 0x99, 0x66, 0x7e, 0xe7,
    ];

    #[test]
    fn a_basic_credentials_password_is_watched_when_stored_encoded() {
        let stored = STANDARD.encode("user:s3cr3t-t0ken-value");
        assert_eq!(stored, "dXNlcjpzM2NyM3QtdDBrZW4tdmFsdWU=");
        let s = SecretScanner::new(&[("basic".into(), stored.clone().into_bytes())]);
        let password = "s3cr3t-t0ken-value";
        for (name, echoed) in [
            ("plain", format!("{{\"user\":\"user\",\"password\":\"{password}\"}}")),
            ("JSON-escaped", format!("{{\"password\":\"{}\"}}", json_escape_all(password))),
            ("percent-encoded", format!("?password={}", pct(password))),
            ("upper-cased", password.to_uppercase()),
            ("base64 of it alone", STANDARD.encode(password)),
            ("hex of it", hex::encode(password)),
            ("the whole pair, decoded", "user:s3cr3t-t0ken-value".to_owned()),
            ("stored, with a line feed (a secret file's own)", format!("{stored}\n")),
        ] {
            assert_eq!(found(&s, echoed.as_bytes()).as_deref(), Some("basic"), "{name}: {echoed}");
        }
        // A secret file with its line feed: the trimmed value decodes.
        let s = SecretScanner::new(&[("basic".into(), format!("{stored}\n").into_bytes())]);
        assert_eq!(found(&s, password.as_bytes()).as_deref(), Some("basic"));
        // So does a stored `Basic …` (its word).
        let s = SecretScanner::new(&[("basic".into(), format!("Basic {stored}").into_bytes())]);
        assert_eq!(found(&s, password.as_bytes()).as_deref(), Some("basic"));
        // The user alone is no secret; a password under 8 bytes is not
        // watched alone (the pair still is).
        let s = SecretScanner::new(&[("basic".into(), STANDARD.encode("service-account-name:hunter2").into_bytes())]);
        assert_eq!(found(&s, b"{\"user\":\"service-account-name\"}"), None);
        assert_eq!(found(&s, b"hunter2"), None);
        assert_eq!(found(&s, b"service-account-name:hunter2").as_deref(), Some("basic"));
    }

    #[test]
    fn a_key_stored_encoded_is_found_in_another_encoding_of_its_bytes() {
        for (name, stored) in [
            ("base64, padded", STANDARD.encode(KEY)),
            ("base64, unpadded", STANDARD_NO_PAD.encode(KEY)),
            ("base64url", URL_SAFE_NO_PAD.encode(KEY)),
            ("hex", hex::encode(KEY)),
            ("hex, upper", hex::encode_upper(KEY)),
            (
                "hex with colons",
                hex::encode(KEY).as_bytes().chunks(2).map(|p| String::from_utf8_lossy(p)).collect::<Vec<_>>().join(":"),
            ),
        ] {
            let s = SecretScanner::new(&[("key".into(), stored.into_bytes())]);
            for (form, echoed) in [
                ("base64, unpadded", STANDARD_NO_PAD.encode(KEY)),
                (
                    "base64url, unpadded (a JWK's k)",
                    format!("{{\"kty\":\"oct\",\"k\":\"{}\"}}", URL_SAFE_NO_PAD.encode(KEY)),
                ),
                ("base64url, padded", URL_SAFE.encode(KEY)),
                ("base64, padded", STANDARD.encode(KEY)),
                ("base64 of it inside JSON, `\\/`-escaped", STANDARD.encode(KEY).replace('/', "\\/")),
                ("hex", hex::encode(KEY)),
                ("hex, upper", hex::encode_upper(KEY)),
                ("byte list", KEY.iter().map(u8::to_string).collect::<Vec<_>>().join(",")),
            ] {
                assert_eq!(found(&s, echoed.as_bytes()).as_deref(), Some("key"), "stored as {name}, echoed as {form}");
            }
        }
        // A UUID key read as its 16 bytes.
        let uuid = "3f2504e0-4f89-11d3-9a0c-0305e82c3301";
        let s = SecretScanner::new(&[("id".into(), uuid.as_bytes().to_vec())]);
        let bytes = hex::decode(uuid.replace('-', "")).unwrap();
        assert_eq!(found(&s, STANDARD.encode(&bytes).as_bytes()).as_deref(), Some("id"));
    }

    /// An ordinary token, that no strict decoder reads as base64 or hex,
    /// gets no more needles than it had; one that decodes gets its bytes'.
    #[test]
    fn an_ordinary_token_gets_no_more_needles() {
        let plain = |stored: &[u8]| {
            let (mut exact, mut folded) = (Needles::default(), Needles::default());
            add_needles(stored, 0, &mut exact, &mut folded);
            exact.patterns.len() + folded.patterns.len()
        };
        for token in [
            &b"tok-abcdef0123456789x"[..],
            b"sk_live_51HqLyjWDarjtT1zdp7dc",
            b"xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx",
            b"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            b"Xq7+vR2pL9sK4mTz/8",
            b"0th3r-s3cret-value",
            b"s3cr3t-t0ken-value",
        ] {
            assert!(decoded_values(token).is_empty(), "{}", String::from_utf8_lossy(token));
            let s = SecretScanner::new(&[("t".into(), token.to_vec())]);
            assert_eq!(needles(&s), plain(token), "{}", String::from_utf8_lossy(token));
        }
        let stored = STANDARD.encode(KEY);
        let s = SecretScanner::new(&[("k".into(), stored.clone().into_bytes())]);
        assert_eq!(needles(&s), plain(stored.as_bytes()) + plain(&KEY));
        // A token that a strict decoder reads as base64url by chance (40
        // characters of that alphabet) is watched as those bytes too: some
        // forty needles more, nothing found that is not its bytes.
        let token = b"ghp_16C7e42F292c6912E7710c838347Ae178B4a";
        let [bytes] = &decoded_values(token)[..] else { panic!("one value") };
        let s = SecretScanner::new(&[("t".into(), token.to_vec())]);
        assert_eq!(needles(&s), plain(token) + plain(bytes));
        assert!(plain(bytes) <= 40, "{}", plain(bytes));
        // A decoded value's forms are no longer than the value's own.
        let own = SecretScanner::new(&[("k".into(), KEY.to_vec())]).longest();
        assert!(own <= s.longest(), "{own} {}", s.longest());
    }

    /// Hex of a form only the views undo: the secret percent-encoded as
    /// the host sends a query credential, JSON-escaped, in base64 escaped.
    #[test]
    fn hex_of_an_escaped_secret_is_decoded_and_read_with_every_view() {
        let secret = "tg/s3+cr=tZq8vXy";
        let s = SecretScanner::new(&[("query".into(), secret.as_bytes().to_vec())]);
        let query = "key=tg%2Fs3%2Bcr%3DtZq8vXy";
        let escaped = format!("{{\"key\":\"{}\"}}", secret.replace('/', "\\/").replace('+', "\\u002B"));
        for (name, data) in [
            ("hex of the query", hex::encode(format!("GET /v1?{query} HTTP/1.1"))),
            ("hex of the query, upper", hex::encode_upper(query)),
            ("hex of the query, 0x", format!("0x{}", hex::encode(query))),
            ("hex of the query, \\x (bytea)", format!("{{\"raw\":\"\\\\x{}\"}}", hex::encode(query))),
            ("hex of the query, one digit off", format!("a{}", hex::encode(query))),
            ("hex of the query, wrapped (xxd -p)", {
                let h = hex::encode(format!("{query}&page=2&more={}", "x".repeat(40)));
                h.as_bytes().chunks(60).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join("\n")
            }),
            ("hex of the JSON-escaped secret", hex::encode(&escaped)),
            ("hex of its base64, percent-encoded", hex::encode(pct(&STANDARD.encode(secret)))),
            ("base64 of hex of the query", STANDARD.encode(hex::encode(query))),
            ("hex inside a JSON field", format!("{{\"trace\":\"{}\",\"n\":1}}", hex::encode(query))),
        ] {
            let f = s.find(data.as_bytes());
            assert_eq!(f.as_ref().map(|f| f.credential.as_str()), Some("query"), "{name}: {data}");
        }
        // Hex of ordinary text and hashes is decoded and passes.
        for clean in [
            hex::encode("key=tg%2Fs3%2Bcr%3DtZq"),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
                .to_owned(),
            hex::encode("the quick brown fox jumps over the lazy dog").repeat(20),
        ] {
            assert_eq!(s.find(clean.as_bytes()), None, "{clean}");
        }
    }

    /// Hex that decodes to hex, over and over, or to what base64 reads:
    /// the hex view is charged to the base64 view's budget and bounds.
    #[test]
    fn hostile_hex_stays_in_the_budget_and_bound() {
        let s = SecretScanner::new(&[("query".into(), b"tg/s3+cr=tZq8vXy".to_vec())]);
        for (name, data) in [
            ("`41`s (`A`s)", "41".repeat(256 << 10)),
            ("hex of hex of hex", hex::encode(hex::encode(hex::encode("0123456789".repeat(20 << 10))))),
            ("hex of `A`s", hex::encode("A".repeat(256 << 10))),
        ] {
            let mut b = Base64Budget::for_len(data.len());
            let f = s.find_with(data.as_bytes(), &mut b);
            assert!(f.is_none() || f.as_ref().is_some_and(|f| f.form == OVER_BOUND), "{name}: {f:?}");
            assert!(b.decoded <= BASE64_FACTOR * data.len() + BASE64_SLACK, "{name}: {}", b.decoded);
            assert_eq!(b.held, 0, "{name}");
            assert!(b.peak < 1 << 20, "{name}: held {}", b.peak);
        }
    }

    #[test]
    fn ordinary_data_is_not_flagged_by_a_decoded_value() {
        let s = SecretScanner::new(&[
            ("basic".into(), STANDARD.encode("user:s3cr3t-t0ken-value").into_bytes()),
            ("key".into(), hex::encode(KEY).into_bytes()),
        ]);
        for clean in [
            "{\"user\":\"user\",\"authenticated\":true}",
            "s3cr3t-t0ken",
            "{\"sha\":\"da39a3ee5e6b4b0d3255bfef95601890afd80709\"}",
            "0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(found(&s, clean.as_bytes()), None, "{clean}");
        }
    }

    /// The scanner for a `Basic` pair stored as its base64.
    fn basic(pair: &str) -> SecretScanner {
        SecretScanner::new(&[("basic".into(), STANDARD.encode(pair).into_bytes())])
    }

    /// The side of a decoded `Basic` pair watched alone is the one that
    /// carries the secret: the password when it looks like one, else the
    /// key sent as the user; neither a word nor a constant is watched alone.
    #[test]
    fn a_basic_pair_is_watched_by_the_side_that_carries_the_secret() {
        for (scheme, pair, token) in [
            ("Toggl", "1971800d4d82861d8f2c1651fea4d212:api_token", "1971800d4d82861d8f2c1651fea4d212"),
            (
                "GitHub",
                "ghp_16C7e42F292c6912E7710c838347Ae178B4a:x-oauth-basic",
                "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            ),
            ("Stripe, empty password", "sk_live_51HqLyjWDarjtT1zdp7dc:", "sk_live_51HqLyjWDarjtT1zdp7dc"),
            ("Freshdesk, KEY:X", "Abc1Def2Ghi3Jkl4Mno5:X", "Abc1Def2Ghi3Jkl4Mno5"),
            ("Google registry", "oauth2accesstoken:ya29.a0AfH6SMBx3dKq9Lq", "ya29.a0AfH6SMBx3dKq9Lq"),
            ("Apple app-specific password", "me@icloud.com:abcd-efgh-ijkl-mnop", "abcd-efgh-ijkl-mnop"),
            ("Google app password", "me@gmail.com:qwrtzpmvbnkxlhsd", "qwrtzpmvbnkxlhsd"),
            ("a passphrase", "svc:correct-horse-battery-staple", "correct-horse-battery-staple"),
            ("a camel-case passphrase", "svc:CorrectHorseBatteryStaple", "CorrectHorseBatteryStaple"),
            ("upper-case letters", "me@x.com:ABCDEFGHJKLMNPQR", "ABCDEFGHJKLMNPQR"),
            (
                "Twilio: the SID beside a secret password is not watched",
                "AC0123456789abcdef0123456789abcdef:f00dbabe1234567890abcdef12345678",
                "f00dbabe1234567890abcdef12345678",
            ),
        ] {
            let s = basic(pair);
            for echoed in [
                format!("{{\"token\":\"{token}\"}}"),
                token.to_uppercase(),
                STANDARD.encode(token),
                hex::encode(token),
                format!("?key={}", pct(token)),
            ] {
                assert_eq!(found(&s, echoed.as_bytes()).as_deref(), Some("basic"), "{scheme}: {echoed}");
            }
            let other = pair.split_once(':').map(|(u, p)| if p == token { u } else { p }).unwrap_or_default();
            for clean in [
                format!("{{\"{other}\":\"x\",\"api_token\":null,\"password\":\"\"}}"),
                other.to_uppercase(),
                "x-oauth-basic api_token PASSWORD".to_owned(),
            ] {
                assert_eq!(found(&s, clean.as_bytes()), None, "{scheme}: {clean}");
            }
        }
        // Weak or word passwords, names and ids: the pair alone is watched.
        for pair in [
            "admin:password",
            "root:changeme",
            "user:12345678",
            "deploy01:Password",
            "jdoe42@example.com:changeme",
            "service-account-name:x-oauth-basic",
            "api_token:api_token",
        ] {
            let s = basic(pair);
            assert_eq!(decoded_values(STANDARD.encode(pair).as_bytes()), [pair.as_bytes()], "{pair}");
            let (user, password) = pair.split_once(':').unwrap_or_default();
            for clean in [
                format!("{{\"user\":\"{user}\",\"password\":\"{password}\"}}"),
                format!("{{\"api_token\":\"{}\"}}", password.to_uppercase()),
                "Password: PASSWORD password api_token".to_owned(),
            ] {
                assert_eq!(found(&s, clean.as_bytes()), None, "{pair}: {clean}");
            }
            assert_eq!(found(&s, pair.as_bytes()).as_deref(), Some("basic"), "{pair}");
        }
    }

    #[test]
    fn a_side_looks_like_a_secret_by_its_shape_not_as_a_word() {
        for secret in [
            "s3cr3t-t0ken-value",
            "1971800d4d82861d8f2c1651fea4d212",
            "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            "sk_live_51HqLyjWDarjtT1zdp7dc",
            "Abc1Def2Ghi3Jkl4Mno5",
            "Tr0ub4dor&3",
            "correct-Horse9",
            "XqvRpLsKmTzWbNdQ",
        ] {
            assert!(looks_like_a_secret(secret, MIN_SECRET), "{secret}");
        }
        for word in [
            "api_token",
            "API_TOKEN",
            "x-oauth-basic",
            "x-access-token",
            "__token__",
            "oauth2accesstoken",
            "password",
            "Password",
            "PASSWORD",
            "changeme",
            "12345678",
            "service-account-name",
            "accessToken",
            "hunter2",
            "",
            "--------",
        ] {
            assert!(!looks_like_a_secret(word, MIN_SECRET), "{word}");
        }
    }

    /// A decoded binary key's own bytes are no form bytes: the base64
    /// view keeps no more of decoded binary than for an ordinary token,
    /// also for a PEM key stored as a credential (each of its lines a word
    /// that decodes), and the work stays in the budget.
    #[test]
    fn a_decoded_binary_key_does_not_widen_the_form_bytes() {
        let ascii = SecretScanner::new(&[("t".into(), b"tok-abcdef0123456789x".to_vec())]).form_bytes;
        let der: Vec<u8> = (0u32..1200).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let lines: Vec<String> =
            STANDARD.encode(&der).as_bytes().chunks(64).map(|l| String::from_utf8_lossy(l).into_owned()).collect();
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n", lines.join("\n"));
        for (name, stored) in [
            ("hex", hex::encode(KEY)),
            ("base64", STANDARD.encode(KEY)),
            ("base64url", URL_SAFE_NO_PAD.encode(KEY)),
            ("PEM", pem.clone()),
        ] {
            let s = SecretScanner::new(&[("k".into(), stored.into_bytes())]);
            assert_eq!(s.form_bytes, ascii, "{name}");
        }
        // A text value decoded (a `Basic` pair) still marks its letters.
        let s = basic("user:p\u{e4}ssw\u{f6}rd-0123");
        assert!(s.form_bytes[0xc3] && s.form_bytes[0xe4], "the password's UTF-8 and Latin-1 bytes");
        let s = SecretScanner::new(&[("k".into(), pem.into_bytes())]);
        let plain = SecretScanner::new(&[("t".into(), lines[0].clone().into_bytes())]);
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let binary: Vec<u8> = (0..96 << 10)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 24) as u8
            })
            .collect();
        let data = STANDARD.encode(binary);
        let work = |s: &SecretScanner| {
            let mut b = Base64Budget::for_len(data.len());
            let f = s.find_with(data.as_bytes(), &mut b);
            assert!(f.is_none() || f.as_ref().is_some_and(|f| f.form == OVER_BOUND), "{f:?}");
            assert!(b.decoded <= BASE64_FACTOR * data.len() + BASE64_SLACK, "decoded {}", b.decoded);
            assert!(b.searched <= 2 * (data.len() + b.decoded + BASE64_SLACK), "searched {}", b.searched);
            b.searched
        };
        let (pem_work, plain_work) = (work(&s), work(&plain));
        assert!(
            pem_work <= plain_work + plain_work / 10,
            "a PEM key's scanner searched {pem_work}, a token's {plain_work}"
        );
    }
}

/// A secret holding escape-like bytes of its own (`%41`, `\$`, `&lt;`,
/// `=41`, `+`) under two layers of escaping: the pass that removes the
/// inner layer decodes the secret's own sequences too.
#[cfg(test)]
mod layered_escape_tests {
    use super::*;

    fn json(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for &b in s {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'"' => out.extend_from_slice(b"\\\""),
                // PHP's `json_encode`.
                b'/' => out.extend_from_slice(b"\\/"),
                0..0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
                _ => out.push(b),
            }
        }
        out
    }

    fn html(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for &b in s {
            match b {
                b'&' => out.extend_from_slice(b"&amp;"),
                b'<' => out.extend_from_slice(b"&lt;"),
                b'>' => out.extend_from_slice(b"&gt;"),
                b'"' => out.extend_from_slice(b"&quot;"),
                b'\'' => out.extend_from_slice(b"&#039;"),
                _ => out.push(b),
            }
        }
        out
    }

    /// `encodeURIComponent`.
    fn percent(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for &b in s {
            if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
                out.push(b);
            } else {
                out.extend_from_slice(format!("%{b:02X}").as_bytes());
            }
        }
        out
    }

    /// `application/x-www-form-urlencoded`.
    fn form(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for &b in s {
            if b.is_ascii_alphanumeric() || b"*-._".contains(&b) {
                out.push(b);
            } else if b == b' ' {
                out.push(b'+');
            } else {
                out.extend_from_slice(format!("%{b:02X}").as_bytes());
            }
        }
        out
    }

    fn quoted_printable(s: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for &b in s {
            if b == b'=' || !(b' '..=b'~').contains(&b) {
                out.extend_from_slice(format!("={b:02X}").as_bytes());
            } else {
                out.push(b);
            }
        }
        out
    }

    type Encoder = (&'static str, fn(&[u8]) -> Vec<u8>);

    const ENCODERS: [Encoder; 5] =
        [("JSON", json), ("HTML", html), ("percent", percent), ("form", form), ("quoted-printable", quoted_printable)];

    /// Secrets holding each escape-like sequence the views decode.
    const SECRETS: &[&str] = &[
        "ab/cd%41ef1234",
        "Ld8%e3Qx\\w9Rv2Tn",
        "Pa\\$sw0rd<Q7x!Zk",
        "Qx7\\/Rv2Tn9Wm",
        "Qx7\\nRv2Tn9Wm",
        "Qx7\\u0041Rv2Tn9",
        "Qx7\\x41Rv2Tn9",
        "Qx7\\101Rv2Tn9",
        "Qx7&lt;Rv2Tn9Wm",
        "Qx7&#65;Rv2Tn9Wm",
        "Qx7&#x41;Rv2Tn9",
        "Qx7&ampRv2Tn9Wm",
        "Qx7=41Rv2Tn9Wm",
        "Qx7=3DRv2Tn9Wm",
        "Qx7%2541Rv2Tn9",
        "Qx7%u0041Rv2Tn9",
        "Qx7+Rv2 Tn9Wm5",
        "Qx7+Rv2%41Tn9Wm",
        "a%41b\\$c&lt;d=41e+f9",
    ];

    #[test]
    fn the_three_traced_inputs_are_found() {
        for (secret, data) in [
            ("ab/cd%41ef1234", "ab%5C%2Fcd%2541ef1234"),
            ("Ld8%e3Qx\\w9Rv2Tn", "Ld8%25e3Qx%5C%5Cw9Rv2Tn"),
            ("Pa\\$sw0rd<Q7x!Zk", "Pa%5C%24sw0rd%26lt%3BQ7x%21Zk"),
        ] {
            let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
            assert!(s.find(format!("{{\"v\":\"{data}\"}}").as_bytes()).is_some(), "{secret} as {data}");
        }
    }

    #[test]
    fn a_secret_with_escapes_of_its_own_is_found_under_any_two_layers() {
        let mut missed = Vec::new();
        for secret in SECRETS {
            let s = SecretScanner::new(&[("t".into(), secret.as_bytes().to_vec())]);
            for (inner_name, inner) in ENCODERS {
                for (outer_name, outer) in ENCODERS {
                    if inner_name == outer_name {
                        continue;
                    }
                    let data = outer(&inner(secret.as_bytes()));
                    let wrapped = [&b"{\"v\":\""[..], &data, b"\"}"].concat();
                    if s.find(&wrapped).is_none() {
                        missed.push(format!(
                            "{secret} {inner_name} then {outer_name}: {}",
                            String::from_utf8_lossy(&data)
                        ));
                    }
                }
            }
        }
        assert!(missed.is_empty(), "{} missed:\n{}", missed.len(), missed.join("\n"));
    }

    /// Pieces of secrets: plain ones, and escape-like sequences of every
    /// kind the views undo, and the characters the encoders escape.
    const PIECES: [&str; 20] = [
        "Qx7", "Rv2T", "n9Wm", "%41", "%e3", "%u0041", "\\$", "\\w", "\\/", "\\u0041", "&lt;", "&#65;", "&amp", "=41",
        "+", " ", "<", "/", "\"", "\u{e9}",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn any_secret_with_escapes_of_its_own_is_found_under_two_layers(
            pieces in proptest::collection::vec(0..PIECES.len(), 2..7),
            inner in 0..ENCODERS.len(),
            outer in 0..ENCODERS.len(),
        ) {
            let secret: String = ["Zk8", &pieces.iter().map(|&p| PIECES[p]).collect::<String>(), "Tn5"].concat();
            let s = SecretScanner::new(&[("t".into(), secret.clone().into_bytes())]);
            let data = ENCODERS[outer].1(&ENCODERS[inner].1(secret.as_bytes()));
            proptest::prop_assert!(
                s.find(&[&b"{\"v\":\""[..], &data, b"\"}"].concat()).is_some(),
                "{secret:?} {} then {}: {}", ENCODERS[inner].0, ENCODERS[outer].0, String::from_utf8_lossy(&data)
            );
        }
    }
}
