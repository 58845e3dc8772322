//! The bodies of `Model::actions` and `Model::next_state`: which steps are enabled in a state,
//! and what each does. Each request and job step maps to one call in the real code (MODEL.md).

use crate::actors::{Answer, Job, JobKind, PassKind, Pc, Request, Task};
use crate::arbiter::{ClaimOutcome, HoldOutcome, MoveOutcome, RowState};
use crate::protocol::{admission_id, bit, Action, SeatRush, State};
use crate::replication::Conn;
use crate::scripts::{AdmitReply, Call, Record};

pub fn enabled(m: &SeatRush, s: &State, out: &mut Vec<Action>) {
    let b = &m.bounds;
    for (c, client) in s.clients.iter().enumerate() {
        let c = c as u8;
        // A client still waiting may time out and send again: its earlier request goes on
        // without anyone listening.
        if client.requests_used < b.requests[c as usize] {
            // Only after close can a cached view be stale in a way the model sees.
            let views: &[bool] = if s.closed { &[false, true] } else { &[false] };
            for &stale in views {
                if client.nonces_used > 0 && !client.settled {
                    out.push(Action::Book { client: c, fresh: false, stale });
                }
                if client.nonces_used < b.nonces[c as usize] {
                    out.push(Action::Book { client: c, fresh: true, stale });
                }
            }
        }
        if let Some(row) = s.db.rows[c as usize] {
            let running = row.state == RowState::Held && !row.expired;
            if running && s.spent.pays < b.pays {
                out.push(Action::Pay { client: c });
            }
            // Holds last minutes, a request's last steps milliseconds: a hold does not run out
            // between the database deciding a 201 and the 201 going out.
            if running && !s.requests.iter().any(|r| r.client == c && r.pc.answering_admitted()) {
                out.push(Action::HoldRunsOut { client: c });
            }
            if row.holds_seat() && s.spent.cancels < b.cancels {
                out.push(Action::Cancel { client: c });
            }
            if row.holds_seat() && s.spent.moves < b.moves {
                out.push(Action::Move { client: c });
            }
        }
    }
    for r in &s.requests {
        if let Pc::Wait { epoch, .. } = r.pc {
            if epoch == s.redis.epoch_of(r.serve) {
                out.push(Action::Step { request: r.id, acked: true });
            }
        }
        out.push(Action::Step { request: r.id, acked: false });
    }
    let passes = s.jobs.iter().filter(|j| matches!(j.kind, JobKind::Pass(_))).count();
    for serve in (0..b.serves).filter(|_| passes < b.passes_at_once as usize) {
        let busy = s.jobs.iter().any(|j| j.serve == serve && matches!(j.kind, JobKind::Pass(_)));
        if !busy && next_stage(s, serve, None).is_some() {
            out.push(Action::StartPass { serve });
        }
    }
    for (j, job) in s.jobs.iter().enumerate() {
        if let Task::ReleaseWait { epoch, .. } | Task::MoveWait { epoch, .. } = job.tasks[0] {
            if epoch == s.redis.epoch_of(job.serve) {
                out.push(Action::JobStep { job: j as u8, acked: true });
            }
        }
        out.push(Action::JobStep { job: j as u8, acked: false });
    }
    // One promotion at a time: the other kinds of failover are not combined with an old primary
    // still running.
    let old = s.redis.old.is_some();
    if s.spent.failovers < b.failovers && !old {
        for received in 0..=s.redis.backlog.len() as u8 {
            out.push(Action::Failover { received });
        }
    }
    if s.spent.crashes < b.crashes {
        for serve in 0..b.serves {
            if s.requests.iter().any(|r| r.serve == serve) || s.jobs.iter().any(|j| j.serve == serve) {
                out.push(Action::Crash { serve });
            }
        }
    }
    if s.spent.closes < b.closes {
        out.push(Action::Close);
    }
    if s.spent.rack_failovers < b.rack_failovers && !old {
        if s.spent.lag_syncs < b.lag_syncs {
            out.push(Action::LagSync);
        }
        out.push(Action::RackFailover);
    }
    if s.spent.splits < b.splits && !old {
        for serve in 0..b.serves {
            out.push(Action::Split { serve });
        }
    }
    if old {
        out.push(Action::Rejoin);
    }
    if s.spent.wipes < b.wipes {
        out.push(Action::Wipe);
    }
    // One heal at a time (the operator lock: a serve that finds it taken keeps its evidence and
    // asks again), started by evidence. Which serve heals matters only while one of them still
    // reaches an old primary.
    if (s.heal_wanted || b.sweep) && s.spent.heals < b.heals && !s.jobs.iter().any(|j| j.kind == JobKind::Heal) {
        for serve in 0..if old { b.serves } else { 1 } {
            out.push(Action::StartHeal { serve });
        }
    }
}

