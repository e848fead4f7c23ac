//! Destination: what an outbound HTTP grant names, and matching it exactly.
//!
//! Owns parsing `scheme://host:port` (with the explicit `*.example.com` host
//! form and, in a Tool's declaration only, a `*` port) and deciding whether a
//! request URL or another pattern falls under it. Matching is exact: scheme,
//! host (case-insensitive) and port must all agree; `*.example.com` matches
//! any name ending in `.example.com` and never `example.com` itself.
//!
//! Architecture invariant: no DNS, no IO — names are compared as written, so a
//! grant means the same thing wherever the host runs.

use std::fmt;

/// A parsed destination pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Destination {
    scheme: String,
    host: HostPattern,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum HostPattern {
    Exact(String),
    /// `*.suffix`: stores `.suffix`.
    Subdomains(String),
}

/// Why a destination does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("destination `{input}`: {problem}; write scheme://host:port, e.g. https://api.example.com:443")]
pub struct DestinationError {
    input: String,
    problem: String,
}

/// `input` as an error quotes it: without a user part, path, query or
/// fragment — where a pasted URL carries a secret
/// (`https://x-access-token:ghp_…@api.github.com`, `…?api_key=…`).
pub fn redacted(input: &str) -> String {
    let (scheme, rest) = input.split_once("://").map_or(("", input), |(s, r)| (s, r));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (user, host) = match authority.rsplit_once('@') {
        Some((_, host)) => ("…@", host),
        None => ("", authority),
    };
    let cut = if authority.len() < rest.len() { "/…" } else { "" };
    let scheme = if input.contains("://") { format!("{scheme}://") } else { String::new() };
    format!("{scheme}{user}{host}{cut}")
}

