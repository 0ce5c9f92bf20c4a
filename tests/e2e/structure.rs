//! The code's structure, read from the source tree (`../` of this crate's manifest): one
//! direction of dependencies between files, the store below the engine, no long files.
//!
//! **The import graph** is drawn between the files of one crate's `src/` (`engine/src`,
//! `api/src`). A file is the module it holds: `foo.rs` or `foo/mod.rs` is `foo`, `lib.rs` the
//! crate's root. An edge goes from a file to the file of the module a path names, read from
//! `use` declarations and from paths in code:
//!
//! - a path starts at `crate`, `super` (any number), `self`, a child module of the file's
//!   module (`use change::Change` in a `mod.rs`), or a name a `use` of this file bound to a
//!   module of the crate (`use super::steps;` then `steps::of_run`); paths into other crates are
//!   not edges;
//! - the edge goes to the longest prefix of the path that is a module with a file of its own:
//!   `crate::store::steps::StepRow` is an edge to `store/steps.rs`, `super::Change` (an item of
//!   the parent) to the parent's `mod.rs`, an item of an inline module to the file holding it;
//! - importing a module by name (`use super::steps;`, `{self, …}`) is no edge by itself: the
//!   paths through it are;
//! - `mod` declarations are no edges, and neither are re-exports (`pub use`, `pub(crate) use`,
//!   …): a re-export forwards a name for others; a path through it counts for the file it
//!   names. So a `mod.rs` that re-exports its children's items and whose children use items
//!   it defines is no circle. (A file that also calls an item it re-exports, unqualified, is
//!   not seen to depend on it: give it a plain `use` too.)
//! - test code is left out: `#[cfg(test)]` items (inline test modules, and the files of
//!   `#[cfg(test)] mod x;`), files named `tests.rs` and files under a `tests/` directory.
//!
//! Comments, strings and character literals are blanked before anything is read.
//!
//! **Long files**: no `.rs` file of `engine/src`, `api/src`, `host/src`, `cli/src` or
//! `bench/src` has more than 600 lines, not counting its `#[cfg(test)]` items; test files (as
//! above) are not counted at all.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a source file may be, in lines outside its tests.
const MAX_LINES: usize = 600;

/// What the store may not import: the engine above it.
const ABOVE_THE_STORE: [&str; 4] = ["advance", "pool", "github", "triggers"];

#[test]
fn engine_files_import_each_other_in_one_direction() {
    let krate = Crate::read(&root().join("engine/src"));
    let circles = krate.circles();
    assert!(circles.is_empty(), "import circles between files of engine/src:\n{}", circles.join("\n"));
}

/// The circles of `api/src` not yet broken (#21), as the groups of files that reach each other:
/// in each, a module's `mod.rs` wires its children (routes, pages)
/// while they use items it defines. Moving those items into a file of their own breaks one.
/// The test fails on any circle outside these groups, so none can be added.
const API_CIRCLES_LEFT: [&[&str]; 2] = [
    &[
        "console/internal.rs", "console/mod.rs", "console/oauth.rs", "console/pages/act.rs", "console/pages/audit.rs",
        "console/pages/budgets.rs", "console/pages/github.rs", "console/pages/host_add.rs", "console/pages/hosts.rs",
        "console/pages/members.rs", "console/pages/mod.rs", "console/pages/run/act.rs", "console/pages/run/decide.rs",
        "console/pages/run/forecast.rs", "console/pages/run/headline.rs", "console/pages/run/mod.rs", "console/pages/run/tail.rs",
        "console/pages/runs.rs", "console/pages/today.rs", "console/pages/tokens.rs", "console/pages/webhooks.rs",
        "console/pages/workflows.rs", "console/session.rs", "console/transcript.rs", "console/view.rs",
    ],
    &[
        "http/admission.rs", "http/audit.rs", "http/auth.rs", "http/budgets.rs", "http/error.rs", "http/events.rs",
        "http/extract.rs", "http/health.rs", "http/host_protocol/claim.rs", "http/host_protocol/held.rs",
        "http/host_protocol/mod.rs", "http/hosts.rs", "http/idempotency.rs", "http/installations.rs", "http/limits.rs",
        "http/members.rs", "http/messages.rs", "http/metrics.rs", "http/mod.rs", "http/openapi.rs", "http/operator.rs",
        "http/page.rs", "http/projects.rs", "http/repositories.rs", "http/runs/act.rs", "http/runs/answers.rs",
        "http/runs/history.rs", "http/runs/mod.rs", "http/runs/read.rs", "http/tenant.rs", "http/tokens.rs",
        "http/webhooks_out.rs", "http/workflows.rs",
    ],
];