pub fn apply(m: &SeatRush, s: &mut State, action: Action) {
    step(m, s, action);
    // With no failover left, the replica's progress can no longer be observed (a WAIT may be
    // acknowledged or fall short either way): keep it caught up, so that states differing only in
    // the history of writes it lacks are one state.
    if s.spent.failovers >= m.bounds.failovers {
        s.redis.replicate_all(m.caps());
    }
    // Before Redis lost anything a heal finds nothing to repair (it is idempotent: a heal of a
    // healthy event only reads), so evidence then is dropped, which keeps such states one state
    // and keeps a heal from hiding what a bug switch breaks. The sweep world explores it.
    if !s.ghost.lost_acked && !m.bounds.sweep {
        s.heal_wanted = false;
    }
}

fn step(m: &SeatRush, s: &mut State, action: Action) {
    match action {
        Action::Book { client, fresh, stale } => book(m, s, client, fresh, stale),
        Action::Step { request, acked } => {
            let i = s.requests.iter().position(|r| r.id == request).expect("enabled only in flight");
            request_step(m, s, i, acked);
        }
        Action::StartPass { serve } => {
            let (stage, tasks) = next_stage(s, serve, None).expect("enabled only with work to do");
            s.jobs.push(Job { serve, kind: JobKind::Pass(stage), tasks });
        }
        Action::JobStep { job, acked } => job_step(m, s, job as usize, acked),
        Action::Pay { client } => {
            s.spent.pays += 1;
            s.db.pay(client);
        }
        Action::Cancel { client } => {
            s.spent.cancels += 1;
            let serve = client % m.bounds.serves;
            s.jobs.push(Job { serve, kind: JobKind::Cancel, tasks: vec![Task::Cancel { code: client }] });
        }
        Action::HoldRunsOut { client } => {
            s.db.rows[client as usize].as_mut().expect("enabled only with a row").expired = true;
        }
        Action::Failover { received } => {
            s.spent.failovers += 1;
            s.ghost.lost_writes |= s.redis.backlog.len() > received as usize;
            s.redis.failover(m.caps(), received as usize);
        }
        Action::Crash { serve } => {
            s.spent.crashes += 1;
            // Restarted, the serve reaches the new primary, and its first check sweeps every
            // open event (it has no replication id to compare with). Other crashes are not
            // evidence in the model: the sweeps are left out (MODEL.md), so that the guards a
            // crash tests are checked without a heal behind them.
            if s.redis.old.as_ref().is_some_and(|o| o.serve == serve) {
                s.ghost.lost_acked |= s.redis.rejoin();
                s.heal_wanted = true;
            }
            s.requests.retain(|r| r.serve != serve);
            s.jobs.retain(|j| j.serve != serve);
            s.redis.forget_connections(serve);
        }
        Action::Close => {
            s.spent.closes += 1;
            // close.lua sets the state in Redis; modelled as reaching the replica too (a close
            // a failover loses is the heal's to restore from the database).
            s.closed = true;
            s.redis.primary.closed = true;
            s.redis.replica.closed = true;
            s.redis.lagging.closed = true;
        }
        Action::LagSync => {
            s.spent.lag_syncs += 1;
            s.redis.lag_sync();
        }
        Action::RackFailover => {
            s.spent.rack_failovers += 1;
            s.ghost.lost_acked |= s.redis.lagging != s.redis.primary;
            s.redis.rack_failover();
            s.heal_wanted |= !m.switches.replid_not_watched;
        }
        Action::Split { serve } => {
            s.spent.splits += 1;
            s.redis.split(m.caps(), serve);
            // The other serves see the new primary's replication id.
            s.heal_wanted |= !m.switches.replid_not_watched;
        }
        Action::Rejoin => {
            s.ghost.lost_acked |= s.redis.rejoin();
            s.heal_wanted |= !m.switches.replid_not_watched;
        }
        Action::Wipe => {
            s.spent.wipes += 1;
            s.redis.wipe();
            s.ghost.lost_acked = true;
            s.heal_wanted |= !m.switches.replid_not_watched;
        }
        Action::StartHeal { serve } => {
            s.spent.heals += 1;
            s.heal_wanted = false;
            s.jobs.push(Job { serve, kind: JobKind::Heal, tasks: vec![Task::HealReadRedis] });
        }
        Action::Move { client } => {
            let mid = s.spent.moves;
            s.spent.moves += 1;
            // The operator's read of the row; by the time the script runs it may be stale.
            let row = s.db.rows[client as usize].expect("enabled only with a row");
            let level = (row.level + 1) % m.caps().len() as u8;
            let task = Task::MoveScript { code: client, nonce: row.nonce, aid: row.aid, level, mid };
            s.jobs.push(Job { serve: client % m.bounds.serves, kind: JobKind::Move, tasks: vec![task] });
        }
    }
}

