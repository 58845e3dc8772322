//! The booking page's waiting list (issue 30; docs/design.md#the-waiting-list): a person told the
//! sale is sold out joins the level's list, sees their place in line change, and is shown the
//! freed seat without a reload; a join answered `seats_available` sends them to book, a full list
//! and a sale closed while they wait are said plainly.

use crate::accessibility::assert_accessible;
use crate::helpers::{nonce, spawn_app, AppOptions, TestApp, EVENT, OPERATOR_TOKEN};
use crate::pages::{book, open_booking_page};
use crate::webdriver::{Browser, Screen};
use serde_json::json;

#[tokio::test]
async fn a_sold_out_person_joins_the_waiting_list_and_is_offered_a_freed_seat_without_a_reload() {
    let app = spawn_app(AppOptions { seats: 2, levels: vec![("A1", 2)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.book("CODE-00002", "A1", &nonce("b")).await.status, 201);
    // Someone else is already waiting, so the person is second in line.
    let first = app.wait("CODE-00003", "A1", &nonce("w")).await;
    assert_eq!((first.status, first.body["position"].as_i64()), (202, Some(1)), "{:?}", first.body);

    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    browser.wait_for_text("#summary", "0 of 2 seats left").await;
    // Record every waiting-list body the page sends, to see the nonce it keeps.
    browser
        .eval(
            "window.sentBodies = []; const real = window.fetch;
             window.fetch = (url, init) => { if (init && init.method === 'POST' && String(url).endsWith('/waitlist')) window.sentBodies.push(JSON.parse(init.body)); return real(url, init); };",
            json!([]),
        )
        .await;
    book(&browser, "CODE-00004", "A1").await;
    // A1 is the only level, but people wait for it: the answer is level_full.
    browser.wait_for_text("#result.bad", "This level is full").await;
    let join = browser.wait_for_text("#join", "Join the waiting list").await;
    assert_eq!(join, "Join the waiting list for level A1");
    browser.screenshot("waitlist-1-sold-out-join").await;
    assert_accessible(&browser, "sold out, join offered").await;

    browser.find("#join").await.click().await;
    let said = browser.wait_for_text("#result.wait", "You are number 2 in line").await;
    assert!(said.starts_with("You are number 2 in line for level A1."), "{said}");
    // The figures come from a snapshot up to 1 s old, which the page's own read may just have
    // made: within a little more than that they count both waiters.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while app.get(&format!("/api/events/{EVENT}")).await.body["levels"]["A1"]["waiting"] != 2 {
        assert!(std::time::Instant::now() < deadline, "the availability never counted both waiters");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    browser.screenshot("waitlist-2-waiting").await;
    assert_accessible(&browser, "waiting").await;

    // The first waiter is offered the first freed seat; the person moves up, without a reload.
    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    browser.wait_for_text("#result.wait", "You are number 1 in line").await;

    assert_eq!(app.operator("CODE-00002", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    let offered = browser.wait_for_text("#result.ok", "A seat came free for you").await;
    browser.screenshot("waitlist-3-offered").await;
    assert_accessible(&browser, "offered").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00004")).await.unwrap().expect("the offer's booking row");
    assert!(row.holds_seat(), "{row:?}");
    assert!(offered.starts_with(&format!("A seat came free for you: seat {}, level A1.", row.slot)), "{offered}");
    assert!(offered.contains("Please pay by"), "{offered}");
    assert!(browser.find("#waitlist").await.text().await.is_empty(), "the join button goes once answered");
    assert_eq!(
        browser.eval("return document.activeElement.id;", json!([])).await,
        "result",
        "focus moves to the answer"
    );

    let sent = browser.eval("return window.sentBodies;", json!([])).await;
    let sent = sent.as_array().unwrap();
    assert!(sent.len() >= 2, "the page polls the list: {sent:?}");
    assert!(
        sent.iter().all(|b| b["nonce"] == sent[0]["nonce"] && b["code"] == "CODE-00004" && b["level"] == "A1"),
        "{sent:?}"
    );
    assert_eq!(row.nonce.as_str(), sent[0]["nonce"].as_str().unwrap());
    app.assert_invariants().await;
}

/// A phone on the booking page of an event whose one level (cap: the whole event) is full: `code`
/// books, is told the level is full (its cap's check comes first) and offered the waiting list.
async fn full_and_join_offered(app: &TestApp, code: &str) -> Browser {
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(app, &browser).await;
    book(&browser, code, "A1").await;
    browser.wait_for_text("#result.bad", "This level is full").await;
    browser.wait_for_text("#join", "Join the waiting list").await;
    browser
}

/// Between "sold out" and the press on "Join", a seat came free and nobody waits for it: the
/// list answers `seats_available`, and the page sends the person to book, focusing the button.
#[tokio::test]
async fn a_join_answered_seats_available_sends_the_person_to_book() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let browser = full_and_join_offered(&app, "CODE-00002").await;

    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    browser.find("#join").await.click().await;
    browser.wait_for_text("#result.ok", "Seats are free again").await;
    assert_eq!(
        browser.eval("return document.activeElement.id;", json!([])).await,
        "submit",
        "focus moves to the Book button"
    );
    // Read again once the snapshot is fresh: the level no longer shows as full beside the answer.
    browser.wait_for_text("#summary", "1 of 1 seats left").await;
    browser.screenshot("waitlist-4-seats-available").await;
    assert_accessible(&browser, "seats available, book instead").await;

    browser.find("#submit").await.click().await;
    browser.wait_for_text("#result.ok", "You have a seat!").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().expect("the booking");
    assert!(row.holds_seat(), "{row:?}");
    app.assert_invariants().await;
}

/// While the person waits, the operator closes the sale: the page's next poll is answered
/// `closed`, it says the list closed with the sale, and the person is out of the list.
#[tokio::test]
async fn a_waiting_person_is_told_when_the_sale_closes() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let browser = full_and_join_offered(&app, "CODE-00002").await;
    browser.find("#join").await.click().await;
    browser.wait_for_text("#result.wait", "You are number 1 in line").await;

    seatrush::ops::loader::close_event(&mut app.sale.link().check().await.unwrap(), &app.store, &app.event)
        .await
        .unwrap();
    browser.wait_for_text("#result.bad", "so is its waiting list").await;
    browser.screenshot("waitlist-5-closed").await;
    assert_accessible(&browser, "closed while waiting").await;
    assert_eq!(app.redis::<i64>(redis::cmd("ZCARD").arg(&app.keys.waitq)), 0, "nobody waits any more");
    assert!(app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().is_none());
}

/// The list is at its bound (`--waitlist-max`): the page says so plainly, and the person is not
/// left polling.
#[tokio::test]
async fn a_full_waiting_list_is_said_plainly() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], waitlist_max: 1, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    assert_eq!(app.wait("CODE-00002", "A1", &nonce("w")).await.status, 202, "the one place is taken");
    let browser = full_and_join_offered(&app, "CODE-00003").await;
    browser.find("#join").await.click().await;
    browser.wait_for_text("#result.bad", "the waiting list is full").await;
    assert_eq!(browser.eval("return document.activeElement.id;", json!([])).await, "result", "focus on the answer");
    browser.screenshot("waitlist-6-full").await;
    assert_accessible(&browser, "waiting list full").await;
    assert_eq!(app.get(&format!("/api/events/{EVENT}")).await.body["levels"]["A1"]["waiting"], 1, "not joined");
}

