//! The code's structure, read from the source tree (`../` of this crate's manifest): one
//! direction of dependencies between files, the store below the engine, no long files.
//!
//! **The import graph** is drawn between the files of one crate's `src/` (`engine/src`,
//! `api/src`). A file is the module it holds: `foo.rs` or `foo/mod.rs` is `foo`, `lib.rs` the
//! crate's root. An edge goes from a file to the file of the module a path names, read from
//! `use` declarations and from paths in code:
//!
//! - a path starts at `crate`, `super` (any number), `self`, a child module of the file's
//!   module (`use change::Change` in a `mod.rs`), or a name a `use` of this file bound
//!   (`use super::steps;` then `steps::of_run`); `self` and `super` inside an inline module
//!   (`mod journal { use super::x; }`) start from that module; paths into other crates are not
//!   edges;
//! - the edge goes to the file that defines what the path names: the longest prefix of the
//!   path that is a module with a file of its own (`crate::store::steps::StepRow` is an edge to
//!   `store/steps.rs`, `super::Result` (an item of the parent) to the parent's `mod.rs`, an
//!   item of an inline module to the file holding it), unless that file only forwards the next
//!   name with a `use` of its own (a re-export, `pub use change::Change`, or a plain `use`) or
//!   a glob (`pub use model::*`, when the module it names has that name): then the path is
//!   followed through it, so `crate::store::Change` is an edge to `store/change.rs`, and a name
//!   forwarded from another crate is no edge;
//! - importing a module by name (`use super::steps;`, `{self, …}`) is no edge by itself: the
//!   paths through it are;
//! - `mod` declarations are no edges, and neither are re-exports (`pub use`, `pub(crate) use`,
//!   …) themselves: a re-export forwards a name for others. So a `mod.rs` that re-exports its
//!   children's items and whose children use items it defines is no circle. (A file that also
//!   calls an item it re-exports, unqualified, is not seen to depend on it: give it a plain
//!   `use` too.)
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

#[test]
fn api_files_import_each_other_in_one_direction() {
    let krate = Crate::read(&root().join("api/src"));
    let circles = krate.circles();
    assert!(circles.is_empty(), "import circles between files of api/src:\n{}", circles.join("\n"));
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
    assert!(wrong.is_empty(), "store/ imports from {}:\n{}", ABOVE_THE_STORE.join(", "), wrong.join("\n"));
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
    let edges: BTreeMap<String, BTreeSet<String>> =
        [("a.rs", vec!["b.rs"]), ("b.rs", vec!["c.rs", "d.rs"]), ("c.rs", vec!["a.rs"]), ("d.rs", vec![]), ("e.rs", vec!["d.rs"])]
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
        ("store/mod.rs", "mod change;\npub mod runs;\npub mod steps;\npub use change::Change;\npub type Result<T> = std::result::Result<T, ()>;\n"),
        ("store/change.rs", "use super::Result;\nfn f() { let _ = super::steps::COLUMNS; }\n"),
        ("store/steps.rs", "pub const COLUMNS: &str = \"\";\n"),
        ("store/runs.rs", "use super::{Change, Result};\n// crate::advance::x\nconst S: &str = \"crate::advance::y\";\npub const COLUMNS: &str = \"\";\n"),
        (
            "advance.rs",
            "use crate::store::{self, runs};\nfn f() { runs::go(); store::Change::new(); }\nmod inner { use super::f; }\n#[cfg(test)]\nmod tests { use crate::walk::x; }\n",
        ),
        ("walk.rs", "pub fn walk() {}\n#[cfg(test)]\nmod tests;\n"),
        ("walk/tests.rs", "use crate::advance::f;\n"),
    ];
    let krate = Crate::from_sources(sources.iter().map(|(f, s)| ((*f).to_owned(), (*s).to_owned())));
    let edges = |f: &str| krate.edges[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges("store/mod.rs"), Vec::<String>::new());
    assert_eq!(edges("store/change.rs"), vec!["store/mod.rs", "store/steps.rs"]);
    // `Change` through the parent's `pub use change::Change` is the file that defines it.
    assert_eq!(edges("store/runs.rs"), vec!["store/change.rs", "store/mod.rs"]);
    assert_eq!(edges("advance.rs"), vec!["store/change.rs", "store/runs.rs"]);
    assert_eq!(edges("walk.rs"), Vec::<String>::new());
    assert!(!krate.edges.contains_key("walk/tests.rs"));
    assert!(krate.circles().is_empty());
}

