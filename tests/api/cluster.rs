//! Many events on a Redis Cluster (docs/design.md#many-events-on-a-redis-cluster): three
//! primaries with a replica each, started here; events whose hash tags land on different
//! primaries, sold at once through one `serve`.

use crate::helpers::{init_logs, nonce, test_codes, test_db, Backend, TestDb, OPERATOR_TOKEN};
use seatrush::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use seatrush::domain::event::{EventId, EventSpec, LevelName};
use seatrush::domain::session::SeatNumbering;
use seatrush::ops::settings::{Connections, ServeSettings};
use seatrush::ops::{self, loader, Reaper};
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::link::RedisLink;
use seatrush::redis_io::oplock::OperatorLock;
use seatrush::sale::Sale;
use seatrush::store::Store;
use seatrush_lab::cluster::TestCluster;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::{CancellationToken, DropGuard};

const SEATS: i64 = 12;
const CODES: usize = 30;
/// A candidate's tries, 100 ms apart: longer than a failover (the node timeout and an election).
const TRIES: usize = 100;

struct ClusterSale {
    url: String,
    client: reqwest::Client,
    cluster: TestCluster,
    sale: Arc<Sale>,
    store: Store,
    /// Each event and the port of the primary that owns its slot.
    events: Vec<(EventId, u16)>,
    codes: Vec<String>,
    /// `503 retry` answers so far.
    retries: std::sync::atomic::AtomicUsize,
    _db: TestDb,
    _stop: DropGuard,
}

/// Events named `c0`, `c1`, … until `count` of them sit on different primaries.
fn events_on_different_primaries(cluster: &TestCluster, count: usize) -> Vec<(EventId, u16)> {
    let mut found: Vec<(EventId, u16)> = Vec::new();
    for i in 0.. {
        let id = EventId::parse(&format!("c{i}")).unwrap();
        let port = cluster.primary_of(&EventKeys::new(&id).meta).unwrap();
        if found.iter().all(|(_, p)| *p != port) {
            found.push((id, port));
        }
        if found.len() == count {
            return found;
        }
    }
    unreachable!()
}

fn spec(id: &EventId) -> EventSpec {
    EventSpec {
        id: id.clone(),
        total_seats: SEATS,
        hold_seconds: 900,
        opens_at_ms: None,
        closes_at_ms: None,
        levels: BTreeMap::from([(LevelName::parse("A1").unwrap(), SEATS)]),
        sessions: BTreeMap::new(),
        seat_numbering: SeatNumbering::EventWide,
        language: None,
        payment_url: None,
        fair_start_seconds: 0,
    }
}

async fn spawn_cluster_sale(events: usize) -> ClusterSale {
    spawn_cluster_sale_with(events, 1, Reaper::Off).await
}

/// [`spawn_cluster_sale`] with `replicas` replicas a primary, and the reaper and the heal running
/// beside the server with `Reaper::Run`.
async fn spawn_cluster_sale_with(events: usize, replicas: usize, reaper: Reaper) -> ClusterSale {
    init_logs();
    let cluster = tokio::task::spawn_blocking(move || TestCluster::start(3, replicas)).await.unwrap().unwrap();
    let events = events_on_different_primaries(&cluster, events);
    let db = test_db(Backend::Sqlite).await;
    let store = Store::connect(&db.url).await.unwrap();
    let codes = test_codes(CODES);
    let hasher = CodeHasher::from_env();
    let hashes: Vec<CodeHash> = codes.iter().map(|c| hasher.hash(&NormalisedCode::parse(c).unwrap())).collect();
    let link = RedisLink::new(&cluster.url()).unwrap();
    assert!(link.is_cluster());
    for (id, _) in &events {
        store.apply_event(&spec(id)).await.unwrap();
        store.import_allowlist(id, &hashes).await.unwrap();
        loader::open_event(&mut link.check().await.unwrap(), &store, id).await.unwrap();
    }
    let connections = Connections { redis_url: cluster.url(), redis_ca_file: None, database_url: db.url.clone() };
    let mut serve = ServeSettings::from_env().unwrap();
    serve.operator_token = Some(OPERATOR_TOKEN.into());
    serve.wait_replicas = 1;
    serve.wait_timeout_ms = 300;
    serve.reaper_interval_ms = 100;
    serve.commit_connections = 2;
    let state = ops::build_app(&connections, &serve).await.unwrap();
    let sale = state.sale.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    tokio::spawn(ops::serve_until(state, listener, stop.clone(), reaper));
    ClusterSale {
        url,
        client: reqwest::Client::new(),
        cluster,
        store: sale.store().clone(),
        sale,
        events,
        codes,
        retries: Default::default(),
        _db: db,
        _stop: stop.drop_guard(),
    }
}

