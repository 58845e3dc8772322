//! What a crowd meets around the click: a countdown to the opening second by the server's clock,
//! a reload that keeps the attempt, the seat a code already holds, a guesser slowed down.

use crate::accessibility::assert_accessible;
use crate::helpers::{nonce, spawn_app, AppOptions};
use crate::pages::{book, open_booking_page};
use crate::webdriver::{Browser, Screen};
use seatrush::domain::event::now_ms;
use seatrush::http::EdgeSettings;
use serde_json::json;

/// Replaces `Date` in every page with one that runs `skew_ms` off the real clock, as on a device
/// whose clock is set wrong.
fn skewed_clock(skew_ms: i64) -> String {
    format!(
        "(() => {{ const skew = {skew_ms}; const Real = Date;
           class Skewed extends Real {{ constructor(...a) {{ if (a.length === 0) super(Real.now() + skew); else super(...a); }}
                                        static now() {{ return Real.now() + skew; }} }}
           window.Date = Skewed; }})();"
    )
}

/// Keeps every booking body the page sends in sessionStorage, so it survives a reload.
const RECORD_BODIES: &str = "(() => { const real = window.fetch;
    window.fetch = (url, init) => {
      if (init && init.method === 'POST') {
        const sent = JSON.parse(sessionStorage.getItem('test-sent') || '[]');
        sent.push(JSON.parse(init.body)); sessionStorage.setItem('test-sent', JSON.stringify(sent));
      }
      return real(url, init);
    }; })();";

