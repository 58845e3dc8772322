//! "The offer is made as the model makes it": lua/with_offer.lua, spliced into release.lua,
//! undo.lua and heal_seats.lua by `scripts::with_offer` as `serve` loads them, against a reference
//! written here from the design's words (docs/design.md#the-waiting-list): once a script has made
//! room, while a level with room has a waiter, the earliest such waiter of all levels gets the
//! lowest seat its level may take; a waiter who holds a seat (the releasing code among them) or was
//! taken off the allowlist is dropped. Random events of one to three levels, event-wide or per-level
//! numbering, against the Redis at 127.0.0.1:6379 under keys of their own; every key the scripts
//! touch is compared after each call.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;
use seatrush::redis_io::keys::{parse_pending_member, pending_member};
use seatrush::redis_io::scripts::with_offer;
use std::collections::{BTreeMap, BTreeSet};

const CASES: usize = 600;

/// One event's waiting-list world, as the keys hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct World {
    /// Level -> (cap, base with per-level numbering).
    levels: BTreeMap<String, (i64, Option<i64>)>,
    taken: BTreeMap<String, i64>,
    free: BTreeSet<i64>,
    /// Code -> (nonce, admission id, seat, level).
    adm: BTreeMap<String, (String, String, i64, String)>,
    pending: BTreeSet<String>,
    /// (sequence, level, code), in join order.
    waitq: Vec<(u32, String, String)>,
    allow: BTreeSet<String>,
    open: bool,
}

impl World {
    fn room(&self, level: &str) -> Option<i64> {
        let (cap, base) = self.levels[level];
        if self.taken[level] >= cap {
            return None;
        }
        match base {
            Some(b) => self.free.range(b + 1..=b + cap).next().copied(),
            None => self.free.iter().next().copied(),
        }
    }

    /// The reference: with_offer.lua's `offer_room`, from the design's words.
    fn offer_room(&mut self, ids: &[&str]) -> Vec<(String, i64, String)> {
        let mut offers = Vec::new();
        if !self.open {
            return offers;
        }
        while offers.len() < ids.len() {
            let Some(i) = self.waitq.iter().position(|(_, level, _)| self.room(level).is_some()) else { break };
            let (_, level, code) = self.waitq.remove(i);
            if self.adm.contains_key(&code) || !self.allow.contains(&code) {
                continue;
            }
            let seat = self.room(&level).expect("room");
            self.free.remove(&seat);
            *self.taken.get_mut(&level).expect("a level") += 1;
            let id = ids[offers.len()].to_string();
            self.adm.insert(code.clone(), (format!("w{code}"), id, seat, level.clone()));
            self.pending.insert(code.clone());
            offers.push((code, seat, level));
        }
        offers
    }

    /// release.lua (and undo.lua, `seat-held` or not) of `code`'s record.
    fn release(&mut self, code: &str, keep_seat_out: bool, id: &str) -> Vec<(String, i64, String)> {
        let (_, _, seat, level) = self.adm[code].clone();
        if !keep_seat_out {
            self.free.insert(seat);
        }
        *self.taken.get_mut(&level).expect("a level") -= 1;
        let offers = self.offer_room(&[id]);
        self.adm.remove(code);
        self.pending.remove(code);
        offers
    }
}

fn random_world(rng: &mut StdRng) -> World {
    let per_level = rng.random_bool(0.5);
    let mut levels = BTreeMap::new();
    let mut next_base = 0;
    for l in 1..=rng.random_range(1..=3) {
        let cap = rng.random_range(1..=3);
        levels.insert(format!("L{l}"), (cap, per_level.then_some(next_base)));
        next_base += cap;
    }
    let total = if per_level { next_base } else { rng.random_range(1..=next_base + 1) };
    let mut w = World {
        taken: levels.keys().map(|l| (l.clone(), 0)).collect(),
        levels,
        free: BTreeSet::new(),
        adm: BTreeMap::new(),
        pending: BTreeSet::new(),
        waitq: Vec::new(),
        allow: BTreeSet::new(),
        open: rng.random_bool(0.9),
    };
    let names: Vec<String> = w.levels.keys().cloned().collect();
    for seat in 1..=total {
        let level = match w.levels.iter().find(|(_, (cap, b))| b.is_some_and(|b| seat > b && seat <= b + cap)) {
            Some((l, _)) => l.clone(),
            None => names[rng.random_range(0..names.len())].clone(),
        };
        // Seat 1 is always held: the releasing code's.
        if seat == 1 || (rng.random_bool(0.6) && w.taken[&level] < w.levels[&level].0) {
            let code = format!("c{}", w.adm.len());
            w.adm.insert(code.clone(), (format!("n{code}"), format!("a{code}"), seat, level.clone()));
            *w.taken.get_mut(&level).expect("a level") += 1;
            if rng.random_bool(0.5) || code == "c0" {
                w.pending.insert(code.clone());
            }
        } else {
            w.free.insert(seat);
        }
    }
    let holders: Vec<String> = w.adm.keys().cloned().collect();
    for seq in 1..=rng.random_range(0..=5u32) {
        let code =
            if rng.random_bool(0.25) { holders[rng.random_range(0..holders.len())].clone() } else { format!("v{seq}") };
        if w.waitq.iter().any(|(_, _, c)| *c == code) {
            continue;
        }
        w.waitq.push((seq, names[rng.random_range(0..names.len())].clone(), code));
    }
    let codes = holders.iter().cloned().chain(w.waitq.iter().map(|(_, _, c)| c.clone()));
    w.allow = codes.filter(|_| rng.random_bool(0.85)).collect();
    w
}

