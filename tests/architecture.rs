//! The house rule "no module imports one that imports it back", checked on the source: every
//! path in `src/` (`use` trees and paths in code, `crate::`, `super::`, `self::` and names
//! brought in by `use`) is resolved to the file that defines what it names, following
//! re-exports, and the resulting graph must be acyclic at file level and at folder level
//! (a top-level module with everything under it). `make lint` runs this test; with
//! `ARCH_GRAPH=1` it prints both graphs.
//!
//! A `pub use` only forwards a name (the facade of a folder), so it is not an edge itself: the
//! files that use the name depend on the file that defines it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

type ModId = usize;
/// (from, to) → one path that makes the edge.
type Edges = BTreeMap<(String, String), String>;

#[derive(Default)]
struct Module {
    path: Vec<String>,
    /// Relative to `src/`.
    file: String,
    parent: Option<ModId>,
    children: BTreeMap<String, ModId>,
    items: BTreeSet<String>,
    /// Name → the path it was imported from (as written).
    uses: BTreeMap<String, Vec<String>>,
    globs: Vec<Vec<String>>,
}

#[derive(Default)]
struct Crate {
    modules: Vec<Module>,
    /// Per file: its syntax and the module of its top level.
    files: Vec<(ModId, syn::File)>,
}

impl Crate {
    fn load(src: &Path) -> Crate {
        let mut krate = Crate::default();
        krate.load_file(src, "lib.rs", Vec::new(), None);
        krate
    }

