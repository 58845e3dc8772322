//! The batched database write gives every booking the outcome the one-at-a-time write gives it,
//! on SQLite (the batch writer's statements, on a connection of their own and on the persister's
//! writer) and on PostgreSQL (the server-side
//! function `seatrush_hold`, one round trip per batch), and both dialects agree with each other.

use crate::helpers::{spec, test_db, AppOptions, Backend, TestDb};
use seatrush::domain::admission::Admission;
use seatrush::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use seatrush::domain::event::EventId;
use seatrush::domain::nonce::Nonce;
use seatrush::sale::persister::{PersistPolicy, Persister};
use seatrush::sale::stats::Stats;
use seatrush::store::{HoldItem, HoldOutcome, PostgresBatchWriter, SqliteBatchWriter, Store, StoreError};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

fn hash(code: &str) -> CodeHash {
    CodeHasher::plain().hash(&NormalisedCode::parse(code).unwrap())
}

pub(crate) fn item(code: &str, admission: &str, slot: i64, level: &str) -> HoldItem {
    let admission = Admission {
        code: hash(code),
        nonce: Nonce::parse(&format!("nonce-{admission}")).unwrap(),
        id: admission.to_owned(),
        slot,
        level: level.to_owned(),
        admitted_ms: 1_000,
    };
    HoldItem { event: EventId::parse(crate::helpers::EVENT).unwrap(), admission, hold_ms: 900_000 }
}

/// A retry whose first admission Redis lost: the same nonce, a new admission id.
pub(crate) fn retry_redis_lost(code: &str, admission: &str, slot: i64, level: &str) -> HoldItem {
    let mut again = item(code, admission, slot, level);
    again.admission.id = format!("{admission}-again");
    again
}

/// 3 seats; A1 holds 1, B1 holds 5. Every outcome of `hold` appears once.
fn scenario() -> (Vec<HoldItem>, Vec<&'static str>) {
    let cases = vec![
        (item("CODE-1", "a1", 1, "A1"), "held"),
        (item("CODE-1", "a1", 1, "A1"), "already_held"),
        (retry_redis_lost("CODE-1", "a1", 3, "B1"), "same_nonce_holds"),
        (item("CODE-1", "a2", 2, "B1"), "code_has_seat"),
        (item("CODE-2", "b1", 2, "A1"), "level_full"),
        (item("CODE-3", "c1", 1, "B1"), "seat_taken"),
        (item("CODE-3", "c2", 2, "B1"), "held"),
        (item("CODE-6", "f1", 5, "B1"), "reaper_won"),
        (item("CODE-4", "d1", 3, "B1"), "held"),
        (item("CODE-5", "e1", 4, "B1"), "sold_out"),
    ];
    cases.into_iter().unzip()
}

/// The outcomes as comparable kinds, plus the seat each names (the hold's end differs by clock).
fn kinds(outcomes: &[HoldOutcome]) -> Vec<&'static str> {
    outcomes.iter().map(HoldOutcome::kind).collect()
}

/// The seat each outcome names, without the hold's end (each write stamps it by its own clock).
fn seats(outcomes: &[HoldOutcome]) -> Vec<Option<(i64, String)>> {
    outcomes
        .iter()
        .map(|o| match o {
            HoldOutcome::Held(s)
            | HoldOutcome::AlreadyHeld(s)
            | HoldOutcome::SameNonceHolds(s)
            | HoldOutcome::CodeHasSeat(s) => Some((s.slot, s.level.clone())),
            _ => None,
        })
        .collect()
}

/// A hold that starts at the write runs `hold_ms` from a moment between `before` and now.
fn assert_hold_runs_from_the_write(outcomes: &[HoldOutcome], before_ms: i64, hold_ms: i64) {
    let after_ms = seatrush::domain::event::now_ms();
    for o in outcomes {
        if let HoldOutcome::Held(s) = o {
            // PostgreSQL's clock is another process's: allow it a second of skew.
            assert!(
                s.hold_until_ms >= before_ms + hold_ms - 1_000 && s.hold_until_ms <= after_ms + hold_ms + 1_000,
                "{o:?}"
            );
        }
    }
}

pub(crate) async fn fresh_store(backend: Backend) -> (TestDb, Store) {
    let db = test_db(backend).await;
    let store = Store::connect(&db.url).await.unwrap();
    store
        .apply_event(&spec(&AppOptions { seats: 3, levels: vec![("A1", 1), ("B1", 5)], ..Default::default() }))
        .await
        .unwrap();
    // The reaper got to CODE-6's admission first.
    let reaped = item("CODE-6", "f1", 5, "B1");
    store.reap(&reaped.event, &reaped.admission, 1_500).await.unwrap();
    (db, store)
}

