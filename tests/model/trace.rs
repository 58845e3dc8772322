//! Prints a counterexample as the steps taken and, after each, what Redis (primary and replica)
//! and the database hold, so a reader can follow it without the full state dump.

use crate::protocol::{Action, SeatRush, State};
use crate::scripts::Redis;
use stateright::Path;

pub fn print(_model: &SeatRush, path: Path<State, Action>) {
    let steps = path.into_vec();
    for (i, pair) in steps.windows(2).enumerate() {
        let ((before, action), (after, _)) = (&pair[0], &pair[1]);
        let action = action.expect("every step but the last has an action");
        println!("  {:>2}. {}\n        -> {}", i + 1, describe(before, action), summary(after));
    }
}

/// The action, with the request or job it moves spelled out.
fn describe(s: &State, action: Action) -> String {
    match action {
        Action::Step { request, acked } => {
            let r = s.requests.iter().find(|r| r.id == request).expect("in flight");
            let wait = if matches!(r.pc, crate::actors::Pc::Wait { .. }) {
                if acked {
                    " (acked)"
                } else {
                    " (short)"
                }
            } else {
                ""
            };
            format!("request a{} (client {}, nonce {}, serve {}) {:?}{wait}", r.id, r.client, r.nonce, r.serve, r.pc)
        }
        Action::JobStep { job, acked } => {
            let j = &s.jobs[job as usize];
            let wait = if matches!(j.tasks[0], crate::actors::Task::ReleaseWait { .. }) {
                if acked {
                    " (acked)"
                } else {
                    " (short)"
                }
            } else {
                ""
            };
            format!("serve {} {:?}: {:?}{wait}", j.serve, j.kind, j.tasks[0])
        }
        other => format!("{other:?}"),
    }
}

fn redis(r: &Redis) -> String {
    let records: Vec<String> = r
        .records
        .iter()
        .enumerate()
        .filter_map(|(c, rec)| {
            rec.map(|x| {
                format!(
                    "c{c}:n{}/a{} seat {}{}",
                    x.nonce,
                    x.aid,
                    x.slot,
                    if r.pending & (1 << c) != 0 { " pending" } else { "" }
                )
            })
        })
        .collect();
    let free: Vec<String> = (0..16).filter(|b| r.free & (1 << b) != 0).map(|b| (b + 1).to_string()).collect();
    let moves: Vec<String> = r
        .moves
        .iter()
        .enumerate()
        .filter_map(|(c, m)| m.map(|m| format!("c{c}: move {} seat {} -> {}", m.mid, m.old_slot, m.new_slot)))
        .collect();
    let markers = if moves.is_empty() { String::new() } else { format!(" markers [{}]", moves.join(", ")) };
    let state = if r.loaded { "" } else { " NOT LOADED" };
    format!("taken {:?} [{}] free [{}]{markers}{state}", r.taken, records.join(", "), free.join(" "))
}

/// What Redis (primary, and how many writes the replica lacks) and the database hold.
fn summary(s: &State) -> String {
    let rows: Vec<String> = s
        .db
        .rows
        .iter()
        .enumerate()
        .filter_map(|(c, row)| {
            row.map(|r| {
                let flags =
                    format!("{}{}", if r.expired { " expired" } else { "" }, if r.synced { "" } else { " unsynced" });
                format!("c{c}:n{}/a{} {:?}{flags}", r.nonce, r.aid, r.state)
            })
        })
        .collect();
    let old = match &s.redis.old {
        Some(old) => format!(" | old primary (serve {}) {}", old.serve, redis(&old.redis)),
        None => String::new(),
    };
    format!(
        "primary {} | replica lacks {} write(s){old} | db [{}]{}",
        redis(&s.redis.primary),
        s.redis.backlog.len(),
        rows.join(", "),
        if s.heal_wanted { " | heal wanted" } else { "" }
    )
}
