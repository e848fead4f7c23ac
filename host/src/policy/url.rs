//! URL-shaped values (`scheme://…`) in rules and arguments, put in one
//! standard form, so that a rule about a destination sees every spelling of
//! it and no spelling of another one.
//!
//! Owns the reading of an argument string as a URL ([`read`]), the standard
//! form of a URL literal, and of a URL glob in a rule ([`glob_variants`]). A
//! URL is compared as a URL, never as a file path: dot segments are resolved
//! inside its path only, so they can never remove the authority.
//!
//! The standard form: scheme and host in lowercase; a host's trailing dot
//! dropped; an IPv6 address in its canonical text; the scheme's default port
//! dropped (and an empty port, and a port's leading zeros); an empty path is
//! `/`; in the path, percent-encoded unreserved characters decoded, other
//! percent-encodings in uppercase hex, non-ASCII and `"<>\`{}` percent-encoded,
//! and `.` / `..` segments (also as `%2e`) resolved per RFC 3986 §5.2.4;
//! the query as written; no fragment. A fragment never leaves the client
//! (every HTTP client drops it before the request), so it is no part of any
//! reading of an argument, a rule's URL literal or a rule's URL glob. A
//! query is: a URL with one has a second reading without it
//! ([`without_query`]), the destination's path alone, which a rule that
//! names no query is compared against as well.
//!
//! A URL-shaped argument that is not in a form every common client reads
//! the same way — user information (`user@`), a host that is not a plain
//! name or address (percent-encoding, non-ASCII, a number the WHATWG parser
//! reads as IPv4 like `2130706433` or `0x7f.1`, an IPv6 literal that embeds
//! an IPv4 address like `[::ffff:169.254.169.254]`), whitespace (any
//! Unicode whitespace: Python's `str.strip` and `requests` strip NBSP or
//! U+3000 as they strip a space), control, format or default-ignorable
//! characters anywhere, a backslash before the query, `https:host` without
//! `//` — has no known destination: [`UrlReading::Unknown`]. Such a value
//! satisfies every deny or ask condition on it and no allow condition.
//! Whether a value is URL-shaped at all is judged with all of those
//! characters set aside, so `"\u{a0}http://…"` is a URL, never a path.

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

/// What an argument string is, read as a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum UrlReading<'a> {
    /// Not URL-shaped: a path or plain text.
    NotUrl,
    /// URL-shaped, but which destination a client would reach is not known.
    Unknown,
    /// Its standard form, and — when merging empty path segments before
    /// resolving dot segments gives another path (`/a//../b`) — that form
    /// too: servers differ on `//`, so both are readings of the call.
    Known(Cow<'a, str>, Option<String>),
}

/// Schemes the WHATWG URL standard treats as special: their URLs always
/// have a host, `\` is a separator, and `scheme:host` means `scheme://host`.
const SPECIAL: [&str; 6] = ["http", "https", "ws", "wss", "ftp", "file"];

/// The default port of `scheme` (lowercase), as WHATWG and the outbound
/// boundary fill it in.
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        "ftp" => Some(21),
        _ => None,
    }
}

/// A character some common parser or Tool drops from a URL before reading
/// it, beside the ASCII ones WHATWG trims or removes: Unicode whitespace
/// (`str.strip`, `requests`' `lstrip`), controls, format characters and
/// default-ignorables.
fn dropped(c: char) -> bool {
    c.is_whitespace() || crate::display::unseen(c)
}

