//! Levels as sessions (issue 33, item 1): display fields in every answer, per-level seat
//! numbering, the allowlist's `levels` column, and `/ops` paging through every loaded event.

use crate::helpers::{nonce, spawn_app, AppOptions, EVENT, OPERATOR_TOKEN};
use seatrush::domain::event::{EventId, LevelName};
use seatrush::domain::session::{SeatNumbering, Session};
use seatrush::ops::loader;
use seatrush::redis_io::link::RedisLink;
use std::collections::BTreeSet;
use std::time::Duration;

fn session(name: &str, venue: &str) -> Session {
    Session { name: Some(name.into()), starts_at_ms: Some(1_805_014_800_000), venue: Some(venue.into()) }
}

/// Two sessions of 3 and 4 seats, numbered per level: 7 seats in all.
fn per_level() -> AppOptions {
    AppOptions {
        seats: 7,
        levels: vec![("A1-AM", 3), ("B2-PM", 4)],
        sessions: vec![("B2-PM", session("B2, 14 March, afternoon", "Hall 3"))],
        seat_numbering: SeatNumbering::PerLevel,
        ..AppOptions::default()
    }
}

#[tokio::test]
async fn per_level_numbering_gives_each_session_its_own_seats_from_one() {
    let app = spawn_app(per_level()).await;
    let mut seats = Vec::new();
    for (i, level) in ["B2-PM", "A1-AM", "B2-PM", "A1-AM", "B2-PM", "B2-PM", "A1-AM"].iter().enumerate() {
        let answer = app.book(&format!("CODE-{:05}", i + 1), level, &nonce("pl")).await;
        assert_eq!(answer.status, 201, "{answer:?}");
        seats.push((level.to_string(), answer.body["seat"].as_i64().unwrap(), answer.body["slot"].as_i64().unwrap()));
    }
    let of = |level: &str| -> Vec<i64> { seats.iter().filter(|s| s.0 == level).map(|s| s.1).collect() };
    assert_eq!(of("A1-AM"), vec![1, 2, 3], "A1-AM's room has seats 1-3");
    assert_eq!(of("B2-PM"), vec![1, 2, 3, 4], "B2-PM's room has seats 1-4, not 4-7");
    // The event-wide numbers stay unique (the database's index, the invariants): A1-AM owns 1-3,
    // B2-PM 4-7.
    let slots: BTreeSet<i64> = seats.iter().map(|s| s.2).collect();
    assert_eq!(slots, (1..=7).collect());
    assert!(seats.iter().all(|(l, seat, slot)| if l == "A1-AM" { slot == seat } else { *slot == seat + 3 }));
    assert_eq!(app.book("CODE-00020", "A1-AM", &nonce("pl")).await.status_str(), "level_full");
    app.assert_invariants().await;

    // A second press shows the same seat as the candidate reads it.
    let again = app.book("CODE-00001", "B2-PM", &nonce("again")).await;
    assert_eq!((again.status, again.status_str()), (409, "already_admitted"));
    assert_eq!(again.body["seat"], 1);
    assert_eq!(again.body["session"]["venue"], "Hall 3");

    // The export names the seat in the room too.
    let csv = seatrush::ops::export::export_csv(&app.store, &app.event, None, &app.hasher).await.unwrap().0;
    let csv = String::from_utf8(csv).unwrap();
    let b2: Vec<&str> = csv.lines().filter(|l| l.contains(",B2-PM,")).collect();
    assert_eq!(b2.len(), 4);
    for (row, seat) in b2.iter().zip(1..) {
        assert!(row.contains(&format!(",B2-PM,{seat},held,")), "{row}");
    }
}