async fn one_at_a_time(backend: Backend) -> (Vec<HoldOutcome>, String) {
    let (_db, store) = fresh_store(backend).await;
    let (items, _) = scenario();
    let mut outcomes = Vec::new();
    for i in &items {
        outcomes.push(store.hold(&i.event, &i.admission, i.hold_ms).await.unwrap());
    }
    (outcomes, state(&store).await)
}

/// What the database holds afterwards, in a comparable form.
async fn state(store: &Store) -> String {
    let event = EventId::parse(crate::helpers::EVENT).unwrap();
    // Not the hold's end: each write stamps it by the clock of its own moment.
    let rows: Vec<_> = store
        .seat_holders(&event)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.code, r.nonce, r.admission_id, r.slot, r.level, r.state))
        .collect();
    format!("{:?} {:?}", rows, store.counters(&event).await.unwrap())
}

async fn check_batched(backend: Backend, direct: bool) {
    let (expected, expected_state) = one_at_a_time(backend).await;
    assert_eq!(kinds(&expected), scenario().1, "the scenario covers every outcome of hold");
    let (db, store) = fresh_store(backend).await;
    let (items, _) = scenario();
    let before_ms = seatrush::domain::event::now_ms();
    let outcomes = hold_batches(&store, direct, vec![items]).await;
    assert_eq!(kinds(&outcomes), kinds(&expected));
    assert_eq!(seats(&outcomes), seats(&expected));
    assert_hold_runs_from_the_write(&outcomes, before_ms, 900_000);
    assert_eq!(state(&store).await, expected_state);
    drop(db);
}

#[tokio::test]
async fn a_batch_gives_every_booking_the_outcome_hold_gives_it_sqlite_on_a_connection_of_its_own() {
    check_batched(Backend::Sqlite, false).await;
}

#[tokio::test]
async fn a_batch_gives_every_booking_the_outcome_hold_gives_it_sqlite_direct() {
    check_batched(Backend::Sqlite, true).await;
}

#[tokio::test]
async fn a_batch_gives_every_booking_the_outcome_hold_gives_it_postgres() {
    check_batched(Backend::Postgres, false).await;
}

/// The persister's PostgreSQL writer, on the connection it keeps between batches.
#[tokio::test]
async fn a_batch_gives_every_booking_the_outcome_hold_gives_it_postgres_writer() {
    check_batched(Backend::Postgres, true).await;
}

#[tokio::test]
async fn both_dialects_give_the_same_outcomes_and_leave_the_same_rows() {
    let (sqlite, sqlite_state) = one_at_a_time(Backend::Sqlite).await;
    let (postgres, postgres_state) = one_at_a_time(Backend::Postgres).await;
    assert_eq!((kinds(&postgres), seats(&postgres)), (kinds(&sqlite), seats(&sqlite)));
    assert_eq!(postgres_state, sqlite_state);
}

/// The bookings of the batches written one at a time with `Store::hold`: the outcomes a batch
/// writer must give.
async fn hold_one_at_a_time(store: &Store, batches: Vec<Vec<HoldItem>>) -> Vec<HoldOutcome> {
    let mut outcomes = Vec::new();
    for i in batches.concat() {
        outcomes.push(store.hold(&i.event, &i.admission, i.hold_ms).await.unwrap());
    }
    outcomes
}

/// The batch writer under test: `Store::hold_batch` on the pool, or the persister's own writer
/// (`direct`): SQLite's batch writer thread, or a PostgreSQL connection the writer keeps.
pub(crate) enum BatchUnderTest<'a> {
    Pool(&'a Store),
    Sqlite(SqliteBatchWriter),
    Postgres(PostgresBatchWriter),
}

impl<'a> BatchUnderTest<'a> {
    pub(crate) fn new(store: &'a Store, direct: bool) -> Self {
        match (direct, store.postgres_batch_writer()) {
            (false, _) => Self::Pool(store),
            (true, Some(postgres)) => Self::Postgres(postgres),
            (true, None) => Self::Sqlite(SqliteBatchWriter::open(&store.sqlite_path().unwrap()).unwrap()),
        }
    }

