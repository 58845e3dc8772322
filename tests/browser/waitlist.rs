//! The booking page's waiting list (issue 30; docs/design.md#the-waiting-list): a person told the
//! sale is sold out joins the level's list, sees their place in line change, and is shown the
//! freed seat without a reload.

use crate::accessibility::assert_accessible;
use crate::helpers::{nonce, spawn_app, AppOptions, EVENT, OPERATOR_TOKEN};
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
    assert_eq!(app.get(&format!("/api/events/{EVENT}")).await.body["levels"]["A1"]["waiting"], 2);
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