#[tokio::test]
async fn the_page_counts_down_by_the_servers_clock_and_opens_at_the_opening_second() {
    // The browser first: on a busy machine it takes seconds to start, and the countdown must
    // still be running when the page shows.
    let browser = Browser::start(Screen::Phone).await;
    let opens_at_ms = now_ms() + 12_000;
    let app = spawn_app(AppOptions {
        opens_at_ms: Some(opens_at_ms),
        closes_at_ms: Some(opens_at_ms + 3 * 3_600_000),
        ..Default::default()
    })
    .await;
    // The device's clock runs two hours and 17 seconds slow: by it, the sale would open in two hours.
    browser.before_every_page(&skewed_clock(-(2 * 3_600_000 + 17_000))).await;
    open_booking_page(&app, &browser).await;
    assert!(
        browser.eval("return Date.now();", json!([])).await.as_i64().unwrap() < now_ms() - 3_600_000,
        "the page's clock is skewed"
    );

    let countdown = browser.wait_for_text("#countdown", "Opens in").await;
    let seconds: i64 = countdown
        .trim_start_matches("Opens in ")
        .trim_end_matches(" s")
        .parse()
        .unwrap_or_else(|_| panic!("{countdown:?}"));
    assert!((1..=12).contains(&seconds), "the countdown follows the server's clock, not the device's: {countdown:?}");
    assert_eq!(browser.eval("return document.getElementById('submit').disabled;", json!([])).await, true);
    browser.wait_for_text("#summary", "The sale opens at").await;
    browser.screenshot("crowd-1-waiting").await;
    assert_accessible(&browser, "waiting").await;

    browser.wait_until("!document.getElementById('submit').disabled").await;
    let enabled_at = now_ms();
    assert!(
        enabled_at >= opens_at_ms - 300,
        "the button turned on {} ms before the opening second",
        opens_at_ms - enabled_at
    );
    browser.wait_for_text("#summary", "The sale is open").await;
    browser.wait_for_text("#result.ok", "The sale is open: you can book now.").await;
    let closing = browser.wait_for_text("#clock", "Closes at").await;
    assert!(closing.contains("in 2 h 59 min") || closing.contains("in 3 h 00 min"), "{closing}");
    browser.screenshot("crowd-2-open").await;
    assert_accessible(&browser, "open").await;

    book(&browser, "CODE-00005", "A1").await;
    let said = browser.wait_for_text("#result.ok", "You have a seat").await;
    browser.screenshot("crowd-3-admitted").await;
    assert_accessible(&browser, "booked").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00005")).await.unwrap().expect("a booking row");
    assert!(said.contains(&format!("Seat {}, level A1", row.slot)), "{said}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_reload_then_a_second_press_gets_the_same_seat() {
    let app = spawn_app(AppOptions::default()).await;
    let browser = Browser::start(Screen::Phone).await;
    browser.before_every_page(RECORD_BODIES).await;
    open_booking_page(&app, &browser).await;
    book(&browser, " code-00004 ", "B1").await;
    let first = browser.wait_for_text("#result.ok", "You have a seat").await;

    browser.reload().await;
    browser.wait_until("document.querySelectorAll('#level option').length > 0").await;
    assert_eq!(
        browser.eval("return document.getElementById('result').textContent;", json!([])).await,
        "",
        "a fresh page"
    );
    book(&browser, "CODE-00004", "B1").await;
    let second = browser.wait_for_text("#result.ok", "You have a seat").await;
    browser.screenshot("crowd-6-after-reload").await;

    let row = app.store.booking(&app.event, &app.hash("CODE-00004")).await.unwrap().expect("a booking row");
    let seat = format!("Seat {}, level B1", row.slot);
    assert!(first.contains(&seat) && second.contains(&seat), "{first} / {second}");
    let sent = browser.eval("return JSON.parse(sessionStorage.getItem('test-sent'));", json!([])).await;
    let nonces: Vec<&str> = sent.as_array().unwrap().iter().map(|b| b["nonce"].as_str().unwrap()).collect();
    assert_eq!(nonces.len(), 2, "{sent}");
    assert_eq!(nonces[0], nonces[1], "the reloaded page retried the same attempt");
    assert_eq!(row.nonce, nonces[0]);
    assert_eq!(app.sale.stats.snapshot()["already_admitted"], 0, "the retry was answered as the original 201");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_code_that_already_holds_a_seat_is_shown_that_seat() {
    let app = spawn_app(AppOptions::default()).await;
    let held = app.book("CODE-00006", "B1", &nonce("other-device")).await;
    assert_eq!(held.status, 201);
    let slot = held.body["slot"].as_i64().unwrap();
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    book(&browser, "code-00006", "A1").await;
    let said = browser.wait_for_text("#result.ok", "You already hold").await;
    browser.screenshot("crowd-7-already-holds-a-seat").await;
    assert_accessible(&browser, "already holds a seat").await;
    // The 409 carries the seat (docs/design.md#answers); the page names it.
    assert!(said.starts_with(&format!("You already hold seat {slot} (level B1) with this code.")), "{said}");
    assert!(said.contains("Please pay by"), "{said}");

    // An answer without the seat's fields (an older server, a record Redis lost) still reads well.
    browser
        .eval(
            "window.fetch = async (url, init) => init && init.method === 'POST'
               ? new Response(JSON.stringify({ status: 'already_admitted' }), { status: 409, headers: { 'content-type': 'application/json' } })
               : new Response('{}', { status: 503 });",
            json!([]),
        )
        .await;
    browser
        .eval(
            "document.getElementById('result').className = ''; document.getElementById('result').textContent = '';",
            json!([]),
        )
        .await;
    book(&browser, "code-00006", "A1").await;
    let said = browser.wait_for_text("#result.ok", "You already hold").await;
    assert_eq!(said, "You already hold a seat with this code. You do not need to book again.");
}

#[tokio::test]
async fn a_guesser_is_slowed_down_and_told_so_in_plain_words() {
    let app = spawn_app(AppOptions {
        edge: EdgeSettings { refusal_rate_per_minute: 2, ..Default::default() },
        ..Default::default()
    })
    .await;
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    for code in ["NOBODY-0001", "NOBODY-0002"] {
        browser
            .eval(
                "document.getElementById('result').className = ''; document.getElementById('result').textContent = '';",
                json!([]),
            )
            .await;
        book(&browser, code, "A1").await;
        browser.wait_for_text("#result.bad", "not registered").await;
    }
    browser.screenshot("crowd-4-refused").await;
    assert_accessible(&browser, "refused").await;
    book(&browser, "NOBODY-0003", "A1").await;
    let said = browser.wait_for_text("#result.bad", "Too many codes were refused").await;
    assert!(said.contains("pausing your attempts for"), "{said}");
    browser.wait_for_text("#submit", "Try again in").await;
    assert_eq!(browser.eval("return document.getElementById('submit').disabled;", json!([])).await, true);
    browser.screenshot("crowd-5-rate-limited").await;
    assert_accessible(&browser, "rate limited").await;
    assert_eq!(app.sale.stats.snapshot()["rate_limited"], 1);
    // The same address with a real code is never limited.
    assert_eq!(app.book("CODE-00001", "A1", &nonce("real")).await.status, 201);
}
