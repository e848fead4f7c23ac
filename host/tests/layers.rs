//! Architecture invariant: the core's modules import each other without
//! cycles, so each can be read, tested and replaced from the bottom up
//! (ARCHITECTURE.md, "Layers"). A module is a source file; an import is a
//! `crate::…` path outside comments and test modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `src/catalog/mod.rs` → `catalog`, `src/catalog/descriptor.rs` → `catalog::descriptor`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments and without its `#[cfg(test)] mod tests`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

fn imports(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let path: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
        let segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
        // The longest prefix that names a module is the module imported.
        if let Some(m) =
            (1..=segs.len()).rev().map(|n| segs[..n].join("::")).find(|candidate| modules.contains(candidate))
        {
            out.insert(m);
        }
    }
    out
}

#[test]
fn core_modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = Vec::new();
    files(&src, &mut all);
    let modules: BTreeSet<String> = all.iter().map(|f| module_of(&src, f)).filter(|m| m != "lib").collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &all {
        let m = module_of(&src, f);
        if m == "lib" {
            continue; // the crate root re-exports; it is the top, not a layer
        }
        let mut deps = imports(&code(&std::fs::read_to_string(f).unwrap()), &modules);
        deps.remove(&m);
        graph.insert(m, deps);
    }
    assert!(graph.len() >= 15, "the walk found the core's modules: {:?}", graph.keys());
    assert!(graph["runtime"].contains("policy::gate"), "imports are read: {:?}", graph["runtime"]);

    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle in the core: {}", cycle.join(" → "));
    }
}

/// A cycle of `graph`, if it has one (depth-first search for a back edge).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == m) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(m.to_owned());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        stack.push(m.to_owned());
        for d in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(d, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(m.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_cycle_check_sees_a_planted_cycle() {
    let modules: BTreeSet<String> = ["a", "b", "b::c"].into_iter().map(String::from).collect();
    assert_eq!(imports("use crate::b::c::X;", &modules), BTreeSet::from(["b::c".to_owned()]));
    assert_eq!(code("use crate::a;\n// use crate::b;\n#[cfg(test)]\nmod tests { use crate::b; }"), "use crate::a;");
    let edges = |pairs: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in pairs {
            g.entry((*from).into()).or_default().insert((*to).into());
            g.entry((*to).into()).or_default();
        }
        g
    };
    assert_eq!(find_cycle(&edges(&[("a", "b"), ("b", "b::c")])), None);
    assert_eq!(find_cycle(&edges(&[("a", "b"), ("b", "b::c"), ("b::c", "a")])).map(|c| c.len()), Some(4));
}
