//! Places where Redis and the database could part ways (issue 29, items 2 to 8), each forced on
//! the real code. Each test failed before its fix.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, OPERATOR_TOKEN};
use seatrush::domain::nonce::Nonce;
use seatrush::redis_io::scripts::OutsideWindow;
use seatrush::sale::committer::{AdmitCall, Committed, ScriptRefusal};

/// Item 2: a past sale's releases that can never run (its event is not loaded: its Redis was
/// wiped) must not crowd a live event's unacknowledged release out of the sync pass.
async fn a_dead_events_releases_never_starve_a_live_one(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    let stuck = seatrush::sale::lifecycle::PASS_BATCH_MAX + 1;
    seatrush::store::on_pool!(&app.store, pool => {
        for i in 0..stuck {
            sqlx::query(
                "INSERT INTO release_syncs (event_id, code_hash, admission_id, nonce, slot, level, admitted_ms, released_ms)
                 VALUES ('old-sale', $1, $2, 'n', 1, 'A1', 1, $3)",
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
    assert_eq!(refused(app.sale.committer.admit(admit("CODE-00003", &nonce("after"))).await), OutsideWindow::Closed);
    assert_eq!(app.redis_state(), before, "a refusal writes nothing");
    match app.sale.committer.admit(admit("CODE-00001", &first)).await {
        Ok(Committed::Acked(a)) => assert_eq!(a.code, app.hash("CODE-00001")),
        other => panic!("a retry of an earlier admission is still answered: {other:?}"),
    }
    let closes = seatrush::domain::event::now_ms() - 1;
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.meta).arg("state").arg("open").arg("closes_at_ms").arg(closes));
    assert_eq!(refused(app.sale.committer.admit(admit("CODE-00004", &nonce("late"))).await), OutsideWindow::Closed);
    let opens = seatrush::domain::event::now_ms() + 3_600_000;
    app.redis::<()>(redis::cmd("HDEL").arg(&app.keys.meta).arg("closes_at_ms"));
    app.redis::<()>(redis::cmd("HSET").arg(&app.keys.meta).arg("opens_at_ms").arg(opens));
    assert_eq!(refused(app.sale.committer.admit(admit("CODE-00005", &nonce("early"))).await), OutsideWindow::NotOpen);
    // Redis lost the event's state: answered 503 retry on the request path, never a final refusal.
    app.redis::<()>(redis::cmd("DEL").arg(&app.keys.meta));
    assert_eq!(refused(app.sale.committer.admit(admit("CODE-00006", &nonce("lost"))).await), OutsideWindow::NotLoaded);
}