/// A client sends a request; the read-only gates run as it arrives. After `close` only a retry
/// whose nonce the code's record carries goes on
/// (docs/design.md#a-retry-is-recognised-before-a-gate-refuses-it); a stale cached view
/// (`stale`) lets a fresh request through to admit.lua, whose own window check refuses it.
fn book(m: &SeatRush, s: &mut State, c: u8, fresh: bool, stale: bool) {
    let gate_closed = s.closed && !stale;
    let b = &m.bounds;
    if let Some(earlier) = s.requests.iter_mut().find(|r| r.client == c && r.listened) {
        earlier.listened = false;
    }
    let client = &mut s.clients[c as usize];
    let k = client.requests_used;
    client.requests_used += 1;
    if fresh {
        client.nonces_used += 1;
    }
    client.settled = false;
    let nonce = client.nonces_used - 1;
    let request = Request {
        id: admission_id(c, k),
        client: c,
        nonce,
        level: b.client_levels[c as usize],
        serve: (c + k) % b.serves,
        listened: true,
        retry_only: gate_closed,
        pc: Pc::Admit,
    };
    let retry_of_record = s.redis.side(request.serve).records[c as usize].is_some_and(|r| r.nonce == nonce);
    s.requests.push(request);
    if gate_closed && !retry_of_record {
        // The window's refusal is not final for an attempt whose seat the database holds.
        if m.switches.refusal_not_checked {
            finish(s, s.requests.len() - 1, Answer::Closed);
        } else {
            s.requests.last_mut().expect("pushed").pc = Pc::CheckRow { answer: Answer::Closed };
        }
    }
}

