//! The booking page, used as a person on a phone would.

use crate::accessibility::assert_accessible;
use crate::helpers::{nonce, spawn_app, AppOptions};
use crate::pages::{assert_nothing_loaded_from_elsewhere, book, open_booking_page};
use crate::webdriver::{Browser, Screen, TAB};
use seatrush::sale::answer::AnswerStatus;
use seatrush::sale::stats::Stats;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_person_books_a_seat_and_sees_its_number_and_the_pay_by_time() {
    let app = spawn_app(AppOptions::default()).await;
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    let summary = browser.wait_for_text("#summary", "seats left").await;
    assert_eq!(summary, "The sale is open. 10 of 10 seats left.");
    assert_eq!(browser.find("#level option[value=B1]").await.text().await, "B1 (8 seats left)");
    assert_nothing_loaded_from_elsewhere(&browser).await;

    book(&browser, " code-00007 ", "B1").await;
    browser.screenshot("booking-1-submitted").await;
    let said = browser.wait_for_text("#result.ok", "You have a seat").await;
    browser.screenshot("booking-2-admitted").await;

    let row = app.store.booking(&app.event, &app.hash("CODE-00007")).await.unwrap().expect("a booking row");
    assert_eq!((row.state.as_str(), row.level.as_str()), ("held", "B1"));
    assert!(said.contains(&format!("Seat {}, level B1", row.slot)), "{said}");
    assert!(said.contains("Please pay by"), "{said}");
    browser.wait_for_text("#summary", "9 of 10 seats left").await;
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_forced_503_is_retried_with_the_same_nonce_until_the_seat_is_booked() {
    let app = spawn_app(AppOptions::default()).await;
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    // Record every booking body the page sends, to see the nonce it reuses.
    browser
        .eval(
            "window.sentBodies = []; const real = window.fetch;
             window.fetch = (url, init) => { if (init && init.method === 'POST') window.sentBodies.push(JSON.parse(init.body)); return real(url, init); };",
            json!([]),
        )
        .await;

    // A stopped replica never acknowledges: every admission is undone and answered 503.
    let replica = app.replica.as_ref().unwrap();
    replica.pause();
    book(&browser, "CODE-00003", "A1").await;
    let waiting = browser.wait_for_text("#result.wait", "Still trying").await;
    assert!(waiting.contains("keep this page open"), "{waiting}");
    wait_for_retries(app.sale.stats(), 2).await;
    browser.screenshot("booking-3-retrying").await;
    assert_accessible(&browser, "retrying").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00003")).await.unwrap();
    assert!(row.is_none_or(|r| !r.holds_seat()), "nothing counts while the replica is stopped");
    replica.resume();

    browser.wait_for_text("#result.ok", "You have a seat").await;
    let sent = browser.eval("return window.sentBodies;", json!([])).await;
    let nonces: Vec<&str> = sent.as_array().unwrap().iter().map(|b| b["nonce"].as_str().unwrap()).collect();
    assert!(nonces.len() >= 3, "expected at least two retries, saw {nonces:?}");
    assert!(nonces.iter().all(|n| *n == nonces[0]), "every retry must reuse the attempt's nonce: {nonces:?}");
    let row = app.store.booking(&app.event, &app.hash("CODE-00003")).await.unwrap().expect("a booking row");
    assert_eq!(row.nonce.as_str(), nonces[0]);
    assert!(app.sale.stats().undone_short_ack.load(Ordering::Relaxed) >= 2);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_sold_out_sale_says_so_in_plain_words() {
    let app = spawn_app(AppOptions { seats: 1, ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("first")).await.status, 201);
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    browser.wait_for_text("#summary", "0 of 1 seats left").await;
    assert_eq!(browser.find("#level option[value=A1]").await.text().await, "A1 (full)");

    book(&browser, "CODE-00002", "A1").await;
    let said = browser.wait_for_text("#result.bad", "every seat is taken").await;
    browser.screenshot("booking-4-sold-out").await;
    assert_accessible(&browser, "sold out").await;
    assert_eq!(said, "Sorry, every seat is taken. The sale is sold out.");
    assert!(app.store.booking(&app.event, &app.hash("CODE-00002")).await.unwrap().is_none());
}

#[tokio::test]
async fn every_other_final_answer_is_said_in_plain_words() {
    let app = spawn_app(AppOptions { levels: vec![("A1", 1), ("B1", 8)], ..Default::default() }).await;
    assert_eq!(app.book("CODE-00001", "A1", &nonce("first")).await.status, 201);
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;

    let cases = [
        ("CODE-00002", "A1", "This level is full. Pick another level if one has seats left."),
        ("NOBODY-4242", "B1", "This code is not registered for this sale."),
        ("ab", "B1", "That is not a valid code: codes are 4 to 64 letters, digits and dashes"),
    ];
    for (i, (code, level, expected)) in cases.into_iter().enumerate() {
        // Clear the previous answer so the wait below sees this one.
        browser
            .eval(
                "document.getElementById('result').className = ''; document.getElementById('result').textContent = '';",
                json!([]),
            )
            .await;
        book(&browser, code, level).await;
        let said = browser.wait_for_text("#result.bad", expected).await;
        assert!(said.starts_with(expected), "{code}: {said}");
        browser.screenshot(&format!("booking-5-refusal-{}", i + 1)).await;
    }
    assert_accessible(&browser, "refused").await;
    let stats = app.sale.stats().snapshot();
    assert_eq!((stats["level_full"], stats["not_registered"], stats["invalid_request"]), (1, 1, 1));
}

#[tokio::test]
async fn the_honeypot_is_in_the_form_but_hidden_from_people_and_the_keyboard() {
    let app = spawn_app(AppOptions::default()).await;
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    let facts = browser
        .eval(
            "const input = document.getElementById('book').elements.namedItem('website');
             const box = input.getBoundingClientRect(), style = getComputedStyle(input);
             return { inForm: input instanceof HTMLInputElement, tabIndex: input.tabIndex,
                      ariaHidden: input.closest('[aria-hidden=\"true\"]') !== null,
                      notDisplayed: style.display === 'none' || style.visibility === 'hidden',
                      tiny: box.width <= 1 && box.height <= 1,
                      offScreen: box.right <= 0 || box.bottom <= 0 || box.left >= innerWidth || box.top >= innerHeight };",
            json!([]),
        )
        .await;
    assert_eq!(facts["inForm"], true, "the honeypot must be in the form: {facts}");
    assert_eq!(facts["ariaHidden"], true, "screen readers must not announce it: {facts}");
    assert_eq!(facts["tabIndex"], -1, "{facts}");
    let hidden = [&facts["notDisplayed"], &facts["tiny"], &facts["offScreen"]].iter().any(|v| **v == Value::Bool(true));
    assert!(hidden, "a person can see the honeypot: {facts}");

    // Tab walks code → level → button and never lands in the honeypot.
    browser.find("#code").await.click().await;
    let mut focused = Vec::new();
    for _ in 0..3 {
        focused.push(browser.eval("return document.activeElement.id;", json!([])).await);
        browser.find(":focus").await.send_keys(TAB).await;
    }
    assert_eq!(focused, [json!("code"), json!("level"), json!("submit")]);
    browser.screenshot("booking-0-form").await;
}

/// Polls a server counter with a bound: retries arrive at the page's own pace.
async fn wait_for_retries(stats: &Stats, at_least: u64) {
    let deadline = Instant::now() + crate::webdriver::WAIT_TIMEOUT;
    while stats.answers(AnswerStatus::Retry) < at_least {
        assert!(Instant::now() < deadline, "retries stayed at {}", stats.answers(AnswerStatus::Retry));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