impl ClusterSale {
    /// One booking: its status and the seat it names, if any.
    async fn book(&self, event: &EventId, code: &str, nonce: &str) -> (u16, Option<i64>) {
        let body = json!({ "code": code, "level": "A1", "nonce": nonce, "website": "" });
        let r = self
            .client
            .post(format!("{}/api/events/{}/bookings", self.url, event.as_str()))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        if status != 201 {
            tracing::info!(%event, status, %body, "booking answered");
        }
        (status, body.get("seat").and_then(serde_json::Value::as_i64))
    }

    /// Waits until no admission of any event is still pending in Redis.
    async fn drain(&self) {
        for (event, _) in &self.events {
            let left = self.sale.drain(event, Duration::from_secs(10)).await.unwrap();
            assert_eq!(left, 0, "{event}: every admission settled");
        }
    }

    /// Books as a candidate does: a `503 retry` is sent again with the same nonce, until the
    /// answer is final.
    async fn book_until_final(&self, event: &EventId, code: &str) -> (u16, Option<i64>) {
        let nonce = nonce("burst");
        for _ in 0..TRIES {
            let answer = self.book(event, code, &nonce).await;
            if answer.0 != 503 {
                return answer;
            }
            self.retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{event} {code}: still 503 after {TRIES} tries")
    }

    async fn assert_invariants(&self) {
        let mut conn = self.sale.link().check().await.unwrap();
        for (event, _) in &self.events {
            let violations = seatrush_lab::invariants::violations(&mut conn, &self.store, event).await.unwrap();
            assert!(violations.is_empty(), "{event}: {}", violations.join("\n"));
        }
    }

    /// `cmdstat_evalsha` calls on the primary on `port`.
    fn script_calls(&self, port: u16) -> u64 {
        let info: String =
            seatrush::demo::redis_server::command_at(port, redis::cmd("INFO").arg("commandstats")).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_on_three_primaries_each_sell_every_seat_once() {
    let sale = spawn_cluster_sale(3).await;
    let before: HashMap<u16, u64> = sale.events.iter().map(|(_, port)| (*port, sale.script_calls(*port))).collect();
    // Every candidate of every event at once, each retrying a 503 as the page does: 90 candidates
    // for 36 seats.
    let sale = &sale;
    let mut attempts = Vec::new();
    for (event, _) in &sale.events {
        for code in &sale.codes {
            attempts.push(async move { (event.clone(), code.clone(), sale.book_until_final(event, code).await) });
        }
    }
    let answers = futures::future::join_all(attempts).await;
    for (event, port) in &sale.events {
        let mine: Vec<_> = answers.iter().filter(|(e, _, _)| e == event).collect();
        let admitted: Vec<_> = mine.iter().filter(|(_, _, (status, _))| *status == 201).collect();
        let statuses: Vec<u16> = mine.iter().map(|(_, _, (s, _))| *s).collect();
        assert_eq!(
            admitted.len() as i64,
            SEATS,
            "{event} on {port}: every seat sold once the crowd outnumbers them: {statuses:?}"
        );
        let seats: HashSet<i64> = admitted.iter().filter_map(|(_, _, (_, seat))| *seat).collect();
        assert_eq!(seats.len() as i64, SEATS, "{event}: no seat sold twice");
        assert!(
            mine.iter().all(|(_, _, (s, _))| *s == 201 || *s == 409),
            "{event}: the rest are told the level is full: {statuses:?}"
        );
        assert!(sale.script_calls(*port) > before[port], "{event}'s scripts ran on its own primary {port}");
    }
    // A second click of an admitted code is its own seat again, on each event's node.
    for (event, _) in &sale.events {
        let (code, seat) = answers
            .iter()
            .find_map(|(e, c, (s, seat))| (e == event && *s == 201).then_some((c.clone(), *seat)))
            .unwrap();
        let (status, again) = sale.book(event, &code, &nonce("second")).await;
        assert_eq!((status, again), (409, seat), "{event}: one seat per candidate");
    }
    sale.drain().await;
    sale.assert_invariants().await;
    // The operator's commands run on the cluster too: reconcile finds no drift (and a repair has
    // nothing to do), and close closes each event on its own primary.
    for (event, _) in &sale.events {
        let link = sale.sale.link();
        let drift = seatrush::ops::reconcile::reconcile(link, &sale.store, event, false).await.unwrap();
        assert!(drift.is_empty(), "{event}: {drift:?}");
        assert!(seatrush::ops::reconcile::reconcile(link, &sale.store, event, true).await.unwrap().is_empty());
        let closed = loader::close_event(&mut link.check().await.unwrap(), &sale.store, event).await.unwrap();
        assert!(matches!(closed, loader::CloseOutcome::Closed), "{event}");
        let (status, _) = sale.book(event, &sale.codes[0], &nonce("after-close")).await;
        assert_eq!(status, 403, "{event}: closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_that_dies_holds_back_only_its_own_primarys_events() {
    let mut sale = spawn_cluster_sale(2).await;
    let ((quiet, quiet_port), (busy, _)) = (sale.events[0].clone(), sale.events[1].clone());
    let replica = sale.cluster.replicas_of(quiet_port).unwrap()[0];
    // Killed, not stopped: a stopped node holds the crate's slot refresh (which asks the nodes
    // one by one under a lock) up to its response timeout, for every event (docs/design.md).
    sale.cluster.kill(replica);
    let sale = &sale;
    // The primary still counts the dead replica as good for a while, so it admits; its WAIT
    // cannot be met, and the admission is undone, not sold.
    let (status, _) = sale.book(&quiet, &sale.codes[0], &nonce("quiet")).await;
    // The other primary's replica keeps up: its event sells in the same moments (one WAIT per
    // node, not the slowest node's for every event).
    let (other, seat) = sale.book(&busy, &sale.codes[0], &nonce("busy")).await;
    assert_eq!(status, 503, "an admission no replica holds is not sold");
    assert_eq!((other, seat.is_some()), (201, true), "the other primary's event is not held back");
    sale.drain().await;
    sale.assert_invariants().await;
    let free: i64 =
        seatrush::demo::redis_server::command_at(quiet_port, redis::cmd("ZCARD").arg(EventKeys::new(&quiet).free))
            .unwrap();
    assert_eq!(free, SEATS, "the unacknowledged admission's seat is back in the pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_mid_burst_is_followed_and_every_event_keeps_its_invariants() {
    // Two replicas a primary: the one promoted still has a replica to acknowledge its writes.
    let mut sale = spawn_cluster_sale_with(3, 2, Reaper::Run).await;
    let (victim, victim_port) = sale.events[0].clone();
    let replicas = sale.cluster.replicas_of(victim_port).unwrap();
    let answers = {
        let sale = &sale;
        let mut attempts = Vec::new();
        for (event, _) in &sale.events {
            for (i, code) in sale.codes.iter().enumerate() {
                attempts.push(async move {
                    // Spread over the first second, so the kill lands in the middle of the burst.
                    tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
                    (event.clone(), sale.book_until_final(event, code).await)
                });
            }
        }
        let burst = futures::future::join_all(attempts);
        let kill = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            sale.cluster.sigkill(victim_port);
        };
        futures::join!(burst, kill).0
    };
    sale.cluster.kill(victim_port);
    // The replica took over, and the cluster agrees on it.
    let cluster = &sale.cluster;
    tokio::task::block_in_place(|| cluster.wait_settled(3, 5)).unwrap();
    let now = sale.cluster.primary_of(&EventKeys::new(&victim).meta).unwrap();
    assert!(replicas.contains(&now), "a replica of {victim_port} took over: {now}");
    for (event, _) in &sale.events {
        let admitted: Vec<Option<i64>> =
            answers.iter().filter(|(e, (s, _))| e == event && *s == 201).map(|(_, (_, seat))| *seat).collect();
        let seats: HashSet<i64> = admitted.iter().flatten().copied().collect();
        assert_eq!(seats.len(), admitted.len(), "{event}: no seat sold twice");
        assert_eq!(admitted.len() as i64, SEATS, "{event}: every seat sold, the failover's included");
    }
    sale.drain().await;
    sale.assert_invariants().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_events_slot_migrated_while_it_sells_loses_no_seat() {
    let sale = spawn_cluster_sale_with(2, 1, Reaper::Run).await;
    let ((moving, from), (_, to)) = (sale.events[0].clone(), sale.events[1].clone());
    let key = EventKeys::new(&moving).meta;
    let answers = {
        let sale = &sale;
        let attempts = sale.codes.iter().enumerate().map(|(i, code)| {
            let moving = moving.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
                sale.book_until_final(&moving, code).await
            }
        });
        let burst = futures::future::join_all(attempts);
        let migrate = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            tokio::task::block_in_place(|| sale.cluster.migrate_slot_of(&key, to)).unwrap();
        };
        futures::join!(burst, migrate).0
    };
    assert_eq!(sale.cluster.primary_of(&key).unwrap(), to, "the event's slot left {from} for {to}");
    let admitted: Vec<Option<i64>> = answers.iter().filter(|(s, _)| *s == 201).map(|(_, seat)| *seat).collect();
    let seats: HashSet<i64> = admitted.iter().flatten().copied().collect();
    assert_eq!(seats.len(), admitted.len(), "no seat sold twice");
    assert_eq!(admitted.len() as i64, SEATS, "every seat sold across the migration: {answers:?}");
    // The committer sends an event's admits again after a MOVED, ASK or TRYAGAIN (the node ran
    // nothing), so no candidate was told to retry.
    assert_eq!(sale.retries.load(std::sync::atomic::Ordering::Relaxed), 0, "no 503 during the migration");
    sale.drain().await;
    sale.assert_invariants().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_refuses_a_cluster_whose_primaries_disagree_and_says_which() {
    let cluster = tokio::task::spawn_blocking(|| TestCluster::start(3, 1)).await.unwrap().unwrap();
    let db = test_db(Backend::Sqlite).await;
    let store = Store::connect(&db.url).await.unwrap();
    let id = EventId::parse("c0").unwrap();
    store.apply_event(&spec(&id)).await.unwrap();
    let link = RedisLink::new(&cluster.url()).unwrap();
    let odd = cluster.primary_ports().unwrap()[1];
    let set = |policy: &str| {
        seatrush::demo::redis_server::command_at::<()>(
            odd,
            redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg(policy),
        )
        .unwrap()
    };
    set("allkeys-lru");
    let err = loader::open_event(&mut link.check().await.unwrap(), &store, &id).await.unwrap_err().to_string();
    assert!(err.contains("disagree") && err.contains(&odd.to_string()), "{err}");
    // Every primary evicting alike is the evicting refusal, not a disagreement.
    for port in cluster.primary_ports().unwrap() {
        seatrush::demo::redis_server::command_at::<()>(
            port,
            redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("allkeys-lru"),
        )
        .unwrap();
    }
    let err = loader::open_event(&mut link.check().await.unwrap(), &store, &id).await.unwrap_err().to_string();
    assert!(err.contains("noeviction") && !err.contains("disagree"), "{err}");
    for port in cluster.primary_ports().unwrap() {
        seatrush::demo::redis_server::command_at::<()>(
            port,
            redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("noeviction"),
        )
        .unwrap();
    }
    loader::open_event(&mut link.check().await.unwrap(), &store, &id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_reads_every_primary_as_a_user_refused_cluster_nodes() {
    let cluster = tokio::task::spawn_blocking(|| TestCluster::start(3, 1)).await.unwrap().unwrap();
    // A managed cluster's application user: everything but CLUSTER NODES (CLUSTER SLOTS, which
    // the crate needs too, stays allowed).
    for node in &cluster.nodes {
        let mut user = redis::cmd("ACL");
        user.arg("SETUSER").arg("app").arg("on").arg(">app-password").arg("~*").arg("&*").arg("+@all");
        user.arg("-cluster|nodes");
        cluster.command::<()>(node.port, &user).unwrap();
    }
    let url = cluster.url().replacen("redis+cluster://", "redis+cluster://app:app-password@", 1);
    let link = RedisLink::new(&url).unwrap();
    let mut conn = link.check().await.unwrap();
    let refused = redis::cmd("CLUSTER").arg("NODES").query_async::<String>(&mut conn).await.unwrap_err();
    assert!(refused.to_string().contains("no permissions"), "{refused}");
    let db = test_db(Backend::Sqlite).await;
    let store = Store::connect(&db.url).await.unwrap();
    let id = EventId::parse("c0").unwrap();
    store.apply_event(&spec(&id)).await.unwrap();
    let report = loader::open_event(&mut conn, &store, &id).await.unwrap();
    assert_eq!(report.free_seats, SEATS);
}

/// Two events' slots on different primaries, a link to the cluster, and a connection made before
/// any migration, whose slot map a migration leaves stale (as a long-running operator's is).
async fn start_three_primaries() -> (TestCluster, Vec<(EventId, u16)>, RedisLink) {
    init_logs();
    let cluster = tokio::task::spawn_blocking(|| TestCluster::start(3, 1)).await.unwrap().unwrap();
    let events = events_on_different_primaries(&cluster, 2);
    let link = RedisLink::new(&cluster.url()).unwrap();
    (cluster, events, link)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_lock_held_across_its_slots_migration_is_freed_and_taken_again() {
    let (cluster, events, link) = start_three_primaries().await;
    let ((event, _), (_, to)) = (events[0].clone(), events[1].clone());
    let conn = link.check().await.unwrap();
    let lock = OperatorLock::acquire(&conn, &event, "lock test").await.unwrap();
    let key = EventKeys::new(&event).lock;
    tokio::task::block_in_place(|| cluster.migrate_slot_of(&key, to)).unwrap();
    // The release meets MOVED; sent again once the slot map is rebuilt, it frees the lock on its
    // new node instead of leaving it held for its whole expiry.
    lock.release().await.expect("the release follows the slot to its new primary");
    let again = OperatorLock::acquire(&conn, &event, "lock test again").await.expect("the lock is free at once");
    assert_eq!(cluster.primary_of(&key).unwrap(), to);
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_close_and_open_again_just_after_the_events_slot_migrated() {
    let (cluster, events, link) = start_three_primaries().await;
    let ((event, _), (_, to)) = (events[0].clone(), events[1].clone());
    let db = test_db(Backend::Sqlite).await;
    let store = Store::connect(&db.url).await.unwrap();
    store.apply_event(&spec(&event)).await.unwrap();
    let mut conn = link.check().await.unwrap();
    loader::open_event(&mut conn, &store, &event).await.unwrap();
    let key = EventKeys::new(&event).meta;
    tokio::task::block_in_place(|| cluster.migrate_slot_of(&key, to)).unwrap();
    let report = loader::open_event(&mut conn, &store, &event).await.expect("open after the migration");
    assert_eq!(report.free_seats, SEATS);
    let closed = loader::close_event(&mut conn, &store, &event).await.expect("close after the migration");
    assert!(matches!(closed, loader::CloseOutcome::Closed), "{closed:?}");
    let report =
        loader::open_event(&mut conn, &store, &event).await.expect("open again at once, not refused as locked");
    assert_eq!(report.free_seats, SEATS);
    let state: Option<String> = cluster.command(to, redis::cmd("HGET").arg(&key).arg("state")).unwrap();
    assert_eq!(state.as_deref(), Some("open"), "the event is open on its new primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_reply_is_followed_to_the_node_it_names() {
    let (cluster, events, link) = start_three_primaries().await;
    let ((event, _), (_, to)) = (events[0].clone(), events[1].clone());
    let key = EventKeys::new(&event).meta;
    let conn = link.check().await.unwrap();
    let mut set = redis::cmd("HSET");
    set.arg(&key).arg("probe").arg("before the move");
    conn.resending(|mut c| {
        let set = set.clone();
        async move { set.query_async::<()>(&mut c).await }
    })
    .await
    .unwrap();
    tokio::task::block_in_place(|| cluster.migrate_slot_of(&key, to)).unwrap();
    // The connection's slot map still names the old owner, so the first send meets MOVED; the
    // next goes to the node the MOVED named, not to wherever a rebuilt map would point.
    let targets = std::sync::Mutex::new(Vec::new());
    let read: Option<String> = conn
        .resending(|mut c| {
            targets.lock().unwrap().push(c.redirect_address());
            let mut get = redis::cmd("HGET");
            get.arg(&key).arg("probe");
            async move { get.query_async(&mut c).await }
        })
        .await
        .unwrap();
    assert_eq!(read.as_deref(), Some("before the move"));
    assert_eq!(*targets.lock().unwrap(), vec![None, Some(format!("127.0.0.1:{to}"))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_lock_is_taken_in_the_middle_of_its_slots_migration() {
    let (cluster, events, link) = start_three_primaries().await;
    let ((event, _), (_, to)) = (events[0].clone(), events[1].clone());
    let conn = link.check().await.unwrap();
    let key = EventKeys::new(&event).lock;
    let moving = tokio::task::block_in_place(|| cluster.move_keys_of(&key, to)).unwrap();
    // The source still owns the slot and answers ASK; the target, importing it, serves the lock
    // after ASKING, at once rather than after the slot's hand-over.
    let lock = OperatorLock::acquire(&conn, &event, "lock test").await.expect("taken on the importing node");
    tokio::task::block_in_place(|| cluster.hand_over(&moving)).unwrap();
    let held: Option<String> = cluster.command(to, redis::cmd("GET").arg(&key)).unwrap();
    assert!(held.is_some(), "the lock was written on the node the slot moved to");
    lock.release().await.expect("released on its new primary");
    let held: Option<String> = cluster.command(to, redis::cmd("GET").arg(&key)).unwrap();
    assert_eq!(held, None);
}