    fn load_file(&mut self, src: &Path, rel: &str, path: Vec<String>, parent: Option<ModId>) {
        let text = std::fs::read_to_string(src.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let id = self.add(path, rel, parent);
        // A child of `a/mod.rs` or `lib.rs` lives beside it; a child of `a.rs` in `a/`.
        let dir = match rel.strip_suffix("mod.rs").or(rel.strip_suffix("lib.rs")) {
            Some(dir) => dir.to_string(),
            None => format!("{}/", rel.trim_end_matches(".rs")),
        };
        self.load_items(src, &dir, id, &file.items);
        self.files.push((id, file));
    }

    fn add(&mut self, path: Vec<String>, file: &str, parent: Option<ModId>) -> ModId {
        let id = self.modules.len();
        if let Some(p) = parent {
            let name = path.last().expect("a child has a name").clone();
            self.modules[p].children.insert(name, id);
        }
        self.modules.push(Module {
            path,
            file: file.to_string(),
            parent,
            ..Module::default()
        });
        id
    }

    fn load_items(&mut self, src: &Path, dir: &str, id: ModId, items: &[syn::Item]) {
        for item in items {
            let name = match item {
                syn::Item::Mod(m) => {
                    let mut path = self.modules[id].path.clone();
                    path.push(m.ident.to_string());
                    match &m.content {
                        Some((_, inner)) => {
                            let file = self.modules[id].file.clone();
                            let child = self.add(path, &file, Some(id));
                            self.load_items(src, dir, child, inner);
                        }
                        None => {
                            let flat = format!("{dir}{}.rs", m.ident);
                            let rel = if src.join(&flat).exists() {
                                flat
                            } else {
                                format!("{dir}{}/mod.rs", m.ident)
                            };
                            self.load_file(src, &rel, path, Some(id));
                        }
                    }
                    continue;
                }
                syn::Item::Use(u) => {
                    let mut flat = Vec::new();
                    flatten(&u.tree, Vec::new(), &mut flat);
                    for (alias, path) in flat {
                        match alias {
                            Some(alias) => self.modules[id].uses.insert(alias, path),
                            None => {
                                self.modules[id].globs.push(path);
                                continue;
                            }
                        };
                    }
                    continue;
                }
                syn::Item::Const(i) => &i.ident,
                syn::Item::Enum(i) => &i.ident,
                syn::Item::Fn(i) => &i.sig.ident,
                syn::Item::Static(i) => &i.ident,
                syn::Item::Struct(i) => &i.ident,
                syn::Item::Trait(i) => &i.ident,
                syn::Item::TraitAlias(i) => &i.ident,
                syn::Item::Type(i) => &i.ident,
                syn::Item::Union(i) => &i.ident,
                syn::Item::Macro(i) => match &i.ident {
                    Some(ident) => ident,
                    None => continue,
                },
                _ => continue,
            };
            self.modules[id].items.insert(name.to_string());
        }
    }

    /// The module whose file defines what `segs`, written in module `ctx`, names; `None` for
    /// other crates, the prelude and local names.
    fn resolve(&self, ctx: ModId, segs: &[String], depth: usize) -> Option<ModId> {
        if depth > 16 || segs.is_empty() {
            return None;
        }
        let (mut cur, mut rest) = match segs[0].as_str() {
            "crate" => (0, &segs[1..]),
            "self" => (ctx, &segs[1..]),
            "Self" => return None,
            "super" => {
                let mut cur = ctx;
                let mut rest = segs;
                while rest.first().map(String::as_str) == Some("super") {
                    cur = self.modules[cur].parent?;
                    rest = &rest[1..];
                }
                (cur, rest)
            }
            _ => return self.lookup(ctx, segs, depth),
        };
        while let Some(seg) = rest.first() {
            let m = &self.modules[cur];
            if let Some(&child) = m.children.get(seg) {
                cur = child;
                rest = &rest[1..];
            } else {
                return self.lookup(cur, rest, depth).or(Some(cur));
            }
        }
        Some(cur)
    }

    /// `segs[0]` as a name in scope in module `m`: a child, an item, an import or a glob's.
    fn lookup(&self, m: ModId, segs: &[String], depth: usize) -> Option<ModId> {
        let module = &self.modules[m];
        let first = &segs[0];
        if module.children.contains_key(first) {
            return self.resolve(m, &[&["self".to_string()], segs].concat(), depth + 1);
        }
        if module.items.contains(first) {
            return Some(m);
        }
        if let Some(path) = module.uses.get(first) {
            return self.resolve(m, &[path.as_slice(), &segs[1..]].concat(), depth + 1);
        }
        module.globs.iter().find_map(|g| {
            let source = self.resolve(m, g, depth + 1)?;
            let s = &self.modules[source];
            let known = s.children.contains_key(first)
                || s.items.contains(first)
                || s.uses.contains_key(first);
            known
                .then(|| self.lookup(source, segs, depth + 1))
                .flatten()
        })
    }

    /// File → file edges, each with one path that makes it.
    fn edges(&self) -> Edges {
        let mut edges = BTreeMap::new();
        for (id, file) in &self.files {
            let mut v = Collector {
                krate: self,
                stack: vec![*id],
                edges: &mut edges,
            };
            v.visit_file(file);
        }
        edges
    }
}

struct Collector<'a> {
    krate: &'a Crate,
    stack: Vec<ModId>,
    edges: &'a mut Edges,
}

impl Collector<'_> {
    fn ctx(&self) -> ModId {
        *self.stack.last().expect("in a module")
    }

    fn edge(&mut self, segs: &[String]) {
        let ctx = self.ctx();
        if let Some(target) = self.krate.resolve(ctx, segs, 0) {
            let (from, to) = (
                &self.krate.modules[ctx].file,
                &self.krate.modules[target].file,
            );
            if from != to {
                self.edges
                    .entry((from.clone(), to.clone()))
                    .or_insert_with(|| segs.join("::"));
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // File modules are visited on their own; an inline one is a scope of its own.
        if let Some((_, items)) = &m.content {
            let ctx = self.ctx();
            let child = self.krate.modules[ctx].children[&m.ident.to_string()];
            self.stack.push(child);
            for item in items {
                self.visit_item(item);
            }
            self.stack.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !matches!(u.vis, syn::Visibility::Inherited) {
            return;
        }
        let mut flat = Vec::new();
        flatten(&u.tree, Vec::new(), &mut flat);
        for (_, path) in flat {
            self.edge(&path);
        }
    }

    /// `pub(super)` and `pub(in crate::x)` say who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.edge(&segs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// A use tree as (name it binds, full path); a glob binds no name.
fn flatten(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Option<String>, Vec<String>)>) {
    let with = |s: &syn::Ident| [prefix.clone(), vec![s.to_string()]].concat();
    match tree {
        syn::UseTree::Path(p) => flatten(&p.tree, with(&p.ident), out),
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.last().cloned(), prefix.clone()));
        }
        syn::UseTree::Name(n) => out.push((Some(n.ident.to_string()), with(&n.ident))),
        syn::UseTree::Rename(r) => out.push((Some(r.rename.to_string()), with(&r.ident))),
        syn::UseTree::Glob(_) => out.push((None, prefix)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix.clone(), out);
            }
        }
    }
}

