//! Steps shared by the page tests, as a person would take them.

use crate::helpers::{TestApp, EVENT};
use crate::webdriver::Browser;
use serde_json::json;

/// Opens the booking page and waits until the levels have loaded.
pub async fn open_booking_page(app: &TestApp, browser: &Browser) {
    browser.goto(&format!("{}/events/{EVENT}", app.url)).await;
    browser.wait_until("document.querySelectorAll('#level option').length > 0").await;
}

/// Types the code, picks the level, presses the button.
pub async fn book(browser: &Browser, code: &str, level: &str) {
    let input = browser.find("#code").await;
    input.clear().await;
    input.send_keys(code).await;
    browser.find(&format!("#level option[value={level:?}]")).await.click().await;
    browser.find("#submit").await.click().await;
}

/// Every resource the page loaded came from the page's own origin.
pub async fn assert_nothing_loaded_from_elsewhere(browser: &Browser) {
    let foreign = browser
        .eval("return performance.getEntriesByType('resource').map(e => e.name).filter(u => !u.startsWith(location.origin));", json!([]))
        .await;
    assert_eq!(foreign, json!([]), "the page loaded resources from another origin");
}