#[test]
fn api_files_import_each_other_in_one_direction() {
    let krate = Crate::read(&root().join("api/src"));
    let new: Vec<String> = krate
        .groups()
        .into_iter()
        .filter(|group| !API_CIRCLES_LEFT.iter().any(|left| group.iter().all(|f| left.contains(&f.as_str()))))
        .map(|group| group.join(", "))
        .collect();
    assert!(new.is_empty(), "import circles between files of api/src beyond those left to break:\n{}", new.join("\n"));
}

#[test]
fn the_store_imports_nothing_from_the_engine_above_it() {
    let krate = Crate::read(&root().join("engine/src"));
    let mut wrong = Vec::new();
    for (file, targets) in &krate.edges {
        if !file.starts_with("store/") {
            continue;
        }
        for target in targets {
            let module = &krate.files[target];
            if module.first().is_some_and(|m| ABOVE_THE_STORE.contains(&m.as_str())) {
                wrong.push(format!("{file} → {target}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "store/ imports from {}:\n{}",
        ABOVE_THE_STORE.join(", "),
        wrong.join("\n")
    );
}

#[test]
fn no_source_file_is_longer_than_600_lines() {
    let mut long = Vec::new();
    for dir in ["engine/src", "api/src", "host/src", "cli/src", "bench/src"] {
        let dir = root().join(dir);
        if !dir.is_dir() {
            continue;
        }
        let krate = Crate::read(&dir);
        for (file, lines) in &krate.lines {
            if *lines > MAX_LINES {
                long.push(format!("{}/{file}: {lines} lines", dir.strip_prefix(root()).unwrap_or(&dir).display()));
            }
        }
    }
    assert!(long.is_empty(), "source files over {MAX_LINES} lines outside tests:\n{}", long.join("\n"));
}

#[test]
fn the_circle_finder_finds_a_made_up_circle() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a.rs", vec!["b.rs"]),
        ("b.rs", vec!["c.rs", "d.rs"]),
        ("c.rs", vec!["a.rs"]),
        ("d.rs", vec![]),
        ("e.rs", vec!["d.rs"]),
    ]
    .into_iter()
    .map(|(f, to)| (f.to_owned(), to.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(circles(&edges), vec!["a.rs → b.rs → c.rs → a.rs".to_owned()]);
    let mut straight = edges.clone();
    straight.get_mut("c.rs").unwrap().clear();
    assert!(circles(&straight).is_empty());
}

#[test]
fn paths_become_edges_as_the_doc_says() {
    let sources = [
        ("lib.rs", "pub mod store;\npub mod advance;\nmod walk;\n"),
        (
            "store/mod.rs",
            "mod change;\npub mod runs;\npub use change::Change;\npub type Result<T> = std::result::Result<T, ()>;\n",
        ),
        ("store/change.rs", "use super::Result;\nfn f() { let _ = super::runs::COLUMNS; }\n"),
        (
            "store/runs.rs",
            "use super::{Change, Result};\n// crate::advance::x\nconst S: &str = \"crate::advance::y\";\npub const COLUMNS: &str = \"\";\n",
        ),
        (
            "advance.rs",
            "use crate::store::{self, runs};\nfn f() { runs::go(); store::Change::new(); }\n#[cfg(test)]\nmod tests { use crate::walk::x; }\n",
        ),
        ("walk.rs", "pub fn walk() {}\n#[cfg(test)]\nmod tests;\n"),
        ("walk/tests.rs", "use crate::advance::f;\n"),
    ];
    let krate = Crate::from_sources(sources.iter().map(|(f, s)| ((*f).to_owned(), (*s).to_owned())));
    let edges = |f: &str| krate.edges[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges("store/mod.rs"), Vec::<String>::new());
    assert_eq!(edges("store/change.rs"), vec!["store/mod.rs", "store/runs.rs"]);
    assert_eq!(edges("store/runs.rs"), vec!["store/mod.rs"]);
    assert_eq!(edges("advance.rs"), vec!["store/mod.rs", "store/runs.rs"]);
    assert_eq!(edges("walk.rs"), Vec::<String>::new());
    assert!(!krate.edges.contains_key("walk/tests.rs"));
    assert!(krate.circles().is_empty());
}

/// The workspace's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// One crate's files: their modules, their import edges, and their length outside tests.
struct Crate {
    /// File (relative to `src/`) → module path.
    files: BTreeMap<String, Vec<String>>,
    edges: BTreeMap<String, BTreeSet<String>>,
    lines: BTreeMap<String, usize>,
}

impl Crate {
    fn read(src: &Path) -> Crate {
        let mut sources = Vec::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let name = path.strip_prefix(src).expect("under src").to_string_lossy().replace('\\', "/");
                    sources.push((name, std::fs::read_to_string(&path).expect("a source file")));
                }
            }
        }
        Crate::from_sources(sources)
    }

    fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> Crate {
        let mut cleaned = BTreeMap::new();
        let mut test_only = BTreeSet::new();
        let mut lines = BTreeMap::new();
        for (file, text) in sources {
            let module = module_of(&file);
            let (code, test_mods, test_lines) = without_tests(&blank(&text));
            for m in test_mods {
                let mut child = module.clone();
                child.push(m);
                test_only.insert(child);
            }
            lines.insert(file.clone(), text.lines().count().saturating_sub(test_lines));
            cleaned.insert(file, (module, code, text));
        }
        // Test files: by name, by place, or declared `#[cfg(test)] mod x;` (and what is under them).
        let is_test = |file: &str, module: &[String]| {
            file == "tests.rs"
                || file.ends_with("/tests.rs")
                || file.starts_with("tests/")
                || file.contains("/tests/")
                || test_only.iter().any(|t| module.starts_with(t))
        };
        let mut files = BTreeMap::new();
        let mut codes = BTreeMap::new();
        for (file, (module, code, _)) in cleaned {
            if is_test(&file, &module) {
                lines.remove(&file);
                continue;
            }
            files.insert(file.clone(), module);
            codes.insert(file, code);
        }
        let by_module: BTreeMap<Vec<String>, String> = files.iter().map(|(f, m)| (m.clone(), f.clone())).collect();
        let mut edges = BTreeMap::new();
        for (file, code) in &codes {
            edges.insert(file.clone(), imports(file, &files[file], code, &by_module));
        }
        Crate { files, edges, lines }
    }

    fn circles(&self) -> Vec<String> {
        circles(&self.edges)
    }

    /// The groups of files that reach each other, each sorted.
    fn groups(&self) -> Vec<Vec<String>> {
        groups(&self.edges)
    }
}

/// The module a file holds: `store/mod.rs` and `store.rs` are `store`, `lib.rs` the root.
fn module_of(file: &str) -> Vec<String> {
    let mut parts: Vec<String> = file.trim_end_matches(".rs").split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The text with comments, strings and character literals replaced by spaces (newlines kept,
/// so positions and line counts hold).
fn blank(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let put = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        let ident_before = i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_');
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                put(&mut out, b[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    put(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if !ident_before && (c == 'r' || (c == 'b' && next == Some('r'))) && raw_string_start(&b, i).is_some() {
            let (hashes, open) = raw_string_start(&b, i).expect("checked");
            for &ch in &b[i..=open] {
                put(&mut out, ch);
            }
            i = open + 1;
            while i < b.len() {
                if b[i] == '"' && (1..=hashes).all(|k| b.get(i + k) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                put(&mut out, b[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    put(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    put(&mut out, b[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && char_literal_len(&b, i).is_some() {
            let len = char_literal_len(&b, i).expect("checked");
            for _ in 0..len {
                out.push(' ');
            }
            i += len;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// At a raw string (`r"`, `r#"`, `br#"`): the number of `#` and the index of its opening quote.
fn raw_string_start(b: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i + if b[i] == 'b' { 2 } else { 1 };
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (b.get(j) == Some(&'"')).then_some((hashes, j))
}

/// At a `'`: the length of the character literal starting there, or `None` for a lifetime.
fn char_literal_len(b: &[char], i: usize) -> Option<usize> {
    match b.get(i + 1)? {
        '\\' => {
            let mut j = i + 2;
            while j < b.len() && b[j] != '\'' && j < i + 12 {
                j += 1;
            }
            (b.get(j) == Some(&'\'')).then_some(j - i + 1)
        }
        _ if b.get(i + 2) == Some(&'\'') => Some(3),
        _ => None,
    }
}

/// The code without its `#[cfg(test)]` items (blanked), the names of the child modules
/// declared test-only (`#[cfg(test)] mod x;`), and how many lines the items took.
fn without_tests(code: &str) -> (String, Vec<String>, usize) {
    let mut out: Vec<char> = code.chars().collect();
    let mut test_mods = Vec::new();
    let mut test_lines = 0;
    let pattern: Vec<char> = "#[cfg(test)]".chars().collect();
    let mut i = 0;
    while i + pattern.len() <= out.len() {
        if out[i..i + pattern.len()] != pattern[..] {
            i += 1;
            continue;
        }
        // The item it applies to ends at its first `;` or its block's closing brace.
        let start = i;
        let mut j = i + pattern.len();
        let mut depth = 0usize;
        let mut bracket = 0usize;
        while j < out.len() {
            match out[j] {
                '[' => bracket += 1,
                ']' => bracket = bracket.saturating_sub(1),
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ';' if depth == 0 && bracket == 0 => break,
                _ => {}
            }
            j += 1;
        }
        let item: String = out[start + pattern.len()..j.min(out.len())].iter().collect();
        let words: Vec<&str> = item
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        let declared = words.iter().position(|w| *w == "mod").and_then(|pos| words.get(pos + 1));
        if let Some(name) = declared.filter(|_| !item.contains('{')) {
            test_mods.push((*name).to_owned());
        }
        test_lines += 1;
        for ch in out.iter_mut().take(j + 1).skip(start) {
            if *ch == '\n' {
                test_lines += 1;
            } else {
                *ch = ' ';
            }
        }
        i = j + 1;
    }
    (out.into_iter().collect(), test_mods, test_lines)
}

/// A token of blanked code: an identifier, `::`, or one punctuation character.
fn tokens(code: &str) -> Vec<String> {
    let b: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(b[start..i].iter().collect());
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// The files `file` (holding `module`) imports from, as the module doc says.
fn imports(file: &str, module: &[String], code: &str, by_module: &BTreeMap<Vec<String>, String>) -> BTreeSet<String> {
    let toks = tokens(code);
    let is_module = |p: &[String]| by_module.contains_key(p);
    // A path's first segment, made absolute (within the crate), or `None` for another crate.
    let start = |first: &str, aliases: &BTreeMap<String, Vec<String>>| -> Option<Vec<String>> {
        match first {
            "crate" => Some(Vec::new()),
            "self" => Some(module.to_vec()),
            "super" => Some(module[..module.len().saturating_sub(1)].to_vec()),
            _ => {
                if let Some(a) = aliases.get(first) {
                    return Some(a.clone());
                }
                let mut child = module.to_vec();
                child.push(first.to_owned());
                by_module.contains_key(&child).then_some(child)
            }
        }
    };
    let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut targets = BTreeSet::new();
    let edge = |path: &[String], targets: &mut BTreeSet<String>| {
        if is_module(path) {
            return;
        }
        let found = (0..path.len()).rev().find_map(|n| by_module.get(&path[..n]));
        if let Some(target) = found.filter(|t| t.as_str() != file) {
            targets.insert(target.clone());
        }
    };
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == "use" {
            let public = toks[..i].last().is_some_and(|t| t == "pub" || t == ")");
            let end = toks[i..].iter().position(|t| t == ";").map_or(toks.len(), |p| i + p);
            let mut leaves = Vec::new();
            use_tree(&toks[i + 1..end], &[], &mut leaves);
            for (path, name) in leaves {
                let Some(first) = path.first() else { continue };
                let Some(mut abs) = start(first, &aliases) else { continue };
                for seg in &path[1..] {
                    if seg == "super" {
                        abs.pop();
                    } else {
                        abs.push(seg.clone());
                    }
                }
                if let Some(name) = name {
                    aliases.insert(name, abs.clone());
                }
                if !public {
                    edge(&abs, &mut targets);
                }
            }
            i = end + 1;
            continue;
        }
        // A path in code: `a::b…`, not the tail of a longer one.
        let at_path = toks.get(i + 1).is_some_and(|t| t == "::")
            && toks
                .get(i + 2)
                .is_some_and(|t| t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_'))
            && !(i > 0 && toks[i - 1] == "::");
        if at_path && toks[i].chars().next().is_some_and(|c| c.is_alphabetic() || c == '_') {
            let mut path = vec![toks[i].clone()];
            let mut j = i + 1;
            while toks.get(j).is_some_and(|t| t == "::")
                && toks
                    .get(j + 1)
                    .is_some_and(|t| t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_'))
            {
                path.push(toks[j + 1].clone());
                j += 2;
            }
            if let Some(mut abs) = start(&path[0], &aliases) {
                for seg in &path[1..] {
                    if seg == "super" {
                        abs.pop();
                    } else {
                        abs.push(seg.clone());
                    }
                }
                edge(&abs, &mut targets);
            }
            i = j;
            continue;
        }
        i += 1;
    }
    targets
}

/// The leaves of a `use` tree: each full path, and the name it binds (`None` for a glob).
/// `self` in a group (`{self, …}`) is the group's prefix.
fn use_tree(toks: &[String], prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    while i < toks.len() {
        match toks[i].as_str() {
            "::" => {}
            "{" => {
                let close = matching(toks, i);
                for part in split_commas(&toks[i + 1..close]) {
                    use_tree(part, &path, out);
                }
                return;
            }
            "*" => {
                out.push((path, None));
                return;
            }
            "as" => {
                let name = toks.get(i + 1).filter(|n| *n != "_").cloned();
                out.push((path, name));
                return;
            }
            "self" if !prefix.is_empty() && path.len() == prefix.len() => {}
            t => path.push(t.to_owned()),
        }
        i += 1;
    }
    if !path.is_empty() {
        let name = path.last().cloned();
        out.push((path, name));
    }
}

fn matching(toks: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (k, t) in toks.iter().enumerate().skip(open) {
        match t.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

fn split_commas(toks: &[String]) -> Vec<&[String]> {
    let mut parts = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (k, t) in toks.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&toks[from..k]);
                from = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&toks[from..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// The groups of files that reach each other (strongly connected, with more than one file),
/// found by Tarjan's algorithm.
fn sccs(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<&str>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        groups: Vec<BTreeSet<&'a str>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = BTreeSet::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.insert(w);
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.groups.push(group);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.groups
}

/// Each group of files that reach each other, sorted.
fn groups(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    sccs(edges).into_iter().map(|g| g.into_iter().map(str::to_owned).collect()).collect()
}

/// One circle for each group of files that reach each other (strongly connected, found by
/// Tarjan's algorithm), as `a.rs → b.rs → a.rs`, starting at the group's first file.
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out: Vec<String> = sccs(edges)
        .iter()
        .map(|group| {
            // The shortest way from the group's first file back to itself, inside the group.
            let first = *group.iter().next().expect("a group has files");
            let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([first]);
            let mut last = first;
            'search: while let Some(v) = queue.pop_front() {
                for w in edges.get(v).into_iter().flatten().map(String::as_str).filter(|w| group.contains(w)) {
                    if w == first {
                        last = v;
                        break 'search;
                    }
                    if !came_from.contains_key(w) {
                        came_from.insert(w, v);
                        queue.push_back(w);
                    }
                }
            }
            let mut way = vec![first, last];
            let mut at = last;
            while at != first {
                at = came_from[at];
                way.push(at);
            }
            way.reverse();
            let circle = way.join(" → ");
            if group.len() + 1 > way.len() {
                let all: Vec<&str> = group.iter().copied().collect();
                format!("{circle} (one of the circles between {})", all.join(", "))
            } else {
                circle
            }
        })
        .collect();
    out.sort();
    out
}