/// The folder (top-level module) a file belongs to; `lib.rs` is the crate's root.
fn folder(file: &str) -> String {
    file.split('/')
        .next()
        .expect("a path")
        .trim_end_matches(".rs")
        .to_string()
}

/// Strongly connected components of more than one node (Tarjan's, iterative enough for a
/// crate's few hundred nodes).
fn cycles(edges: &Edges) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        graph.entry(from).or_default().push(to);
        graph.entry(to).or_default();
    }
    struct State<'a> {
        graph: &'a BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for &w in &s.graph[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        graph: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn report(level: &str, edges: &Edges) -> Vec<String> {
    cycles(edges)
        .into_iter()
        .map(|scc| {
            let inside: Vec<String> = edges
                .iter()
                .filter(|((f, t), _)| scc.contains(f) && scc.contains(t))
                .map(|((f, t), via)| format!("    {f} -> {t} (via {via})"))
                .collect();
            format!(
                "{level} cycle among {}:\n{}",
                scc.join(", "),
                inside.join("\n")
            )
        })
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn graphs() -> (Edges, Edges) {
    let files = Crate::load(&src()).edges();
    let mut folders = BTreeMap::new();
    for ((from, to), via) in &files {
        let (f, t) = (folder(from), folder(to));
        if f != t && f != "lib" {
            folders
                .entry((f, t))
                .or_insert_with(|| format!("{from} -> {to}: {via}"));
        }
    }
    (files, folders)
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let (files, folders) = graphs();
    if std::env::var_os("ARCH_GRAPH").is_some() {
        for ((f, t), via) in &folders {
            println!("folder {f} -> {t}  ({via})");
        }
        for ((f, t), via) in &files {
            println!("file {f} -> {t}  ({via})");
        }
    }
    let mut found = report("file", &files);
    found.extend(report("folder", &folders));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The checker itself: it sees a cycle through `super::` and one through a re-export, and
/// resolves a name to the file that defines it.
#[test]
fn the_checker_sees_cycles_through_super_and_re_exports() {
    let dir = std::env::temp_dir().join(format!("arch-check-{}", std::process::id()));
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    write("lib.rs", "mod a; mod b; mod w;");
    write("a/mod.rs", "mod x; pub use x::X;");
    write("a/x.rs", "pub struct X; fn f() -> crate::b::B { todo!() }");
    write("b.rs", "use crate::a::X; pub struct B(X);");
    write("w/mod.rs", "mod p; mod t;");
    write("w/p.rs", "pub fn p() { super::t::t() }");
    write("w/t.rs", "pub fn t() { super::p::p() }");
    let edges = Crate::load(&dir).edges();
    std::fs::remove_dir_all(&dir).expect("clean up");
    let found = cycles(&edges);
    assert_eq!(
        found,
        vec![
            vec!["a/x.rs".to_string(), "b.rs".to_string()],
            vec!["w/p.rs".to_string(), "w/t.rs".to_string()],
        ],
        "{edges:?}"
    );
}
