//! Each Lua script called directly against a real Redis: replies, guards, and error replies.

use crate::helpers::{nonce, spawn_app, AppOptions};
use seatrush::domain::admission::Admission;
use seatrush::domain::event::EventId;
use seatrush::domain::nonce::Nonce;
use seatrush::fault_hooks::FaultPlan;
use seatrush::redis_io::keys::{pending_member, EventKeys};
use seatrush::redis_io::scripts::{
    admit_replies, decode_attempt, decode_changed, persisted_call, run, AdmitArgs, AdmitReply, ScriptRefusal, Scripts,
};
use seatrush::sale::committer::{AckPolicy, AdmitCall, Committed, Committer};
use std::sync::Arc;
use std::time::Duration;

async fn admit(
    app: &crate::helpers::TestApp,
    code: &str,
    level: &str,
    n: &str,
    id: &str,
) -> Result<AdmitReply, redis::RedisError> {
    let scripts = Scripts::new();
    let mut conn = app.sale.link().check().await.unwrap();
    let cmd = scripts.admit_call(&app.keys, &app.hash(code), &Nonce::parse(n).unwrap(), level, id);
    AdmitReply::decode_single(run(&mut conn, &scripts.admit, &cmd).await?)
}

/// The database writer's mark of `batch` (one `ZREM`): the entries it dropped.
async fn mark(app: &crate::helpers::TestApp, batch: &[&Admission]) -> i64 {
    let mut conn = app.sale.link().check().await.unwrap();
    persisted_call(&app.keys, batch.iter().copied()).query_async(&mut conn).await.unwrap()
}

async fn back(app: &crate::helpers::TestApp, release: bool, adm: &Admission) -> bool {
    let scripts = Scripts::new();
    let (script, call) = if release {
        (&scripts.release, scripts.release_call(&app.keys, adm))
    } else {
        (&scripts.undo, scripts.undo_call(&app.keys, adm))
    };
    let mut conn = app.sale.link().check().await.unwrap();
    decode_changed(run(&mut conn, script, &call).await.unwrap()).unwrap()
}

fn admission(app: &crate::helpers::TestApp, code: &str, n: &str, reply: &AdmitReply) -> Admission {
    let AdmitReply::Admitted { slot, admitted_ms, admission, level } = reply.clone() else { panic!("{reply:?}") };
    Admission { code: app.hash(code), nonce: Nonce::parse(n).unwrap(), id: admission, slot, level, admitted_ms }
}

#[tokio::test]
async fn admit_returns_each_documented_reply_in_check_order() {
    let app =
        spawn_app(AppOptions { seats: 2, levels: vec![("A1", 1), ("B1", 2)], replica: false, ..Default::default() })
            .await;
    let n = nonce("n");
    let first = admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap();
    assert!(matches!(&first, AdmitReply::Admitted { slot: 1, admission, .. } if admission == "id-1"));
    // same nonce: the original, whatever the new call's level or admission id
    assert_eq!(admit(&app, "CODE-00001", "B1", &n, "id-2").await.unwrap(), first);
    assert_eq!(
        admit(&app, "CODE-00001", "A1", &nonce("m"), "id-3").await.unwrap(),
        AdmitReply::Refused(ScriptRefusal::AlreadyAdmitted)
    );
    assert_eq!(
        admit(&app, "CODE-00002", "A1", &nonce("m"), "id-4").await.unwrap(),
        AdmitReply::Refused(ScriptRefusal::LevelFull)
    );
    assert!(matches!(
        admit(&app, "CODE-00002", "B1", &nonce("m"), "id-5").await.unwrap(),
        AdmitReply::Admitted { slot: 2, .. }
    ));
    assert_eq!(
        admit(&app, "CODE-00003", "B1", &nonce("m"), "id-6").await.unwrap(),
        AdmitReply::Refused(ScriptRefusal::SoldOut)
    );
    let err = admit(&app, "CODE-00003", "ZZ", &nonce("m"), "id-7").await.unwrap_err();
    assert!(err.to_string().contains("unknown level"), "{err}");
}

