//! Places where Redis and the database could part ways (issue 29, items 2 to 8), each forced on
//! the real code. Each test failed before its fix.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, OPERATOR_TOKEN};
use seatrush::domain::nonce::Nonce;
use seatrush::redis_io::scripts::OutsideWindow;
use seatrush::redis_io::scripts::ScriptRefusal;
use seatrush::sale::committer::{AdmitCall, Committed};

/// Item 2: a past sale's releases that can never run (its event is not loaded: its Redis was
/// wiped) must not crowd a live event's unacknowledged release out of the sync pass.
async fn a_dead_events_releases_never_starve_a_live_one(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let stuck = seatrush::sale::lifecycle::PASS_BATCH_MAX + 1;
    seatrush::store::on_pool!(&app.store, pool => {
        for i in 0..stuck {
            sqlx::query(
                "INSERT INTO release_syncs (event_id, code_hash, admission_id, nonce, slot, level, admitted_ms, released_ms)
                 VALUES ('old-sale', $1, $2, 'nonce-stuck', 1, 'A1', 1, $3)",
            )
            .bind(format!("{i:064x}"))
            .bind(format!("a{i}"))
            .bind(i)
            .execute(pool)
            .await
            .unwrap();
        }
    });
    assert_eq!(app.book("CODE-00001", "A1", &nonce("first")).await.status, 201);
    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    replica.resume();
    let live = |rows: Vec<(seatrush::domain::event::EventId, _)>| rows.iter().filter(|(e, _)| *e == app.event).count();
    assert_eq!(live(app.store.unsynced_releases(i64::MAX).await.unwrap()), 1, "the cancel's WAIT fell short");
    app.sale.sync_releases_once().await.unwrap();
    assert_eq!(live(app.store.unsynced_releases(i64::MAX).await.unwrap()), 0, "the live release ran again");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_dead_events_releases_never_starve_a_live_one_sqlite() {
    a_dead_events_releases_never_starve_a_live_one(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_dead_events_releases_never_starve_a_live_one_postgres() {
    a_dead_events_releases_never_starve_a_live_one(Backend::Postgres).await;
}

/// Item 4: in WAL mode, a commit with `synchronous = NORMAL` may roll back after a power loss or
/// an OS crash, after its 201 went out. Every connection that writes bookings commits with FULL.
#[tokio::test]
async fn sqlite_commits_survive_an_os_crash() {
    let app = spawn_app(AppOptions { backend: Backend::Sqlite, ..Default::default() }).await;
    let seatrush::store::Store::Sqlite(pool) = &app.store else { panic!("an SQLite store") };
    for _ in 0..4 {
        let mut conn = pool.acquire().await.unwrap();
        let (mode,): (i64,) = sqlx::query_as("PRAGMA synchronous").fetch_one(&mut *conn).await.unwrap();
        assert_eq!(mode, 2, "PRAGMA synchronous: 2 is FULL, 1 NORMAL");
    }
    let (journal,): (String,) = sqlx::query_as("PRAGMA journal_mode").fetch_one(pool).await.unwrap();
    assert_eq!(journal, "wal");
}

/// Item 5: the window is kept inside admit.lua by Redis's clock and the event's state there, not
/// only by each serve's cached view and clock. The committer is called as the request path calls
/// it after its gates let a request through (a stale view, a clock ahead): the script refuses a
/// fresh admission outside the window, and still answers a retry of an admission made before.
#[tokio::test]
async fn the_admit_script_keeps_the_window_whatever_a_serves_view_says() {
    let app = spawn_app(AppOptions::default()).await;
    let first = nonce("before");
    assert_eq!(app.book("CODE-00001", "A1", &first).await.status, 201);
    let admit = |code: &str, n: &str| AdmitCall {
        keys: std::sync::Arc::new(app.keys.clone()),
        code: app.hash(code),
        nonce: Nonce::parse(n).unwrap(),
        level: "A1".into(),
        admission_id: uuid::Uuid::new_v4().simple().to_string(),
        retry_only: false,
    };
    let refused = |c: Result<Committed, _>| match c {
        Ok(Committed::Refused(ScriptRefusal::Outside(why))) => why,
        other => panic!("expected a window refusal, got {other:?}"),
    };
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.meta).arg("state").arg("closed"));
    let before = app.redis_state();
    assert_eq!(refused(app.sale.committer().admit(admit("CODE-00003", &nonce("after"))).await), OutsideWindow::Closed);
    assert_eq!(app.redis_state(), before, "a refusal writes nothing");
    match app.sale.committer().admit(admit("CODE-00001", &first)).await {
        Ok(Committed::Acked(a)) => assert_eq!(a.code, app.hash("CODE-00001")),
        other => panic!("a retry of an earlier admission is still answered: {other:?}"),
    }
    let closes = seatrush::domain::event::now_ms() - 1;
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.meta).arg("state").arg("open").arg("closes_at_ms").arg(closes));
    assert_eq!(refused(app.sale.committer().admit(admit("CODE-00004", &nonce("late"))).await), OutsideWindow::Closed);
    let opens = seatrush::domain::event::now_ms() + 3_600_000;
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.meta).arg("closes_at_ms"));
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.meta).arg("opens_at_ms").arg(opens));
    assert_eq!(refused(app.sale.committer().admit(admit("CODE-00005", &nonce("early"))).await), OutsideWindow::NotOpen);
    // Redis lost the event's state: answered 503 retry on the request path, never a final refusal.
    app.redis::<()>(redis::cmd("DEL").arg(&app.keys.meta));
    assert_eq!(
        refused(app.sale.committer().admit(admit("CODE-00006", &nonce("lost"))).await),
        OutsideWindow::NotLoaded
    );
}

