//! `seatrush export` (issue 33 item 4): the list after the sale as CSV, on both databases; the
//! operator's candidate file joined by the hash of its codes, raw codes never copied; the real
//! binary writing the file and failing loudly on skipped lines.

use crate::helpers::{nonce, spawn_app, AppOptions, Backend, TestApp, EVENT, OPERATOR_TOKEN};
use seatrush::domain::code::CodeHasher;
use seatrush::ops::export::{export_csv, EXPORT_COLUMNS};

/// Three bookings: CODE-00001 paid (A1), CODE-00002 held (B1), CODE-00003 cancelled (A1).
async fn three_bookings(app: &TestApp) {
    for (code, level) in [("CODE-00001", "A1"), ("CODE-00002", "B1"), ("CODE-00003", "A1")] {
        let answer = app.book(code, level, &nonce("export")).await;
        assert_eq!(answer.status, 201, "{:?}", answer.body);
    }
    assert_eq!(app.operator("CODE-00001", "payment", Some(OPERATOR_TOKEN)).await.status, 200);
    assert_eq!(app.operator("CODE-00003", "cancel", Some(OPERATOR_TOKEN)).await.status, 200);
    app.store.set_allowlist_pepper(&app.event, &app.hasher.fingerprint()).await.unwrap();
}

/// The candidate file an exam board keeps: a code in another case with spaces, a formula for a
/// name, a candidate with no booking, and a line that is no code.
const CANDIDATES: &str = "Name,code,Email\r\n\
    \"Doe, Jane\", code-00001 ,jane@example.org\r\n\
    =HYPERLINK(\"http://x\"),CODE-00002,bo@example.org\r\n\
    Nobody,CODE-00040,no@example.org\r\n\
    Typo,x!,t@example.org\r\n";

fn records(csv_bytes: &[u8]) -> (Vec<String>, Vec<Vec<String>>) {
    let text = csv_bytes.strip_prefix(b"\xEF\xBB\xBF").expect("a UTF-8 byte-order mark for spreadsheets");
    assert!(std::str::from_utf8(text).unwrap().contains("\r\n"), "CRLF line endings");
    let mut reader = csv::Reader::from_reader(text);
    let header = reader.headers().unwrap().iter().map(str::to_owned).collect();
    let rows = reader.records().map(|r| r.unwrap().iter().map(str::to_owned).collect()).collect();
    (header, rows)
}

async fn the_export_lists_every_booking_and_joins_the_candidates(backend: Backend) {
    let app = spawn_app(AppOptions { backend, ..Default::default() }).await;
    three_bookings(&app).await;
    let dir = tempfile::tempdir().unwrap();
    let codes = dir.path().join("candidates.csv");
    std::fs::write(&codes, CANDIDATES).unwrap();

    let (csv_bytes, summary) = export_csv(&app.store, &app.event, Some(&codes), &app.hasher).await.unwrap();
    assert_eq!((summary.bookings, summary.joined, summary.candidates_without_booking), (3, 2, 1), "{summary:?}");
    assert_eq!(summary.bad_lines.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [5], "{summary:?}");
    let text = String::from_utf8_lossy(&csv_bytes);
    assert!(!text.to_uppercase().contains("CODE-0000"), "no raw code is copied into the export: {text}");

    let (header, rows) = records(&csv_bytes);
    let mut expected: Vec<String> = EXPORT_COLUMNS.iter().map(|c| c.to_string()).collect();
    expected.extend(["Name".into(), "Email".into()]);
    assert_eq!(header, expected);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let row = |code: &str| rows.iter().find(|r| r[0] == app.hash(code).as_str()).unwrap_or_else(|| panic!("{code}"));
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();

    let paid = row("CODE-00001");
    assert_eq!((paid[col("level")].as_str(), paid[col("state")].as_str()), ("A1", "paid"));
    assert!(paid[col("paid_at")].ends_with('Z') && paid[col("released_at")].is_empty(), "{paid:?}");
    assert!(paid[col("admitted_at")] <= paid[col("paid_at")], "{paid:?}");
    assert_eq!((paid[col("Name")].as_str(), paid[col("Email")].as_str()), ("Doe, Jane", "jane@example.org"));

    let held = row("CODE-00002");
    assert_eq!(held[col("state")], "held");
    assert!(held[col("paid_at")].is_empty() && !held[col("hold_until")].is_empty(), "{held:?}");
    assert_eq!(held[col("Name")], "'=HYPERLINK(\"http://x\")", "a formula stays text in a spreadsheet");

    let released = row("CODE-00003");
    assert_eq!(released[col("state")], "released");
    assert!(!released[col("released_at")].is_empty() && released[col("paid_at")].is_empty(), "{released:?}");
    assert_eq!((released[col("Name")].as_str(), released[col("Email")].as_str()), ("", ""), "not in the file");
    let seats: Vec<i64> = rows.iter().map(|r| r[col("seat")].parse().unwrap()).collect();
    assert!(seats.iter().all(|s| (1..=10).contains(s)), "{seats:?}");

    let other = CodeHasher::with_pepper(b"another pepper");
    let err = format!("{:#}", export_csv(&app.store, &app.event, Some(&codes), &other).await.unwrap_err());
    assert!(err.contains("pepper"), "codes hashed with another pepper would match nothing: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_lists_every_booking_and_joins_the_candidates_sqlite() {
    the_export_lists_every_booking_and_joins_the_candidates(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_lists_every_booking_and_joins_the_candidates_postgres() {
    the_export_lists_every_booking_and_joins_the_candidates(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_command_writes_the_file_and_exits_1_naming_the_skipped_lines() {
    let app = spawn_app(AppOptions::default()).await;
    three_bookings(&app).await;
    let dir = tempfile::tempdir().unwrap();
    let (codes, out) = (dir.path().join("candidates.csv"), dir.path().join("list.csv"));
    std::fs::write(&codes, CANDIDATES).unwrap();
    let run = |args: Vec<String>| {
        std::process::Command::new(env!("CARGO_BIN_EXE_seatrush"))
            .arg("export")
            .args(args)
            .env("SEATRUSH_DATABASE_URL", &app.db.url)
            .output()
            .unwrap()
    };
    let ran = run(vec![
        "--event".into(),
        EVENT.into(),
        "--out".into(),
        out.display().to_string(),
        "--codes".into(),
        codes.display().to_string(),
    ]);
    let said = String::from_utf8_lossy(&ran.stderr);
    assert_eq!(ran.status.code(), Some(1), "a skipped line is an error: {said}");
    assert!(said.contains("candidates.csv:5:") && said.contains("exported 3 bookings"), "{said}");
    assert!(!said.contains("x!"), "the bad line's content (maybe a code) is not echoed: {said}");
    let (_, rows) = records(&std::fs::read(&out).unwrap());
    assert_eq!(rows.len(), 3, "the export holds every booking despite the skipped line");

    let plain = run(vec!["--event".into(), EVENT.into()]);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    let (header, rows) = records(&plain.stdout);
    assert_eq!((header.len(), rows.len()), (EXPORT_COLUMNS.len(), 3), "to stdout without --out");
    let unknown = run(vec!["--event".into(), "no-such-event".into()]);
    assert!(!unknown.status.success() && String::from_utf8_lossy(&unknown.stderr).contains("unknown event"));
}