#[tokio::test]
async fn undo_runs_once_and_a_second_run_changes_nothing() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let before = app.redis_state();
    let n = nonce("n");
    let reply = admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap();
    let adm = admission(&app, "CODE-00001", &n, &reply);
    assert!(back(&app, false, &adm).await, "the first undo returns the seat");
    assert_eq!(app.redis_state(), before);
    assert!(!back(&app, false, &adm).await, "the second undo is a no-op");
    assert_eq!(app.redis_state(), before, "and changed nothing");
}

#[tokio::test]
async fn undo_needs_the_same_nonce_and_admission_and_a_pending_entry() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let n = nonce("n");
    let reply = admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap();
    let adm = admission(&app, "CODE-00001", &n, &reply);
    let other_nonce = Admission { nonce: Nonce::parse(&nonce("x")).unwrap(), ..adm.clone() };
    let other_id = Admission { id: "id-9".into(), ..adm.clone() };
    assert!(!back(&app, false, &other_nonce).await);
    assert!(!back(&app, false, &other_id).await);
    assert_eq!(mark(&app, &[&adm]).await, 1);
    assert!(!back(&app, false, &adm).await, "a persisted admission is not undone; only release returns it");
    assert!(back(&app, true, &adm).await);
    assert!(!back(&app, true, &adm).await, "the second release is a no-op");
}

#[tokio::test]
async fn a_stale_release_cannot_free_the_seat_of_a_later_booking() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let n1 = nonce("first");
    let first = admission(&app, "CODE-00001", &n1, &admit(&app, "CODE-00001", "A1", &n1, "id-1").await.unwrap());
    assert!(back(&app, true, &first).await);
    let n2 = nonce("second");
    let second = admission(&app, "CODE-00001", &n2, &admit(&app, "CODE-00001", "A1", &n2, "id-2").await.unwrap());
    let held = app.redis_state();
    assert!(!back(&app, true, &first).await, "the old booking's release is refused by the guard");
    assert!(!back(&app, false, &first).await);
    assert_eq!(app.redis_state(), held);
    assert!(back(&app, false, &second).await);
}

#[tokio::test]
async fn undo_and_release_run_on_a_full_redis_but_admit_does_not() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let n = nonce("n");
    let adm = admission(&app, "CODE-00001", &n, &admit(&app, "CODE-00001", "A1", &n, "id-1").await.unwrap());
    app.redis::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(1));
    let before = app.redis_state();
    let err = admit(&app, "CODE-00002", "A1", &nonce("m"), "id-2").await.unwrap_err();
    assert!(err.to_string().contains("OOM"), "{err}");
    assert_eq!(app.redis_state(), before, "refused whole, before it ran");
    assert!(back(&app, false, &adm).await, "undo is allow-oom");
}

#[tokio::test]
async fn one_mark_drops_a_batch_and_only_the_admissions_it_names() {
    let app = spawn_app(AppOptions { seats: 5, levels: vec![("A1", 5)], replica: false, ..Default::default() }).await;
    let mut admitted = Vec::new();
    for (i, code) in ["CODE-00001", "CODE-00002", "CODE-00003", "CODE-00004"].into_iter().enumerate() {
        let n = nonce(&format!("n{i}"));
        let reply = admit(&app, code, "A1", &n, &format!("id-{i}")).await.unwrap();
        admitted.push(admission(&app, code, &n, &reply));
    }
    // CODE-00005 admitted, released, and admitted again: the mark of its first admission (a
    // database batch that wrote it before the release) must not drop the second's entry.
    let n = nonce("first");
    let first = admission(&app, "CODE-00005", &n, &admit(&app, "CODE-00005", "A1", &n, "id-first").await.unwrap());
    assert!(back(&app, true, &first).await);
    let n = nonce("again");
    let again = admission(&app, "CODE-00005", &n, &admit(&app, "CODE-00005", "A1", &n, "id-again").await.unwrap());
    assert_eq!(pending(&app).await.len(), 5);
    // Admission 2 under another admission id is not this admission's mark either.
    let mut stale_id = admitted[2].clone();
    stale_id.id = "id-other".into();
    let batch = [&admitted[0], &first, &stale_id, &admitted[3], &admitted[3]];
    assert_eq!(
        mark(&app, &batch).await,
        2,
        "one drop each for admissions 0 and 3; the repeat of 3 finds its entry gone"
    );
    let left = pending(&app).await;
    let named = |a: &Admission| pending_member(a.code.as_str(), &a.id);
    assert_eq!(left.len(), 3, "{left:?}");
    for a in [&admitted[1], &admitted[2], &again] {
        assert!(left.contains(&named(a)), "{left:?} keeps {}", named(a));
    }
    // Marked admissions are no longer undone; the ones the batch left are.
    assert!(!back(&app, false, &admitted[0]).await);
    assert!(back(&app, false, &admitted[1]).await);
    assert!(back(&app, false, &again).await, "the later admission is still pending, so still undone");
}