/// Whether `s` would be read as a URL by some common client: after the
/// WHATWG clean-up (leading C0 controls and spaces trimmed, tabs and
/// newlines removed anywhere) — and with every other control and every
/// character some parser drops ([`dropped`]: NBSP, U+3000, zero-width
/// characters…) set aside, leading or anywhere — it starts with a scheme of two or more
/// characters and `:/` or `:\` — or with a special scheme and `:` and
/// anything visible (`https:host` is `https://host` to a WHATWG parser).
/// One-letter schemes are left to paths (`c:/x` is a drive).
pub(super) fn url_shaped(s: &str) -> bool {
    // The common case, a path: the first byte that cannot be in a scheme is
    // ASCII and not `:` (nor whitespace or a control, which WHATWG trims or
    // removes). A non-ASCII one may be a character some parser drops.
    let first_other = s.bytes().find(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')));
    match first_other {
        None => return false,
        Some(b) if b != b':' && b > b' ' && b != 0x7f && b.is_ascii() => return false,
        Some(_) => {}
    }
    let mut chars = s
        .chars()
        .skip_while(|&c| c <= ' ' || dropped(c))
        .filter(|&c| !c.is_ascii_control() && (c.is_ascii() || !dropped(c)));
    let mut scheme = [0u8; 5];
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() => scheme[0] = c.to_ascii_lowercase() as u8,
        _ => return false,
    }
    let mut len = 1usize;
    loop {
        match chars.next() {
            Some(':') => break,
            Some(c) if c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.') => {
                if let Some(slot) = scheme.get_mut(len) {
                    *slot = c.to_ascii_lowercase() as u8;
                }
                len += 1;
            }
            _ => return false,
        }
    }
    if len < 2 {
        return false;
    }
    let special = scheme.get(..len).is_some_and(|s| SPECIAL.iter().any(|sp| sp.as_bytes() == s));
    match chars.next() {
        Some('/' | '\\') => true,
        Some(c) => special && c > ' ',
        None => special,
    }
}

/// Read an argument string as a URL.
pub(super) fn read(s: &str) -> UrlReading<'_> {
    // The common case, a path such as `data/x.csv`, is decided on its first bytes.
    if !url_shaped(s) {
        return UrlReading::NotUrl;
    }
    match standard(s, Side::Argument) {
        Some((text, merged)) => UrlReading::Known(text, merged),
        None => UrlReading::Unknown,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// An argument: everything must be plain.
    Argument,
    /// A glob in a rule: glob characters are allowed in host, port and path.
    Glob,
}

