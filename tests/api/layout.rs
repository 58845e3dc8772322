//! The folder listing is the architecture (`src/lib.rs` and `lab/src/lib.rs`, "Layout"): in each
//! crate each layer imports only the layers before it, so no module imports one that imports it
//! back; and the product never names the lab. The lab's crate cannot import the product's
//! privately anyway, and the product cannot import the lab without depending on it: so the other
//! half of the rule is its `[dependencies]`, checked here too (and transitively by `.ci/run`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The product's layers in import order; a layer may use itself and any layer before it, never
/// after. `redis_io` and `store` share a rank: neither may import the other.
const PRODUCT: &[(&str, u8)] = &[
    ("domain", 0),
    ("fault_hooks", 1),
    ("redis_io", 2),
    ("store", 2),
    ("sale", 3),
    ("http", 4),
    ("ops", 5),
    ("demo", 6),
    ("cli", 7),
];

/// The lab's layers (`lab/src/`), likewise; every one may use the product.
const LAB: &[(&str, u8)] = &[
    ("scratch_db", 0),
    ("invariants", 0),
    ("crowd", 0),
    ("fleet", 0),
    ("cluster", 0),
    ("bench", 1),
    ("runner", 1),
    ("demo", 1),
    ("buckets", 1),
    ("cli", 2),
];

/// The lab's crates: the product's library and binary link none of them. (hyper, hyper-util and
/// http-body-util are the server's too: only hyper's client side is the lab's, checked below.)
const LAB_CRATES: &[&str] = &["seatrush-lab", "reqwest", "hdrhistogram", "indicatif", "tempfile"];

fn rank(layers: &[(&str, u8)], layer: &str) -> u8 {
    layers
        .iter()
        .find(|(name, _)| *name == layer)
        .map(|(_, r)| *r)
        .unwrap_or_else(|| panic!("{layer} is not a layer of its crate's lib.rs"))
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layers a file names through `crate::LAYER`.
fn used_layers(text: &str) -> BTreeSet<String> {
    text.match_indices("crate::")
        .filter(|(i, _)| !text[..*i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
        .map(|(i, _)| text[i + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect::<String>())
        .filter(|name| !name.is_empty())
        .collect()
}

/// Every import against `layers` in the crate whose sources are `src`.
fn wrong_imports(src: &Path, layers: &[(&str, u8)]) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first =
            relative.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if first == "lib" || first == "main" {
            continue;
        }
        let own = rank(layers, &first);
        for used in used_layers(&std::fs::read_to_string(&file).unwrap()) {
            let theirs = rank(layers, &used);
            if used != first && theirs >= own {
                wrong.push(format!("{} uses crate::{used}", relative.display()));
            }
        }
    }
    wrong
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_module_imports_only_the_layers_before_its_own() {
    let wrong = wrong_imports(&root().join("src"), PRODUCT);
    assert!(wrong.is_empty(), "imports against the layering of src/lib.rs:\n{}", wrong.join("\n"));
    let wrong = wrong_imports(&root().join("lab/src"), LAB);
    assert!(wrong.is_empty(), "imports against the layering of lab/src/lib.rs:\n{}", wrong.join("\n"));
}

#[test]
fn the_product_never_names_the_lab() {
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let naming: Vec<_> = files
        .iter()
        .filter(|f| std::fs::read_to_string(f).unwrap().contains("seatrush_lab"))
        .map(|f| f.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(naming.is_empty(), "the product's sources name the lab: {naming:?}");

    // The product's own dependencies (not its dev-dependencies, which the tests use) hold no lab crate.
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let section = manifest.split("\n[dependencies]\n").nth(1).expect("a [dependencies] section");
    let section = section.split("\n[").next().unwrap();
    let deps: BTreeSet<&str> = section
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split('=').next())
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .collect();
    assert!(deps.contains("axum") && deps.contains("redis"), "parsed the product's dependencies: {deps:?}");
    let linked: Vec<_> = LAB_CRATES.iter().filter(|c| deps.contains(*c)).collect();
    assert!(linked.is_empty(), "the product's [dependencies] name lab crates: {linked:?}");
    let hyper = section.lines().find(|l| l.starts_with("hyper ")).unwrap_or_default();
    assert!(!hyper.contains("\"client\""), "the product enables hyper's client: {hyper}");
}

#[test]
fn the_checker_sees_a_forbidden_import() {
    let used = used_layers("use crate::demo::Demo;\nuse crate::domain::code::CodeHash;\nuse seatrush::ops;");
    assert_eq!(used, BTreeSet::from(["demo".to_owned(), "domain".to_owned()]));
    assert!(rank(PRODUCT, "demo") > rank(PRODUCT, "sale"), "the sale must rank below the demo");
    assert!(rank(LAB, "runner") > rank(LAB, "fleet"), "the runner must rank above the fleet");
}
