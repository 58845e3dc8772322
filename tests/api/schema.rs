//! SQLite's schema migrations on a database that already holds bookings: migration 0007 rebuilds
//! `bookings` (its state check as comparisons, not an IN list), and nothing a sale wrote before
//! may be lost or loosened by it.

use crate::helpers::{test_db, Backend};
use seatrush::store::Store;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
use sqlx::Row;
use std::str::FromStr;

/// The first migration that rebuilds `bookings`.
const REBUILD: i64 = 7;

type BookingRow = (String, String, String, String, i64, String, String, i64, i64, i64);

/// Every column but `redis_synced`, which migration 0009 drops (nothing read it).
async fn rows(pool: &SqlitePool) -> Vec<BookingRow> {
    sqlx::query_as("SELECT event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms FROM bookings ORDER BY code_hash")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Column `index` of every row `sql` returns, as text.
async fn column(pool: &SqlitePool, sql: &str, index: usize) -> Vec<String> {
    sqlx::query(sql).fetch_all(pool).await.unwrap().iter().map(|r| r.get(index)).collect()
}

async fn refusal(pool: &SqlitePool, sql: &str) -> String {
    match sqlx::query(sql).execute(pool).await {
        Ok(done) => panic!("{sql} was accepted ({} rows)", done.rows_affected()),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn rebuilding_bookings_keeps_every_row_and_every_guard() {
    let db = test_db(Backend::Sqlite).await;
    let options = SqliteConnectOptions::from_str(&db.url).unwrap().create_if_missing(true).foreign_keys(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    // The migrations before the rebuild, as a release before it would have run them.
    let earlier = tempfile::tempdir().unwrap();
    for file in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite")).unwrap() {
        let path = file.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let version: i64 = name.split('_').next().unwrap().parse().unwrap();
        if version < REBUILD {
            std::fs::copy(&path, earlier.path().join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(earlier.path()).await.unwrap().run(&pool).await.unwrap();
    sqlx::query("INSERT INTO events (id, total_seats, hold_seconds, state) VALUES ('exam', 10, 900, 'open')")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO levels (event_id, name, cap) VALUES ('exam', 'A1', 10)").execute(&pool).await.unwrap();
    for (i, state) in ["held", "paid", "released"].iter().enumerate() {
        sqlx::query("INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms, redis_synced)
                     VALUES ('exam', $1, $2, $3, $4, 'A1', $5, 1000, 2000, 1500, $6)")
            .bind(format!("hash-{i}"))
            .bind(format!("nonce-{i}"))
            .bind(format!("admission-{i}"))
            .bind(i as i64 + 1)
            .bind(state)
            .bind(i64::from(*state != "released"))
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query("INSERT INTO released_admissions (event_id, admission_id) VALUES ('exam', 'admission-2')")
        .execute(&pool)
        .await
        .unwrap();
    let before = rows(&pool).await;
    assert_eq!(before.len(), 3);

    // The store's own start-up runs the rest, as a `serve` of the new version would.
    Store::connect(&db.url).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations").fetch_one(&pool).await.unwrap();
    assert!(applied >= REBUILD, "migration {REBUILD} ran (last applied: {applied})");
    assert_eq!(rows(&pool).await, before, "every booking row as it was");

    let objects = column(
        &pool,
        "SELECT name FROM sqlite_schema WHERE tbl_name = 'bookings' AND type IN ('index', 'trigger') ORDER BY name",
        0,
    )
    .await;
    for name in [
        "bookings_hold_expiry",
        "bookings_never_deleted",
        "bookings_no_resurrection_update",
        "bookings_one_holder_per_seat",
    ] {
        assert!(objects.iter().any(|o| o == name), "{name} is back: {objects:?}");
    }
    // Migration 0009 drops the index with the column nothing read.
    assert!(!objects.iter().any(|o| o == "bookings_release_unsynced"), "{objects:?}");
    let bad_state = refusal(&pool, "INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms) VALUES ('exam', 'h', 'n', 'a', 9, 'A1', 'lost', 1, 2, 3)").await;
    assert!(bad_state.contains("CHECK constraint failed"), "{bad_state}");
    let seat_twice = refusal(&pool, "INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms) VALUES ('exam', 'h', 'n', 'a', 1, 'A1', 'held', 1, 2, 3)").await;
    assert!(seat_twice.contains("UNIQUE"), "{seat_twice}");
    let no_level = refusal(&pool, "INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms) VALUES ('exam', 'h', 'n', 'a', 9, 'Z9', 'held', 1, 2, 3)").await;
    assert!(no_level.contains("FOREIGN KEY"), "{no_level}");
    let deleted = refusal(&pool, "DELETE FROM bookings WHERE code_hash = 'hash-2'").await;
    assert!(deleted.contains("never deleted"), "{deleted}");
    // A tombstoned admission cannot take its row back: the update trigger skips the write.
    sqlx::query("UPDATE bookings SET state = 'held', admission_id = 'admission-2' WHERE code_hash = 'hash-0'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(rows(&pool).await, before, "the tombstone trigger refused the resurrection");

    // The point of the rebuild: writing a row (the request path's upsert writes one a booking)
    // builds no temporary B-tree for the state check. Column 1 of EXPLAIN is the opcode.
    let plan = column(&pool, "EXPLAIN INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)", 1).await;
    assert!(plan.iter().any(|op| op == "Insert"), "a real plan: {plan:?}");
    assert!(!plan.iter().any(|op| op == "OpenEphemeral"), "the state check opens a temporary B-tree: {plan:?}");
    pool.close().await;
}