fn valid_scheme(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

fn has_glob_meta(s: &str) -> bool {
    s.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// The standard form of an argument URL (see the module documentation) and
/// its merged-slashes reading if different; `None` when it is not plain.
fn standard(s: &str, side: Side) -> Option<(Cow<'_, str>, Option<String>)> {
    // Whitespace and controls are trimmed, removed or refused differently
    // by each parser; so are Unicode whitespace and invisible characters.
    if s.bytes().any(|b| b <= b' ' || b == 0x7f) || (!s.is_ascii() && s.chars().any(dropped)) {
        return None;
    }
    // The fragment stays in the client: `https://h/x#/../y` requests `/x`.
    let s = without_fragment(s);
    let (scheme, rest) = s.split_once("://")?;
    if !valid_scheme(scheme) {
        return None;
    }
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let (path, after) = tail.split_at(path_end);
    if authority.contains(['@', '\\']) || path.contains('\\') {
        return None;
    }
    let lower_scheme = lowercase(scheme);
    let (host, port) = split_host_port(authority)?;
    let host = standard_host(host, &lower_scheme, side)?;
    let port = standard_port(port, &lower_scheme)?;
    let (path1, path2) = standard_path(path, side);
    let unchanged = matches!(lower_scheme, Cow::Borrowed(_))
        && matches!(host, Cow::Borrowed(_))
        && matches!(port, Port::AsWritten)
        && matches!(path1, Cow::Borrowed(_));
    if unchanged {
        let merged = path2.map(|p2| {
            let prefix = scheme.len() + 3 + authority.len();
            format!("{}{p2}{after}", s.get(..prefix).unwrap_or_default())
        });
        return Some((Cow::Borrowed(s), merged));
    }
    let mut out = String::with_capacity(s.len() + 1);
    out.push_str(&lower_scheme);
    out.push_str("://");
    out.push_str(&host);
    match &port {
        Port::AsWritten => {
            if let Some(p) = authority_port(authority) {
                out.push(':');
                out.push_str(p);
            }
        }
        Port::Number(n) => {
            out.push(':');
            out.push_str(&n.to_string());
        }
        Port::Default => {}
    }
    let prefix = out.len();
    out.push_str(&path1);
    out.push_str(after);
    let merged = path2.map(|p2| {
        let mut m = String::with_capacity(out.len());
        m.push_str(out.get(..prefix).unwrap_or_default());
        m.push_str(&p2);
        m.push_str(after);
        m
    });
    Some((Cow::Owned(out), merged))
}

/// `s` up to its first `#`: what a client sends of a URL.
fn without_fragment(s: &str) -> &str {
    s.find('#').map_or(s, |i| s.get(..i).unwrap_or(s))
}

/// A standard form (or its merged reading) without its query, when it has
/// one: `https://h/admin?x` is `https://h/admin`, the path a server
/// routes. In a standard form of an argument the first `?` starts the
/// query: scheme, host and port never hold one.
pub(super) fn without_query(text: &str) -> Option<&str> {
    text.find('?').and_then(|i| text.get(..i))
}

/// Whether a rule's URL glob names a query: a `?` after its host
/// (`https://h/search?q=*`). Such a rule is not also held against the
/// query-less reading of an argument by an allow (see `Pattern::holds`).
/// In a path glob any `?` counts.
pub(super) fn glob_names_query(glob: &str) -> bool {
    if !is_url_glob(glob) {
        return glob.contains('?');
    }
    without_fragment(glob)
        .split_once("://")
        .and_then(|(_, rest)| rest.find('/').and_then(|i| rest.get(i..)))
        .is_some_and(|path| path.contains('?'))
}

fn lowercase(s: &str) -> Cow<'_, str> {
    if s.bytes().any(|b| b.is_ascii_uppercase()) { Cow::Owned(s.to_ascii_lowercase()) } else { Cow::Borrowed(s) }
}

/// Host and port text of an authority; `None` when it has no single reading.
fn split_host_port(authority: &str) -> Option<(&str, Option<&str>)> {
    if authority.starts_with('[') {
        let close = authority.find(']')?;
        let (host, after) = authority.split_at(close + 1);
        return match after.strip_prefix(':') {
            Some(port) => Some((host, Some(port))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match authority.split_once(':') {
        Some((_, port)) if port.contains(':') => None,
        Some((host, port)) => Some((host, Some(port))),
        None => Some((authority, None)),
    }
}

fn authority_port(authority: &str) -> Option<&str> {
    split_host_port(authority).and_then(|(_, p)| p)
}

/// A port as the standard form writes it.
enum Port {
    /// The text of the authority (absent, or a number in standard form).
    AsWritten,
    /// The scheme's default, or empty: not written.
    Default,
    /// A number written with leading zeros: written without.
    Number(u16),
}

fn standard_port(port: Option<&str>, scheme: &str) -> Option<Port> {
    let Some(text) = port else {
        return Some(Port::AsWritten);
    };
    if text.is_empty() {
        return Some(Port::Default);
    }
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = text.trim_start_matches('0');
    // At most five significant digits, so the parse cannot overflow.
    let n: u16 = if digits.is_empty() {
        0
    } else if digits.len() > 5 {
        return None;
    } else {
        digits.parse().ok()?
    };
    Some(if default_port(scheme) == Some(n) {
        Port::Default
    } else if digits.len() != text.len() {
        Port::Number(n)
    } else {
        Port::AsWritten
    })
}

/// The standard host: lowercase, one trailing dot dropped, an address in
/// canonical text. `None` for anything a parser could read as another host.
fn standard_host<'a>(host: &'a str, scheme: &str, side: Side) -> Option<Cow<'a, str>> {
    if let Some(inner) = host.strip_prefix('[') {
        let inner = inner.strip_suffix(']')?;
        return match inner.parse::<Ipv6Addr>() {
            // A second spelling of an IPv4 destination (a dual-stack socket
            // connects to `::ffff:a.b.c.d` over IPv4; NAT64, 6to4 and Teredo
            // gateways forward to the address inside): no rule on the IPv4
            // address would see it.
            Ok(addr) if side == Side::Argument && embeds_ipv4(addr) => None,
            Ok(addr) => {
                let canonical = format!("[{addr}]");
                Some(if canonical == host { Cow::Borrowed(host) } else { Cow::Owned(canonical) })
            }
            Err(_) if side == Side::Glob && has_glob_meta(inner) => Some(lowercase(host)),
            Err(_) => None,
        };
    }
    let trimmed = host.strip_suffix('.').unwrap_or(host);
    if trimmed.is_empty() {
        // WHATWG skips any number of slashes after a special scheme: `https:///h` is `https://h`.
        let special = SPECIAL.contains(&scheme) && scheme != "file";
        return (host.is_empty() && !special).then_some(Cow::Borrowed(host));
    }
    if side == Side::Glob && has_glob_meta(trimmed) {
        return Some(match lowercase(trimmed) {
            Cow::Borrowed(t) if t.len() == host.len() => Cow::Borrowed(host),
            lower => Cow::Owned(lower.into_owned()),
        });
    }
    if !trimmed.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return None;
    }
    if trimmed.split('.').any(str::is_empty) {
        return None;
    }
    // WHATWG reads a host whose last label is a number as IPv4, in decimal,
    // octal or hex and with fewer than four parts; only the plain dotted
    // form is read the same way everywhere.
    let last = trimmed.rsplit('.').next().unwrap_or_default();
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || last
            .strip_prefix("0x")
            .or_else(|| last.strip_prefix("0X"))
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        let addr = trimmed.parse::<Ipv4Addr>().ok()?;
        if addr.to_string() != trimmed {
            return None;
        }
    }
    Some(match lowercase(trimmed) {
        Cow::Borrowed(t) if t.len() == host.len() => Cow::Borrowed(host),
        lower => Cow::Owned(lower.into_owned()),
    })
}