fn request_step(m: &SeatRush, s: &mut State, i: usize, acked: bool) {
    let r = s.requests[i];
    let code = r.client;
    let next = match r.pc {
        Pc::Admit => {
            let window = !m.switches.window_not_in_script;
            let call =
                Call::Admit { code, nonce: r.nonce, level: r.level, aid: r.id, retry_only: r.retry_only, window };
            let (reply, _) = s.redis.run_at(r.serve, m.caps(), call, Some(Conn::Committer(r.serve)), true);
            // A final refusal reads the code's row first (Sale::script_refusal).
            let refused = |answer: Answer| {
                if m.switches.refusal_not_checked {
                    None
                } else {
                    Some(Pc::CheckRow { answer })
                }
            };
            let answer = match reply.expect("admit replies") {
                AdmitReply::Admitted(adm) => {
                    if adm.aid == r.id {
                        s.ghost.born |= bit(r.id);
                        s.ghost.admitted_after_close |= s.closed;
                    }
                    s.requests[i].pc = Pc::Wait { adm, epoch: s.redis.epoch_of(r.serve) };
                    return;
                }
                AdmitReply::AlreadyAdmitted => Answer::AlreadyAdmitted,
                AdmitReply::LevelFull => Answer::LevelFull,
                AdmitReply::SoldOut => Answer::SoldOut,
                AdmitReply::Closed => Answer::Closed,
                // The record changed between the gate's read and the script: the gate's refusal
                // stands once the row is read (Sale::script_refusal's NotARetry arm).
                AdmitReply::NotARetry if !m.switches.not_a_retry_unread => Answer::Closed,
                AdmitReply::NotARetry => return finish(s, i, Answer::Closed),
                AdmitReply::NotLoaded => {
                    s.heal_wanted = true;
                    return finish(s, i, Answer::Retry);
                }
                AdmitReply::UnknownLevel => unreachable!("the shape gate refuses unknown levels"),
            };
            match refused(answer) {
                Some(pc) => pc,
                None => return finish(s, i, answer),
            }
        }
        Pc::CheckRow { answer } => return check_row(m, s, i, answer),
        // The connection reached a primary that has since failed over: a Redis error, 503, and
        // the admission (if the new primary has it) stays pending for the reaper.
        Pc::Wait { epoch, .. } if epoch != s.redis.epoch_of(r.serve) => return finish(s, i, Answer::Retry),
        Pc::Wait { adm, .. } if acked => {
            s.redis.acknowledge_at(r.serve, m.caps(), Conn::Committer(r.serve));
            Pc::Hold { adm }
        }
        Pc::Wait { adm, .. } => settle(m, adm, false, Answer::Retry),
        Pc::Hold { adm } => match s.db.hold(m.caps(), m.bounds.seats, code, adm) {
            HoldOutcome::Held => Pc::Persist { adm, answer: Answer::Admitted(adm.aid), fresh: true },
            // Never a 201 whose payment window has already run out.
            HoldOutcome::AlreadyHeld { expired: true } => Pc::Persist { adm, answer: Answer::Retry, fresh: false },
            HoldOutcome::AlreadyHeld { expired: false } => {
                Pc::Persist { adm, answer: Answer::Admitted(adm.aid), fresh: false }
            }
            HoldOutcome::SameNonceHolds(row) => {
                let ran_out = row.state == RowState::Held && row.expired;
                settle(m, adm, false, if ran_out { Answer::Retry } else { Answer::Admitted(row.aid) })
            }
            // The row says released for this admission, so its undo is safe.
            HoldOutcome::ReaperWon => Pc::Undo { adm, seat_held: false, answer: Answer::Retry },
            // Redis handed out a code or a seat the database holds: it lost their holder.
            HoldOutcome::CodeHasSeat => {
                s.heal_wanted = true;
                settle(m, adm, false, Answer::AlreadyAdmitted)
            }
            HoldOutcome::LevelFull => settle(m, adm, false, Answer::LevelFull),
            HoldOutcome::SoldOut => settle(m, adm, false, Answer::SoldOut),
            HoldOutcome::SeatTaken => {
                s.heal_wanted = true;
                settle(m, adm, true, Answer::Retry)
            }
            HoldOutcome::Spent(told) => settle(m, adm, false, told),
        },
        Pc::Persist { adm, answer, fresh } => {
            let call = Call::Persisted { code, aid: adm.aid, by_code: m.switches.mark_by_code };
            let (_, dropped) = s.redis.run_at(r.serve, m.caps(), call, None, true);
            // A fresh hold is still pending: an entry that is gone was lost with Redis's data
            // (a hold that landed after a rebuild or a heal read the holders).
            if fresh && !dropped && !m.switches.late_hold_no_heal {
                s.heal_wanted = true;
            }
            return finish(s, i, answer);
        }
        Pc::Settle { adm, seat_held, answer } => match s.db.claim_released(code, adm, m.arbiter()) {
            ClaimOutcome::Released | ClaimOutcome::OtherHolds => Pc::Undo { adm, seat_held, answer },
            ClaimOutcome::Persisted => Pc::Persist { adm, answer, fresh: false },
        },
        Pc::Undo { adm, seat_held, answer } => {
            let call = Call::Undo { code, nonce: adm.nonce, aid: adm.aid, seat_held };
            s.redis.run_at(r.serve, m.caps(), call, None, true);
            return finish(s, i, answer);
        }
    };
    s.requests[i].pc = next;
}

