//! The folder listing is the architecture (`src/lib.rs`, "Layout"): each layer imports only the
//! layers before it, so no module imports one that imports it back and the core never uses the lab.

use std::collections::BTreeSet;
use std::path::Path;

/// The layers in import order; a layer may use itself and any layer before it, never after.
/// `redis_io` and `store` share a rank: neither may import the other.
const LAYERS: &[(&str, u8)] = &[
    ("domain", 0),
    ("fault_hooks", 1),
    ("redis_io", 2),
    ("store", 2),
    ("sale", 3),
    ("http", 4),
    ("ops", 5),
    ("lab", 6),
    ("cli", 7),
];

fn rank(layer: &str) -> u8 {
    LAYERS
        .iter()
        .find(|(name, _)| *name == layer)
        .map(|(_, r)| *r)
        .unwrap_or_else(|| panic!("{layer} is not a layer of src/lib.rs"))
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
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
        .map(|(i, _)| text[i + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect::<String>())
        .filter(|name| !name.is_empty())
        .collect()
}

#[test]
fn every_module_imports_only_the_layers_before_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let first =
            relative.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if first == "lib" || first == "main" {
            continue;
        }
        let own = rank(&first);
        for used in used_layers(&std::fs::read_to_string(&file).unwrap()) {
            let theirs = rank(&used);
            if used != first && theirs >= own {
                wrong.push(format!("{} uses crate::{used}", relative.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "imports against the layering of src/lib.rs:\n{}", wrong.join("\n"));
}

#[test]
fn the_checker_sees_a_forbidden_import() {
    let used = used_layers("use crate::lab::fleet::Fleet;\nuse crate::domain::code::CodeHash;");
    assert!(used.contains("lab") && used.contains("domain"));
    assert!(rank("lab") > rank("sale"), "the sale must rank below the lab");
}
