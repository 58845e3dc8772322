//! The booking page during the draw at the opening (docs/design.md#the-draw-at-the-opening): a
//! person who presses in the window is told they are in the draw and when it decides, sees a
//! countdown, and gets the answer without a reload.

use crate::accessibility::assert_accessible;
use crate::helpers::{spawn_app, AppOptions};
use crate::pages::{book, open_booking_page};
use crate::webdriver::{Browser, Screen};
use seatrush::domain::event::now_ms;

#[tokio::test]
async fn a_person_in_the_draw_sees_when_it_decides_and_then_the_answer_without_a_reload() {
    let opens_at = now_ms() + 2_000;
    let app = spawn_app(AppOptions {
        opens_at_ms: Some(opens_at),
        closes_at_ms: Some(opens_at + 3_600_000),
        // Long enough for Chromium to start and the person to press while the window lasts.
        fair_start_seconds: 15,
        // The serve's own background loops, the drawer among them.
        background_reaper: true,
        ..Default::default()
    })
    .await;
    let browser = Browser::start(Screen::Phone).await;
    open_booking_page(&app, &browser).await;
    browser.wait_until("!document.querySelector('#submit').disabled").await;
    book(&browser, "CODE-00004", "A1").await;
    let said = browser.wait_for_text("#result.wait", "You are in the draw").await;
    assert!(said.contains("It decides at") && said.contains("keep this page open"), "{said}");
    let decides_at: i64 = app.redis(redis::cmd("HGET").arg(&app.keys.draw).arg("decides_at_ms"));
    let row = app.store.booking(&app.event, &app.hash("CODE-00004")).await.unwrap();
    if now_ms() < decides_at {
        assert!(row.is_none(), "nothing is admitted before the draw decides");
    }
    let countdown = browser.wait_for_text("#draw-countdown", "Deciding in").await;
    assert!(!browser.find("#draw").await.text().await.is_empty(), "{countdown}");
    browser.screenshot("draw-1-in-the-draw").await;
    assert_accessible(&browser, "in the draw").await;

    // No reload: the page asks again at decides_at with the same nonce.
    let admitted = browser.wait_for_text("#result.ok", "You have a seat").await;
    browser.screenshot("draw-2-admitted").await;
    assert_accessible(&browser, "drawn and admitted").await;
    let row = app.store.booking(&app.event, &app.hash("CODE-00004")).await.unwrap().expect("admitted by the draw");
    assert!(admitted.contains(&format!("Seat {}", row.slot)), "{admitted}");
    let drawn = app.store.drawn_entries(&app.event).await.unwrap();
    assert_eq!(drawn.len(), 1);
    assert_eq!((drawn[0].code_hash.as_str(), drawn[0].outcome.as_str()), (app.hash("CODE-00004").as_str(), "admitted"));
    assert!(browser.find("#draw").await.text().await.is_empty(), "the countdown goes once answered");
    app.assert_invariants().await;
}