/// Whether `addr` is one of the IPv6 forms that carry an IPv4 address:
/// IPv4-mapped (`::ffff:0:0/96`), IPv4-compatible (`::/96`, but `::` and
/// `::1`), SIIT's IPv4-translated (`::ffff:0:0:0/96`), NAT64 (`64:ff9b::/96`,
/// local-use `64:ff9b:1::/48`), 6to4 (`2002::/16`) and Teredo (`2001::/32`).
fn embeds_ipv4(addr: Ipv6Addr) -> bool {
    let s = addr.segments();
    (s[..5] == [0; 5] && (s[5] == 0xffff || (s[5] == 0 && !(addr.is_loopback() || addr.is_unspecified()))))
        || s[..6] == [0, 0, 0, 0, 0xffff, 0]
        || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
        || s[..3] == [0x64, 0xff9b, 1]
        || s[0] == 0x2002
        || s[..2] == [0x2001, 0]
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Whether the path text is already standard: nothing to decode, encode or resolve.
fn path_is_standard(path: &str, side: Side) -> bool {
    path.starts_with('/')
        && !path.bytes().any(|b| {
            b == b'%'
                || !b.is_ascii()
                || (side == Side::Argument && matches!(b, b'"' | b'<' | b'>' | b'`' | b'{' | b'}'))
        })
        && !path.split('/').any(|seg| seg == "." || seg == "..")
        && !(path.contains("//"))
}

/// The standard path and, when different, the reading with empty segments merged first.
fn standard_path(path: &str, side: Side) -> (Cow<'_, str>, Option<String>) {
    if path_is_standard(path, side) {
        return (Cow::Borrowed(path), None);
    }
    if path.is_empty() {
        return (Cow::Owned("/".to_owned()), None);
    }
    let mut text = String::with_capacity(path.len() + 8);
    let bytes = path.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%'
            && let (Some(h), Some(l)) =
                (bytes.get(i + 1).copied().and_then(hex_value), bytes.get(i + 2).copied().and_then(hex_value))
        {
            let decoded = h * 16 + l;
            if is_unreserved(decoded) {
                text.push(char::from(decoded));
            } else {
                text.push('%');
                text.push(char::from(HEX[usize::from(h)]));
                text.push(char::from(HEX[usize::from(l)]));
            }
            i += 3;
            continue;
        }
        let encode = !b.is_ascii() || (side == Side::Argument && matches!(b, b'"' | b'<' | b'>' | b'`' | b'{' | b'}'));
        if encode {
            text.push('%');
            text.push(char::from(HEX[usize::from(b >> 4)]));
            text.push(char::from(HEX[usize::from(b & 0xf)]));
        } else {
            text.push(char::from(b));
        }
        i += 1;
    }
    let resolved = remove_dot_segments(&text, false);
    let merged = if text.contains("//") { Some(remove_dot_segments(&text, true)) } else { None };
    let merged = merged.filter(|m| *m != resolved);
    let resolved = if resolved == path { Cow::Borrowed(path) } else { Cow::Owned(resolved) };
    (resolved, merged)
}

/// RFC 3986 §5.2.4 on an absolute path (a path of a URL with an
/// authority): `.` and `..` segments removed, never above the root; a
/// final `.` or `..` leaves a trailing `/`. With `merge`, empty segments
/// (other than a trailing one) are dropped first.
fn remove_dot_segments(path: &str, merge: bool) -> String {
    let rest = path.strip_prefix('/').unwrap_or(path);
    let segments: Vec<&str> = rest.split('/').collect();
    let last = segments.len().saturating_sub(1);
    let mut out: Vec<&str> = Vec::with_capacity(segments.len());
    for (i, seg) in segments.into_iter().enumerate() {
        match seg {
            "." | ".." => {
                if seg == ".." {
                    out.pop();
                }
                if i == last {
                    out.push("");
                }
            }
            "" if merge && i != last => {}
            _ => out.push(seg),
        }
    }
    let mut s = String::with_capacity(path.len());
    s.push('/');
    s.push_str(&out.join("/"));
    s
}