/// Item 6: a round with two events where one call admits and the other meets `NOREPLICAS` (a
/// primary losing its replica between the two calls of one pipeline; forced here by an admit
/// script that answers so for the second event). The connection is dropped for the next round,
/// but the round's WAIT must still run on the connection that wrote the admission: with the
/// replica stalled, the admission is short, not acknowledged by a fresh connection's WAIT.
#[tokio::test]
#[cfg(feature = "fault-hooks")] // Scripts::with_admit_source exists only in a fault-hooks build
async fn a_rounds_wait_runs_on_the_connection_that_admitted() {
    use seatrush::domain::event::EventId;
    use seatrush::fault_hooks::FaultPlan;
    use seatrush::redis_io::keys::EventKeys;
    use seatrush::redis_io::scripts::Scripts;
    use seatrush::sale::committer::AckPolicy;
    use seatrush::sale::committer::Committer;
    use std::sync::Arc;
    use std::time::Duration;

    let app = spawn_app(AppOptions::default()).await;
    let other = Arc::new(EventKeys::new(&EventId::parse("other-event").unwrap()));
    let admit = include_str!("../../lua/admit.lua");
    let (shebang, body) = admit.split_once('\n').unwrap();
    let source = format!(
        "{shebang}\nif KEYS[1] == '{}' then return redis.error_reply('NOREPLICAS Not enough good replicas to write.') end\n{body}",
        other.adm
    );
    let scripts = Arc::new(Scripts::with_admit_source(Box::leak(source.into_boxed_str())));
    let policy = AckPolicy { replicas: 1, timeout: Duration::from_millis(300) };
    let committer = Committer::start(app.sale.link().clone(), scripts, policy, 1, FaultPlan::none());
    let call = |keys: &Arc<EventKeys>, code: &str| AdmitCall {
        keys: keys.clone(),
        code: app.hash(code),
        nonce: Nonce::parse(&nonce("n")).unwrap(),
        level: "A1".into(),
        admission_id: uuid::Uuid::new_v4().simple().to_string(),
        retry_only: false,
    };
    let mine = Arc::new(app.keys.clone());
    // Warm the committer's connection and script cache with a round of its own.
    assert!(matches!(committer.admit(call(&mine, "CODE-00001")).await, Ok(Committed::Acked(_))));
    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    // A round whose WAIT falls short keeps the worker busy for the timeout, so the next two
    // admits queue up and go in one round; it also stops the next round riding its WAIT in the
    // admits' pipeline, so that round sends a WAIT of its own.
    let busy = committer.admit(call(&mine, "CODE-00004"));
    let queued = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::join!(committer.admit(call(&mine, "CODE-00002")), committer.admit(call(&other, "CODE-00003")))
    };
    let (first, (admitted, refused)) = tokio::join!(busy, queued);
    replica.resume();
    assert!(matches!(first, Ok(Committed::Short(_))), "{first:?}");
    assert!(refused.is_err(), "the other event's call met NOREPLICAS: {refused:?}");
    match admitted {
        // The replica was stalled: nothing acknowledged this admission.
        Ok(Committed::Short(_)) | Err(_) => {}
        other => panic!("an admission counted as acknowledged by a WAIT that covered none of it: {other:?}"),
    }
}

