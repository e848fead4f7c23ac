//! Scan: finding a configured secret in what comes back to a guest, in the
//! encodings servers and HTTP libraries commonly produce.
//!
//! Owns the check behind DESIGN.md invariant 13. For every secret it builds
//! needles — the raw bytes (in any ASCII letter case, for secrets of
//! [`MIN_SECRET`] bytes or more: servers normalize ids); base64 and base64url of the secret at each of
//! the three byte alignments (so a secret inside a larger value encoded
//! whole, like `user:pass` or `Bearer …`, is found; padding does not
//! matter); hex in either case — and searches them with one multi-pattern
//! automaton (aho-corasick, linear in the input) over several *views* of
//! the data: as it is, with JSON string escapes decoded (`\/`, `\uXXXX` of
//! any character, surrogate pairs), with HTML/XML character references
//! decoded (numeric and the named ones for ASCII punctuation), and
//! percent-decoded (`%XX` in either case, with and without `+` as a space).
//! A view is built only when the data holds its escape character, so plain
//! data is scanned once.
//!
//! What it cannot find is written down in SECURITY.md ("Known limits"): a
//! secret split across responses, reversed, encrypted, compressed inside a
//! field, or wrapped in two encodings beyond one decoded view plus one
//! encoded needle.
//!
//! Architecture invariant: a finding names the credential, the encoding and
//! the view — never the secret. Secrets shorter than [`MIN_SECRET`] bytes
//! cannot be told apart from ordinary text; the credentials layer refuses
//! to apply them.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use base64::Engine as _;

pub use crate::authority::credentials::MIN_SECRET;

/// Where a secret was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The credential's name.
    pub credential: String,
    /// How the secret was encoded: `raw`, `base64`, `base64url`, `hex`.
    pub form: &'static str,
    /// Which view found it: `as sent`, `JSON-unescaped`, `HTML-unescaped`,
    /// `percent-decoded`, `form-decoded`.
    pub view: &'static str,
}

