//! Every key a script touches arrives in `KEYS` (docs/design.md#redis-keys): on a Redis Cluster a
//! key the caller did not declare is neither routed nor checked against the event's slot, and a
//! script that builds a key name itself would reach outside the event. Read from the sources:
//! each `redis.call` / `redis.pcall` names its keys as `KEYS[n]`, as a parameter every caller
//! fills from `KEYS[n]`, or as a field of the table `offer_room` is given, whose every field is a
//! `KEYS[n]`. That the keys the Rust side passes share the event's hash tag is
//! `redis_io::keys::tests`; that they stay in one slot on a real cluster is `cluster::*`.

use std::path::Path;

/// Commands whose every argument after the name is a key; for the others only the first is.
const ALL_KEYS: &[&str] = &["DEL", "EXISTS", "RENAME"];
/// Commands that take no key.
const NO_KEY: &[&str] = &["TIME"];

/// The arguments of the call starting at `text` (just after its opening parenthesis), split at
/// the commas of its own level.
fn call_args(text: &str) -> Vec<String> {
    let (mut depth, mut args, mut current) = (0usize, Vec::new(), String::new());
    let mut in_string = None;
    for c in text.chars() {
        match (in_string, c) {
            (Some(q), c) if c == q => in_string = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => in_string = Some(c),
            (None, '(' | '{' | '[') => depth += 1,
            (None, ')' | '}' | ']') if depth == 0 => {
                args.push(current.trim().to_owned());
                return args;
            }
            (None, ')' | '}' | ']') => depth -= 1,
            (None, ',') if depth == 0 => {
                args.push(current.trim().to_owned());
                current.clear();
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    panic!("unclosed call: {text:.80}")
}

fn is_keys_entry(arg: &str) -> bool {
    arg.strip_prefix("KEYS[").and_then(|r| r.strip_suffix(']')).is_some_and(|n| n.parse::<u32>().is_ok())
}

/// The parameters of `local function NAME(a, b)` in `source` that every call of NAME fills with
/// a `KEYS[n]`.
fn keys_parameters(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in source.match_indices("local function ") {
        let rest = &source[at + "local function ".len()..];
        let Some(open) = rest.find('(') else { continue };
        let name = rest[..open].trim();
        let params = call_args(&rest[open + 1..]);
        let calls: Vec<Vec<String>> = source
            .match_indices(&format!("{name}("))
            .filter(|(i, _)| !source[..*i].ends_with("function "))
            .map(|(i, _)| call_args(&source[i + name.len() + 1..]))
            .collect();
        for (p, param) in params.iter().enumerate() {
            if !calls.is_empty() && calls.iter().all(|args| args.get(p).is_some_and(|a| is_keys_entry(a))) {
                found.push(param.clone());
            }
        }
    }
    found
}

/// Every problem in one script's source.
fn undeclared_keys(name: &str, source: &str) -> Vec<String> {
    let params = keys_parameters(source);
    let mut problems = Vec::new();
    for call in ["redis.call(", "redis.pcall("] {
        for (at, _) in source.match_indices(call) {
            let args = call_args(&source[at + call.len()..]);
            let command = args[0].trim_matches(['\'', '"']).to_uppercase();
            let keys: &[String] = match () {
                _ if NO_KEY.contains(&command.as_str()) => &[],
                _ if ALL_KEYS.contains(&command.as_str()) => &args[1..],
                _ => &args[1..args.len().min(2)],
            };
            for key in keys {
                // `k.field` is offer_room's table (lua/with_offer.lua), checked at its callers.
                let declared = is_keys_entry(key) || params.contains(key) || key.starts_with("k.");
                if !declared {
                    problems.push(format!("{name}: {command} on {key}, not a KEYS entry"));
                }
            }
        }
    }
    for (at, _) in source.match_indices("offer_room({") {
        let table = call_args(&source[at + "offer_room({".len()..]);
        for field in table {
            let value = field.split_once('=').map(|(_, v)| v.trim()).unwrap_or_default();
            if !is_keys_entry(value) {
                problems.push(format!("{name}: offer_room is given {field}, not a KEYS entry"));
            }
        }
    }
    problems
}

#[test]
fn every_key_a_script_touches_arrives_in_keys() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
    let mut scripts = 0;
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "lua") {
            let source = std::fs::read_to_string(&path).unwrap();
            problems.extend(undeclared_keys(&path.file_name().unwrap().to_string_lossy(), &source));
            scripts += 1;
        }
    }
    assert!(scripts >= 19, "read {scripts} scripts from {}", dir.display());
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_script_that_names_its_own_key_is_caught() {
    let built = "local id = ARGV[1]\nredis.call('HSET', '{ev:' .. id .. '}:meta', 'state', 'open')\n";
    assert_eq!(undeclared_keys("built.lua", built).len(), 1, "a key built from ARGV");
    let global = "redis.call('SADD', 'seatrush:events', ARGV[1])\n";
    assert_eq!(undeclared_keys("global.lua", global).len(), 1, "a key of no event");
    let second = "redis.call('RENAME', KEYS[1], ARGV[2])\n";
    assert_eq!(undeclared_keys("second.lua", second).len(), 1, "RENAME's second key");
    let passed = "local function put(key, v)\n  redis.call('SET', key, v)\nend\nput(KEYS[1], 1)\nput(ARGV[1], 2)\n";
    assert_eq!(undeclared_keys("passed.lua", passed).len(), 1, "a parameter one caller fills from ARGV");
    let offer = "offer_room({adm = KEYS[1], meta = ARGV[1]}, ids)\n";
    assert_eq!(undeclared_keys("offer.lua", offer).len(), 1, "offer_room given an ARGV");
    let fine = "local function put(key)\n  redis.call('DEL', key, KEYS[2])\nend\nput(KEYS[1])\n";
    assert!(undeclared_keys("fine.lua", fine).is_empty());
}
