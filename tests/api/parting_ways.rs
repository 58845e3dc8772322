//! Places where Redis and the database could part ways (issue 29, items 2 to 8), each forced on
//! the real code. Each test failed before its fix.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, OPERATOR_TOKEN};

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