/// Every configured secret, ready to be searched for.
pub struct SecretScanner {
    /// Case-sensitive needles (raw, base64 forms).
    exact: Option<AhoCorasick>,
    /// ASCII-case-insensitive needles (hex).
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

/// The base64 characters of `secret` that do not depend on the bytes around
/// it, when it starts `offset` (0, 1 or 2) bytes into a 3-byte group.
fn base64_core(secret: &[u8], offset: usize, engine: &base64::engine::GeneralPurpose) -> Option<Vec<u8>> {
    let mut padded = vec![0u8; offset];
    padded.extend_from_slice(secret);
    let encoded = engine.encode(&padded).into_bytes();
    // Character i covers bits [6i, 6i+6) of `padded`; keep those inside the secret.
    let first = (8 * offset).div_ceil(6);
    let end = (8 * (offset + secret.len())) / 6;
    (end > first + 3).then(|| encoded.get(first..end).map(<[u8]>::to_vec)).flatten()
}

impl SecretScanner {
    /// A scanner for `secrets` (credential name, secret bytes). Secrets
    /// shorter than [`MIN_SECRET`] are searched for raw only.
    pub fn new(secrets: &[(String, Vec<u8>)]) -> Self {
        let std = base64::engine::general_purpose::STANDARD_NO_PAD;
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let (mut exact, mut exact_meta, mut folded, mut folded_meta) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, (_, secret)) in secrets.iter().enumerate() {
            if secret.is_empty() {
                continue;
            }
            if secret.len() < MIN_SECRET {
                exact.push(secret.clone());
                exact_meta.push((i, "raw"));
                continue;
            }
            // In any letter case: servers normalize ids and hex keys (a
            // lowercase key or UUID echoed upper-case is the same secret).
            folded.push(secret.clone());
            folded_meta.push((i, "raw"));
            for offset in 0..3 {
                for (engine, form) in [(&std, "base64"), (&url, "base64url")] {
                    if let Some(core) = base64_core(secret, offset, engine)
                        && !exact.contains(&core)
                    {
                        exact.push(core);
                        exact_meta.push((i, form));
                    }
                }
            }
            folded.push(hex::encode(secret).into_bytes());
            folded_meta.push((i, "hex"));
        }
        let build = |patterns: &[Vec<u8>], fold: bool| {
            (!patterns.is_empty())
                .then(|| {
                    AhoCorasickBuilder::new()
                        .match_kind(MatchKind::Standard)
                        .ascii_case_insensitive(fold)
                        .build(patterns)
                        .ok()
                })
                .flatten()
        };
        SecretScanner {
            exact: build(&exact, false),
            folded: build(&folded, true),
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
        if let Some(f) = self.find_in(data, "as sent") {
            return Some(f);
        }
        if data.contains(&b'\\')
            && let Some(f) = self.find_in(&json_unescape(data), "JSON-unescaped")
        {
            return Some(f);
        }
        if data.contains(&b'&')
            && let Some(f) = self.find_in(&html_unescape(data), "HTML-unescaped")
        {
            return Some(f);
        }
        if data.contains(&b'%')
            && let Some(f) = self.find_in(&percent_decode(data, false), "percent-decoded")
        {
            return Some(f);
        }
        if data.contains(&b'+')
            && let Some(f) = self.find_in(&percent_decode(data, true), "form-decoded")
        {
            return Some(f);
        }
        None
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

/// Decode JSON string escapes wherever they appear (`\"`, `\\`, `\/`,
/// `\b\f\n\r\t`, `\uXXXX` with surrogate pairs); anything else stays as is.
fn json_unescape(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    let hex4 = |at: usize| -> Option<u32> {
        let s = std::str::from_utf8(data.get(at..at + 4)?).ok()?;
        u32::from_str_radix(s, 16).ok()
    };
    while i < data.len() {
        if data[i] != b'\\' || i + 1 >= data.len() {
            out.push(data[i]);
            i += 1;
            continue;
        }
        let simple = match data[i + 1] {
            b'"' => Some(b'"'),
            b'\\' => Some(b'\\'),
            b'/' => Some(b'/'),
            b'b' => Some(8),
            b'f' => Some(12),
            b'n' => Some(b'\n'),
            b'r' => Some(b'\r'),
            b't' => Some(b'\t'),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            i += 2;
            continue;
        }
        if data[i + 1] == b'u'
            && let Some(hi) = hex4(i + 2)
        {
            let (code, used) = if (0xD800..0xDC00).contains(&hi)
                && data.get(i + 6..i + 8) == Some(b"\\u")
                && let Some(lo) = hex4(i + 8)
                && (0xDC00..0xE000).contains(&lo)
            {
                (0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00), 12)
            } else {
                (hi, 6)
            };
            if let Some(c) = char::from_u32(code) {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                i += used;
                continue;
            }
        }
        out.push(data[i]);
        i += 1;
    }
    out
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

/// Decode character references: `&#NN;`, `&#xHH;` (the `;` optional, as
/// browsers accept) and the named ones above.
fn html_unescape(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i] != b'&' {
            out.push(data[i]);
            i += 1;
            continue;
        }
        let rest = &data[i + 1..];
        if rest.first() == Some(&b'#') {
            let (radix, start) = if matches!(rest.get(1), Some(b'x' | b'X')) { (16, 2) } else { (10, 1) };
            let digits = rest[start..]
                .iter()
                .take_while(|b| b.is_ascii_hexdigit() && (radix == 16 || b.is_ascii_digit()))
                .count();
            if digits > 0 && digits <= 8 {
                let text = std::str::from_utf8(&rest[start..start + digits]).unwrap_or("");
                if let Some(c) = u32::from_str_radix(text, radix).ok().and_then(char::from_u32) {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    let semi = usize::from(rest.get(start + digits) == Some(&b';'));
                    i += 1 + start + digits + semi;
                    continue;
                }
            }
        } else if let Some((name, b)) =
            NAMED.iter().find(|(n, _)| rest.starts_with(n.as_bytes()) && rest.get(n.len()) == Some(&b';'))
        {
            out.push(*b);
            i += 1 + name.len() + 1;
            continue;
        }
        out.push(b'&');
        i += 1;
    }
    out
}

/// Decode `%XX` (either case); with `plus`, `+` is a space too.
fn percent_decode(data: &[u8], plus: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    let val = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    while i < data.len() {
        match data[i] {
            b'%' if i + 2 < data.len() => match (val(data[i + 1]), val(data[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                }
                _ => {
                    out.push(b'%');
                    i += 1;
                }
            },
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
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
    fn decoders_never_panic_on_truncated_escapes() {
        for data in
            ["\\", "\\u", "\\u12", "\\ud800", "\\ud800\\u", "&", "&#", "&#x", "&#99999999999;", "%", "%4", "%zz", "+"]
        {
            let _ =
                (json_unescape(data.as_bytes()), html_unescape(data.as_bytes()), percent_decode(data.as_bytes(), true));
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
