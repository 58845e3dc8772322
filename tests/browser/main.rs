//! Browser tests: the booking page and the operator dashboard in a real headless Chromium, against
//! the real server (the API tests' `spawn_app`). They fail, never skip, when Chromium is missing.
//! Screenshots land in `artifacts/screenshots/`.

#[path = "../api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

mod accessibility;
mod booking_page;
mod crowd;
mod dashboard;
mod draw;
mod languages;
mod pages;
mod waitlist;
mod webdriver;