async fn pending(app: &crate::helpers::TestApp) -> Vec<String> {
    let mut conn = app.sale.link().check().await.unwrap();
    redis::cmd("ZRANGE").arg(&app.keys.pending).arg(0).arg(-1).query_async(&mut conn).await.unwrap()
}

#[tokio::test]
async fn one_admit_call_decides_each_attempt_as_a_call_of_its_own_would() {
    // The attempts of `admit_returns_each_documented_reply_in_check_order`, in one call.
    let app =
        spawn_app(AppOptions { seats: 2, levels: vec![("A1", 1), ("B1", 2)], replica: false, ..Default::default() })
            .await;
    let nonces = [Nonce::parse(&nonce("n")).unwrap(), Nonce::parse(&nonce("m")).unwrap()];
    let codes = ["CODE-00001", "CODE-00002", "CODE-00003"].map(|c| app.hash(c));
    // (code, nonce, level, admission id, retry-only)
    let attempts = [
        (0, 0, "A1", "id-1", false),
        (0, 0, "B1", "id-2", false),
        (0, 1, "A1", "id-3", false),
        (1, 1, "ZZ", "id-4", false),
        (1, 1, "A1", "id-5", false),
        (1, 1, "B1", "id-6", false),
        (2, 1, "B1", "id-7", true),
        (2, 1, "B1", "id-8", false),
    ];
    let scripts = Scripts::new();
    let call = scripts.admit_batch_call(
        &app.keys,
        attempts.iter().map(|&(c, n, level, admission, retry_only)| AdmitArgs {
            code: &codes[c],
            nonce: &nonces[n],
            level,
            admission,
            retry_only,
        }),
    );
    let mut conn = app.sale.link().check().await.unwrap();
    scripts.admit.load_cmd().query_async::<String>(&mut conn).await.unwrap();
    // As the committer sends it: in a pipeline that keeps error replies as values (a plain query
    // turns one attempt's error into an error for the whole reply).
    let mut pipe = redis::pipe();
    pipe.ignore_errors().add_command(call);
    let mut values: Vec<redis::Value> = pipe.query_async(&mut conn).await.unwrap();
    let replies: Vec<_> =
        admit_replies(values.pop().unwrap(), attempts.len()).into_iter().map(decode_attempt).collect();
    let first = replies[0].as_ref().unwrap().clone();
    assert!(matches!(&first, AdmitReply::Admitted { slot: 1, admission, .. } if admission == "id-1"), "{replies:?}");
    assert_eq!(replies[1].as_ref().unwrap(), &first, "the same nonce gets the original, within the call too");
    assert_eq!(replies[2].as_ref().unwrap(), &AdmitReply::Refused(ScriptRefusal::AlreadyAdmitted));
    let err = replies[3].as_ref().unwrap_err();
    assert!(err.to_string().contains("unknown level"), "the unknown level is its attempt's error alone: {err}");
    assert_eq!(replies[4].as_ref().unwrap(), &AdmitReply::Refused(ScriptRefusal::LevelFull));
    assert!(
        matches!(replies[5].as_ref().unwrap(), AdmitReply::Admitted { slot: 2, admission, .. } if admission == "id-6"),
        "{replies:?}"
    );
    assert_eq!(replies[6].as_ref().unwrap(), &AdmitReply::Refused(ScriptRefusal::NotARetry));
    assert_eq!(replies[7].as_ref().unwrap(), &AdmitReply::Refused(ScriptRefusal::SoldOut));
    let state = app.redis_state();
    assert!(state.free.is_empty() && state.records.len() == 2 && state.pending.len() == 2, "{state:?}");
    assert_eq!((state.taken.get("A1"), state.taken.get("B1")), (Some(&1), Some(&1)));
}

