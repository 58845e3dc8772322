//! `seatrush export --event ID [--out FILE] [--codes candidates.csv]`: the list after the sale,
//! as CSV a spreadsheet opens (a UTF-8 byte-order mark, CRLF line endings, RFC 4180 quoting).
//! One row per booking the database holds, by level and seat; with `--codes`, the operator's own
//! columns joined by code hash, so the list names people while seatrush never stores, logs or
//! writes a raw code (the `code` column itself is not copied). The columns are a stable
//! interface (README "The list afterwards"): new ones are only ever added at the end.

use super::allowlist_file::UTF8_BOM;
use super::candidates_file::{parse_candidates, Candidates};
use crate::domain::code::CodeHasher;
use crate::domain::event::{EventId, LevelName};
use crate::domain::session::{seat_bases, seat_in_level};
use crate::http::availability::rfc3339_millis;
use crate::store::{ExportRow, Store};
use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::path::Path;

/// seatrush's own columns, in this order, before the operator's.
pub const EXPORT_COLUMNS: [&str; 11] = [
    "code_hash",
    "level",
    "seat",
    "state",
    "admitted_at",
    "hold_until",
    "paid_at",
    "released_at",
    "payment_reference",
    "offered_at",
    "joined_waitlist_at",
];

/// What an export wrote, for its report.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ExportSummary {
    pub bookings: usize,
    /// Bookings whose code was in the candidate file.
    pub joined: usize,
    /// Candidates in the file that hold no booking row.
    pub candidates_without_booking: usize,
    /// (line, reason) of the candidate file's skipped lines.
    pub bad_lines: Vec<(u64, String)>,
}

/// Reads the candidate file (when given) and the bookings, and returns the CSV with its summary.
/// The candidate file's codes are hashed with `hasher`, which must be the pepper the allowlist
/// was imported with, or no code would match.
pub async fn export_csv(
    store: &Store,
    id: &EventId,
    codes: Option<&Path>,
    hasher: &CodeHasher,
) -> anyhow::Result<(Vec<u8>, ExportSummary)> {
    let event = store.event(id).await?;
    // `seat` is the seat in the level's room with per-level numbering (docs/design.md#seat-numbering).
    let bases = seat_bases(event.spec.seat_numbering, &event.spec.levels);
    let candidates = match codes {
        None => Candidates::default(),
        Some(path) => {
            store
                .check_allowlist_pepper(id, &hasher.fingerprint())
                .await
                .context("the candidate codes would be hashed with another pepper than the allowlist's")?;
            let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let candidates = parse_candidates(&bytes, hasher).with_context(|| format!("{}", path.display()))?;
            if let Some(clash) =
                candidates.columns.iter().find(|c| EXPORT_COLUMNS.iter().any(|e| e.eq_ignore_ascii_case(c)))
            {
                bail!("{}: the column {clash:?} is one of the export's own; rename it", path.display());
            }
            candidates
        }
    };
    let rows = store.export_rows(id).await?;
    let mut summary = ExportSummary { bookings: rows.len(), ..Default::default() };
    let mut out = UTF8_BOM.to_vec();
    {
        let mut writer = csv::WriterBuilder::new().terminator(csv::Terminator::CRLF).from_writer(&mut out);
        let header: Vec<&str> =
            EXPORT_COLUMNS.iter().copied().chain(candidates.columns.iter().map(String::as_str)).collect();
        writer.write_record(&header)?;
        let blank = vec![String::new(); candidates.columns.len()];
        for row in &rows {
            let theirs = candidates.by_hash.get(&row.code);
            summary.joined += usize::from(theirs.is_some());
            let fields = ours(row, &bases).into_iter().chain(theirs.unwrap_or(&blank).iter().map(|f| defused(f)));
            writer.write_record(fields)?;
        }
        writer.flush()?;
    }
    let booked: std::collections::HashSet<_> = rows.iter().map(|r| &r.code).collect();
    summary.candidates_without_booking = candidates.by_hash.keys().filter(|h| !booked.contains(h)).count();
    summary.bad_lines = candidates.bad_lines;
    Ok((out, summary))
}

fn ours(row: &ExportRow, bases: &BTreeMap<LevelName, i64>) -> Vec<String> {
    let time = |ms: Option<i64>| ms.map(rfc3339_millis).unwrap_or_default();
    vec![
        row.code.as_str().to_owned(),
        row.level.to_string(),
        seat_in_level(bases, row.level.as_str(), row.slot).to_string(),
        row.state.to_string(),
        time(Some(row.admitted_ms)),
        time(Some(row.hold_until_ms)),
        time(row.paid_ms),
        time(row.released_ms),
        row.payment_reference.clone().unwrap_or_default(),
        time(row.offered_ms),
        time(row.joined_waitlist_ms),
    ]
}

/// An operator's field that a spreadsheet would run as a formula (`=`, `+`, `-`, `@`, a tab or
/// a carriage return first) gets a leading `'`, which spreadsheets show as text: a candidate who
/// registered as `=HYPERLINK(…)` stays a name.
fn defused(field: &str) -> String {
    match field.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{field}"),
        _ => field.to_owned(),
    }
}

/// The command: the CSV to `out` (or stdout), the summary and any bad candidate lines to stderr;
/// an error (exit 1) after writing when lines were skipped, so a script notices.
pub async fn export(
    connections: &super::settings::Connections,
    event: &str,
    out: Option<&Path>,
    codes: Option<&Path>,
) -> anyhow::Result<()> {
    use std::io::Write;
    let id = EventId::parse(event)?;
    let store = Store::connect(&connections.database_url).await?;
    let (csv, summary) = export_csv(&store, &id, codes, &CodeHasher::from_env()).await?;
    match out {
        Some(path) => write_atomically(path, &csv)?,
        None => std::io::stdout().lock().write_all(&csv)?,
    }
    let to = out.map_or("stdout".to_owned(), |p| p.display().to_string());
    eprintln!("exported {} bookings of {id} to {to}", summary.bookings);
    if let Some(path) = codes {
        eprintln!(
            "{} of them joined to {}; {} candidates in it hold no booking",
            summary.joined,
            path.display(),
            summary.candidates_without_booking
        );
        for (line, why) in summary.bad_lines.iter().take(50) {
            eprintln!("{}:{line}: {why}", path.display());
        }
        if !summary.bad_lines.is_empty() {
            bail!("{} lines of {} were skipped (the export holds the rest)", summary.bad_lines.len(), path.display());
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` whole or not at all: a temporary file beside it, synced, renamed.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let name = path.file_name().with_context(|| format!("{} names no file", path.display()))?;
    let tmp = path.with_file_name(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::defused;

    #[test]
    fn formula_fields_are_defused_and_the_rest_kept() {
        assert_eq!(defused("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        assert_eq!(defused("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(defused("Jane Doe"), "Jane Doe");
        assert_eq!(defused(""), "");
    }
}
