//! Managed Redis (issue 33 item 7): a primary with `CONFIG` renamed away or refused by its ACL
//! user is judged from `INFO`, and a setting that neither shows needs the operator's
//! acknowledgement; passwords on the data nodes and on the Sentinels, each credential where the
//! README says it goes. Every server is a private `redis-server` on a free port, killed by pid
//! when the test ends.

use crate::helpers::{nonce, spec, test_codes, AppOptions, TestDb, EVENT};
use seatrush::demo::redis_server::{RedisOptions, RedisServer, SentinelPasswords};
use seatrush::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use seatrush::ops::settings::{Connections, ServeSettings};
use seatrush::ops::{self, loader};
use seatrush::redis_io::link::{RedisLink, SentinelAuth};
use seatrush::store::Store;
use seatrush_lab::fleet::{Fleet, ServeSpec};
use serde_json::json;

const MASTER: &str = "managed";
const NODE_PASSWORD: &str = "node-secret-7f3a";
const SENTINEL_PASSWORD: &str = "sentinel-secret-91c2";
const APP_USER: &str = "seatrush-app";
const APP_PASSWORD: &str = "app-secret-5d8e";

async fn start(options: RedisOptions) -> RedisServer {
    tokio::task::spawn_blocking(move || RedisServer::start(&options)).await.unwrap().unwrap()
}

async fn start_pair(options: RedisOptions) -> (RedisServer, RedisServer) {
    tokio::task::spawn_blocking(move || RedisServer::start_pair_with(&options)).await.unwrap().unwrap()
}

/// A store holding the demo-shaped event and ten codes.
async fn seeded(db: &TestDb) -> (Store, Vec<String>) {
    let store = Store::connect(&db.url).await.unwrap();
    let spec = spec(&AppOptions::default());
    store.apply_event(&spec).await.unwrap();
    let codes = test_codes(10);
    let hasher = CodeHasher::from_env();
    let hashes: Vec<CodeHash> = codes.iter().map(|c| hasher.hash(&NormalisedCode::parse(c).unwrap())).collect();
    store.import_allowlist(&spec.id, &hashes).await.unwrap();
    (store, codes)
}

async fn open(url: &str, store: &Store, unverifiable_ok: bool) -> anyhow::Result<loader::OpenReport> {
    let link = RedisLink::open_with(url, None, &SentinelAuth::default())?;
    let id = spec(&AppOptions::default()).id;
    loader::open_event_acknowledging(&mut link.check().await?, store, &id, unverifiable_ok).await
}

fn serve_settings(unverifiable_ok: bool, wait_replicas: u32) -> ServeSettings {
    let mut settings = ServeSettings::from_env().unwrap();
    settings.wait_replicas = wait_replicas;
    settings.redis_checks.redis_settings_unverifiable_ok = unverifiable_ok;
    settings
}