    /// One batch, one transaction: each booking's own outcome. The batch answers with the
    /// database's clock at the write (a retry's hold is judged by it): read between the call's
    /// start and its end, and no earlier than the start of the holds it wrote.
    pub(crate) async fn write(&mut self, batch: Vec<HoldItem>) -> Vec<Result<HoldOutcome, StoreError>> {
        let hold_ms: Vec<i64> = batch.iter().map(|i| i.hold_ms).collect();
        let before_ms = seatrush::domain::event::now_ms();
        let written = match self {
            Self::Pool(store) => store.hold_batch(&batch).await.unwrap(),
            Self::Sqlite(writer) => writer.hold_batch(Arc::new(batch)).await.unwrap(),
            Self::Postgres(writer) => writer.hold_batch(&batch).await.unwrap(),
        };
        let after_ms = seatrush::domain::event::now_ms();
        // PostgreSQL rounds its clock to the millisecond, this host truncates: 1 ms either way.
        assert!(
            (before_ms - 1..=after_ms + 1).contains(&written.clock_ms),
            "{before_ms} <= {} <= {after_ms}",
            written.clock_ms
        );
        for (outcome, hold_ms) in written.outcomes.iter().zip(hold_ms) {
            if let Ok(HoldOutcome::Held(seat)) = outcome {
                assert!(seat.hold_until_ms - hold_ms <= written.clock_ms, "the clock is read at or after the write");
            }
        }
        written.outcomes
    }
}

/// Each batch through the writer under test, its bookings' outcomes in order.
async fn hold_batches(store: &Store, direct: bool, batches: Vec<Vec<HoldItem>>) -> Vec<HoldOutcome> {
    let mut writer = BatchUnderTest::new(store, direct);
    let mut outcomes = Vec::new();
    for batch in batches {
        outcomes.extend(writer.write(batch).await.into_iter().map(Result::unwrap));
    }
    outcomes
}

/// Batches that name every code and every seat once: PostgreSQL (migration 0005) and the direct
/// SQLite writer answer these with their fast paths, and fall back to the one-at-a-time path when
/// a cap or a taken seat refuses a booking. Each batch must give what the bookings give one at a
/// time, in the same order, and leave the same rows and counters.
fn distinct_batches() -> Vec<Vec<HoldItem>> {
    vec![
        // All fresh.
        vec![item("CODE-1", "a1", 1, "A1"), item("CODE-3", "c1", 2, "B1")],
        // Held beside every kind of row that stops a write: the code's own held row (a retry),
        // a retry whose first admission Redis lost, a row the reaper claimed released.
        vec![
            item("CODE-4", "d1", 3, "B1"),
            item("CODE-1", "a1", 1, "A1"),
            retry_redis_lost("CODE-3", "c1", 4, "B1"),
            item("CODE-6", "f1", 5, "B1"),
        ],
        // Past the level's cap, a seat another row holds, past the event's cap: every one of
        // these refuses a booking, so the batch falls back, and the others still get theirs.
        vec![item("CODE-2", "b1", 6, "A1"), item("CODE-5", "e1", 2, "B1"), item("CODE-7", "g1", 7, "B1")],
    ]
}

async fn check_distinct_batches(backend: Backend, direct: bool) {
    let (_db, store) = fresh_store(backend).await;
    let expected = hold_one_at_a_time(&store, distinct_batches()).await;
    let expected_state = state(&store).await;
    assert_eq!(
        kinds(&expected),
        [
            "held",
            "held",
            "held",
            "already_held",
            "same_nonce_holds",
            "reaper_won",
            "level_full",
            "seat_taken",
            "sold_out"
        ],
        "the batches cover every outcome but an error"
    );
    let (_db, store) = fresh_store(backend).await;
    let outcomes = hold_batches(&store, direct, distinct_batches()).await;
    assert_eq!(kinds(&outcomes), kinds(&expected));
    assert_eq!(seats(&outcomes), seats(&expected));
    assert_eq!(state(&store).await, expected_state);
}

#[tokio::test]
async fn a_batch_of_distinct_codes_gives_the_outcomes_hold_gives_sqlite() {
    check_distinct_batches(Backend::Sqlite, false).await;
}

/// The direct SQLite writer's fast path (one upsert a booking, counters once) on the same batches.
#[tokio::test]
async fn a_batch_of_distinct_codes_gives_the_outcomes_hold_gives_sqlite_direct() {
    check_distinct_batches(Backend::Sqlite, true).await;
}

#[tokio::test]
async fn a_batch_of_distinct_codes_gives_the_outcomes_hold_gives_postgres() {
    check_distinct_batches(Backend::Postgres, false).await;
    check_distinct_batches(Backend::Postgres, true).await;
}

