//! TLS to Redis and PostgreSQL, against real servers: TLS-only `redis-server`s (a primary and a
//! replica replicating over TLS, and a Sentinel), a PostgreSQL with `ssl=on` that refuses plain
//! connections, and certificates made here (a CA and a server certificate for localhost and
//! 127.0.0.1). A plain URL against a TLS-only server fails with a hint, and no password in a URL
//! reaches an error message or a log line.

use crate::helpers::{nonce, spec, test_codes, AppOptions, TestDb, EVENT};
use seatrush::demo::redis_server::{spawn_tied, RedisOptions, RedisServer, RedisTls};
use seatrush::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use seatrush::ops::settings::{Connections, ServeSettings};
use seatrush::ops::{self, loader, Reaper};
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::link::RedisLink;
use seatrush::store::Store;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

const MASTER: &str = "seatrush-tls";
/// The password of the PostgreSQL superuser and of the Redis servers that require one.
const RIGHT_PASSWORD: &str = "right-password";
/// The password that must never be printed.
const SECRET: &str = "s3cret";

/// A CA and a certificate it signed for localhost and 127.0.0.1, as PEM files in a temp dir.
struct Certificates {
    _dir: tempfile::TempDir,
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl Certificates {
    fn make() -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        // A name of its own: a wrong CA is an unknown issuer, not a namesake.
        ca_params.distinguished_name.push(DnType::CommonName, format!("seatrush test CA {}", uuid::Uuid::new_v4()));
        ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "localhost");
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let dir = tempfile::Builder::new().prefix("seatrush-tls-").tempdir().unwrap();
        let write = |name: &str, pem: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        let ca_file = write("ca.pem", ca.pem());
        let cert_file = write("server.pem", cert.pem());
        let key_file = write("server.key", key.serialize_pem());
        Self { _dir: dir, ca_file, cert_file, key_file }
    }

    fn redis(&self) -> RedisTls {
        RedisTls { cert_file: self.cert_file.clone(), key_file: self.key_file.clone(), ca_file: self.ca_file.clone() }
    }
}

/// A TLS-only primary and replica (`tls-replication yes`), the replica's first sync done.
async fn tls_pair(certificates: &Certificates, extra: Vec<(String, String)>) -> (RedisServer, RedisServer) {
    let options = RedisOptions { tls: Some(certificates.redis()), extra, ..Default::default() };
    tokio::task::spawn_blocking(move || RedisServer::start_pair_with(&options)).await.unwrap().unwrap()
}

/// The demo-shaped event, applied and its allowlist imported, in the database of `database_url`.
async fn seed(database_url: &str) -> Vec<String> {
    let store = Store::connect(database_url).await.unwrap();
    let spec = spec(&AppOptions::default());
    store.apply_event(&spec).await.unwrap();
    let codes = test_codes(10);
    let hasher = CodeHasher::from_env();
    let hashes: Vec<CodeHash> = codes.iter().map(|c| hasher.hash(&NormalisedCode::parse(c).unwrap())).collect();
    store.import_allowlist(&spec.id, &hashes).await.unwrap();
    drop(store);
    codes
}

/// `open`, then the app `serve` builds from `connections` (one replica to WAIT for), on port 0.
async fn serve(connections: &Connections) -> anyhow::Result<(String, DropGuard)> {
    let link = RedisLink::open(&connections.redis_url, connections.redis_ca_file.as_deref())?;
    let store = Store::connect(&connections.database_url).await?;
    loader::open_event(&mut link.check().await?, &store, &spec(&AppOptions::default()).id).await?;
    drop(store);
    let mut settings = ServeSettings::from_env().unwrap();
    settings.wait_replicas = 1;
    settings.wait_timeout_ms = 200;
    let state = ops::build_app(connections, &settings).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let stop = CancellationToken::new();
    tokio::spawn(ops::serve_until(state, listener, stop.clone(), Reaper::Off));
    Ok((url, stop.drop_guard()))
}

