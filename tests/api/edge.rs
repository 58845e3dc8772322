//! The public edge (issue 28): slow or idle clients cannot take capacity, one work bound per
//! process, only a JSON booking is a booking, browser protections on every answer, a guesser is
//! stopped before it books, health that costs nothing.

use crate::helpers::{nonce, spawn_app, AppOptions, TestApp, EVENT, OPERATOR_TOKEN};
use seatrush::http::guess_guard::GuessPolicy;
use seatrush::http::server::ConnectionLimits;
use seatrush::http::EdgeSettings;
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn edge(connections: ConnectionLimits) -> EdgeSettings {
    EdgeSettings { connections, ..Default::default() }
}

fn address(app: &TestApp) -> String {
    app.url.trim_start_matches("http://").to_owned()
}

/// Reads until the server closes the connection; the time it took, or None past `bound`.
async fn closed_within(stream: &mut TcpStream, bound: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buffer = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + bound).into(), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

fn booking_head(content_length: usize) -> String {
    format!(
        "POST /api/events/{EVENT}/bookings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {content_length}\r\n\r\n"
    )
}

#[tokio::test]
async fn a_half_sent_request_head_and_an_idle_kept_alive_connection_are_closed_after_the_header_timeout() {
    let limits = ConnectionLimits { header_read_timeout: Duration::from_millis(500), ..Default::default() };
    let app = spawn_app(AppOptions { edge: edge(limits), ..Default::default() }).await;

    let mut slowloris = TcpStream::connect(address(&app)).await.unwrap();
    slowloris.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let closed = closed_within(&mut slowloris, Duration::from_secs(5)).await;
    assert!(closed.is_some(), "a half-sent head was still open after 5 s");

    let mut idle = TcpStream::connect(address(&app)).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answer = [0u8; 512];
    let n = idle.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"));
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await.is_some(), "an idle kept-alive connection stayed");
}

#[tokio::test]
async fn trickling_bodies_hold_no_work_permit_and_real_bookings_are_admitted_at_once() {
    let limits = ConnectionLimits { body_read_timeout: Duration::from_secs(3), ..Default::default() };
    let settings = EdgeSettings { in_flight_max: 4, ..edge(limits) };
    let app = spawn_app(AppOptions { edge: settings, ..Default::default() }).await;
    // Fifty times the work bound: each sent a booking's head and one byte of its body.
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut stream = TcpStream::connect(address(&app)).await.unwrap();
        stream.write_all(format!("{}{{", booking_head(100)).as_bytes()).await.unwrap();
        slow.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 1..=5 {
        let a = app.book(&format!("CODE-{i:05}"), "A1", &nonce("real")).await;
        assert_eq!(a.status, 201, "booking {i} behind 200 trickling bodies: {a:?}");
    }
    // The trickler's body never completes: it is answered 408 once its deadline passes.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), slow[0].read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the trickling connection was not answered");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("\"body_timeout\""), "{answer}");
    assert!(app.sale.stats().snapshot()["body_timeouts"] >= 1);
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_work_bound_is_one_for_the_whole_process_so_a_flood_of_one_route_sheds_the_others() {
    let app = std::sync::Arc::new(
        spawn_app(AppOptions { edge: EdgeSettings { in_flight_max: 2, ..Default::default() }, ..Default::default() })
            .await,
    );
    // Two bookings park on a stalled database (another connection holds SQLite's write lock).
    use sqlx::Connection;
    let mut blocker = sqlx::SqliteConnection::connect(&app.db.url).await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut blocker).await.unwrap();
    let stuck: Vec<_> = (1..=2)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { app.book(&format!("CODE-{i:05}"), "A1", &nonce("stuck")).await })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let other_route = loop {
        let a = app.get(&format!("/api/events/{EVENT}")).await;
        if a.status == 503 || Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((other_route.status, other_route.status_str()), (503, "retry"), "availability shares the bound");
    sqlx::raw_sql("ROLLBACK").execute(&mut blocker).await.unwrap();
    for s in stuck {
        let a = s.await.unwrap();
        assert!(a.status == 201 || a.status == 503, "{a:?}");
    }
    assert_eq!(app.get(&format!("/api/events/{EVENT}")).await.status, 200);
    app.sale.drain(&app.event, Duration::from_secs(30)).await.unwrap();
    app.assert_invariants().await;
}