/// Every undo goes through the arbiter, unless `old_undo_guard` restores today's bare undo.
fn settle(m: &SeatRush, adm: Record, seat_held: bool, answer: Answer) -> Pc {
    if m.switches.old_undo_guard {
        Pc::Undo { adm, seat_held, answer }
    } else {
        Pc::Settle { adm, seat_held, answer }
    }
}

/// A final refusal's read of the code's row (`Sale::script_refusal`; the gate's `closed`,
/// `Sale::attempt_row`): a seat held for this nonce is the answer, as for any retry (unless its
/// hold ran out), and Redis, which refused it, lost its record: evidence for the heal.
fn check_row(m: &SeatRush, s: &mut State, i: usize, answer: Answer) {
    let r = s.requests[i];
    let row = s.db.rows[r.client as usize].filter(|row| row.holds_seat());
    let told = match row {
        Some(row) if row.nonce != r.nonce && matches!(answer, Answer::LevelFull | Answer::SoldOut) => {
            Answer::AlreadyAdmitted
        }
        _ => answer,
    };
    // The fence: in the same step as the read, the attempt is spent unless the row holds a seat
    // for this very nonce.
    if row.is_none_or(|row| row.nonce != r.nonce) {
        if !m.switches.refusal_not_fenced {
            s.db.spend(r.client, r.nonce, told);
        }
        s.ghost.checked_refusals.push((r.client, r.nonce));
        s.ghost.checked_refusals.sort_unstable();
        s.ghost.checked_refusals.dedup();
    }
    let Some(row) = row else {
        return finish(s, i, answer);
    };
    if row.nonce == r.nonce {
        s.heal_wanted = true;
        let ran_out = row.state == RowState::Held && row.expired;
        return finish(s, i, if ran_out { Answer::Retry } else { Answer::Admitted(row.aid) });
    }
    let answer = match answer {
        // Redis counted the level full or sold out for a code the database says holds a seat:
        // it had no record for the code, so it lost it.
        Answer::LevelFull | Answer::SoldOut => {
            s.heal_wanted = true;
            Answer::AlreadyAdmitted
        }
        other => other,
    };
    finish(s, i, answer)
}

/// The request answers: the client hears it if it still waits; the ghost remembers it.
fn finish(s: &mut State, i: usize, answer: Answer) {
    let r = s.requests.remove(i);
    let code = r.client as usize;
    if answer.is_refusal() && s.db.rows[code].is_some_and(|row| row.holds_seat() && row.nonce == r.nonce) {
        s.ghost.refused_while_held = true;
    }
    match answer {
        Answer::Admitted(aid) => {
            s.ghost.told[code] |= bit(aid);
            let row = s.db.rows[code].filter(|row| row.aid == aid);
            if row.is_some_and(|row| row.expired && row.state != RowState::Paid) {
                s.ghost.expired_201 = true;
            }
        }
        a if a.is_refusal() => {
            // After a loss, an admission whose database write is still to come may have lost its
            // record, and a retry's read of the row can run before that write lands: the retry
            // is refused although its seat is held a moment later (docs/design.md "Not built
            // yet"). Such admissions are not held against this refusal.
            let writing = s
                .requests
                .iter()
                .filter(|q| s.ghost.lost_acked && matches!(q.pc, Pc::Wait { .. } | Pc::Hold { .. }))
                .fold(0, |bits, q| bits | bit(q.id));
            s.ghost.refusals.push((r.client, r.nonce, s.ghost.born & !writing));
            s.ghost.refusals.sort_unstable();
            s.ghost.refusals.dedup();
        }
        _ => {}
    }
    if r.listened {
        s.clients[code].settled = answer != Answer::Retry;
    }
}

/// The first stage after `after` whose list (read now) is not empty, with that list.
fn next_stage(s: &State, serve: u8, after: Option<PassKind>) -> Option<(PassKind, Vec<Task>)> {
    [PassKind::Reap, PassKind::Expire, PassKind::Sync, PassKind::Moves]
        .into_iter()
        .filter(|&k| after.is_none_or(|a| k > a))
        .map(|k| (k, pass_list(s, serve, k)))
        .find(|(_, tasks)| !tasks.is_empty())
}