#[tokio::test]
async fn a_malformed_admit_call_is_refused_whole_and_writes_nothing() {
    let app = spawn_app(AppOptions { replica: false, ..Default::default() }).await;
    let before = app.redis_state();
    let scripts = Scripts::new();
    let mut conn = app.sale.link().check().await.unwrap();
    let keys = [&app.keys.adm, &app.keys.taken, &app.keys.cap, &app.keys.free, &app.keys.pending, &app.keys.meta];
    let code = app.hash("CODE-00001");
    for args in [
        vec![code.as_str(), "nonce-aaaaaaaa", "A1", "id-1"],
        vec![code.as_str(), "nonce-aaaaaaaa", "A1", "id-1", "maybe"],
    ] {
        let mut call = redis::cmd("EVALSHA");
        call.arg(redis::Script::new(include_str!("../../lua/admit.lua")).get_hash())
            .arg(keys.len())
            .arg(&keys[..])
            .arg(&args[..]);
        let err = run(&mut conn, &scripts.admit, &call).await.unwrap_err();
        assert!(err.to_string().contains("admit"), "{args:?}: {err}");
    }
    assert_eq!(app.redis_state(), before);
}

#[tokio::test]
async fn a_committer_round_sends_one_admit_call_per_event() {
    let app =
        spawn_app(AppOptions { seats: 10, levels: vec![("A1", 5), ("B1", 8)], replica: false, ..Default::default() })
            .await;
    // A second event, straight into Redis: three seats, one level with room for ten.
    let other = Arc::new(EventKeys::new(&EventId::parse("other-event").unwrap()));
    app.redis::<()>(redis::cmd("HSET").arg(&other.cap).arg("A1").arg(10));
    app.redis::<()>(redis::cmd("HSET").arg(&other.meta).arg("state").arg("open"));
    app.redis::<()>(redis::cmd("ZADD").arg(&other.free).arg(1).arg(1).arg(2).arg(2).arg(3).arg(3));
    let policy = AckPolicy { replicas: 0, timeout: Duration::from_secs(1) };
    let committer = Committer::start(app.sale.link().clone(), Arc::new(Scripts::new()), policy, 1, FaultPlan::none());
    let mine = Arc::new(app.keys.clone());
    let call = |keys: &Arc<EventKeys>, i: usize, level: &str| AdmitCall {
        keys: keys.clone(),
        code: app.hash(&format!("CODE-{i:05}")),
        nonce: Nonce::parse(&nonce(&format!("n{i}"))).unwrap(),
        level: level.into(),
        admission_id: format!("id-{i}"),
        retry_only: false,
    };
    let calls: Vec<AdmitCall> = (1..=12)
        .map(|i| if i % 2 == 0 { call(&mine, i, "A1") } else { call(&other, i, if i == 7 { "ZZ" } else { "A1" }) })
        .collect();
    let evalsha_calls = |app: &crate::helpers::TestApp| command_calls(app, "evalsha");
    let mut conn = app.sale.link().check().await.unwrap();
    Scripts::new().admit.load_cmd().query_async::<String>(&mut conn).await.unwrap();
    let before = evalsha_calls(&app);
    let results = futures::future::join_all(calls.into_iter().map(|c| committer.admit(c))).await;
    assert_eq!(evalsha_calls(&app) - before, 2, "one round, one call for each event");
    let (mut mine_admitted, mut other_admitted) = (0, 0);
    for (i, result) in (1..=12).zip(&results) {
        match (i % 2 == 0, i, result) {
            (_, 7, Err(e)) => assert!(e.to_string().contains("unknown level"), "{e}"),
            (true, _, Ok(Committed::Acked(_))) => mine_admitted += 1,
            (true, _, Ok(Committed::Refused(ScriptRefusal::LevelFull))) => {}
            (false, _, Ok(Committed::Acked(_))) => other_admitted += 1,
            (false, _, Ok(Committed::Refused(ScriptRefusal::SoldOut))) => {}
            other => panic!("attempt {i}: {other:?}"),
        }
    }
    // Event one: six asked for A1 (cap 5). The other: five asked (one for no level), three seats.
    assert_eq!((mine_admitted, other_admitted), (5, 3), "{results:?}");
    let other_taken: i64 = app.redis(redis::cmd("HGET").arg(&other.taken).arg("A1"));
    assert_eq!(other_taken, 3);
}

