//! The operator dashboard: asks for the token, then draws the sale live.

use crate::accessibility::assert_accessible;
use crate::helpers::{nonce, spawn_app, AppOptions, EVENT, OPERATOR_TOKEN};
use crate::pages::assert_nothing_loaded_from_elsewhere;
use crate::webdriver::{Browser, Screen};
use serde_json::json;
use std::time::Duration;

const A1_BAR: &str = "svg[data-event=\"exam\"] g[data-level=\"A1\"] title";

#[tokio::test]
async fn the_dashboard_asks_for_the_token_and_draws_the_sale_as_it_runs() {
    let app = spawn_app(AppOptions {
        seats: 40,
        levels: vec![("A1", 10), ("B1", 25), ("C1", 15)],
        codes: 60,
        ..Default::default()
    })
    .await;
    for code in ["CODE-00001", "CODE-00002", "CODE-00003"] {
        assert_eq!(app.book(code, "A1", &nonce("ops")).await.status, 201);
    }
    assert_eq!(app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await.status, 200);
    let browser = Browser::start(Screen::Desktop { width: 1280, height: 1300 }).await;
    browser.goto(&format!("{}/ops", app.url)).await;
    browser.wait_for_text("#status", "Enter the operator token").await;
    assert_eq!(
        browser.eval("return document.getElementById('fill').hidden;", json!([])).await,
        true,
        "no data before the token"
    );

    let token = browser.find("#token").await;
    token.send_keys("not-the-token").await;
    browser.find("#token-form button").await.click().await;
    browser.wait_for_text("#login-error", "The token was refused").await;
    browser.screenshot("ops-1-token-refused").await;
    assert_accessible(&browser, "ops: token refused").await;

    let token = browser.find("#token").await;
    token.clear().await;
    token.send_keys(OPERATOR_TOKEN).await;
    browser.find("#token-form button").await.click().await;
    let a1 = browser.wait_for_text(A1_BAR, "A1: 1 paid, 2 held").await;
    assert_eq!(a1, "A1: 1 paid, 2 held, 7 can still be booked, cap 10");
    browser.wait_for_text("#status", "Live").await;
    assert_nothing_loaded_from_elsewhere(&browser).await;

    // The sale goes on while the page is open: the bars and the counters follow it.
    let mut codes = (4..=33).map(|i| format!("CODE-{i:05}"));
    for (code, level) in codes.by_ref().take(5).map(|c| (c, "A1")) {
        assert_eq!(app.book(&code, level, &nonce("live")).await.status, 201);
    }
    browser.wait_for_text(A1_BAR, "A1: 1 paid, 7 held, 2 can still be booked").await;
    for code in codes.by_ref().take(20) {
        assert_eq!(app.book(&code, "B1", &nonce("live")).await.status, 201);
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert_eq!(app.book("CODE-00004", "B1", &nonce("again")).await.status, 409);
    assert_eq!(app.book("NOBODY-0000", "B1", &nonce("bot")).await.status, 403);
    browser.wait_until("document.querySelector('[data-status=\"admitted\"]')?.textContent.endsWith('28')").await;
    browser.wait_until("Number(document.getElementById('rate-peak').textContent) > 0").await;
    let series = browser.eval("return document.querySelectorAll('#rate-chart polyline').length;", json!([])).await;
    assert_eq!(series, 2, "admitted and retry lines");
    browser.wait_for_text("#events", &format!("{EVENT}: 12 of 40 seats left")).await;
    browser.screenshot("ops-2-live").await;
    assert_accessible(&browser, "ops: live").await;
}
