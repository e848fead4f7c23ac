//! Authority only narrows: the two-valued `ToolCapabilityNarrowing` and concrete
//! capability sets (directories, HTTP hosts, credential names) that combine by
//! intersection.
//!
//! This module owns the algebra: merging narrowings and intersecting / comparing
//! capability sets. It never adds authority — every operation returns something at
//! most as wide as each input — and it never touches the filesystem, the network or
//! a credential's value (credentials here are names, i.e. references).
//!
//! Directory keys are guest paths compared as exact strings: `/data` and `/data/sub`
//! are different keys, so intersecting them yields nothing rather than guessing at a
//! containment relation. Callers normalize paths before building a set.

use std::collections::{BTreeMap, BTreeSet};

/// Whether a Tool keeps the authority the host configured or loses all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolCapabilityNarrowing {
    /// Keep the capabilities the host configured (never more).
    Configured,
    /// Remove every capability.
    DenyAll,
}

impl ToolCapabilityNarrowing {
    /// `Configured` only when both are `Configured`; `DenyAll` absorbs.
    #[must_use]
    pub fn merge(self, other: Self) -> Self {
        match (self, other) {
            (Self::Configured, Self::Configured) => Self::Configured,
            _ => Self::DenyAll,
        }
    }

    /// Merge every input; an empty input is `Configured` (the identity of `merge`).
    #[must_use]
    pub fn merge_all(iter: impl IntoIterator<Item = Self>) -> Self {
        iter.into_iter().fold(Self::Configured, Self::merge)
    }
}

/// Access to one directory. `ReadWrite` includes `Read` (`Read < ReadWrite`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Read only.
    Read,
    /// Read and write.
    ReadWrite,
}

impl Access {
    /// The lesser of the two: what both grant.
    #[must_use]
    pub fn meet(self, other: Access) -> Access {
        self.min(other)
    }
}

/// Concrete authority: directories (guest path → access), HTTP destinations,
/// credential names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapabilitySet {
    /// Preopened directories: guest path → access.
    pub directories: BTreeMap<String, Access>,
    /// HTTP destinations the guest may reach.
    pub hosts: BTreeSet<String>,
    /// Credential references (names, never values) the host may attach.
    pub credentials: BTreeSet<String>,
}

impl CapabilitySet {
    /// What both grant: directories present in both with the lesser access; the
    /// intersection of hosts and of credentials.
    #[must_use]
    pub fn intersect(&self, other: &CapabilitySet) -> CapabilitySet {
        let directories = self
            .directories
            .iter()
            .filter_map(|(path, &access)| {
                other.directories.get(path).map(|&theirs| (path.clone(), access.meet(theirs)))
            })
            .collect();
        CapabilitySet {
            directories,
            hosts: self.hosts.intersection(&other.hosts).cloned().collect(),
            credentials: self.credentials.intersection(&other.credentials).cloned().collect(),
        }
    }

    /// True when `other` grants everything `self` does: each directory present in
    /// `other` with at least the same access, and hosts and credentials subsets.
    #[must_use]
    pub fn is_subset_of(&self, other: &CapabilitySet) -> bool {
        self.directories
            .iter()
            .all(|(path, &access)| other.directories.get(path).is_some_and(|&theirs| theirs >= access))
            && self.hosts.is_subset(&other.hosts)
            && self.credentials.is_subset(&other.credentials)
    }

    /// True when the set grants nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.directories.is_empty() && self.hosts.is_empty() && self.credentials.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use Access::{Read, ReadWrite};
    use ToolCapabilityNarrowing::{Configured, DenyAll};

    fn narrowing() -> impl Strategy<Value = ToolCapabilityNarrowing> {
        prop_oneof![Just(Configured), Just(DenyAll)]
    }

    fn access() -> impl Strategy<Value = Access> {
        prop_oneof![Just(Read), Just(ReadWrite)]
    }

    /// Small alphabets so that generated sets overlap often.
    fn capability_set() -> impl Strategy<Value = CapabilitySet> {
        (
            prop::collection::btree_map("/(a|b|c|d)", access(), 0..4),
            prop::collection::btree_set("(h1|h2|h3|h4)\\.example", 0..4),
            prop::collection::btree_set("cred-(a|b|c|d)", 0..4),
        )
            .prop_map(|(directories, hosts, credentials)| CapabilitySet { directories, hosts, credentials })
    }