/// How many times the primary has run `command` (its `INFO commandstats`).
fn command_calls(app: &crate::helpers::TestApp, command: &str) -> i64 {
    let info: String = app.redis(redis::cmd("INFO").arg("commandstats"));
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|l| l.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn a_committer_sends_its_wait_with_the_admits_only_while_the_replica_keeps_up() {
    let app = spawn_app(AppOptions { seats: 10, ..Default::default() }).await;
    let policy = AckPolicy { replicas: 1, timeout: Duration::from_millis(500) };
    let committer = Committer::start(app.sale.link().clone(), Arc::new(Scripts::new()), policy, 1, FaultPlan::none());
    let keys = Arc::new(app.keys.clone());
    let call = |code: &str, n: &str| AdmitCall {
        keys: keys.clone(),
        code: app.hash(code),
        nonce: Nonce::parse(&nonce(n)).unwrap(),
        level: "A1".into(),
        admission_id: format!("id-{n}"),
        retry_only: false,
    };
    let waits = |app: &crate::helpers::TestApp| command_calls(app, "wait");
    // A refusal writes nothing, but a round that rides its WAIT in the admits' pipeline sends it
    // anyway: while the replica keeps up, a refused round costs one WAIT and no extra round trip.
    assert!(matches!(committer.admit(call("CODE-00001", "a")).await, Ok(Committed::Acked(_))));
    let before = waits(&app);
    let refused = committer.admit(call("CODE-00001", "other")).await;
    assert!(matches!(refused, Ok(Committed::Refused(ScriptRefusal::AlreadyAdmitted))), "{refused:?}");
    assert_eq!(waits(&app) - before, 1, "the WAIT rode in the round's pipeline");

    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    let short = committer.admit(call("CODE-00002", "b")).await;
    assert!(matches!(short, Ok(Committed::Short(_))), "the piggybacked WAIT still fell short: {short:?}");
    // Behind a missing replica a piggybacked WAIT would hold every refusal for its whole timeout:
    // the next refused round sends none.
    let before = waits(&app);
    let refused = committer.admit(call("CODE-00001", "again")).await;
    assert!(matches!(refused, Ok(Committed::Refused(ScriptRefusal::AlreadyAdmitted))), "{refused:?}");
    assert_eq!(waits(&app), before, "no WAIT behind a refusal while the replica lags");
    let short = committer.admit(call("CODE-00003", "c")).await;
    assert!(matches!(short, Ok(Committed::Short(_))), "an admission still waits for its replica: {short:?}");
    replica.resume();

    let acked = committer.admit(call("CODE-00004", "d")).await;
    assert!(matches!(acked, Ok(Committed::Acked(_))), "{acked:?}");
    let before = waits(&app);
    let refused = committer.admit(call("CODE-00004", "other")).await;
    assert!(matches!(refused, Ok(Committed::Refused(ScriptRefusal::AlreadyAdmitted))), "{refused:?}");
    assert_eq!(waits(&app) - before, 1, "once a WAIT found the replica in step, the next one rides the pipeline again");
}
