//! The draw at the opening (issue 31, docs/design.md#the-draw-at-the-opening), model-checked in a
//! world of its own: candidates entering in the window, two drawers (serves) that take the draw
//! lock, freeze the entries, and admit the undecided entries batch by batch in rank order (admit
//! and mark in one `MULTI` under `WATCH` of the marks), `WAIT`, the database write; a drawer's
//! crash, the lock expiring under a stalled drawer, a failover (the replica holds the primary's
//! state as of the last acknowledged `WAIT`), and a cancel of a drawn seat.
//!
//! The real code: `src/sale/draw.rs` (`Sale::run_draw`, `draw_locked`, `draw_batch`,
//! `wait_for_replica`), `lua/draw_enter.lua`, `lua/draw_start.lua`, `lua/draw_mark.lua`,
//! `lua/draw_finish.lua`, and admit.lua's check 1 (a record with the entry's nonce is the
//! original admission). Properties: an entry is admitted by the draw at most once; the marks
//! are always a prefix of the rank order (nobody overtaken, a lost batch redone first); Redis never
//! hands out more seats than there are; once the draw is done and quiet, the first `seats` ranks
//! each hold (or held) a seat: a failover or a crash loses nobody's place.
//!
//! The switch `draw_without_watch` drops the `WATCH`: a drawer whose lock expired while it
//! stalled, holding marks read before another drawer decided its batch, admits an entry whose
//! seat was since cancelled a second time.

use stateright::{Checker, HasDiscoveries, Model, Property};
use std::time::Instant;

/// Entries (candidates) and seats.
const CODES: usize = 3;
const SEATS: u8 = 2;
/// Entries admitted per `MULTI` (the code's `DRAW_BATCH`, scaled down).
const BATCH: usize = 2;
const DRAWERS: usize = 2;

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Outcome {
    Admitted,
    SoldOut,
}

/// Redis: the keys the draw touches, for one event.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Redis {
    /// draw_enter.lua's entries (a bit per code).
    entered: [bool; CODES],
    /// draw_start.lua ran: no more entries.
    started: bool,
    done: bool,
    /// The admission record per code (its admission id), from admit.lua.
    adm: [Option<u8>; CODES],
    free: u8,
    /// draw_mark.lua's marks.
    marks: [Option<Outcome>; CODES],
    /// Bumped by every write of the marks: what `WATCH` compares.
    marks_version: u8,
    /// The draw lock's holder.
    lock: Option<u8>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Pc {
    Idle,
    /// Holds (or held) the lock; next: start, or read the marks.
    Locked,
    /// Read the marks (at `version`) and chose this batch, in rank order; the lock was its own.
    Read {
        version: u8,
        batch: Vec<u8>,
    },
    /// The `MULTI` ran; these admissions (code, admission id) wait for a replica.
    Wait {
        admitted: Vec<(u8, u8)>,
    },
    /// Acknowledged: the database writes.
    Persist {
        admitted: Vec<(u8, u8)>,
    },
}

