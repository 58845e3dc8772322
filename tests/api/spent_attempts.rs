//! A final refusal spends its attempt (docs/design.md#a-final-refusal-spends-its-attempt): the
//! refusal's read of the code's row and the spend are one step, and a held write of that attempt
//! landing afterwards is skipped by the database, on both databases and through each writer. The
//! gap this closes (issue 29): a retry refused after Redis lost its record, read before the same
//! attempt's stalled write landed, and that write then held a seat for a candidate told "no".

use crate::helpers::Backend;
use crate::persister::{fresh_store, item, retry_redis_lost, BatchUnderTest};
use seatrush::store::{SqliteBatchWriter, Store};
use std::time::Duration;

/// The refusal's spend through the writer the request path uses: SQLite's batch writer thread
/// (`direct`) or the store's own transaction.
async fn spend(store: &Store, direct: bool, code: &str, admission: &str) -> Option<seatrush::store::BookingRow> {
    let i = item(code, admission, 0, "B1");
    if direct && store.sqlite_path().is_some() {
        let writer = SqliteBatchWriter::open(&store.sqlite_path().unwrap()).unwrap();
        return writer.spend_attempt(&i.event, &i.admission.code, &i.admission.nonce, "sold_out").await.unwrap();
    }
    store.spend_attempt(&i.event, &i.admission.code, &i.admission.nonce, "sold_out").await.unwrap()
}

/// One batch through the writer under test: its bookings' outcome kinds.
async fn written(writer: &mut BatchUnderTest<'_>, batch: Vec<seatrush::store::HoldItem>) -> Vec<&'static str> {
    writer.write(batch).await.into_iter().map(|o| o.unwrap().kind()).collect()
}

async fn check_a_late_write_of_a_spent_attempt_is_skipped(backend: Backend, direct: bool) {
    let (_db, store) = fresh_store(backend).await;
    let mut writer = BatchUnderTest::new(&store, direct);
    assert_eq!(spend(&store, direct, "CODE-7", "g1").await, None, "no row: the refusal stands");
    let late = item("CODE-7", "g1", 1, "B1");
    assert_eq!(written(&mut writer, vec![late.clone()]).await, ["reaper_won"]);
    assert_eq!(store.booking(&late.event, &late.admission.code).await.unwrap(), None, "the late write held nothing");
    assert_eq!(
        store.spent(&late.event, &late.admission.code, &late.admission.nonce).await.unwrap().as_deref(),
        Some("sold_out")
    );
    // Another attempt of the same code is a new attempt: it books.
    let next = item("CODE-7", "g2", 1, "B1");
    assert_eq!(written(&mut writer, vec![next]).await, ["held"]);
}

async fn check_a_refusal_after_the_write_reads_its_seat(backend: Backend, direct: bool) {
    let (_db, store) = fresh_store(backend).await;
    let mut writer = BatchUnderTest::new(&store, direct);
    let first = item("CODE-8", "h1", 2, "B1");
    assert_eq!(written(&mut writer, vec![first.clone()]).await, ["held"]);
    let row = spend(&store, direct, "CODE-8", "h1").await.expect("the write's row");
    assert_eq!((row.nonce, row.slot), (first.admission.nonce.clone(), 2));
    assert_eq!(
        store.spent(&first.event, &first.admission.code, &first.admission.nonce).await.unwrap(),
        None,
        "a seat read is not spent"
    );
    // A retry of that attempt whose record Redis lost again is still answered with its seat.
    let again = retry_redis_lost("CODE-8", "h1", 3, "B1");
    assert_eq!(written(&mut writer, vec![again]).await, ["same_nonce_holds"]);
}

#[tokio::test]
async fn a_late_write_of_a_spent_attempt_is_skipped_sqlite() {
    check_a_late_write_of_a_spent_attempt_is_skipped(Backend::Sqlite, false).await;
    check_a_late_write_of_a_spent_attempt_is_skipped(Backend::Sqlite, true).await;
}

#[tokio::test]
async fn a_late_write_of_a_spent_attempt_is_skipped_postgres() {
    check_a_late_write_of_a_spent_attempt_is_skipped(Backend::Postgres, false).await;
    check_a_late_write_of_a_spent_attempt_is_skipped(Backend::Postgres, true).await;
}

#[tokio::test]
async fn a_refusal_after_the_write_reads_its_seat_sqlite() {
    check_a_refusal_after_the_write_reads_its_seat(Backend::Sqlite, false).await;
    check_a_refusal_after_the_write_reads_its_seat(Backend::Sqlite, true).await;
}

#[tokio::test]
async fn a_refusal_after_the_write_reads_its_seat_postgres() {
    check_a_refusal_after_the_write_reads_its_seat(Backend::Postgres, false).await;
    check_a_refusal_after_the_write_reads_its_seat(Backend::Postgres, true).await;
}

/// PostgreSQL runs writers side by side: a refusal whose read comes while a write of its attempt
/// is not yet committed waits for it (the attempt's row lock) and then reads its seat, instead
/// of reading past it and answering "no" to a seat that lands a moment later.
#[tokio::test]
async fn a_refusal_waits_for_an_uncommitted_write_of_its_attempt_postgres() {
    let (_db, store) = fresh_store(Backend::Postgres).await;
    let Store::Postgres(pool) = &store else { panic!("a PostgreSQL store") };
    let w = item("CODE-9", "k1", 2, "B1");
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
         VALUES ($1, $2, $3, $4, 2, 'B1', 'held', 1000, 9000000000000, 1000)",
    )
    .bind(w.event.as_str())
    .bind(w.admission.code.as_str())
    .bind(w.admission.nonce.as_str())
    .bind(&w.admission.id)
    .execute(&mut *tx)
    .await
    .unwrap();
    let refusal = tokio::spawn({
        let store = store.clone();
        let w = w.clone();
        async move { store.spend_attempt(&w.event, &w.admission.code, &w.admission.nonce, "sold_out").await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!refusal.is_finished(), "the refusal waits for the write of its attempt");
    tx.commit().await.unwrap();
    let row = refusal.await.unwrap().expect("the refusal reads the write that committed");
    assert_eq!(row.nonce, w.admission.nonce);
    assert_eq!(store.spent(&w.event, &w.admission.code, &w.admission.nonce).await.unwrap(), None);
    // And after a spend, a write of that attempt through the persister's own connection is
    // skipped (the trigger's upsert finds the attempt refused).
    assert_eq!(spend(&store, false, "CODE-10", "m1").await, None);
    let late = item("CODE-10", "m1", 3, "B1");
    assert_eq!(written(&mut BatchUnderTest::new(&store, true), vec![late]).await, ["reaper_won"]);
}