/// A person waiting reloads the page: it asks again with the nonce it kept and shows their place
/// without a press, and the level shows how many wait. The freed seat then goes to that nonce.
#[tokio::test]
async fn a_reload_while_waiting_keeps_the_place_and_the_level_says_how_many_wait() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let browser = full_and_join_offered(&app, "CODE-00002").await;
    browser.find("#join").await.click().await;
    browser.wait_for_text("#result.wait", "You are number 1 in line").await;
    let kept = browser
        .eval(
            "return JSON.parse(sessionStorage.getItem(arguments[0])).nonce;",
            json!([format!("seatrush:wait:{EVENT}:CODE-00002")]),
        )
        .await;
    let kept = kept.as_str().expect("the page keeps the place's nonce").to_owned();
    // The seats-left refresh (every 5 s) shows who waits beside the full level.
    browser.wait_for_text("#level option[value=A1]", "full, 1 waiting").await;

    browser.reload().await;
    browser.wait_for_text("#result.wait", "You are number 1 in line").await;
    let code = browser.eval("return document.getElementById('code').value;", json!([])).await;
    assert_eq!(code, "CODE-00002", "the code is filled in again");
    assert_eq!(browser.find("#level option[value=A1]").await.text().await, "A1 (full, 1 waiting)");
    browser.screenshot("waitlist-7-after-reload").await;
    assert_accessible(&browser, "waiting, after a reload").await;
    assert_eq!(app.redis::<i64>(redis::cmd("ZCARD").arg(&app.keys.waitq)), 1, "one place, not two");

    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    browser.wait_for_text("#result.ok", "A seat came free for you").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().expect("the offer's booking row");
    assert_eq!(row.nonce.as_str(), kept, "the seat went to the nonce kept across the reload");
    app.assert_invariants().await;
}