/// A background stage reads its list now and works through it later.
fn pass_list(s: &State, serve: u8, kind: PassKind) -> Vec<Task> {
    let rows = s.db.rows.iter().enumerate().filter_map(|(c, r)| r.map(|r| (c as u8, r)));
    let redis = s.redis.side(serve);
    match kind {
        PassKind::Reap => (0..s.clients.len() as u8)
            .filter(|&c| redis.pending & (1 << c) != 0)
            .filter_map(|c| redis.records[c as usize].map(|adm| Task::ReapClaim { code: c, adm }))
            .collect(),
        PassKind::Expire => rows
            .filter(|(_, r)| r.state == RowState::Held && r.expired)
            .map(|(code, r)| Task::Expire { code, aid: r.aid })
            .collect(),
        // Not loaded: a rebuild may still install these rows' records (Sale::sync_releases_once).
        PassKind::Sync if !redis.loaded => Vec::new(),
        PassKind::Sync => rows
            .filter(|(_, r)| r.state == RowState::Released && !r.synced)
            .map(|(code, r)| Task::ReleaseScript { code, adm: r.record() })
            .collect(),
        PassKind::Moves => (0..s.clients.len() as u8)
            .filter_map(|c| redis.moves[c as usize].map(|mk| Task::MoveGiveUp { code: c, mid: mk.mid }))
            .collect(),
    }
}

fn job_step(m: &SeatRush, s: &mut State, j: usize, acked: bool) {
    let serve = s.jobs[j].serve;
    let next = match s.jobs[j].tasks[0] {
        Task::ReapClaim { code, adm } => match s.db.claim_released(code, adm, m.arbiter()) {
            ClaimOutcome::Released | ClaimOutcome::OtherHolds => Some(Task::ReapUndo { code, adm }),
            ClaimOutcome::Persisted => Some(Task::ReapPersisted { code, adm }),
        },
        Task::ReapUndo { code, adm } => {
            let call = Call::Undo { code, nonce: adm.nonce, aid: adm.aid, seat_held: false };
            s.redis.run_at(serve, m.caps(), call, None, true);
            None
        }
        Task::ReapPersisted { code, adm } => {
            let call = Call::Persisted { code, aid: adm.aid, by_code: m.switches.mark_by_code };
            s.redis.run_at(serve, m.caps(), call, None, true);
            None
        }
        Task::Expire { code, aid } => s.db.expire(code, aid).map(|row| {
            s.ghost.released_legitimately |= bit(row.aid);
            Task::ReleaseScript { code, adm: row.record() }
        }),
        Task::Cancel { code } => s.db.cancel(code).map(|row| {
            s.ghost.released_legitimately |= bit(row.aid);
            Task::ReleaseScript { code, adm: row.record() }
        }),
        // Not loaded: the row stays unsynced; a rebuild may still install its record
        // (Sale::release_and_wait).
        Task::ReleaseScript { .. } if !s.redis.side(serve).loaded => None,
        Task::ReleaseScript { code, adm } => {
            let call = Call::Release { code, nonce: adm.nonce, aid: adm.aid };
            s.redis.run_at(serve, m.caps(), call, Some(Conn::Release(serve)), !m.switches.release_without_write);
            if m.switches.release_without_wait {
                Some(Task::MarkSynced { code, aid: adm.aid })
            } else {
                Some(Task::ReleaseWait { code, adm, epoch: s.redis.epoch_of(serve) })
            }
        }
        // Acknowledged: the row is marked synced (conditional on the same admission, released) in
        // the same step; the gap between the two only delays the mark, like a short WAIT would.
        // Short, or the connection broke in a failover: the row stays unsynced for the next pass.
        Task::ReleaseWait { code, adm, epoch } => {
            if acked && epoch == s.redis.epoch_of(serve) {
                s.redis.acknowledge_at(serve, m.caps(), Conn::Release(serve));
                s.db.mark_synced(code, adm.aid);
            }
            None
        }
        Task::MarkSynced { code, aid } => {
            s.db.mark_synced(code, aid);
            None
        }
        task @ (Task::HealReadRedis
        | Task::HealReadDb { .. }
        | Task::HealFree { .. }
        | Task::HealAdd { .. }
        | Task::HealSeats { .. }
        | Task::HealRecheck { .. }
        | Task::RebuildRead
        | Task::RebuildSwitch { .. }) => crate::heal::step(m, s, serve, task),
        Task::MoveScript { code, nonce, aid, level, .. } if m.switches.move_in_two_steps => {
            two_step_free(m, s, code, nonce, aid, level).then_some(Task::TwoStepTake { code, nonce, aid, level })
        }
        Task::TwoStepTake { code, nonce, aid, level } => {
            two_step_take(m, s, code, nonce, aid, level);
            None
        }
        Task::MoveScript { code, nonce, aid, level, mid } => {
            let from = s.redis.side(serve).records[code as usize];
            let call = Call::Move { code, nonce, aid, level, mid };
            let (_, moved) = s.redis.run_at(serve, m.caps(), call, Some(Conn::Release(serve)), true);
            match (moved, from, s.redis.side(serve).records[code as usize]) {
                (true, Some(from), Some(to)) => {
                    Some(Task::MoveWait { code, mid, from, to, epoch: s.redis.epoch_of(serve) })
                }
                _ => None,
            }
        }
        Task::MoveWait { code, mid, from, to, epoch } => {
            if acked && epoch == s.redis.epoch_of(serve) {
                s.redis.acknowledge_at(serve, m.caps(), Conn::Release(serve));
                Some(Task::MoveDb { code, mid, from, to })
            } else {
                Some(Task::MoveGiveUp { code, mid })
            }
        }
        Task::MoveDb { code, mid, from, to } => match s.db.move_row(m.caps(), code, mid, from, to) {
            MoveOutcome::Moved => {
                s.ghost.moved = true;
                Some(Task::MoveSettle { code, mid, done: true })
            }
            MoveOutcome::Refused | MoveOutcome::GivenUp => Some(Task::MoveGiveUp { code, mid }),
        },
        Task::MoveGiveUp { code, mid } => Some(Task::MoveSettle { code, mid, done: s.db.claim_move(mid) }),
        Task::MoveSettle { code, mid, done } => {
            s.redis.run_at(serve, m.caps(), Call::MoveSettle { code, mid, done }, None, true);
            None
        }
    };
    let job = &mut s.jobs[j];
    match next {
        Some(task) => job.tasks[0] = task,
        None => {
            job.tasks.remove(0);
            if job.tasks.is_empty() {
                let next = match job.kind {
                    JobKind::Pass(stage) => next_stage(s, serve, Some(stage)),
                    JobKind::Cancel | JobKind::Heal | JobKind::Move => None,
                };
                match next {
                    Some((stage, tasks)) => s.jobs[j] = Job { serve, kind: JobKind::Pass(stage), tasks },
                    None => {
                        s.jobs.remove(j);
                    }
                }
            }
        }
    }
}