/// A cap that refuses a booking while everything else fits: the fast paths count a batch against
/// each cap in one statement, and must fall back so that the bookings before the cap still get
/// their seats. The level's cap alone (the event has room), then the event's cap alone.
async fn a_cap_refuses_only_the_bookings_past_it(backend: Backend, direct: bool) {
    let batches = || {
        vec![
            vec![item("CODE-1", "a1", 1, "A1")],
            vec![item("CODE-2", "b1", 2, "A1"), item("CODE-3", "c1", 3, "B1")],
            vec![item("CODE-4", "d1", 4, "B1"), item("CODE-5", "e1", 5, "B1")],
        ]
    };
    let (_db, store) = fresh_store(backend).await;
    let expected = hold_one_at_a_time(&store, batches()).await;
    assert_eq!(kinds(&expected), ["held", "level_full", "held", "held", "sold_out"]);
    let expected_state = state(&store).await;
    let (_db, store) = fresh_store(backend).await;
    let outcomes = hold_batches(&store, direct, batches()).await;
    assert_eq!(kinds(&outcomes), kinds(&expected));
    assert_eq!(state(&store).await, expected_state);
}

#[tokio::test]
async fn a_cap_refuses_only_the_bookings_past_it_sqlite() {
    a_cap_refuses_only_the_bookings_past_it(Backend::Sqlite, false).await;
    a_cap_refuses_only_the_bookings_past_it(Backend::Sqlite, true).await;
}

#[tokio::test]
async fn a_cap_refuses_only_the_bookings_past_it_postgres() {
    a_cap_refuses_only_the_bookings_past_it(Backend::Postgres, false).await;
    a_cap_refuses_only_the_bookings_past_it(Backend::Postgres, true).await;
}

/// A booking the database refuses with an error of its own (here a level the event lacks) fails
/// alone; the bookings around it are written.
async fn an_error_of_one_booking_fails_only_that_booking(backend: Backend, direct: bool) {
    let (_db, store) = fresh_store(backend).await;
    let items = vec![item("CODE-1", "a1", 1, "B1"), item("CODE-2", "b1", 2, "NOPE"), item("CODE-3", "c1", 3, "B1")];
    let outcomes = BatchUnderTest::new(&store, direct).write(items).await;
    assert_eq!(outcomes.len(), 3);
    assert_eq!(outcomes[0].as_ref().unwrap().kind(), "held");
    assert!(outcomes[1].is_err(), "{:?}", outcomes[1]);
    assert_eq!(outcomes[2].as_ref().unwrap().kind(), "held");
    let event = EventId::parse(crate::helpers::EVENT).unwrap();
    assert_eq!(store.seat_holders(&event).await.unwrap().len(), 2);
    assert_eq!(store.counters(&event).await.unwrap().0, 2);
}

#[tokio::test]
async fn an_error_of_one_booking_fails_only_that_booking_sqlite() {
    an_error_of_one_booking_fails_only_that_booking(Backend::Sqlite, false).await;
    an_error_of_one_booking_fails_only_that_booking(Backend::Sqlite, true).await;
}

#[tokio::test]
async fn an_error_of_one_booking_fails_only_that_booking_postgres() {
    an_error_of_one_booking_fails_only_that_booking(Backend::Postgres, false).await;
    an_error_of_one_booking_fails_only_that_booking(Backend::Postgres, true).await;
}

/// The PostgreSQL writer keeps its connection between batches, so a server that drops it (a
/// restart, an operator's `pg_terminate_backend`) must cost one batch, not the rest of the sale:
/// that batch fails whole (its bookings stay pending, for the reaper), and the next one is written
/// on a new connection.
#[tokio::test]
async fn the_postgres_writer_writes_on_after_its_connection_is_killed() {
    let (db, store) = fresh_store(Backend::Postgres).await;
    let mut writer = store.postgres_batch_writer().unwrap();
    let first = writer.hold_batch(&[item("CODE-1", "a1", 1, "B1")]).await.unwrap().outcomes;
    assert_eq!(first[0].as_ref().unwrap().kind(), "held");
    let admin = sqlx::PgPool::connect(&db.url).await.unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()) k",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert!(killed >= 1, "the writer's connection was among the ones killed");
    let lost = writer.hold_batch(&[item("CODE-3", "c1", 3, "B1")]).await;
    assert!(lost.is_err(), "the batch on the dead connection fails whole: {lost:?}");
    let next = writer.hold_batch(&[item("CODE-4", "d1", 4, "B1")]).await.unwrap().outcomes;
    assert_eq!(next[0].as_ref().unwrap().kind(), "held", "written on a new connection");
    let event = EventId::parse(crate::helpers::EVENT).unwrap();
    let holders: Vec<i64> = store.seat_holders(&event).await.unwrap().into_iter().map(|r| r.slot).collect();
    assert_eq!(holders, [1, 4], "the failed batch left nothing behind");
}