/// The database row per code: the admission holding it, and whether it is released.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
struct Row {
    admission: u8,
    released: bool,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct DrawState {
    primary: Redis,
    /// The replica: the primary as of the last acknowledged `WAIT`.
    replica: Redis,
    drawers: [Pc; DRAWERS],
    rows: [Option<Row>; CODES],
    /// Ghost: the distinct draw admissions the database held per code.
    granted: [u8; CODES],
    next_admission: u8,
    crashes: u8,
    expiries: u8,
    failovers: u8,
    cancels: u8,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DrawAction {
    Enter(u8),
    Drawer(u8),
    /// The `WAIT` of a drawer in `Wait` is acknowledged.
    Acked(u8),
    Crash(u8),
    LockExpires,
    Failover,
    Cancel(u8),
}

#[derive(Clone, Copy, Debug, Default)]
pub struct DrawSwitches {
    pub draw_without_watch: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct DrawBounds {
    pub crashes: u8,
    pub expiries: u8,
    pub failovers: u8,
    pub cancels: u8,
}

pub struct DrawModel {
    pub bounds: DrawBounds,
    pub switches: DrawSwitches,
}

/// The rank order over the entered set: a fixed function of the set (the real one is an HMAC
/// keyed by the secret over the set's digest and the code), never of arrival.
fn order(entered: &[bool; CODES]) -> Vec<u8> {
    let set: usize = entered.iter().enumerate().filter(|(_, e)| **e).map(|(i, _)| 1 << i).sum();
    let mut codes: Vec<u8> = (0..CODES as u8).filter(|c| entered[*c as usize]).collect();
    codes.sort_by_key(|c| (usize::from(*c) * 5 + set * 3) % 7);
    codes
}

impl DrawState {
    fn quiet(&self) -> bool {
        self.drawers.iter().all(|d| *d == Pc::Idle)
    }
}

impl Model for DrawModel {
    type State = DrawState;
    type Action = DrawAction;

    fn init_states(&self) -> Vec<DrawState> {
        let redis = Redis {
            entered: [false; CODES],
            started: false,
            done: false,
            adm: [None; CODES],
            free: SEATS,
            marks: [None; CODES],
            marks_version: 0,
            lock: None,
        };
        vec![DrawState {
            primary: redis.clone(),
            replica: redis,
            drawers: [Pc::Idle, Pc::Idle],
            rows: [None; CODES],
            granted: [0; CODES],
            next_admission: 1,
            crashes: 0,
            expiries: 0,
            failovers: 0,
            cancels: 0,
        }]
    }

    fn actions(&self, s: &DrawState, actions: &mut Vec<DrawAction>) {
        for c in 0..CODES as u8 {
            // Entering: every code enters in the window (which code enters before the freeze is
            // the interleaving); entries are replicated at once (their loss is another story:
            // docs/design.md#not-built-yet).
            if !s.primary.started && !s.primary.entered[c as usize] {
                actions.push(DrawAction::Enter(c));
            }
            if s.cancels < self.bounds.cancels && s.rows[c as usize].is_some_and(|r| !r.released) {
                actions.push(DrawAction::Cancel(c));
            }
        }
        for d in 0..DRAWERS as u8 {
            let pc = &s.drawers[d as usize];
            let idle_done = *pc == Pc::Idle && s.primary.done;
            if !idle_done {
                actions.push(DrawAction::Drawer(d));
            }
            if matches!(pc, Pc::Wait { .. }) {
                actions.push(DrawAction::Acked(d));
            }
            if s.crashes < self.bounds.crashes && *pc != Pc::Idle {
                actions.push(DrawAction::Crash(d));
            }
        }
        if s.expiries < self.bounds.expiries && s.primary.lock.is_some() {
            actions.push(DrawAction::LockExpires);
        }
        if s.failovers < self.bounds.failovers {
            actions.push(DrawAction::Failover);
        }
    }

    fn next_state(&self, s: &DrawState, action: DrawAction) -> Option<DrawState> {
        let mut n = s.clone();
        match action {
            DrawAction::Enter(c) => {
                n.primary.entered[c as usize] = true;
                n.replica.entered[c as usize] = true;
            }
            DrawAction::Cancel(c) => {
                // The release path: the row first, then release.lua (guarded by the admission id)
                // and a WAIT; modelled as one step, the kindest order for the draw.
                let row = n.rows[c as usize].as_mut()?;
                row.released = true;
                if n.primary.adm[c as usize] == Some(row.admission) {
                    n.primary.adm[c as usize] = None;
                    n.primary.free += 1;
                }
                n.replica = n.primary.clone();
                n.cancels += 1;
            }
            DrawAction::Crash(d) => {
                // The lock stays until it expires; nothing else of the drawer survives.
                n.drawers[d as usize] = Pc::Idle;
                n.crashes += 1;
            }
            DrawAction::LockExpires => {
                n.primary.lock = None;
                n.expiries += 1;
            }
            DrawAction::Failover => {
                // The promoted replica has what the last acknowledged WAIT covered; every
                // connection breaks: a drawer waiting or about to write gives up (its lock, on
                // the new primary as it was, expires in time).
                n.primary = n.replica.clone();
                for pc in &mut n.drawers {
                    if matches!(pc, Pc::Wait { .. } | Pc::Read { .. }) {
                        *pc = Pc::Idle;
                    }
                }
                n.failovers += 1;
            }
            DrawAction::Acked(d) => {
                let Pc::Wait { admitted } = &s.drawers[d as usize] else { return None };
                n.replica = n.primary.clone();
                n.drawers[d as usize] = Pc::Persist { admitted: admitted.clone() };
            }
            DrawAction::Drawer(d) => self.drawer_step(&mut n, d)?,
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("an entry is admitted by the draw at most once", |_, s: &DrawState| {
                s.granted.iter().all(|g| *g <= 1)
            }),
            Property::always("the marks are a prefix of the rank order", |_, s: &DrawState| {
                [&s.primary, &s.replica].iter().all(|r| {
                    let marked: Vec<bool> = order(&r.entered).iter().map(|c| r.marks[*c as usize].is_some()).collect();
                    marked.windows(2).all(|w| w[0] || !w[1])
                })
            }),
            Property::always("Redis hands out no more seats than there are", |_, s: &DrawState| {
                [&s.primary, &s.replica]
                    .iter()
                    .all(|r| r.adm.iter().filter(|a| a.is_some()).count() as u8 + r.free == SEATS)
            }),
            Property::always("done and quiet, the first ranks hold their seats", |_, s: &DrawState| {
                !(s.primary.done && s.quiet())
                    || order(&s.primary.entered).iter().take(SEATS as usize).all(|c| s.granted[*c as usize] >= 1)
            }),
            Property::sometimes("the draw is done", |_, s: &DrawState| s.primary.done && s.quiet()),
        ]
    }
}

impl DrawModel {
    /// One step of drawer `d`, as `Sale::run_draw` takes them.
    fn drawer_step(&self, n: &mut DrawState, d: u8) -> Option<()> {
        let me = Some(d);
        match n.drawers[d as usize].clone() {
            Pc::Idle => {
                // SET NX PX: the lock, if free.
                if n.primary.lock.is_some() || n.primary.done {
                    return None;
                }
                n.primary.lock = me;
                n.drawers[d as usize] = Pc::Locked;
            }
            Pc::Locked => {
                if n.primary.lock != me {
                    // draw_start / the lock check: not ours any more.
                    n.drawers[d as usize] = Pc::Idle;
                } else if !n.primary.started {
                    n.primary.started = true;
                } else {
                    let undecided: Vec<u8> = order(&n.primary.entered)
                        .into_iter()
                        .filter(|c| n.primary.marks[*c as usize].is_none())
                        .collect();
                    if undecided.is_empty() {
                        // The tail: marked admissions the database lacks are booked as their
                        // candidates' retries (admit check 1, WAIT, persist); then draw_finish.
                        for c in 0..CODES {
                            if n.primary.marks[c] == Some(Outcome::Admitted) {
                                if let Some(a) = n.primary.adm[c] {
                                    n.replica = n.primary.clone();
                                    hold(n, c, a);
                                }
                            }
                        }
                        n.primary.done = true;
                        n.primary.lock = None;
                        n.replica = n.primary.clone();
                        n.drawers[d as usize] = Pc::Idle;
                    } else {
                        let batch = undecided.into_iter().take(BATCH).collect();
                        n.drawers[d as usize] = Pc::Read { version: n.primary.marks_version, batch };
                    }
                }
            }
            Pc::Read { version, batch } => {
                // EXEC: aborted when the marks changed since the WATCH (the guard).
                if !self.switches.draw_without_watch && n.primary.marks_version != version {
                    n.drawers[d as usize] = Pc::Locked;
                    return Some(());
                }
                let mut admitted = vec![];
                for c in batch {
                    let c = c as usize;
                    let outcome = if let Some(a) = n.primary.adm[c] {
                        // admit.lua check 1: the record carries the entry's nonce.
                        admitted.push((c as u8, a));
                        Outcome::Admitted
                    } else if n.primary.free > 0 {
                        let a = n.next_admission;
                        n.next_admission += 1;
                        n.primary.free -= 1;
                        n.primary.adm[c] = Some(a);
                        admitted.push((c as u8, a));
                        Outcome::Admitted
                    } else {
                        Outcome::SoldOut
                    };
                    n.primary.marks[c] = Some(outcome);
                }
                n.primary.marks_version += 1;
                n.drawers[d as usize] = Pc::Wait { admitted };
            }
            // Waiting: only `Acked`, a crash or a failover moves it (a short WAIT is retried).
            Pc::Wait { .. } => return None,
            Pc::Persist { admitted } => {
                for (c, a) in admitted {
                    hold(n, c as usize, a);
                }
                n.drawers[d as usize] = Pc::Locked;
            }
        }
        Some(())
    }
}

/// The database write of a draw admission (the arbiter: a row released for another admission,
/// or none, is taken; the same admission again changes nothing).
fn hold(n: &mut DrawState, c: usize, admission: u8) {
    match n.rows[c] {
        Some(r) if r.admission == admission => {}
        Some(r) if !r.released => {}
        _ => {
            n.rows[c] = Some(Row { admission, released: false });
            n.granted[c] += 1;
        }
    }
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn bounds() -> DrawBounds {
    DrawBounds { crashes: 2, expiries: 2, failovers: 1, cancels: 1 }
}

#[test]
fn the_draw_keeps_every_property_through_a_crash_an_expiry_a_failover_and_a_cancel() {
    let started = Instant::now();
    let checker = DrawModel { bounds: bounds(), switches: DrawSwitches::default() }
        .checker()
        .threads(threads())
        .spawn_bfs()
        .join();
    println!(
        "draw: {} states ({} unique), max depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    for property in checker.model().properties() {
        if let Some(path) = checker.discovery(property.name) {
            if property.expectation == stateright::Expectation::Always {
                print_trace(path);
                panic!("the draw: {:?} does not hold", property.name);
            }
        }
    }
    assert!(checker.discovery("the draw is done").is_some(), "the draw can finish");
}

#[test]
fn draw_without_watch_admits_an_entry_twice() {
    let started = Instant::now();
    let checker = DrawModel { bounds: bounds(), switches: DrawSwitches { draw_without_watch: true } }
        .checker()
        .threads(threads())
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let name = "an entry is admitted by the draw at most once";
    let path = checker.discovery(name).unwrap_or_else(|| panic!("draw_without_watch: no counterexample"));
    println!(
        "draw_without_watch: {} states, {:.1} s; counterexample to {name:?}, {} steps:",
        checker.unique_state_count(),
        started.elapsed().as_secs_f64(),
        path.clone().into_actions().len()
    );
    print_trace(path);
}

fn print_trace(path: stateright::Path<DrawState, DrawAction>) {
    let steps = path.into_vec();
    for (i, pair) in steps.windows(2).enumerate() {
        let ((before, action), (after, _)) = (&pair[0], &pair[1]);
        let action = action.expect("every step but the last has an action");
        let what = match action {
            DrawAction::Drawer(d) => format!("drawer {d} {:?}", before.drawers[d as usize]),
            other => format!("{other:?}"),
        };
        let p = &after.primary;
        println!(
            "  {:>2}. {what}\n        -> lock {:?}, records {:?}, free {}, marks {:?} (v{}), rows {:?}, granted {:?}",
            i + 1,
            p.lock,
            p.adm,
            p.free,
            p.marks,
            p.marks_version,
            after.rows.map(|r| r.map(|r| (r.admission, r.released))),
            after.granted
        );
    }
}