#[tokio::test]
async fn connections_past_the_cap_are_closed_as_soon_as_they_are_accepted() {
    let limits = ConnectionLimits { connections_max: 3, ..Default::default() };
    let app = spawn_app(AppOptions { edge: edge(limits), ..Default::default() }).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(address(&app)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = TcpStream::connect(address(&app)).await.unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(closed_within(&mut extra, Duration::from_secs(2)).await.is_some(), "the fourth connection was served");
    assert!(app.sale.stats().snapshot()["connections_refused"] >= 1);
    drop(held);
    // Once the held ones close, a new connection is served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while app.client.get(format!("{}/healthz", app.url)).send().await.is_err() {
        assert!(Instant::now() < deadline, "no connection served after the held ones closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn only_a_json_booking_is_a_booking_and_a_form_post_writes_nothing() {
    let app = spawn_app(AppOptions::default()).await;
    let body = json!({ "code": "CODE-00001", "level": "A1", "nonce": nonce("form"), "website": "" }).to_string();
    let path = format!("{}/api/events/{EVENT}/bookings", app.url);
    for content_type in
        [Some("text/plain"), Some("application/x-www-form-urlencoded"), Some("multipart/form-data"), None]
    {
        let mut request = app.client.post(&path).body(body.clone());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let r = request.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 415, "{content_type:?}");
        let answer: serde_json::Value = r.json().await.unwrap();
        assert_eq!(answer["status"], "unsupported_media_type");
    }
    let records: i64 = app.redis(redis::cmd("HLEN").arg(&app.keys.adm));
    assert_eq!(records, 0, "a refused form post admitted nothing");
    assert!(app.store.booking(&app.event, &app.hash("CODE-00001")).await.unwrap().is_none());
    let r = app.client.post(&path).header("content-type", "application/json; charset=utf-8").body(body).send().await;
    assert_eq!(r.unwrap().status().as_u16(), 201, "a charset parameter is still JSON");
    app.assert_invariants().await;
}

#[tokio::test]
async fn pages_and_answers_carry_the_browser_protections() {
    let app = spawn_app(AppOptions::default()).await;
    let page = app.client.get(format!("{}/events/{EVENT}", app.url)).send().await.unwrap();
    let headers = page.headers().clone();
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let policy = header("content-security-policy");
    assert!(policy.contains("default-src 'self'") && policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(policy.contains("script-src 'self' 'sha256-") && policy.contains("style-src 'self' 'sha256-"), "{policy}");
    assert!(!policy.contains("unsafe-inline") && !policy.contains('*'), "{policy}");
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("referrer-policy"), "no-referrer");
    assert_eq!(header("x-frame-options"), "DENY");
    assert_eq!(header("strict-transport-security"), "", "HSTS is off unless the operator turns it on");

    let ops = app.client.get(format!("{}/ops", app.url)).send().await.unwrap();
    assert!(ops.headers()["content-security-policy"].to_str().unwrap().contains("script-src 'self' 'sha256-"));
    let api = app.client.get(format!("{}/api/events/{EVENT}", app.url)).send().await.unwrap();
    assert_eq!(
        api.headers()["content-security-policy"],
        "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    );
    assert_eq!(api.headers()["x-content-type-options"], "nosniff");

    let app =
        spawn_app(AppOptions { edge: EdgeSettings { hsts: true, ..Default::default() }, ..Default::default() }).await;
    let r = app.client.get(format!("{}/healthz", app.url)).send().await.unwrap();
    assert_eq!(r.headers()["strict-transport-security"], "max-age=31536000");
}

#[tokio::test]
async fn a_guesser_is_refused_everything_registered_codes_included_until_its_penalty_ends() {
    let guessing = GuessPolicy { penalty: Duration::from_secs(2), ..Default::default() };
    let app = spawn_app(AppOptions {
        edge: EdgeSettings { refusal_rate_per_minute: 0, guessing, ..Default::default() },
        ..Default::default()
    })
    .await;
    for i in 0..20 {
        assert_eq!(app.book(&format!("GUESS-{i:04}"), "A1", &nonce("g")).await.status, 403, "guess {i}");
    }
    for i in 1..=5 {
        let a = app.book(&format!("CODE-{i:05}"), "A1", &nonce("hit")).await;
        assert_eq!((a.status, a.status_str()), (429, "rate_limited"), "registered code {i} from the guesser");
        let seconds: u64 = a.retry_after.as_deref().unwrap().parse().unwrap();
        assert!((1..=2).contains(&seconds), "{seconds}");
    }
    let records: i64 = app.redis(redis::cmd("HLEN").arg(&app.keys.adm));
    assert_eq!(records, 0, "the guesser booked nothing");
    let metrics = app.client.get(format!("{}/metrics", app.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("seatrush_code_refusals_total 20\n"), "{metrics}");
    assert!(metrics.contains("seatrush_guessers_penalised_total 1\n"), "{metrics}");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("later")).await.status, 201, "the penalty ran out");
    app.assert_invariants().await;
}

#[tokio::test]
async fn an_exam_centre_behind_one_address_with_ordinary_typos_is_never_locked_out() {
    let app = spawn_app(AppOptions {
        seats: 300,
        levels: vec![("A1", 300)],
        codes: 300,
        edge: EdgeSettings::default(),
        ..Default::default()
    })
    .await;
    let mut admitted = 0;
    for i in 1..=200 {
        // One candidate in ten mistypes first, then types it right.
        if i % 10 == 0 {
            let typo = app.book(&format!("CODE-{i:05}X"), "A1", &nonce("typo")).await;
            assert_eq!(typo.status, 403, "typo {i}: {typo:?}");
        }
        let a = app.book(&format!("CODE-{i:05}"), "A1", &nonce("centre")).await;
        assert_eq!(a.status, 201, "candidate {i}: {a:?}");
        admitted += 1;
    }
    assert_eq!(admitted, 200);
    assert_eq!(app.sale.stats().snapshot()["guessers_penalised"], 0);
    app.assert_invariants().await;
}

#[tokio::test]
async fn liveness_does_no_io_and_readiness_asks_at_most_once_a_second_whatever_the_callers() {
    let app = spawn_app(AppOptions::default()).await;
    let started = Instant::now();
    let calls: Vec<_> = (0..200)
        .map(|_| {
            let (client, url) = (app.client.clone(), format!("{}/readyz", app.url));
            tokio::spawn(async move { client.get(url).send().await.unwrap().status().as_u16() })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), 200);
    }
    let checks = app.sale.stats().snapshot()["readiness_checks"];
    let seconds = started.elapsed().as_secs() + 1;
    assert!((1..=seconds).contains(&checks), "{checks} readiness checks in {seconds} s for 200 callers");
    // Liveness answers while Redis is frozen, and asks nothing.
    app.primary.pause();
    let live =
        tokio::time::timeout(Duration::from_secs(2), app.client.get(format!("{}/healthz", app.url)).send()).await;
    app.primary.resume();
    assert_eq!(live.expect("healthz waited on Redis").unwrap().status().as_u16(), 200);
    assert_eq!(app.sale.stats().snapshot()["readiness_checks"], checks);
}