#[tokio::test]
async fn sessions_show_in_the_availability_and_booking_answers_and_the_summary() {
    let app = spawn_app(per_level()).await;
    let availability = app.get(&format!("/api/events/{EVENT}")).await;
    assert_eq!(availability.status, 200);
    assert_eq!(availability.body["seat_numbering"], "per-level");
    assert_eq!(availability.body["total_seats"], 7);
    let b2 = &availability.body["levels"]["B2-PM"];
    assert_eq!(b2["cap"], 4);
    assert_eq!(b2["session"]["name"], "B2, 14 March, afternoon");
    assert_eq!(b2["session"]["venue"], "Hall 3");
    assert_eq!(b2["session"]["starts_at"], "2027-03-14T09:00:00Z");
    assert!(availability.body["levels"]["A1-AM"].get("session").is_none(), "a short-form level has no session");

    let booked = app.book("CODE-00001", "B2-PM", &nonce("s")).await;
    assert_eq!(booked.status, 201);
    assert_eq!(booked.body["session"]["name"], "B2, 14 March, afternoon");
    assert_eq!(booked.body["seat"], 1);
    assert_eq!(booked.body["slot"], 4);
    let plain = app.book("CODE-00002", "A1-AM", &nonce("s")).await;
    assert!(plain.body.get("session").is_none(), "{plain:?}");

    let summary: serde_json::Value = app
        .client
        .get(format!("{}/api/ops/summary", app.url))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let event = &summary["events"][0];
    assert_eq!(event["seat_numbering"], "per-level");
    let level = event["levels"].as_array().unwrap().iter().find(|l| l["name"] == "B2-PM").unwrap().clone();
    assert_eq!(level["session"]["venue"], "Hall 3");
}

#[tokio::test]
async fn a_change_that_moves_the_seat_blocks_is_refused_once_seats_are_booked() {
    let app = spawn_app(AppOptions { open: false, ..per_level() }).await;
    let mut spec = app.store.event(&app.event).await.unwrap().spec;
    // Before any booking the blocks may move.
    spec.levels.insert(LevelName::parse("A1-AM").unwrap(), 2);
    spec.total_seats = 6;
    app.store.apply_event(&spec).await.unwrap();
    let link = RedisLink::new(&app.primary.url()).unwrap();
    loader::open_event(&mut link.check().await.unwrap(), &app.store, &app.event).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.book("CODE-00001", "B2-PM", &nonce("m")).await.body["seat"], 1);
    seatrush::ops::loader::close_event(&mut link.check().await.unwrap(), &app.store, &app.event).await.unwrap();

    // A1-AM growing to 3 would move B2-PM's block from 3-6 to 4-7: its candidate's seat 1 would
    // become someone else's room.
    let mut grown = spec.clone();
    grown.levels.insert(LevelName::parse("A1-AM").unwrap(), 3);
    grown.total_seats = 7;
    let refused = seatrush::ops::apply::apply_event(&mut link.check().await.unwrap(), &app.store, &grown).await;
    let why = refused.unwrap_err().to_string();
    assert!(why.contains("per-level seat blocks"), "{why}");
    // Display fields change freely.
    let mut renamed = spec.clone();
    renamed.sessions.insert(LevelName::parse("A1-AM").unwrap(), session("A1, morning", "Hall 1"));
    seatrush::ops::apply::apply_event(&mut link.check().await.unwrap(), &app.store, &renamed).await.unwrap();
    assert_eq!(app.store.event(&app.event).await.unwrap().spec.sessions.len(), 2);
}

#[tokio::test]
async fn a_code_restricted_to_some_levels_is_not_eligible_for_the_others() {
    let app = spawn_app(AppOptions { open: false, ..AppOptions::default() }).await;
    let restricted = [(app.hash("CODE-00001"), Some("B1".to_string())), (app.hash("CODE-00002"), None)];
    app.store.set_allowed_levels(&app.event, &restricted).await.unwrap();
    let link = RedisLink::new(&app.primary.url()).unwrap();
    loader::open_event(&mut link.check().await.unwrap(), &app.store, &app.event).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let refused = app.book("CODE-00001", "A1", &nonce("e")).await;
    assert_eq!((refused.status, refused.status_str()), (403, "not_eligible"));
    assert_eq!(app.redis::<i64>(redis::cmd("HLEN").arg(&app.keys.adm)), 0, "nothing was admitted");
    assert_eq!(app.book("CODE-00001", "B1", &nonce("e")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("e")).await.status, 201, "no restriction: any level");
    assert_eq!(app.book("CODE-00003", "A1", &nonce("e")).await.status, 201, "not in the column: any level");
    assert_eq!(app.book("NOT-REGISTERED-1", "B1", &nonce("e")).await.status_str(), "not_registered");
    app.assert_invariants().await;
}