async fn book(url: &str, code: &str) -> (u16, serde_json::Value) {
    let body = json!({ "code": code, "level": "A1", "nonce": nonce("managed"), "website": "" });
    let answer =
        reqwest::Client::new().post(format!("{url}/api/events/{EVENT}/bookings")).json(&body).send().await.unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_redis_without_config_is_judged_from_info_and_asks_for_the_flag_only_for_what_info_cannot_show() {
    // AOF off, CONFIG gone: INFO shows the policy and the replica guard, but the RDB schedule is
    // nowhere else, so persistence is unverifiable.
    let options = RedisOptions {
        renamed_away: vec!["CONFIG".into()],
        extra: vec![("min-replicas-to-write".into(), "1".into())],
        ..Default::default()
    };
    let (primary, _replica) = start_pair(options).await;
    let config = primary.command::<String>(redis::cmd("CONFIG").arg("GET").arg("save"));
    assert!(config.is_err(), "CONFIG is really gone: {config:?}");
    let db = TestDb::sqlite("managed.db").unwrap();
    let (store, codes) = seeded(&db).await;

    let refused = open(&primary.url(), &store, false).await.unwrap_err().to_string();
    assert!(refused.contains("cannot verify") && refused.contains("persistence"), "{refused}");
    assert!(refused.contains("--redis-settings-unverifiable-ok"), "the refusal names the flag: {refused}");
    assert!(!refused.contains("maxmemory-policy ("), "the policy was read from INFO: {refused}");
    assert!(!refused.contains("min-replicas-to-write ("), "the replica guard was read from INFO: {refused}");

    let report = open(&primary.url(), &store, true).await.unwrap();
    assert_eq!(report.settings.unverified.len(), 1, "{:?}", report.settings);
    assert!(report.settings.unverified[0].contains("persistence"), "{:?}", report.settings);
    assert_eq!(report.settings.min_replicas, None, "INFO shows min_slaves_good_slaves: the guard is on");
    assert_eq!(report.free_seats, 10, "the event was loaded");

    let connections = Connections { redis_url: primary.url(), redis_ca_file: None, database_url: db.url.clone() };
    let Err(refused) = ops::build_app(&connections, &serve_settings(false, 1)).await else {
        panic!("serve started on a primary whose persistence it cannot read, without the flag")
    };
    assert!(format!("{refused:#}").contains("--redis-settings-unverifiable-ok"), "{refused:#}");
    let state = ops::build_app(&connections, &serve_settings(true, 1)).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(ops::serve_until(state, listener, stop, ops::Reaper::Off));
    let (status, body) = book(&url, &codes[0]).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_redis_an_aof_primary_without_config_opens_with_no_flag_and_a_missing_replica_guard_is_a_warning() {
    let options = RedisOptions {
        renamed_away: vec!["CONFIG".into()],
        extra: vec![("appendonly".into(), "yes".into())],
        ..Default::default()
    };
    let primary = start(options).await;
    let db = TestDb::sqlite("managed.db").unwrap();
    let (store, _codes) = seeded(&db).await;
    let report = open(&primary.url(), &store, false).await.unwrap();
    assert!(report.settings.unverified.is_empty(), "{:?}", report.settings);
    assert_eq!(report.settings.persistence, None, "aof_enabled:1 in INFO is persistence");
    let warning = report.settings.min_replicas.expect("min-replicas-to-write is 0 by default");
    assert!(warning.contains("min_slaves_good_slaves"), "{warning}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_redis_an_evicting_primary_is_refused_from_info_even_with_the_flag() {
    let options = RedisOptions {
        renamed_away: vec!["CONFIG".into()],
        maxmemory_policy: Some("allkeys-lru".into()),
        ..Default::default()
    };
    let primary = start(options).await;
    let db = TestDb::sqlite("managed.db").unwrap();
    let (store, _codes) = seeded(&db).await;
    let err = open(&primary.url(), &store, true).await.unwrap_err().to_string();
    assert!(err.contains("\"allkeys-lru\"") && err.contains("noeviction"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_redis_an_acl_user_without_config_reaches_a_password_protected_primary() {
    let primary = start(RedisOptions { password: Some(NODE_PASSWORD.into()), ..Default::default() }).await;
    // The user a managed service hands out: everything but the admin commands.
    primary
        .command::<()>(
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg(APP_USER)
                .arg("on")
                .arg(format!(">{APP_PASSWORD}"))
                .arg("~*")
                .arg("&*")
                .arg("+@all")
                .arg("-@admin"),
        )
        .unwrap();
    let db = TestDb::sqlite("managed.db").unwrap();
    let (store, _codes) = seeded(&db).await;
    let url = format!("redis://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{}", primary.port);

    let refused = open(&url, &store, false).await.unwrap_err().to_string();
    assert!(
        refused.contains("persistence") && refused.contains("no permissions"),
        "CONFIG is refused by the ACL: {refused}"
    );
    assert!(!refused.contains(APP_PASSWORD), "{refused}");
    let report = open(&url, &store, true).await.unwrap();
    assert!(report.settings.unverified[0].contains("persistence"), "{:?}", report.settings);

    let wrong = format!("redis://{APP_USER}:not-it@127.0.0.1:{}", primary.port);
    let err = format!("{:#}", open(&wrong, &store, true).await.unwrap_err());
    assert!(err.contains("cannot reach Redis") && !err.contains("not-it"), "{err}");
}

/// A primary and replica that require `NODE_PASSWORD` and know the ACL user `APP_USER`, under a
/// Sentinel that requires `SENTINEL_PASSWORD`.
async fn authenticated_topology() -> (RedisServer, RedisServer, RedisServer) {
    let (primary, replica) =
        start_pair(RedisOptions { password: Some(NODE_PASSWORD.into()), ..Default::default() }).await;
    let acl = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(APP_USER)
        .arg("on")
        .arg(format!(">{APP_PASSWORD}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .to_owned();
    primary.command::<()>(&acl).unwrap();
    replica.command::<()>(&acl).unwrap();
    let port = primary.port;
    let passwords = SentinelPasswords { own: Some(SENTINEL_PASSWORD.into()), nodes: Some(NODE_PASSWORD.into()) };
    let sentinel =
        tokio::task::spawn_blocking(move || RedisServer::start_sentinel_authenticated(port, MASTER, 1, &passwords))
            .await
            .unwrap()
            .unwrap();
    (primary, replica, sentinel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_redis_the_real_binary_opens_and_books_through_a_password_protected_sentinel_and_nodes() {
    let (_primary, _replica, sentinel) = authenticated_topology().await;
    let db = TestDb::sqlite("managed.db").unwrap();
    let (_store, codes) = seeded(&db).await;
    let redis_url = format!("redis+sentinel://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{}/{MASTER}", sentinel.port);
    let env = vec![
        ("SEATRUSH_REDIS_URL".to_owned(), redis_url),
        ("SEATRUSH_DATABASE_URL".to_owned(), db.url.clone()),
        ("SEATRUSH_SENTINEL_PASSWORD".to_owned(), SENTINEL_PASSWORD.to_owned()),
        ("SEATRUSH_WAIT_REPLICAS".to_owned(), "1".to_owned()),
    ];
    let bin = env!("CARGO_BIN_EXE_seatrush");
    let opened = std::process::Command::new(bin).args(["open", "--event", EVENT]).envs(env.clone()).output().unwrap();
    let said = String::from_utf8_lossy(&opened.stdout).to_string() + &String::from_utf8_lossy(&opened.stderr);
    assert!(opened.status.success(), "open through the Sentinel: {said}");
    assert!(!said.contains(APP_PASSWORD) && !said.contains(SENTINEL_PASSWORD), "{said}");

    let without = std::process::Command::new(bin)
        .args(["open", "--event", EVENT])
        .envs(env.iter().filter(|(name, _)| name != "SEATRUSH_SENTINEL_PASSWORD").cloned())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&without.stderr);
    assert!(!without.status.success(), "the Sentinel requires its password");
    assert!(said.contains("SEATRUSH_SENTINEL_PASSWORD"), "the error says where the Sentinels' password goes: {said}");

    let logs = tempfile::tempdir().unwrap();
    let serve = ServeSpec { bin: bin.into(), env, log_dir: logs.path().to_owned() };
    let fleet = Fleet::start(serve, 1).await.unwrap();
    let (status, body) = book(&fleet.urls()[0], &codes[0]).await;
    assert_eq!(status, 201, "{body}");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_redis_a_wrong_node_password_through_sentinel_says_which_credential_is_which() {
    let (_primary, _replica, sentinel) = authenticated_topology().await;
    let auth = SentinelAuth { username: None, password: Some(SENTINEL_PASSWORD.into()) };
    let right = format!("redis+sentinel://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{}/{MASTER}", sentinel.port);
    RedisLink::open_with(&right, None, &auth).unwrap().check().await.unwrap();
    let wrong = format!("redis+sentinel://{APP_USER}:not-it@127.0.0.1:{}/{MASTER}", sentinel.port);
    let err = format!(
        "{:#}",
        anyhow::Error::from(RedisLink::open_with(&wrong, None, &auth).unwrap().check().await.unwrap_err())
    );
    assert!(err.contains("the data nodes'") && err.contains("SEATRUSH_SENTINEL_PASSWORD"), "{err}");
    assert!(!err.contains("not-it") && !err.contains(SENTINEL_PASSWORD), "{err}");
}