async fn concurrent_callers_each_get_their_own_outcome(backend: Backend) {
    let (_db, store) = fresh_store(backend).await;
    let policy = PersistPolicy { batch_size_max: 4, linger: Duration::from_millis(2), writers: 2 };
    let stats = Arc::new(Stats::default());
    let persister = Persister::start(store.clone(), policy, None, stats.clone()).unwrap();
    // Distinct codes and seats, so the order the batches land in cannot change any outcome.
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let p = persister.clone();
            tokio::spawn(async move {
                p.hold(item(&format!("CODE-P{i}"), &format!("p{i}"), i + 1, "B1")).await.unwrap().outcome
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().kind(), "held");
    }
    let again = persister.hold(item("CODE-P0", "p0", 1, "B1")).await.unwrap().outcome;
    assert_eq!(again.kind(), "already_held");
    let full = persister.hold(item("CODE-P9", "p9", 9, "B1")).await.unwrap().outcome;
    assert_eq!(full, HoldOutcome::SoldOut);
    // Every booking went through a counted batch, and the writers' time was counted.
    let batches = stats.persist_batches.load(Ordering::Relaxed);
    assert!((3..=5).contains(&batches), "{batches} batches for 5 bookings, at most 4 a batch, the last two alone");
    assert_eq!(stats.persist_batched.load(Ordering::Relaxed), 5);
    assert!(stats.persist_busy_us.load(Ordering::Relaxed) > 0);
}

#[tokio::test]
async fn concurrent_callers_each_get_their_own_outcome_sqlite() {
    concurrent_callers_each_get_their_own_outcome(Backend::Sqlite).await;
}

#[tokio::test]
async fn concurrent_callers_each_get_their_own_outcome_postgres() {
    concurrent_callers_each_get_their_own_outcome(Backend::Postgres).await;
}

/// The `409 already_admitted` seat read goes through SQLite's batch writer: it must read what the
/// database holds, the same row the pool reads, for a code it wrote, a code the reaper claimed
/// through another connection after the writer's last commit, and a code with no row.
#[tokio::test]
async fn the_sqlite_writer_reads_the_rows_the_pool_reads() {
    let (db, store) = fresh_store(Backend::Sqlite).await;
    let writer = SqliteBatchWriter::open(&store.sqlite_path().unwrap()).unwrap();
    let (items, _) = scenario();
    writer.hold_batch(Arc::new(items.clone())).await.unwrap();
    // Written by another connection since: the writer must not answer from a stale cache.
    let late = item("CODE-7", "g1", 3, "B1");
    store.reap(&late.event, &late.admission, 2_000).await.unwrap();
    let event = EventId::parse(crate::helpers::EVENT).unwrap();
    let mut held = 0;
    for code in ["CODE-1", "CODE-3", "CODE-4", "CODE-5", "CODE-6", "CODE-7", "CODE-8"] {
        let (by_writer, by_pool) =
            (writer.booking(&event, &hash(code)).await.unwrap(), store.booking(&event, &hash(code)).await.unwrap());
        assert_eq!(by_writer, by_pool, "{code}");
        held += by_writer.as_ref().is_some_and(|r| r.holds_seat()) as usize;
    }
    assert_eq!(held, 3, "CODE-1, CODE-3 and CODE-4 hold seats");
    assert_eq!(
        writer.booking(&event, &hash("CODE-7")).await.unwrap().map(|r| r.state),
        Some(seatrush::store::BookingState::Released)
    );
    assert_eq!(writer.booking(&event, &hash("CODE-8")).await.unwrap(), None);
    drop(db);
}

/// A row the store cannot decode fails the read that meets it: skipped, as it once was, a holder
/// would vanish from the lists reconcile and the seat pool are built from.
#[tokio::test]
async fn a_row_that_does_not_decode_is_an_error_not_skipped() {
    let (db, store) = fresh_store(Backend::Sqlite).await;
    let Store::Sqlite(pool) = &store else { unreachable!("a SQLite store") };
    let event = EventId::parse(crate::helpers::EVENT).unwrap();
    assert_eq!(store.seat_holders(&event).await.unwrap().len(), 0);
    sqlx::query(
        "INSERT INTO bookings (event_id, code_hash, nonce, admission_id, slot, level, state, admitted_ms, hold_until_ms, updated_ms)
         VALUES ($1, 'not-a-hash', 'nonce-0001', 'x1', 2, 'B1', 'held', 1, 2, 3)",
    )
    .bind(event.as_str())
    .execute(pool)
    .await
    .unwrap();
    let err = store.seat_holders(&event).await.unwrap_err().to_string();
    assert!(err.contains("CodeHash"), "{err}");
    drop(db);
}