#[test]
fn a_path_through_a_re_export_is_an_edge_to_the_file_that_defines_the_item() {
    let sources = [
        ("lib.rs", "pub mod store;\npub mod definition;\npub mod triggers;\npub mod advance;\n"),
        ("store/mod.rs", "mod admission;\nmod change;\npub use change::Change;\npub(crate) use admission::release as free;\n"),
        ("store/change.rs", "pub struct Change;\nfn f() { crate::store::free(); }\n"),
        ("store/admission.rs", "use crate::store::Change;\npub fn release() {}\n"),
        ("definition/mod.rs", "mod model;\npub use model::*;\n"),
        ("definition/model.rs", "pub struct Definition;\n"),
        // A re-export of a re-export, and one of another crate's item.
        ("triggers.rs", "pub use crate::store::Change;\npub use serde::Serialize;\nfn f(_: crate::definition::Definition) {}\n"),
        ("advance.rs", "use crate::triggers::{Change, Serialize};\n"),
    ];
    let mut krate = Crate::from_sources(sources.iter().map(|(f, s)| ((*f).to_owned(), (*s).to_owned())));
    let edges = |krate: &Crate, f: &str| krate.edges[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges(&krate, "store/change.rs"), vec!["store/admission.rs"]);
    assert_eq!(edges(&krate, "store/admission.rs"), vec!["store/change.rs"]);
    assert_eq!(edges(&krate, "triggers.rs"), vec!["definition/model.rs"]);
    assert_eq!(edges(&krate, "advance.rs"), vec!["store/change.rs"]);
    assert_eq!(krate.circles(), vec!["store/admission.rs → store/change.rs → store/admission.rs".to_owned()]);
    let sources = [
        ("lib.rs", "pub mod triggers;\npub mod advance;\n"),
        ("triggers.rs", "pub use crate::advance::Step;\npub struct Event;\n"),
        ("advance.rs", "pub struct Step;\nfn f(_: crate::triggers::Event) {}\n"),
        ("walk.rs", "use crate::triggers::{Event, Step};\n"),
    ];
    krate = Crate::from_sources(sources.iter().map(|(f, s)| ((*f).to_owned(), (*s).to_owned())));
    // `triggers.rs` forwards `Step` without using it: no circle with `advance.rs`.
    assert_eq!(edges(&krate, "walk.rs"), vec!["advance.rs", "triggers.rs"]);
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
        let names: BTreeMap<String, Names> = codes.iter().map(|(file, code)| (file.clone(), names(&files[file], code, &by_module))).collect();
        let mut edges = BTreeMap::new();
        for (file, named) in &names {
            let targets = named.paths.iter().filter_map(|p| resolve(p.clone(), &names, &by_module));
            edges.insert(file.clone(), targets.filter(|t| *t != file).cloned().collect());
        }
        Crate { files, edges, lines }
    }

    fn circles(&self) -> Vec<String> {
        circles(&self.edges)
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
        let words: Vec<&str> = item.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
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

/// What a file names: the paths its code and private `use`s lead to, what its `use`s bind,
/// and the items it defines. The bindings and definitions let a path through a re-export be
/// followed to the file that defines the item (`resolve`).
#[derive(Default)]
struct Names {
    /// The paths in code and in private `use`s, made absolute (public `use`s are re-exports:
    /// no edge of their own).
    paths: Vec<Vec<String>>,
    /// Name → the absolute path a `use` of this file binds it to (`None`: another crate's).
    bound: BTreeMap<String, Option<Vec<String>>>,
    /// The modules whose names a glob (`use x::*`) of this file brings in.
    globs: Vec<Vec<String>>,
    /// The items this file defines (`fn`, `struct`, `enum`, `type`, `const`, `static`, `trait`).
    defined: BTreeSet<String>,
}

/// The names of `code`, the file of `module`, as the module doc says.
fn names(module: &[String], code: &str, by_module: &BTreeMap<Vec<String>, String>) -> Names {
    let toks = tokens(code);
    // A path's first segment, made absolute (within the crate), or `None` for another crate;
    // `here` is the module the path is written in (the file's, or an inline one inside it).
    let start = |first: &str, here: &[String], bound: &BTreeMap<String, Option<Vec<String>>>| -> Option<Vec<String>> {
        match first {
            "crate" => Some(Vec::new()),
            "self" => Some(here.to_vec()),
            "super" => Some(here[..here.len().saturating_sub(1)].to_vec()),
            _ => {
                if let Some(a) = bound.get(first) {
                    return a.clone();
                }
                let mut child = module.to_vec();
                child.push(first.to_owned());
                by_module.contains_key(&child).then_some(child)
            }
        }
    };
    let absolute = |mut abs: Vec<String>, rest: &[String]| {
        for seg in rest {
            if seg == "super" {
                abs.pop();
            } else {
                abs.push(seg.clone());
            }
        }
        abs
    };
    let mut out = Names::default();
    // The inline modules (`mod x { … }`) the scan is in, each with the brace depth outside it.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match toks[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, outside)| *outside == depth) {
                    inline.pop();
                }
            }
            "mod" if toks.get(i + 2).is_some_and(|t| t == "{") => inline.push((toks[i + 1].clone(), depth)),
            _ => {}
        }
        let here: Vec<String> = module.iter().cloned().chain(inline.iter().map(|(m, _)| m.clone())).collect();
        if toks[i] == "use" {
            let public = toks[..i].last().is_some_and(|t| t == "pub" || t == ")");
            let end = toks[i..].iter().position(|t| t == ";").map_or(toks.len(), |p| i + p);
            let mut leaves = Vec::new();
            use_tree(&toks[i + 1..end], &[], &mut leaves);
            for (path, name) in leaves {
                let Some(first) = path.first() else { continue };
                let abs = start(first, &here, &out.bound).map(|abs| absolute(abs, &path[1..]));
                match name {
                    Some(name) => {
                        out.bound.insert(name, abs.clone());
                    }
                    None => out.globs.extend(abs.clone()),
                }
                if let Some(abs) = abs.filter(|_| !public) {
                    out.paths.push(abs);
                }
            }
            i = end + 1;
            continue;
        }
        let is_ident = |t: &String| t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_');
        if ["fn", "struct", "enum", "type", "const", "static", "trait", "union"].contains(&toks[i].as_str()) {
            let name = toks[i + 1..].iter().find(|t| *t != "mut");
            if let Some(name) = name.filter(|t| is_ident(t)) {
                out.defined.insert(name.clone());
            }
        }
        // A path in code: `a::b…`, not the tail of a longer one.
        let at_path = toks.get(i + 1).is_some_and(|t| t == "::") && toks.get(i + 2).is_some_and(is_ident) && !(i > 0 && toks[i - 1] == "::");
        if at_path && is_ident(&toks[i]) {
            let mut path = vec![toks[i].clone()];
            let mut j = i + 1;
            while toks.get(j).is_some_and(|t| t == "::") && toks.get(j + 1).is_some_and(is_ident) {
                path.push(toks[j + 1].clone());
                j += 2;
            }
            if let Some(abs) = start(&path[0], &here, &out.bound) {
                out.paths.push(absolute(abs, &path[1..]));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The file that defines what an absolute path names: the longest prefix of the path that is a
/// module with a file of its own, unless that file only re-exports the next segment (a `use`
/// binding it, or a glob over a module that has it), which is then followed. `None` for a
/// module named by itself, or a name re-exported from another crate.
fn resolve<'a>(mut path: Vec<String>, names: &BTreeMap<String, Names>, by_module: &'a BTreeMap<Vec<String>, String>) -> Option<&'a String> {
    let has = |module: &[String], item: &String| by_module.get(module).is_some_and(|f| names[f].defined.contains(item) || names[f].bound.contains_key(item));
    // Each step follows one re-export; a chain longer than the crate has files is a loop.
    for _ in 0..=by_module.len() {
        if by_module.contains_key(&path) {
            return None;
        }
        let n = (0..path.len()).rev().find(|n| by_module.contains_key(&path[..*n]))?;
        let file = &by_module[&path[..n]];
        let item = &path[n];
        let here = &names[file];
        let via = match here.bound.get(item) {
            Some(to) => Some(to.clone()?),
            None if here.defined.contains(item) => None,
            None => here.globs.iter().find(|g| has(g, item)).map(|g| absolute_item(g, item)),
        };
        match via {
            Some(to) if to[..] != path[..=n] => path = to.into_iter().chain(path[n + 1..].iter().cloned()).collect(),
            _ => return Some(file),
        }
    }
    None
}

fn absolute_item(module: &[String], item: &str) -> Vec<String> {
    let mut path = module.to_vec();
    path.push(item.to_owned());
    path
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
    let mut t = Tarjan { edges, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), groups: Vec::new() };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.groups
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