struct Keys {
    tag: String,
}

impl Keys {
    fn key(&self, name: &str) -> String {
        format!("{{model-offer-{}}}:{name}", self.tag)
    }

    fn all(&self) -> Vec<String> {
        ["adm", "taken", "free", "pending", "syncs", "meta", "waitq", "waiters", "allow", "cap", "lock", "moves"]
            .iter()
            .map(|n| self.key(n))
            .collect()
    }

    fn load(&self, conn: &mut redis::Connection, w: &World) {
        let mut pipe = redis::pipe();
        pipe.cmd("DEL").arg(self.all()).ignore();
        pipe.cmd("HSET").arg(self.key("meta")).arg("state").arg(if w.open { "open" } else { "closed" }).ignore();
        pipe.cmd("SET").arg(self.key("lock")).arg("owner").ignore();
        for (level, (cap, base)) in &w.levels {
            pipe.cmd("HSET").arg(self.key("cap")).arg(level).arg(cap).ignore();
            pipe.cmd("HSET").arg(self.key("taken")).arg(level).arg(w.taken[level]).ignore();
            if let Some(b) = base {
                pipe.cmd("HSET").arg(self.key("meta")).arg(format!("base:{level}")).arg(b).ignore();
            }
        }
        for seat in &w.free {
            pipe.cmd("ZADD").arg(self.key("free")).arg(seat).arg(seat).ignore();
        }
        for (code, (nonce, id, seat, level)) in &w.adm {
            pipe.cmd("HSET").arg(self.key("adm")).arg(code).arg(format!("{nonce} {id} {seat} {level} 5")).ignore();
        }
        for code in &w.pending {
            let member = pending_member(code, &w.adm[code].1);
            pipe.cmd("ZADD").arg(self.key("pending")).arg(5).arg(member).ignore();
        }
        for (seq, level, code) in &w.waitq {
            pipe.cmd("ZADD").arg(self.key("waitq")).arg(0).arg(format!("{level} {seq:015} {code}")).ignore();
            let waiter = format!("w{code} {level} {seq:015} 3");
            pipe.cmd("HSET").arg(self.key("waiters")).arg(code).arg(waiter).ignore();
        }
        for code in &w.allow {
            pipe.cmd("SADD").arg(self.key("allow")).arg(code).ignore();
        }
        pipe.query::<()>(conn).expect("load");
    }

    fn read(&self, conn: &mut redis::Connection, like: &World) -> World {
        let mut w = like.clone();
        let taken: BTreeMap<String, i64> = redis::cmd("HGETALL").arg(self.key("taken")).query(conn).unwrap();
        w.taken = taken;
        let free: Vec<i64> = redis::cmd("ZRANGE").arg(self.key("free")).arg(0).arg(-1).query(conn).unwrap();
        w.free = free.into_iter().collect();
        let adm: BTreeMap<String, String> = redis::cmd("HGETALL").arg(self.key("adm")).query(conn).unwrap();
        w.adm = adm
            .into_iter()
            .map(|(code, r)| {
                let f: Vec<&str> = r.split(' ').collect();
                (code, (f[0].to_string(), f[1].to_string(), f[2].parse().unwrap(), f[3].to_string()))
            })
            .collect();
        let pending: Vec<String> = redis::cmd("ZRANGE").arg(self.key("pending")).arg(0).arg(-1).query(conn).unwrap();
        // Each entry names its code's record's admission ("code admission-id").
        w.pending = pending
            .iter()
            .map(|m| {
                let (code, id) = parse_pending_member(m).unwrap_or_else(|| panic!("entry {m:?}"));
                assert_eq!(w.adm.get(code).map(|r| r.1.as_str()), Some(id), "entry {m:?} names its record");
                code.to_owned()
            })
            .collect();
        let waitq: Vec<String> = redis::cmd("ZRANGE").arg(self.key("waitq")).arg(0).arg(-1).query(conn).unwrap();
        let mut waitq: Vec<(u32, String, String)> = waitq
            .iter()
            .map(|m| {
                let f: Vec<&str> = m.split(' ').collect();
                (f[1].parse().unwrap(), f[0].to_string(), f[2].to_string())
            })
            .collect();
        waitq.sort();
        w.waitq = waitq;
        let waiters: Vec<String> = redis::cmd("HKEYS").arg(self.key("waiters")).query(conn).unwrap();
        let listed: BTreeSet<String> = w.waitq.iter().map(|(_, _, c)| c.clone()).collect();
        assert_eq!(waiters.into_iter().collect::<BTreeSet<_>>(), listed, "waiters and waitq name the same codes");
        w
    }
}