async fn book(url: &str, code: &str) -> (u16, serde_json::Value) {
    let body = json!({ "code": code, "level": "A1", "nonce": nonce("tls"), "website": "" });
    let answer =
        reqwest::Client::new().post(format!("{url}/api/events/{EVENT}/bookings")).json(&body).send().await.unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap_or_default())
}

/// The admission records the replica holds: what reached it through TLS replication.
fn replica_records(replica: &RedisServer) -> usize {
    let keys = EventKeys::new(&spec(&AppOptions::default()).id);
    replica.command::<usize>(redis::cmd("HLEN").arg(&keys.adm)).unwrap()
}

/// Admits one booking (201, its record on the replica), then shows WAIT counts the replica: with
/// the replica stalled the next booking is 503 retry.
async fn admit_and_check_wait(url: &str, codes: &[String], replica: &RedisServer) {
    let (status, body) = book(url, &codes[0]).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(replica_records(replica), 1, "the admission reached the replica over TLS");
    replica.pause();
    let (stalled, body) = book(url, &codes[1]).await;
    replica.resume();
    assert_eq!((stalled, body["status"].as_str()), (503, Some("retry")), "WAIT waited for the stalled replica: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_booking_is_admitted_through_rediss_with_the_ca_file_and_waits_for_the_replica() {
    let certificates = Certificates::make();
    let (primary, replica) = tls_pair(&certificates, vec![]).await;
    assert!(primary.url().starts_with("rediss://"));
    let db = TestDb::sqlite("tls.db").unwrap();
    let codes = seed(&db.url).await;
    let connections = Connections {
        redis_url: primary.url(),
        redis_ca_file: Some(certificates.ca_file.clone()),
        database_url: db.url.clone(),
    };
    let (url, _stop) = serve(&connections).await.unwrap();
    admit_and_check_wait(&url, &codes, &replica).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_booking_is_admitted_through_rediss_sentinel_with_tls_to_the_sentinel_and_the_nodes() {
    let certificates = Certificates::make();
    let (primary, replica) = tls_pair(&certificates, vec![]).await;
    let tls = certificates.redis();
    let primary_port = primary.port;
    let sentinel =
        tokio::task::spawn_blocking(move || RedisServer::start_sentinel_with(primary_port, MASTER, 1, Some(&tls)))
            .await
            .unwrap()
            .unwrap();
    let db = TestDb::sqlite("tls.db").unwrap();
    let codes = seed(&db.url).await;
    let connections = Connections {
        redis_url: format!("rediss+sentinel://127.0.0.1:{}/{MASTER}", sentinel.port),
        redis_ca_file: Some(certificates.ca_file.clone()),
        database_url: db.url.clone(),
    };
    let (url, _stop) = serve(&connections).await.unwrap();
    admit_and_check_wait(&url, &codes, &replica).await;
    // The Sentinel itself takes TLS only: what it answered came over TLS.
    let plain = RedisLink::new(&format!("redis+sentinel://127.0.0.1:{}/{MASTER}", sentinel.port)).unwrap();
    assert!(plain.check().await.is_err(), "the Sentinel accepts no plain connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_plain_redis_url_against_a_tls_only_server_fails_at_start_and_suggests_rediss() {
    let certificates = Certificates::make();
    let (primary, _replica) = tls_pair(&certificates, vec![]).await;
    let db = TestDb::sqlite("tls.db").unwrap();
    seed(&db.url).await;
    let connections = Connections {
        redis_url: format!("redis://127.0.0.1:{}", primary.port),
        redis_ca_file: None,
        database_url: db.url.clone(),
    };
    let Err(err) = ops::build_app(&connections, &ServeSettings::from_env().unwrap()).await else {
        panic!("the app started with a plain URL against a TLS-only server")
    };
    let text = format!("{err:#}");
    assert!(text.contains("cannot reach Redis at redis://127.0.0.1:"), "{text}");
    assert!(text.contains("use a rediss:// URL"), "{text}");
    assert!(text.contains("--redis-ca-file"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_rediss_url_with_the_wrong_ca_fails_and_says_the_certificate_was_refused() {
    let certificates = Certificates::make();
    let other = Certificates::make();
    let (primary, _replica) = tls_pair(&certificates, vec![]).await;
    let link = RedisLink::open(&primary.url(), Some(&other.ca_file)).unwrap();
    let text = format!("{:#}", anyhow::Error::from(link.check().await.expect_err("refused")));
    assert!(text.contains("invalid peer certificate"), "{text}");
    assert!(text.contains("--redis-ca-file must name the CA"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_redis_password_in_the_url_is_in_no_error_message_and_no_log_line() {
    let certificates = Certificates::make();
    let options = RedisOptions { tls: Some(certificates.redis()), ..Default::default() };
    let primary = tokio::task::spawn_blocking(move || RedisServer::start(&options)).await.unwrap().unwrap();
    // Set once it is up: the start-up probe of the lab's helper sends no password.
    primary.command::<()>(redis::cmd("CONFIG").arg("SET").arg("requirepass").arg(RIGHT_PASSWORD)).unwrap();
    let db = TestDb::sqlite("tls.db").unwrap();
    seed(&db.url).await;
    let url = format!("rediss://:{SECRET}@127.0.0.1:{}", primary.port);
    let link = RedisLink::open(&url, Some(&certificates.ca_file)).unwrap();
    let err = anyhow::Error::from(link.check().await.expect_err("a wrong password is refused"));
    let (text, debug) = (format!("{err:#}"), format!("{err:?}"));
    assert!(text.contains("rediss://:***@127.0.0.1:"), "{text}");
    assert!(!text.contains(SECRET) && !debug.contains(SECRET), "{text}\n{debug}");
    // The binary, with every log line on: the password is nowhere in what it prints.
    let output = seatrush_open(&url, Some(&certificates.ca_file), &db.url).await;
    assert!(output.contains("cannot reach Redis at rediss://:***@127.0.0.1:"), "{output}");
    assert!(!output.contains(SECRET), "{output}");
}

/// `seatrush open` with trace logs, its stdout and stderr together.
async fn seatrush_open(redis_url: &str, ca_file: Option<&Path>, database_url: &str) -> String {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_seatrush"));
    cmd.args(["open", "--event", EVENT])
        .env("SEATRUSH_REDIS_URL", redis_url)
        .env("SEATRUSH_DATABASE_URL", database_url)
        .env("SEATRUSH_LOG", "trace");
    match ca_file {
        Some(ca) => cmd.env("SEATRUSH_REDIS_CA_FILE", ca),
        None => cmd.env_remove("SEATRUSH_REDIS_CA_FILE"),
    };
    let output = cmd.output().await.unwrap();
    assert!(!output.status.success(), "open must fail");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

const POSTGRES_BIN: &str = "/usr/lib/postgresql/15/bin";
const POSTGRES_START_TIMEOUT: Duration = Duration::from_secs(30);

/// A PostgreSQL of the test's own, started with `ssl=on` on a free port: `hostssl` only (a plain
/// connection is rejected), password authentication (scram) for the superuser `postgres`. Its
/// data dir is a temp dir owned by the `postgres` OS user, which runs `initdb` and the server
/// (both refuse root). Killed when dropped, and when this process dies.
struct TlsPostgres {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// The uid and gid of the `postgres` OS user.
fn postgres_user() -> (u32, u32) {
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam returns a pointer to static storage or null; read at once, on one thread.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(!entry.is_null(), "the postgres OS user must exist (it comes with the PostgreSQL server package)");
    // SAFETY: non-null, as checked.
    unsafe { ((*entry).pw_uid, (*entry).pw_gid) }
}

impl TlsPostgres {
    /// Serves with `cert_file` and `key_file` (PEM).
    fn start(cert_file: &Path, key_file: &Path) -> Self {
        let (uid, gid) = postgres_user();
        let dir = tempfile::Builder::new().prefix("seatrush-pg-tls-").tempdir().unwrap();
        let own = |path: &Path, mode: u32| {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        own(dir.path(), 0o700);
        // The server reads its certificate and key (0600, its own, or it refuses to start).
        let copy = |from: &Path, name: &str, mode: u32| {
            let to = dir.path().join(name);
            std::fs::copy(from, &to).unwrap();
            own(&to, mode);
            to
        };
        let cert = copy(cert_file, "server.pem", 0o644);
        let key = copy(key_file, "server.key", 0o600);
        let pwfile = dir.path().join("pwfile");
        std::fs::write(&pwfile, RIGHT_PASSWORD).unwrap();
        own(&pwfile, 0o600);
        let data = dir.path().join("data");
        let initdb = Command::new(format!("{POSTGRES_BIN}/initdb"))
            .uid(uid)
            .gid(gid)
            .args(["--auth-local=trust", "--auth-host=scram-sha-256", "--username=postgres", "--no-sync"])
            .arg(format!("--pwfile={}", pwfile.display()))
            .arg("-D")
            .arg(&data)
            .stdin(Stdio::null())
            .output()
            .expect("initdb of PostgreSQL 15 must be installed at /usr/lib/postgresql/15/bin");
        assert!(initdb.status.success(), "initdb failed: {}", String::from_utf8_lossy(&initdb.stderr));
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n\
             hostnossl all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        let port = seatrush::demo::redis_server::free_port().unwrap();
        let log = std::fs::File::create(dir.path().join("postgres.log")).unwrap();
        let mut cmd = Command::new(format!("{POSTGRES_BIN}/postgres"));
        cmd.uid(uid)
            .gid(gid)
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .arg("-p")
            .arg(port.to_string())
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "ssl=on", "-c", "fsync=off"])
            .arg("-c")
            .arg(format!("ssl_cert_file={}", cert.display()))
            .arg("-c")
            .arg(format!("ssl_key_file={}", key.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = spawn_tied(cmd).expect("postgres of PostgreSQL 15 must be installed at /usr/lib/postgresql/15/bin");
        let mut server = Self { child, port, dir };
        server.wait_ready();
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + POSTGRES_START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("postgres exited at start-up ({status}); its log:\n{}", self.log());
            }
            if self.log().contains("database system is ready to accept connections") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "postgres not ready after {POSTGRES_START_TIMEOUT:?}; its log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The superuser's database over TLS, with `password` and the server checked against `ca`.
    fn url(&self, password: &str, sslmode: &str, ca: &Path) -> String {
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/postgres?sslmode={sslmode}&sslrootcert={}",
            self.port,
            ca.display()
        )
    }
}

impl Drop for TlsPostgres {
    /// By pid: SIGQUIT (immediate shutdown), then reaped.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGQUIT);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn tls_postgres(certificates: &Certificates) -> TlsPostgres {
    // initdb and the start-up poll block.
    let (cert, key) = (certificates.cert_file.clone(), certificates.key_file.clone());
    tokio::task::spawn_blocking(move || TlsPostgres::start(&cert, &key)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_booking_is_admitted_with_postgres_over_sslmode_verify_full_and_redis_over_rediss() {
    let certificates = Certificates::make();
    let postgres = tls_postgres(&certificates).await;
    let (primary, replica) = tls_pair(&certificates, vec![]).await;
    let database_url = postgres.url(RIGHT_PASSWORD, "verify-full", &certificates.ca_file);
    let codes = seed(&database_url).await;
    let connections = Connections {
        redis_url: primary.url(),
        redis_ca_file: Some(certificates.ca_file.clone()),
        database_url: database_url.clone(),
    };
    let (url, _stop) = serve(&connections).await.unwrap();
    admit_and_check_wait(&url, &codes, &replica).await;
    // The booking is in the database, over a connection that is TLS.
    let Store::Postgres(pool) = Store::connect(&database_url).await.unwrap() else { panic!("a PostgreSQL store") };
    let ssl: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(&pool).await.unwrap();
    assert!(ssl, "the connection is TLS");
    let held: i64 =
        sqlx::query_scalar("SELECT count(*) FROM bookings WHERE state = 'held'").fetch_one(&pool).await.unwrap();
    assert_eq!(held, 1, "the admitted booking was written, and the stalled one holds no seat");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_postgres_with_sslmode_verify_full_and_the_wrong_ca_fails_with_a_clear_error() {
    let certificates = Certificates::make();
    let other = Certificates::make();
    let postgres = tls_postgres(&certificates).await;
    let err = Store::connect(&postgres.url(RIGHT_PASSWORD, "verify-full", &other.ca_file)).await.expect_err("refused");
    let text = format!("{:#}", anyhow::Error::from(err));
    assert!(text.contains("cannot reach the database"), "{text}");
    assert!(text.contains("invalid peer certificate"), "{text}");
    assert!(text.contains("sslrootcert= must name the CA"), "{text}");
    assert!(!text.contains(RIGHT_PASSWORD), "{text}");
    // And a plain connection is rejected by the server: the TLS above was not optional.
    let plain = format!("postgres://postgres:{RIGHT_PASSWORD}@127.0.0.1:{}/postgres?sslmode=disable", postgres.port);
    let text = format!("{:#}", anyhow::Error::from(Store::connect(&plain).await.expect_err("rejected")));
    assert!(text.contains("no encryption"), "{text}");
    assert!(text.contains("add sslmode=verify-full&sslrootcert="), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_postgres_password_in_the_url_is_in_no_error_message_and_no_log_line() {
    let certificates = Certificates::make();
    let postgres = tls_postgres(&certificates).await;
    let url = postgres.url(SECRET, "verify-full", &certificates.ca_file);
    let err = anyhow::Error::from(Store::connect(&url).await.expect_err("a wrong password is refused"));
    let (text, debug) = (format!("{err:#}"), format!("{err:?}"));
    assert!(text.contains("password authentication failed"), "{text}");
    assert!(!text.contains(SECRET) && !debug.contains(SECRET), "{text}\n{debug}");
    // The binary, with every log line on, Redis reachable (TLS) so that it gets to the database.
    let (primary, _replica) = tls_pair(&certificates, vec![]).await;
    let output = seatrush_open(&primary.url(), Some(&certificates.ca_file), &url).await;
    assert!(output.contains("password authentication failed"), "{output}");
    assert!(!output.contains(SECRET), "{output}");
}

/// A Redis Cluster that takes TLS only (`tls-cluster yes`, `tls-replication yes`): `serve` books
/// through `rediss+cluster://` with the CA file, each admission reaches the event's replica, and
/// `redis+cluster://` against it fails at start with the hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_a_booking_is_admitted_through_rediss_cluster_and_a_plain_cluster_url_is_refused() {
    let certificates = Certificates::make();
    let tls = certificates.redis();
    let cluster = tokio::task::spawn_blocking(move || seatrush_lab::cluster::TestCluster::start_with(3, 1, Some(tls)))
        .await
        .unwrap()
        .unwrap();
    assert!(cluster.url().starts_with("rediss+cluster://"));
    let db = TestDb::sqlite("tls.db").unwrap();
    let codes = seed(&db.url).await;
    let connections = Connections {
        redis_url: cluster.url(),
        redis_ca_file: cluster.ca_file().map(Path::to_owned),
        database_url: db.url.clone(),
    };
    let (url, _stop) = serve(&connections).await.unwrap();
    let (status, body) = book(&url, &codes[0]).await;
    assert_eq!(status, 201, "{body}");
    let keys = EventKeys::new(&spec(&AppOptions::default()).id);
    let primary = cluster.primary_of(&keys.meta).unwrap();
    let replica = cluster.replicas_of(primary).unwrap()[0];
    // A replica answers key reads with MOVED; its replication offset says it holds what the
    // primary wrote, the admission included, over TLS replication.
    let offset = |port: u16, field: &str| -> i64 {
        let info: String = cluster.command(port, redis::cmd("INFO").arg("replication")).unwrap();
        seatrush_lab::cluster::info_field(&info, field).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while offset(replica, "slave_repl_offset") != offset(primary, "master_repl_offset") {
        assert!(Instant::now() < deadline, "the event's replica caught up with its primary over TLS");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let plain = cluster.url().replacen("rediss+cluster://", "redis+cluster://", 1);
    let err = RedisLink::new(&plain).unwrap().check().await.map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("rediss+cluster://"), "a plain cluster URL against TLS-only nodes says to use TLS: {err}");
}