#[tokio::test]
async fn the_operator_token_comes_from_a_file_or_the_environment_and_a_short_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = seatrush::ops::settings::ServeSettings::from_env().unwrap();
    let long = dir.path().join("token");
    std::fs::write(&long, "0123456789abcdef0123456789abcdef-operator\n").unwrap();
    settings.operator_token_file = Some(long);
    let token = settings.operator_token().unwrap().expect("read from the file");
    assert_eq!(secrecy::ExposeSecret::expose_secret(&token), "0123456789abcdef0123456789abcdef-operator");
    let short = dir.path().join("short");
    std::fs::write(&short, "hunter2\n").unwrap();
    settings.operator_token_file = Some(short);
    let err = settings.operator_token().unwrap_err().to_string();
    assert!(err.contains("7 characters") && err.contains("at least 32") && !err.contains("hunter2"), "{err}");
    settings.operator_token_file = None;
    std::env::set_var("SEATRUSH_OPERATOR_TOKEN", "too-short-for-a-sale");
    assert!(settings.operator_token().is_err(), "the environment's token is held to the same length");
}

#[tokio::test]
async fn wrong_tokens_are_limited_per_address_and_every_payment_and_cancel_is_audited() {
    let app = spawn_app(AppOptions {
        edge: EdgeSettings { refusal_rate_per_minute: 3, ..Default::default() },
        ..Default::default()
    })
    .await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("paid")).await.status, 201);
    for _ in 0..3 {
        assert_eq!(app.operator("CODE-00001", "payment", Some("wrong-token")).await.status, 401);
    }
    let limited = app.operator("CODE-00001", "payment", Some("wrong-token")).await;
    assert_eq!((limited.status, limited.status_str()), (429, "rate_limited"));
    assert_eq!(app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await.status, 200, "the right token");
    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    assert_eq!(app.operator("CODE-00002", "payment", Some(OPERATOR_TOKEN)).await.status, 404);
    let trail = app.store.recent_audit(&app.event, 10).await.unwrap();
    let summary: Vec<(&str, &str)> = trail.iter().map(|a| (a.action.as_str(), a.outcome.as_str())).collect();
    assert_eq!(summary, [("payment", "not_found"), ("cancel", "done"), ("payment", "done")], "newest first");
    assert_eq!(trail[1].code_hash, app.hash("CODE-00001").as_str());
    assert!(trail.iter().all(|a| a.client == "127.0.0.1" && !a.code_hash.contains("CODE")));
    assert_eq!(app.sale.stats().snapshot()["operator_refusals"], 4);
}

