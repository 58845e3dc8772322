//! The booking page in the candidate's language (issue 33, item 2): the event's `language`, or
//! the browser's `Accept-Language`; `<html lang>` says which, and axe-core stays clean in each.

use crate::accessibility::assert_accessible;
use crate::helpers::{spawn_app, AppOptions};
use crate::pages::{book, open_booking_page};
use crate::webdriver::{Browser, Screen};
use serde_json::json;

async fn lang(browser: &Browser) -> String {
    browser.eval("return document.documentElement.lang;", json!([])).await.as_str().unwrap_or("").to_owned()
}

#[tokio::test]
async fn an_event_in_french_is_booked_in_french() {
    let app = spawn_app(AppOptions { language: Some("fr"), ..AppOptions::default() }).await;
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    assert_eq!(lang(&browser).await, "fr");
    let summary = browser.wait_for_text("#summary", "places restantes").await;
    assert_eq!(summary, "La vente est ouverte. 10 places restantes sur 10.");
    assert_eq!(browser.find("label[for=code]").await.text().await, "Code d’inscription");
    assert_eq!(browser.find("#level option[value=B1]").await.text().await, "B1 (8 places restantes)");
    browser.screenshot("language-fr-1-open").await;
    assert_accessible(&browser, "French, open").await;
    book(&browser, "CODE-00004", "B1").await;
    let said = browser.wait_for_text("#result.ok", "Vous avez une place").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00004")).await.unwrap().expect("a booking row");
    assert!(said.contains(&format!("Place {}, niveau B1.", row.slot)), "{said}");
    assert!(said.contains("Veuillez payer avant le"), "{said}");
    browser.screenshot("language-fr-2-admitted").await;
    assert_accessible(&browser, "French, admitted").await;
    book(&browser, "NOT-A-CODE-42", "B1").await;
    browser.wait_for_text("#result.bad", "n’est pas inscrit").await;
    assert_accessible(&browser, "French, refused").await;
}

#[tokio::test]
async fn without_an_event_language_the_browsers_accept_language_chooses() {
    let app = spawn_app(AppOptions::default()).await;
    let browser = Browser::start(Screen::Phone).await;
    browser
        .cdp(
            "Network.setUserAgentOverride",
            json!({ "userAgent": "Mozilla/5.0 seatrush-test", "acceptLanguage": "de-CH,de;q=0.9,en;q=0.5" }),
        )
        .await;
    open_booking_page(&app, &browser).await;
    assert_eq!(lang(&browser).await, "de");
    browser.wait_for_text("#summary", "Der Verkauf ist geöffnet").await;
    assert_eq!(browser.find("#submit").await.text().await, "Meinen Platz buchen");
    browser.screenshot("language-de-1-open").await;
    assert_accessible(&browser, "German, open").await;
    book(&browser, "CODE-00005", "A1").await;
    browser.wait_for_text("#result.ok", "Sie haben einen Platz").await;
    browser.screenshot("language-de-2-admitted").await;
    assert_accessible(&browser, "German, admitted").await;

    // A language the page does not speak falls back to English.
    browser
        .cdp(
            "Network.setUserAgentOverride",
            json!({ "userAgent": "Mozilla/5.0 seatrush-test", "acceptLanguage": "nl" }),
        )
        .await;
    open_booking_page(&app, &browser).await;
    assert_eq!(lang(&browser).await, "en");
    browser.wait_for_text("#summary", "The sale is open").await;
    assert_accessible(&browser, "English fallback").await;
}

/// Sessions on the page: the level list names each session (display name, start, venue), and a
/// seat is the seat in its room with per-level numbering.
#[tokio::test]
async fn the_page_names_sessions_and_the_seat_in_the_room() {
    use seatrush::domain::session::{SeatNumbering, Session};
    let hall = Session { name: Some("B2, afternoon".into()), starts_at_ms: None, venue: Some("Hall 3".into()) };
    let app = spawn_app(AppOptions {
        seats: 7,
        levels: vec![("A1", 3), ("B2", 4)],
        sessions: vec![("B2", hall)],
        seat_numbering: SeatNumbering::PerLevel,
        ..AppOptions::default()
    })
    .await;
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    assert_eq!(browser.find("#level option[value=B2]").await.text().await, "B2, afternoon, Hall 3 (4 seats left)");
    book(&browser, "CODE-00006", "B2").await;
    let said = browser.wait_for_text("#result.ok", "You have a seat").await;
    assert!(said.starts_with("You have a seat! Seat 1, B2, afternoon, Hall 3."), "{said}");
    browser.screenshot("sessions-1-admitted").await;
    assert_accessible(&browser, "a session booked").await;
}