/// Why a URL in a rule cannot be used; the text completes "rule N …: ".
pub(super) type RuleUrlError = String;

/// Whether a rule's glob is about URLs: `SCHEME://…`, where the scheme may
/// itself be a glob (`*://internal.example/**`).
pub(super) fn is_url_glob(glob: &str) -> bool {
    glob.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(b, b'+' | b'-' | b'.' | b'*' | b'?' | b'[' | b']' | b'{' | b'}' | b',' | b'!' | b'^')
            })
    })
}

/// The standard form of a URL literal in a rule (`u = "https://…"`): the
/// same as an argument's. An error when it is not plain, since no argument
/// could ever equal it.
pub(super) fn literal(text: &str) -> Result<(Box<str>, Option<Box<str>>), RuleUrlError> {
    match read(text) {
        UrlReading::Known(t, merged) => Ok((t.into(), merged.map(Into::into))),
        UrlReading::NotUrl | UrlReading::Unknown => Err(format!(
            "the URL {text:?} is not in a form every client reads the same way (user information, a host that is not a plain name or address, whitespace, a backslash, a port that is not a number); write it plainly, such as \"https://api.example.com/path\""
        )),
    }
}

/// The globs a URL glob in a rule stands for, each in the standard form
/// arguments are compared in: scheme and host lowercase, the host's trailing
/// dot and the scheme's default port dropped, the path's dot segments
/// resolved, an empty path `/` (unless the authority holds `**`, which
/// crosses `/` itself). A glob port (`:*`) also stands for the default port,
/// which standard forms do not write. A trailing `/**` on a longer path also
/// matches the path itself (`https://h/admin/**` covers `https://h/admin`).
/// A fragment (`#…`) is dropped, as from arguments.
pub(super) fn glob_variants(glob: &str) -> Result<Vec<String>, RuleUrlError> {
    let Some((scheme, rest)) = glob.split_once("://") else {
        return Ok(vec![glob.to_owned()]);
    };
    let rest = without_fragment(rest);
    let auth_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(auth_end);
    if authority.contains('@') {
        return Err(format!(
            "the URL glob {glob:?} holds user information (`…@`): the host refuses such URLs, and an argument with `@` in its authority matches every deny and ask rule and no allow; write the URL without it"
        ));
    }
    let scheme = scheme.to_ascii_lowercase();
    let (host, port) = split_host_port(authority).ok_or_else(|| {
        format!(
            "the authority {authority:?} of the URL glob {glob:?} has no single reading; write `host` or `host:port`"
        )
    })?;
    let host = standard_host(host, &scheme, Side::Glob).ok_or_else(|| {
        format!(
            "the host {host:?} of the URL glob {glob:?} is not a plain name or address (letters, digits, `-`, `_`, `.`, an IPv4 address in dotted decimal, or [IPv6]), so no argument could match it"
        )
    })?;
    let ports: Vec<Option<String>> = match port {
        None | Some("") => vec![None],
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => match standard_port(Some(p), &scheme) {
            Some(Port::Default) => vec![None],
            Some(Port::Number(n)) => vec![Some(n.to_string())],
            Some(Port::AsWritten) => vec![Some(p.to_owned())],
            None => return Err(format!("the port {p:?} of the URL glob {glob:?} is not a port number (0 to 65535)")),
        },
        Some(p) if has_glob_meta(p) => vec![Some(p.to_owned()), None],
        Some(p) => {
            return Err(format!("the port {p:?} of the URL glob {glob:?} is not a number or a glob such as `*`"));
        }
    };
    let path: String = if path.is_empty() {
        if authority.contains("**") { String::new() } else { "/".to_owned() }
    } else {
        standard_path(path, Side::Glob).0.into_owned()
    };
    let mut paths = vec![path.clone()];
    if let Some(base) = path.strip_suffix("/**").filter(|b| !b.is_empty()) {
        paths.push(base.to_owned());
    }
    let mut out = Vec::with_capacity(ports.len() * paths.len());
    for port in &ports {
        for path in &paths {
            let mut g = format!("{scheme}://{host}");
            if let Some(p) = port {
                g.push(':');
                g.push_str(p);
            }
            g.push_str(path);
            out.push(g);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Reading never panics, and a standard form reads as itself.
        #[test]
        fn a_standard_form_is_its_own_standard_form(
            prefix in prop_oneof![Just(""), Just("https://"), Just("HTTP://"), Just("s3://"), Just("https:"), Just(" http://")],
            rest in r"[a-zA-Z0-9.:@%/\\?#\[\]{}~ _-]{0,30}",
            unicode in r"\PC{0,8}",
            fragment in r"[a-zA-Z0-9./?#%@:\\-]{0,10}",
        ) {
            for input in [format!("{prefix}{rest}"), format!("{prefix}{rest}{unicode}"), format!("{prefix}{unicode}/{rest}")] {
                if let UrlReading::Known(text, merged) = read(&input) {
                    prop_assert!(matches!(read(&text), UrlReading::Known(ref again, _) if *again == *text), "{} -> {}", input, text);
                    if let Some(m) = &merged {
                        prop_assert!(matches!(read(m), UrlReading::Known(ref again, _) if *again == **m), "{} -> {}", input, m);
                    }
                    // A fragment is no part of any reading.
                    prop_assert!(!text.contains('#'), "{} -> {}", input, text);
                    let with = format!("{input}#{fragment}");
                    prop_assert_eq!(read(&with), UrlReading::Known(text.clone(), merged.clone()), "{}", with);
                }
                let _ = glob_variants(&input);
            }
        }
    }

    fn std_form(s: &str) -> Option<String> {
        match read(s) {
            UrlReading::Known(t, _) => Some(t.into_owned()),
            _ => None,
        }
    }

    #[test]
    fn standard_forms() {
        for (input, want) in [
            ("https://api.github.com/repos/x", "https://api.github.com/repos/x"),
            ("HTTPS://API.GitHub.COM/Repos", "https://api.github.com/Repos"),
            ("https://internal.tracker.example", "https://internal.tracker.example/"),
            ("https://internal.tracker.example:443/x", "https://internal.tracker.example/x"),
            ("https://internal.tracker.example:0443/x", "https://internal.tracker.example/x"),
            ("https://internal.tracker.example:/x", "https://internal.tracker.example/x"),
            ("http://h.example:80", "http://h.example/"),
            ("http://h.example:0080/", "http://h.example/"),
            ("http://h.example:443/", "http://h.example:443/"),
            ("https://h.example:08443/", "https://h.example:8443/"),
            ("https://internal.tracker.example./x", "https://internal.tracker.example/x"),
            ("https://internal.tracker.example/..", "https://internal.tracker.example/"),
            ("https://evil.example/..//api.github.com/x", "https://evil.example//api.github.com/x"),
            ("https://h/a/b/../c/./d", "https://h/a/c/d"),
            ("https://h/a/%2e%2E/b", "https://h/b"),
            ("https://h/%7euser/%41%2f", "https://h/~user/A%2F"),
            ("https://h/a%2fb", "https://h/a%2Fb"),
            ("https://h/é", "https://h/%C3%A9"),
            ("https://h/a{b}", "https://h/a%7Bb%7D"),
            ("https://h/x?a=/../b#/../c", "https://h/x?a=/../b"),
            ("https://h?q", "https://h/?q"),
            ("https://h#f", "https://h/"),
            ("https://h/x#/../y", "https://h/x"),
            ("https://h/x#", "https://h/x"),
            ("https://h/x?#", "https://h/x?"),
            ("https://h/x#?q", "https://h/x"),
            ("HTTPS://H/a/../b#c", "https://h/b"),
            ("http://[0:0::1]:8080/", "http://[::1]:8080/"),
            ("http://127.0.0.1:5000/x", "http://127.0.0.1:5000/x"),
            ("s3://bucket/key", "s3://bucket/key"),
            ("file:///etc/passwd", "file:///etc/passwd"),
            ("custom+x://Host:99", "custom+x://host:99/"),
        ] {
            assert_eq!(std_form(input).as_deref(), Some(want), "{input}");
        }
        assert!(matches!(read("https://api.github.com/repos/x"), UrlReading::Known(Cow::Borrowed(_), None)));
        assert!(matches!(
            read("http://127.0.0.1:5000/x?y#z"),
            UrlReading::Known(Cow::Borrowed("http://127.0.0.1:5000/x?y"), None)
        ));
    }

    /// A fragment never leaves the client, so it is in no reading of an
    /// argument, a literal or a glob; a query-less reading is the path a
    /// server routes. Fails on the previous code (the fragment was kept).
    #[test]
    fn a_fragment_is_dropped_and_a_query_has_a_reading_without_it() {
        assert_eq!(std_form("https://api.example/v1/reset#"), std_form("https://api.example/v1/reset"));
        assert!(
            matches!(read("https://h/public//../admin#x"), UrlReading::Known(a, Some(b)) if a == "https://h/public/admin" && b == "https://h/admin")
        );
        for (text, bare) in [
            ("https://h/admin?", Some("https://h/admin")),
            ("https://h/admin?x=/../y", Some("https://h/admin")),
            ("https://h/?q", Some("https://h/")),
            ("https://h:8443/a?b?c", Some("https://h:8443/a")),
            ("https://h/admin", None),
        ] {
            assert_eq!(without_query(text), bare, "{text}");
        }
        let v = |g: &str| glob_variants(g).unwrap_or_else(|e| panic!("{g}: {e}"));
        assert_eq!(v("https://h/admin/**#x"), ["https://h/admin/**", "https://h/admin"]);
        assert_eq!(v("https://h#x"), ["https://h/"]);
        assert_eq!(v("https://h/a#/../../b"), ["https://h/a"]);
        for (glob, names) in [
            ("https://h/search?q=*", true),
            ("https://h/a/**?x", true),
            ("https://h/**", false),
            ("https://h?.example/**", false),
            ("https://h/x#?", false),
            ("data/file?.csv", true),
            ("data/**", false),
        ] {
            assert_eq!(glob_names_query(glob), names, "{glob}");
        }
        assert_eq!(literal("https://h/x#frag"), Ok(("https://h/x".into(), None)));
    }

    #[test]
    fn a_path_with_doubled_slashes_has_both_readings() {
        let UrlReading::Known(a, Some(b)) = read("https://h/public//../admin") else { panic!() };
        assert_eq!((&*a, &*b), ("https://h/public/admin", "https://h/admin"));
        let UrlReading::Known(a, Some(b)) = read("https://evil.example/..//api.github.com/x") else { panic!() };
        assert_eq!((&*a, &*b), ("https://evil.example//api.github.com/x", "https://evil.example/api.github.com/x"));
        // Without dot segments, both readings agree on everything but the slashes.
        assert!(matches!(read("https://h/a//b"), UrlReading::Known(_, Some(m)) if m == "https://h/a/b"));
    }

    #[test]
    fn unplain_urls_have_no_known_destination() {
        for input in [
            "https://acme.example@internal.example/",
            "https://user:pw@internal.example/",
            "https://@internal.example/",
            "https://internal.example\\@acme.example/",
            "https://acme.example\\x/",
            "https://acme.example/a\\..\\..\\b",
            " https://internal.example/",
            "\thttps://internal.example/",
            "ht\ttps://internal.example/",
            "https://inter\nnal.example/",
            "https://internal.example /",
            "https://internal.example/a b",
            "https:internal.example/x",
            "HTTPS:\\\\internal.example",
            "https:/internal.example/x",
            "https:///internal.example/x",
            "https://%69nternal.example/",
            "https://ínternal.example/",
            "https://internal..example/",
            "https://.internal.example/",
            "https://internal.example:99999/",
            "https://internal.example:44a/",
            "https://internal.example:1:2/",
            "http://2130706433/",
            "http://127.1/",
            "http://0x7f.0.0.1/",
            "http://0177.0.0.1/",
            "http://example.123/",
            "http://[::1/",
            "http://[::1]x/",
            "http://[fe80::1%25eth0]/",
            "https://",
            "https:",
        ] {
            assert_eq!(read(input), UrlReading::Unknown, "{input:?}");
        }
    }

    /// Every character some parser or Tool drops before it reads a URL —
    /// Unicode whitespace (`requests` strips it from the front, `str.strip`
    /// from both ends), zero-width and other invisible characters —
    /// leading, inside the scheme or anywhere after it, makes a URL of
    /// unknown destination, never a path nor a reading that keeps it. Fails
    /// on the previous code (`"\u{a0}http://…"` was a path; a trailing NBSP
    /// was percent-encoded into a path no rule named).
    #[test]
    fn a_url_spelled_with_characters_some_parser_drops_has_no_known_destination() {
        let dropped = [
            '\u{a0}', '\u{85}', '\u{1680}', '\u{2000}', '\u{2007}', '\u{200a}', '\u{2028}', '\u{2029}', '\u{202f}',
            '\u{205f}', '\u{3000}', '\u{200b}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{ad}', '\u{180e}', '\u{1}',
            '\u{7f}', '\u{9f}',
        ];
        let url = "http://169.254.169.254/latest/meta-data/";
        for c in dropped {
            for input in [
                format!("{c}{url}"),
                format!("{c}{c} {url}"),
                format!("ht{c}tp://169.254.169.254/"),
                format!("http:{c}//169.254.169.254/"),
                format!("http://169.254.169.254{c}/latest/"),
                format!("{url}{c}"),
                format!("https://h/a{c}b"),
            ] {
                assert_eq!(read(&input), UrlReading::Unknown, "{input:?}");
            }
        }
        // Visible non-ASCII text stays what it was.
        assert_eq!(read("héllo: wörld"), UrlReading::NotUrl);
        assert_eq!(read("données/x.csv"), UrlReading::NotUrl);
        assert_eq!(std_form("https://h/é").as_deref(), Some("https://h/%C3%A9"));
    }

    /// An IPv6 literal that carries an IPv4 address is a second spelling of
    /// that destination: no known one. Fails on the previous code
    /// (`[::ffff:169.254.169.254]` read as its own IPv6 destination).
    #[test]
    fn an_ipv6_literal_holding_an_ipv4_address_has_no_known_destination() {
        for input in [
            "http://[::ffff:169.254.169.254]/latest/meta-data/",
            "http://[::ffff:a9fe:a9fe]/",
            "http://[0:0:0:0:0:FFFF:7F00:1]:8080/",
            "http://[::169.254.169.254]/",
            "http://[::ffff:0:a9fe:a9fe]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[64:ff9b:1::a9fe:a9fe]/",
            "http://[2002:a9fe:a9fe::1]/",
            "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
        ] {
            assert_eq!(read(input), UrlReading::Unknown, "{input:?}");
        }
        for (input, want) in [
            ("http://[::1]/", "http://[::1]/"),
            ("http://[::]/", "http://[::]/"),
            ("http://[2001:db8::1]/", "http://[2001:db8::1]/"),
            ("http://[2606:4700::1111]/", "http://[2606:4700::1111]/"),
        ] {
            assert_eq!(std_form(input).as_deref(), Some(want), "{input}");
        }
    }

    #[test]
    fn paths_and_plain_text_are_not_urls() {
        for input in
            ["data/x.csv", "/etc/passwd", "c:/windows", "c:\\x", "mailto:a@b", "key: value", "", "..", "a://h/"]
        {
            assert_eq!(read(input), UrlReading::NotUrl, "{input:?}");
        }
        // Two letters or more and `:/` is URL-shaped.
        assert_eq!(read("xy:/a"), UrlReading::Unknown);
    }

    #[test]
    fn url_globs_in_rules() {
        let v = |g: &str| glob_variants(g).unwrap_or_else(|e| panic!("{g}: {e}"));
        assert_eq!(v("https://api.github.com/**"), ["https://api.github.com/**"]);
        assert_eq!(v("HTTPS://API.GitHub.com:443/**"), ["https://api.github.com/**"]);
        assert_eq!(v("https://internal.example"), ["https://internal.example/"]);
        assert_eq!(
            v("https://internal.example./admin/**"),
            ["https://internal.example/admin/**", "https://internal.example/admin"]
        );
        assert_eq!(v("https://h/a/../b/*"), ["https://h/b/*"]);
        assert_eq!(v("https://*.example.com/**"), ["https://*.example.com/**"]);
        assert_eq!(v("https://h:*/x"), ["https://h:*/x", "https://h/x"]);
        assert_eq!(v("*://h/**"), ["*://h/**"]);
        assert_eq!(v("http://**"), ["http://**"]);
        assert_eq!(v("http://h:08080/"), ["http://h:8080/"]);
        assert!(glob_variants("https://user@h/**").is_err());
        assert!(glob_variants("https://h:99999/**").is_err());
        assert!(glob_variants("https://h:x/**").is_err());
        assert!(glob_variants("https://%69nternal/**").is_err());
        assert!(is_url_glob("https://x") && is_url_glob("*://x") && is_url_glob("{http,https}://x"));
        assert!(!is_url_glob("data/**") && !is_url_glob("a/b://c") && !is_url_glob("://x"));
    }
}