/// `move_in_two_steps`, first step: with room in the new level (checked first, as an operator
/// would), the booking is released in the database and in Redis. False when refused.
fn two_step_free(m: &SeatRush, s: &mut State, code: u8, nonce: u8, aid: u8, level: u8) -> bool {
    let c = code as usize;
    let holds = s.db.rows[c].is_some_and(|r| r.aid == aid && r.holds_seat());
    if !holds || s.redis.primary.taken[level as usize] >= m.caps()[level as usize] {
        return false;
    }
    if let Some(row) = s.db.rows[c].as_mut() {
        row.state = RowState::Released;
    }
    s.redis.run(m.caps(), Call::TwoStepFree { code, nonce, aid }, None, true);
    true
}

/// `move_in_two_steps`, second step: the admission to the new level, in Redis then the database,
/// if there is still room and a seat.
fn two_step_take(m: &SeatRush, s: &mut State, code: u8, nonce: u8, aid: u8, level: u8) {
    let (_, taken) = s.redis.run(m.caps(), Call::TwoStepTake { code, nonce, aid, level }, None, true);
    let Some(rec) = s.redis.primary.records[code as usize].filter(|_| taken) else { return };
    let seat_free = !s.db.rows.iter().flatten().any(|r| r.holds_seat() && r.slot == rec.slot);
    if seat_free && s.db.holders(level) < m.caps()[level as usize] as usize {
        if let Some(row) = s.db.rows[code as usize].as_mut() {
            *row = crate::arbiter::Row { slot: rec.slot, level, state: RowState::Held, ..*row };
            s.ghost.moved = true;
        }
    }
}