/// Item 7: Redis lost a holder's record (W, in the database), then the code was admitted again (X,
/// pending, in flight). `reconcile --repair` must leave X's record for the arbiter: writing W's
/// and deleting the code as an orphan left X's pending entry with no record, which no reaper can
/// settle, and W's later release finding nothing. After X settles, a second repair gives W back
/// its record, and the invariants hold.
async fn a_repair_leaves_an_admission_in_flight_to_the_arbiter(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("w")).await.status, 201);
    let hash = app.hash("CODE-00001");
    let w = app.store.booking(&app.event, &hash).await.unwrap().unwrap();
    // What a promoted replica without W's admission holds.
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.adm).arg(hash.as_str()));
    app.redis::<()>(redis::cmd("HINCRBY").arg(&app.keys.taken).arg("A1").arg(-1));
    app.redis::<()>(redis::cmd("ZADD").arg(&app.keys.free).arg(w.slot).arg(w.slot));
    let x = match app
        .sale
        .committer()
        .admit(AdmitCall {
            keys: std::sync::Arc::new(app.keys.clone()),
            code: hash.clone(),
            nonce: Nonce::parse(&nonce("x")).unwrap(),
            level: "A1".into(),
            admission_id: uuid::Uuid::new_v4().simple().to_string(),
            retry_only: false,
        })
        .await
    {
        Ok(Committed::Acked(x)) => x,
        other => panic!("{other:?}"),
    };
    seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, true).await.unwrap();
    let record: Option<String> = app.redis(redis::cmd("HGET").arg(&app.keys.adm).arg(hash.as_str()));
    let record = record.expect("the code keeps a record while its admission is in flight");
    assert!(record.contains(&x.id), "the in-flight admission's record stays: {record}");
    // The arbiter settles X (the database holds W for the code): X is undone.
    app.sale.settle(&app.event, &app.keys, &x, false).await.unwrap();
    seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, true).await.unwrap();
    let record: Option<String> = app.redis(redis::cmd("HGET").arg(&app.keys.adm).arg(hash.as_str()));
    assert!(record.is_some_and(|r| r.contains(&w.admission_id)), "W's record is back");
    app.assert_invariants().await;
    assert!(seatrush::ops::reconcile::reconcile(app.sale.link(), &app.store, &app.event, false)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_repair_leaves_an_admission_in_flight_to_the_arbiter_sqlite() {
    a_repair_leaves_an_admission_in_flight_to_the_arbiter(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_repair_leaves_an_admission_in_flight_to_the_arbiter_postgres() {
    a_repair_leaves_an_admission_in_flight_to_the_arbiter(Backend::Postgres).await;
}