/// The waiting list in French, from the join to the offer: the same steps, the page's own words.
#[tokio::test]
async fn the_waiting_list_speaks_the_events_language() {
    let app =
        spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], language: Some("fr"), ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    book(&browser, "CODE-00002", "A1").await;
    browser.wait_for_text("#result.bad", "complet").await;
    let join = browser.wait_for_text("#join", "Rejoindre la liste d’attente").await;
    assert!(join.starts_with("Rejoindre la liste d’attente pour"), "{join}");
    browser.find("#join").await.click().await;
    let said = browser.wait_for_text("#result.wait", "Vous êtes numéro 1 dans la file").await;
    assert!(said.contains("Gardez cette page ouverte"), "{said}");
    browser.screenshot("waitlist-fr-1-waiting").await;
    assert_accessible(&browser, "French, waiting").await;

    assert_eq!(app.operator("CODE-00001", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    let offered = browser.wait_for_text("#result.ok", "Une place s’est libérée pour vous").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().expect("the offer's booking row");
    assert!(offered.starts_with(&format!("Une place s’est libérée pour vous : place {}", row.slot)), "{offered}");
    assert!(offered.contains("Veuillez payer avant le"), "{offered}");
    browser.screenshot("waitlist-fr-2-offered").await;
    assert_accessible(&browser, "French, offered").await;
    app.assert_invariants().await;
}

/// The list is busy (`503` with `Retry-After: 2`, played by the page's own fetch for its first two
/// sends): the page waits at least that long before asking again, keeps its nonce, and then
/// shows the place the real answer gives.
#[tokio::test]
async fn a_busy_list_is_asked_again_no_sooner_than_retry_after_with_the_same_nonce() {
    let app = spawn_app(AppOptions { seats: 1, levels: vec![("A1", 1)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("a")).await.status, 201);
    let browser = full_and_join_offered(&app, "CODE-00002").await;
    browser
        .eval(
            "window.sends = []; const real = window.fetch;
             window.fetch = (url, init) => {
               if (init && init.method === 'POST' && String(url).endsWith('/waitlist')) {
                 window.sends.push({ at: performance.now(), nonce: JSON.parse(init.body).nonce });
                 if (window.sends.length <= 2) return Promise.resolve(new Response(
                   JSON.stringify({ status: 'retry', detail: 'busy' }),
                   { status: 503, headers: { 'retry-after': '2', 'content-type': 'application/json' } }));
               }
               return real(url, init);
             };",
            json!([]),
        )
        .await;
    browser.find("#join").await.click().await;
    browser.wait_for_text("#result.wait", "You are number 1 in line").await;
    let sends = browser.eval("return window.sends;", json!([])).await;
    let sends = sends.as_array().unwrap();
    assert!(sends.len() >= 3, "two busy answers, then the real one: {sends:?}");
    for pair in sends[..3].windows(2) {
        let gap = pair[1]["at"].as_f64().unwrap() - pair[0]["at"].as_f64().unwrap();
        assert!(gap >= 2000.0, "asked again {gap:.0} ms after a Retry-After of 2 s: {sends:?}");
    }
    assert!(sends.iter().all(|s| s["nonce"] == sends[0]["nonce"]), "one nonce throughout: {sends:?}");
    assert_eq!(app.redis::<i64>(redis::cmd("ZCARD").arg(&app.keys.waitq)), 1);
}