#[tokio::test]
async fn an_allowlist_file_with_a_levels_column_restricts_its_codes_and_refuses_unknown_levels() {
    let app = spawn_app(AppOptions { open: false, ..AppOptions::default() }).await;
    let dir = tempfile::tempdir().unwrap();
    let connections = seatrush::ops::settings::Connections {
        redis_url: app.primary.url(),
        redis_ca_file: None,
        database_url: app.db.url.clone(),
    };
    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "code,levels\nCODE-00001,B1\nCODE-00002,Z9\n").unwrap();
    let err = seatrush::ops::import_allowlist(&connections, EVENT, &bad).await.unwrap_err().to_string();
    assert!(err.contains("Z9") && err.contains("Nothing was imported"), "{err}");
    let good = dir.path().join("good.csv");
    std::fs::write(&good, "name,code,levels\nAda,CODE-00001,B1\nBob,CODE-00002,\n").unwrap();
    seatrush::ops::import_allowlist(&connections, EVENT, &good).await.unwrap();
    let page = app.store.allowed_levels_page(&app.event, "", 10).await.unwrap();
    assert_eq!(page, vec![(app.hash("CODE-00001").as_str().to_owned(), "B1".to_owned())]);
    let link = RedisLink::new(&app.primary.url()).unwrap();
    loader::open_event(&mut link.check().await.unwrap(), &app.store, &app.event).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("f")).await.status_str(), "not_eligible");
    assert_eq!(app.book("CODE-00002", "A1", &nonce("f")).await.status, 201);
}

#[tokio::test]
async fn the_summary_pages_through_every_loaded_event() {
    let app = spawn_app(AppOptions::default()).await;
    // 24 more events than the helper's: more than one page of 20, none cut.
    let link = RedisLink::new(&app.primary.url()).unwrap();
    let base = app.store.event(&app.event).await.unwrap().spec;
    for i in 0..24 {
        let mut spec = base.clone();
        spec.id = EventId::parse(&format!("extra-{i:02}")).unwrap();
        app.store.apply_event(&spec).await.unwrap();
        loader::open_event(&mut link.check().await.unwrap(), &app.store, &spec.id).await.unwrap();
    }
    // The serve's catalog reads the set of loaded events at most every 250 ms; an event opened
    // within that is listed (events_total) before its figures can be read.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let page = |after: Option<String>| {
        let mut url = format!("{}/api/ops/summary?events_limit=10", app.url);
        if let Some(after) = after {
            url.push_str(&format!("&events_after={after}"));
        }
        let request = app.client.get(url).bearer_auth(OPERATOR_TOKEN);
        async move { request.send().await.unwrap().json::<serde_json::Value>().await.unwrap() }
    };
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let summary = page(after).await;
        assert_eq!(summary["events_total"], 25);
        let ids: Vec<String> =
            summary["events"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
        assert!(ids.len() <= 10);
        seen.extend(ids);
        match summary["events_next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    let mut expected: Vec<String> = (0..24).map(|i| format!("extra-{i:02}")).collect();
    expected.push(EVENT.to_owned());
    expected.sort();
    assert_eq!(seen, expected, "every loaded event once, in order");
    let bad = app
        .client
        .get(format!("{}/api/ops/summary?events_limit=0", app.url))
        .bearer_auth(OPERATOR_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    for cursor in ["", "Not-An-Id"] {
        let bad = app
            .client
            .get(format!("{}/api/ops/summary?events_after={cursor}", app.url))
            .bearer_auth(OPERATOR_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(bad.status().as_u16(), 400, "events_after={cursor:?}");
    }
}

/// The page's language: the event's, else Accept-Language, else English; an operator's strings
/// directory replaces texts (the page is the server's, so this needs no browser).
#[tokio::test]
async fn the_page_is_served_in_the_chosen_language_with_its_html_lang() {
    let app = spawn_app(AppOptions::default()).await;
    let page = |accept: &'static str| {
        let request = app.client.get(format!("{}/events/{EVENT}", app.url)).header("accept-language", accept);
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.headers()["vary"], "Accept-Language");
            r.text().await.unwrap()
        }
    };
    let fr = page("fr-CA,fr;q=0.9").await;
    assert!(fr.contains(r#"<html lang="fr">"#) && fr.contains("<title>Réservez votre place</title>"), "{fr}");
    assert!(fr.contains(r#"<meta name="seatrush-strings" content="{"#), "the script's strings are in the page");
    let de = page("de").await;
    assert!(de.contains(r#"<html lang="de">"#) && de.contains("Meinen Platz buchen"));
    let en = page("nl, ja;q=0.5").await;
    assert!(en.contains(r#"<html lang="en">"#) && en.contains("Book my seat"));
    assert!(!en.contains("{{"), "every marker is filled in");
}