/// The offers a reply carries: (code, seat, level) each.
fn offers_of(reply: &Value) -> Vec<(String, i64, String)> {
    let one = |items: &[Value]| {
        let text = |v: &Value| redis::from_redis_value::<String>(v.clone()).unwrap();
        (text(&items[0]), redis::from_redis_value::<i64>(items[3].clone()).unwrap(), text(&items[4]))
    };
    match reply {
        Value::Int(_) => Vec::new(),
        Value::Array(items) if matches!(items.first(), Some(Value::Int(_))) => items[1..]
            .iter()
            .map(|o| match o {
                Value::Array(o) => one(o),
                other => panic!("an offer, got {other:?}"),
            })
            .collect(),
        Value::Array(items) => vec![one(items)],
        other => panic!("unexpected reply {other:?}"),
    }
}

#[test]
fn the_offer_in_every_script_that_makes_room_matches_the_model() {
    let release = with_offer(include_str!("../../lua/release.lua"));
    let undo = with_offer(include_str!("../../lua/undo.lua"));
    let heal_seats = with_offer(include_str!("../../lua/heal_seats.lua"));
    let mut conn = redis::Client::open("redis://127.0.0.1:6379/")
        .and_then(|c| c.get_connection())
        .expect("the Redis at 127.0.0.1:6379 (.ci/run starts one)");
    let seed: u64 = rand::rng().random();
    let mut rng = StdRng::seed_from_u64(seed);
    let keys = Keys { tag: format!("{seed:016x}") };
    let k = |n: &str| keys.key(n);
    let mut seen = BTreeMap::<&str, usize>::new();
    for case in 0..CASES {
        let before = random_world(&mut rng);
        keys.load(&mut conn, &before);
        let mut model = before.clone();
        let offer_keys = [k("meta"), k("waitq"), k("waiters"), k("allow"), k("cap")];
        let script = rng.random_range(0..4);
        let (source, names, args, expected) = match script {
            0 => {
                let mut names = vec![k("adm"), k("taken"), k("free"), k("pending"), k("syncs")];
                names.extend(offer_keys);
                let args: Vec<String> = ["c0", "nc0", "ac0", "o1"].map(String::from).to_vec();
                (release, names, args, model.release("c0", false, "o1"))
            }
            1 | 2 => {
                let mut names = vec![k("adm"), k("taken"), k("free"), k("pending")];
                names.extend(offer_keys);
                let held = if script == 2 { "seat-held" } else { "free" };
                let args: Vec<String> = ["c0", "nc0", "ac0", held, "o1"].map(String::from).to_vec();
                (undo, names, args, model.release("c0", script == 2, "o1"))
            }
            _ => {
                // A seat leaked: its holder's record gone, its count down, the seat out of the
                // pool; heal_seats returns it (and leaves alone a seat a record holds).
                let (_, _, seat, level) = model.adm.remove("c0").expect("c0 holds seat 1");
                model.pending.remove("c0");
                *model.taken.get_mut(&level).expect("a level") -= 1;
                keys.load(&mut conn, &model);
                let held = model.adm.values().next().map(|r| r.2.to_string());
                model.free.insert(seat);
                let expected = model.offer_room(&["o1"]);
                let mut names = vec![k("adm"), k("free"), k("lock"), k("moves"), k("pending")];
                names.extend(offer_keys);
                names.push(k("taken"));
                let args: Vec<String> = match held {
                    Some(h) => vec!["owner".into(), seat.to_string(), h, "o1".into(), "o2".into()],
                    None => vec!["owner".into(), seat.to_string(), "o1".into()],
                };
                (heal_seats, names, args, expected)
            }
        };
        let reply: Value =
            redis::cmd("EVAL").arg(source).arg(names.len()).arg(&names).arg(&args).query(&mut conn).unwrap();
        let context = || format!("seed {seed:#x}, case {case}, script {script}: {before:?}");
        assert_eq!(offers_of(&reply), expected, "{}: the offers", context());
        let after = keys.read(&mut conn, &model);
        assert_eq!(after, model, "{}: the keys after", context());
        let name = match (script, expected.first()) {
            (_, None) => "to the pool",
            (_, Some((_, _, level))) if before.adm.get("c0").is_some_and(|r| r.3 != *level) => "another level's waiter",
            (3, Some(_)) => "offered by heal_seats",
            _ => "offered",
        };
        *seen.entry(name).or_insert(0) += 1;
    }
    let _: () = redis::cmd("DEL").arg(keys.all()).query(&mut conn).unwrap();
    println!("{CASES} cases, seed {seed:#x}: {seen:?}");
    for outcome in ["to the pool", "another level's waiter", "offered by heal_seats", "offered"] {
        assert!(seen.get(outcome).is_some_and(|n| *n >= 10), "too few {outcome:?}: {seen:?}");
    }
}