    fn set(dirs: &[(&str, Access)], hosts: &[&str], creds: &[&str]) -> CapabilitySet {
        CapabilitySet {
            directories: dirs.iter().map(|(p, a)| ((*p).to_owned(), *a)).collect(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            credentials: creds.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    #[test]
    fn merge_table() {
        let cases = [
            (Configured, Configured, Configured),
            (Configured, DenyAll, DenyAll),
            (DenyAll, Configured, DenyAll),
            (DenyAll, DenyAll, DenyAll),
        ];
        for (a, b, want) in cases {
            assert_eq!(a.merge(b), want, "{a:?}.merge({b:?})");
        }
    }

    #[test]
    fn merge_all_empty_is_configured() {
        assert_eq!(ToolCapabilityNarrowing::merge_all([]), Configured);
        assert_eq!(ToolCapabilityNarrowing::merge_all([Configured, Configured]), Configured);
        assert_eq!(ToolCapabilityNarrowing::merge_all([Configured, DenyAll, Configured]), DenyAll);
    }

    #[test]
    fn narrowing_serde_is_kebab_case() {
        assert_eq!(serde_json::to_string(&DenyAll).ok().as_deref(), Some("\"deny-all\""));
        assert_eq!(serde_json::from_str::<ToolCapabilityNarrowing>("\"configured\"").ok(), Some(Configured));
        assert!(serde_json::from_str::<ToolCapabilityNarrowing>("\"allow-all\"").is_err());
    }

    #[test]
    fn access_meet_and_order() {
        assert_eq!(Read.meet(ReadWrite), Read);
        assert_eq!(ReadWrite.meet(Read), Read);
        assert_eq!(ReadWrite.meet(ReadWrite), ReadWrite);
        assert!(Read < ReadWrite);
    }

    #[test]
    fn intersect_example() {
        let host = set(
            &[("/data", ReadWrite), ("/logs", Read), ("/tmp", ReadWrite)],
            &["api.github.com", "example.org"],
            &["github-token", "openai"],
        );
        let plugin = set(
            &[("/data", Read), ("/logs", ReadWrite), ("/home", ReadWrite)],
            &["api.github.com", "evil.example"],
            &["github-token", "aws"],
        );
        let want = set(&[("/data", Read), ("/logs", Read)], &["api.github.com"], &["github-token"]);
        assert_eq!(host.intersect(&plugin), want);
        assert!(want.is_subset_of(&host) && want.is_subset_of(&plugin));
        assert!(!plugin.is_subset_of(&host));
    }

    #[test]
    fn nested_directories_are_distinct_keys() {
        let a = set(&[("/data", ReadWrite)], &[], &[]);
        let b = set(&[("/data/sub", ReadWrite)], &[], &[]);
        assert!(a.intersect(&b).is_empty());
        assert!(!b.is_subset_of(&a));
    }

    #[test]
    fn subset_checks_access_level() {
        let read = set(&[("/d", Read)], &[], &[]);
        let write = set(&[("/d", ReadWrite)], &[], &[]);
        assert!(read.is_subset_of(&write));
        assert!(!write.is_subset_of(&read));
        assert!(CapabilitySet::default().is_subset_of(&read));
        assert!(CapabilitySet::default().is_empty());
        assert!(!read.is_empty());
        assert!(!set(&[], &["h"], &[]).is_empty());
        assert!(!set(&[], &[], &["c"]).is_empty());
    }

    proptest! {
        #[test]
        fn merge_commutative(a in narrowing(), b in narrowing()) {
            prop_assert_eq!(a.merge(b), b.merge(a));
        }

        #[test]
        fn merge_associative(a in narrowing(), b in narrowing(), c in narrowing()) {
            prop_assert_eq!(a.merge(b).merge(c), a.merge(b.merge(c)));
        }

        #[test]
        fn deny_all_absorbs_and_configured_is_identity(a in narrowing()) {
            prop_assert_eq!(a.merge(DenyAll), DenyAll);
            prop_assert_eq!(DenyAll.merge(a), DenyAll);
            prop_assert_eq!(a.merge(Configured), a);
            prop_assert_eq!(Configured.merge(a), a);
        }

        #[test]
        fn merge_all_is_configured_iff_all_configured(v in prop::collection::vec(narrowing(), 0..8)) {
            let want = if v.iter().all(|n| *n == Configured) { Configured } else { DenyAll };
            prop_assert_eq!(ToolCapabilityNarrowing::merge_all(v), want);
        }

        #[test]
        fn intersect_commutative(a in capability_set(), b in capability_set()) {
            prop_assert_eq!(a.intersect(&b), b.intersect(&a));
        }

        #[test]
        fn intersect_associative(a in capability_set(), b in capability_set(), c in capability_set()) {
            prop_assert_eq!(a.intersect(&b).intersect(&c), a.intersect(&b.intersect(&c)));
        }

        #[test]
        fn intersect_idempotent(a in capability_set()) {
            prop_assert_eq!(a.intersect(&a), a);
        }

        #[test]
        fn intersect_never_widens(a in capability_set(), b in capability_set()) {
            let both = a.intersect(&b);
            prop_assert!(both.is_subset_of(&a));
            prop_assert!(both.is_subset_of(&b));
        }

        #[test]
        fn intersect_with_empty_is_empty(a in capability_set()) {
            let empty = CapabilitySet::default();
            prop_assert!(a.intersect(&empty).is_empty());
            prop_assert!(empty.intersect(&a).is_empty());
        }

        #[test]
        fn subset_is_reflexive_and_matches_intersection(a in capability_set(), b in capability_set()) {
            prop_assert!(a.is_subset_of(&a));
            // a ⊆ b exactly when intersecting with b removes nothing from a.
            prop_assert_eq!(a.is_subset_of(&b), a.intersect(&b) == a);
        }
    }
}