impl Destination {
    /// Parse a grant (`port_wildcard = false`) or a declaration (`true`).
    pub fn parse(input: &str, port_wildcard: bool) -> Result<Self, DestinationError> {
        let err = |problem: &str| DestinationError { input: redacted(input), problem: problem.to_owned() };
        let (scheme, rest) = input.split_once("://").ok_or_else(|| err("missing scheme"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(err("only http and https are supported"));
        }
        if rest.contains(['/', '?', '#', '@']) {
            return Err(err("a destination has no path, query, fragment or user"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || rest.starts_with('[') => (h, Some(p)),
            _ => (rest, None),
        };
        let port = match port {
            None => Some(default_port(&scheme)),
            Some("*") if port_wildcard => None,
            Some("*") => return Err(err("a grant names an exact port, not `*`")),
            Some(p) => Some(p.parse::<u16>().map_err(|_| err("invalid port"))?),
        };
        let host = host.to_ascii_lowercase();
        let host = if let Some(suffix) = host.strip_prefix("*.") {
            check_host(suffix).map_err(|p| err(&p))?;
            HostPattern::Subdomains(format!(".{suffix}"))
        } else {
            check_host(&host).map_err(|p| err(&p))?;
            HostPattern::Exact(host)
        };
        Ok(Destination { scheme, host, port })
    }

    /// Whether a concrete request to `scheme://host:port` falls under this pattern.
    pub fn matches(&self, scheme: &str, host: &str, port: u16) -> bool {
        if !self.scheme.eq_ignore_ascii_case(scheme) || self.port.is_some_and(|p| p != port) {
            return false;
        }
        let host = host.to_ascii_lowercase();
        match &self.host {
            HostPattern::Exact(h) => *h == host,
            HostPattern::Subdomains(suffix) => host.len() > suffix.len() && host.ends_with(suffix.as_str()),
        }
    }

    /// Whether everything `other` allows, this allows too.
    pub fn covers(&self, other: &Destination) -> bool {
        if self.scheme != other.scheme {
            return false;
        }
        let port_ok = match (self.port, other.port) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let host_ok = match (&self.host, &other.host) {
            (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
            (HostPattern::Subdomains(s), HostPattern::Exact(h)) => h.len() > s.len() && h.ends_with(s.as_str()),
            (HostPattern::Subdomains(a), HostPattern::Subdomains(b)) => b.ends_with(a.as_str()),
            (HostPattern::Exact(_), HostPattern::Subdomains(_)) => false,
        };
        port_ok && host_ok
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.host {
            HostPattern::Exact(h) => h.clone(),
            HostPattern::Subdomains(s) => format!("*{s}"),
        };
        match self.port {
            Some(p) => write!(f, "{}://{host}:{p}", self.scheme),
            None => write!(f, "{}://{host}:*", self.scheme),
        }
    }
}

/// The port a scheme uses when a URL names none.
pub fn default_port(scheme: &str) -> u16 {
    if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 }
}

fn check_host(host: &str) -> Result<(), String> {
    let ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| !l.is_empty() && l.len() <= 63)
        && host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    let bracketed_v6 =
        host.starts_with('[') && host.ends_with(']') && host[1..host.len() - 1].parse::<std::net::Ipv6Addr>().is_ok();
    if ok || bracketed_v6 { Ok(()) } else { Err(format!("invalid host `{host}`")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Destination {
        Destination::parse(s, true).unwrap()
    }

    /// A destination written as a URL with a secret in it (a token as the
    /// user, a query key) is refused without quoting the secret; the host
    /// and what to write are named.
    #[test]
    fn a_refused_destination_is_quoted_without_its_user_path_or_query() {
        const SECRET: &str = "ghp_L1teralS3cretValue0123456789";
        for input in [
            format!("https://x-access-token:{SECRET}@api.github.com:443"),
            format!("https://api.example.com/v1?api_key={SECRET}"),
            format!("https://api.example.com:443#{SECRET}"),
            format!("https://api.example.com/s/{SECRET}/mcp"),
        ] {
            let e = Destination::parse(&input, false).unwrap_err().to_string();
            assert!(!e.contains(SECRET) && e.contains("api."), "{e}");
        }
        let e = Destination::parse("ftp://files.example.com:21", false).unwrap_err().to_string();
        assert!(e.contains("ftp://files.example.com:21"), "an ordinary one is quoted whole: {e}");
    }

    #[test]
    fn matching_is_exact_in_scheme_host_and_port() {
        let g = d("https://api.example.com:443");
        let table = [
            ("https", "api.example.com", 443, true),
            ("https", "API.Example.COM", 443, true),
            ("http", "api.example.com", 443, false),
            ("https", "api.example.com", 8443, false),
            ("https", "api.example.com.evil.net", 443, false),
            ("https", "evil-api.example.com", 443, false),
            ("https", "example.com", 443, false),
        ];
        for (scheme, host, port, want) in table {
            assert_eq!(g.matches(scheme, host, port), want, "{scheme}://{host}:{port}");
        }
    }

    #[test]
    fn wildcard_hosts_match_subdomains_only_as_written() {
        let g = d("https://*.example.com:443");
        assert!(g.matches("https", "a.example.com", 443));
        assert!(g.matches("https", "a.b.example.com", 443));
        assert!(!g.matches("https", "example.com", 443), "the apex is not a subdomain");
        assert!(!g.matches("https", "badexample.com", 443));
        assert!(!g.matches("https", "a.example.com.evil.net", 443));
    }

    #[test]
    fn default_ports_and_declaration_port_wildcards() {
        assert!(d("https://h.example").matches("https", "h.example", 443));
        assert!(d("http://h.example").matches("http", "h.example", 80));
        assert!(d("http://127.0.0.1:*").matches("http", "127.0.0.1", 5555));
        assert!(Destination::parse("http://127.0.0.1:*", false).is_err(), "grants name exact ports");
    }

    #[test]
    fn covers_is_pattern_containment() {
        assert!(d("http://127.0.0.1:*").covers(&d("http://127.0.0.1:8080")));
        assert!(!d("http://127.0.0.1:8080").covers(&d("http://127.0.0.1:*")));
        assert!(d("https://*.example.com").covers(&d("https://a.example.com")));
        assert!(d("https://*.example.com").covers(&d("https://*.a.example.com")));
        assert!(!d("https://*.example.com").covers(&d("https://example.com")));
        assert!(!d("https://a.example.com").covers(&d("https://*.example.com")));
        assert!(!d("http://a.example.com").covers(&d("https://a.example.com")));
    }

    #[test]
    fn malformed_destinations_are_refused_with_the_input_named() {
        for bad in ["api.example.com", "ftp://x:21", "https://x:99999", "https://", "https://a..b"] {
            let e = Destination::parse(bad, true).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
        // A path or user part is named as cut (it may hold a secret).
        for (bad, shown) in [("https://x/path", "https://x/…"), ("https://u@x", "https://…@x")] {
            let e = Destination::parse(bad, true).unwrap_err().to_string();
            assert!(e.contains(shown) && !e.contains(bad), "{e}");
        }
    }
}