#[tokio::test]
async fn an_allowlist_is_never_served_with_another_pepper_than_it_was_imported_with() {
    let app = spawn_app(AppOptions { codes: 0, open: false, ..Default::default() }).await;
    let connections = seatrush::ops::settings::Connections {
        redis_url: app.primary.url(),
        redis_ca_file: None,
        database_url: app.db.url.clone(),
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("codes.txt");
    std::fs::write(&file, "CODE-00001\nCODE-00002\n").unwrap();
    std::env::set_var(seatrush::domain::code::PEPPER_ENV, "pepper-one-0123456789");
    seatrush::ops::import_allowlist(&connections, EVENT, &file).await.unwrap();
    std::env::set_var(seatrush::domain::code::PEPPER_ENV, "pepper-two-0123456789");
    let mixed = seatrush::ops::import_allowlist(&connections, EVENT, &file).await.unwrap_err().to_string();
    assert!(mixed.contains("hashed with the pepper with fingerprint"), "{mixed}");
    let open = seatrush::ops::open(&connections, EVENT, &Default::default()).await.unwrap_err().to_string();
    assert!(open.contains("every candidate would be refused") && !open.contains("pepper-one"), "{open}");
    std::env::remove_var(seatrush::domain::code::PEPPER_ENV);
    let plain = seatrush::ops::open(&connections, EVENT, &Default::default()).await.unwrap_err().to_string();
    assert!(plain.contains("runs with no pepper"), "{plain}");
    std::env::set_var(seatrush::domain::code::PEPPER_ENV, "pepper-one-0123456789");
    seatrush::ops::open(&connections, EVENT, &Default::default()).await.unwrap();
    // Now open: a `serve` with the other pepper refuses to start.
    std::env::set_var(seatrush::domain::code::PEPPER_ENV, "pepper-two-0123456789");
    let mut serve = seatrush::ops::settings::ServeSettings::from_env().unwrap();
    serve.operator_token = Some(OPERATOR_TOKEN.into());
    let err = seatrush::ops::build_app(&connections, &serve).await.err().expect("refused").to_string();
    assert!(err.contains("every candidate would be refused"), "{err}");
}

#[tokio::test]
async fn allowlist_generate_writes_unguessable_codes_that_book() {
    let app = spawn_app(AppOptions { codes: 0, open: false, ..Default::default() }).await;
    let connections = seatrush::ops::settings::Connections {
        redis_url: app.primary.url(),
        redis_ca_file: None,
        database_url: app.db.url.clone(),
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("issued.txt");
    seatrush::ops::generate_allowlist(&connections, EVENT, 500, &out).await.unwrap();
    let codes: Vec<String> = std::fs::read_to_string(&out).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(codes.len(), 500);
    assert!(seatrush::ops::generate_allowlist(&connections, EVENT, 5, &out).await.is_err(), "an existing file is kept");
    let parsed = seatrush::ops::allowlist_file::parse_allowlist(codes.join("\n").as_bytes(), &app.hasher);
    assert!(parsed.shapes.warning().is_none(), "generated codes are not guessable");
    assert_eq!(app.store.allowlist_count(&app.event).await.unwrap(), 500);
    seatrush::ops::open(&connections, EVENT, &Default::default()).await.unwrap();
    tokio::time::sleep(seatrush::sale::catalog::CATALOG_TTL * 2).await;
    let a = app.book(&codes[0].to_lowercase(), "A1", &nonce("issued")).await;
    assert_eq!(a.status, 201, "{a:?}");
}
