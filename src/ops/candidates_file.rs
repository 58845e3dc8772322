//! The operator's candidate list for `export --codes`: CSV with a header and a `code` column (as
//! `allowlist import` reads it: RFC 4180, a UTF-8 byte-order mark, Windows line endings), any
//! other columns the operator keeps (name, email, centre …). Each code is normalised and hashed
//! with the running pepper here and dropped; only its hash and the other columns go on.

use super::allowlist_file::{csv_error, LineCounter, CODE_COLUMN, UTF8_BOM};
use crate::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use std::collections::HashMap;

/// What a candidate file held.
#[derive(Debug, Default)]
pub struct Candidates {
    /// The header's other columns, in the file's order.
    pub columns: Vec<String>,
    /// Each code's hash → its other fields (same order as `columns`).
    pub by_hash: HashMap<CodeHash, Vec<String>>,
    /// (line number, reason) for every line that was skipped.
    pub bad_lines: Vec<(u64, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum CandidatesError {
    #[error(
        "the first line must be a CSV header with a `code` column (and the columns to join, e.g. code,name,email)"
    )]
    NoCodeColumn,
    #[error("the header names {0:?} twice")]
    DuplicateColumn(String),
    #[error("unreadable header: {0}")]
    Header(String),
}

/// Reads the file; a bad line is reported with its line number and the rest are read. The
/// first line with a given code wins; a later one is a bad line.
pub fn parse_candidates(file: &[u8], hasher: &CodeHasher) -> Result<Candidates, CandidatesError> {
    let file = file.strip_prefix(UTF8_BOM).unwrap_or(file);
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(file);
    let mut lines = LineCounter::new(file);
    let mut records = reader.records();
    let header = match records.next() {
        Some(Ok(header)) => header,
        Some(Err(err)) => return Err(CandidatesError::Header(csv_error(&err))),
        None => return Err(CandidatesError::NoCodeColumn),
    };
    let names: Vec<String> = header.iter().map(|f| f.trim().to_owned()).collect();
    let code_column =
        names.iter().position(|n| n.eq_ignore_ascii_case(CODE_COLUMN)).ok_or(CandidatesError::NoCodeColumn)?;
    let mut out = Candidates { columns: other_fields(&names, code_column), ..Default::default() };
    for (i, name) in names.iter().enumerate() {
        if names[..i].iter().any(|earlier| earlier.eq_ignore_ascii_case(name)) {
            return Err(CandidatesError::DuplicateColumn(name.clone()));
        }
    }
    let mut first_line: HashMap<CodeHash, u64> = HashMap::new();
    for record in records {
        let record = match record {
            Ok(record) => record,
            Err(err) => {
                let line = err.position().map_or(0, |p| lines.line_at(p.byte()));
                out.bad_lines.push((line, csv_error(&err)));
                continue;
            }
        };
        let line = record.position().map_or(0, |p| lines.line_at(p.byte()));
        if record.iter().all(|f| f.trim().is_empty()) {
            continue;
        }
        let code = match NormalisedCode::parse(record.get(code_column).unwrap_or("")) {
            Ok(code) => code,
            Err(e) => {
                out.bad_lines.push((line, e.to_string()));
                continue;
            }
        };
        let hash = hasher.hash(&code);
        if let Some(first) = first_line.get(&hash) {
            out.bad_lines.push((line, format!("the same code as line {first}; line {first} is used")));
            continue;
        }
        first_line.insert(hash.clone(), line);
        let fields: Vec<String> = (0..names.len()).map(|i| record.get(i).unwrap_or("").to_owned()).collect();
        out.by_hash.insert(hash, other_fields(&fields, code_column));
    }
    Ok(out)
}

fn other_fields(fields: &[String], code_column: usize) -> Vec<String> {
    fields.iter().enumerate().filter(|(i, _)| *i != code_column).map(|(_, f)| f.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(code: &str) -> CodeHash {
        CodeHasher::plain().hash(&NormalisedCode::parse(code).unwrap())
    }

    #[test]
    fn codes_are_hashed_and_the_other_columns_kept_in_order() {
        let file = b"\xEF\xBB\xBFName,Code,Email\r\n\"Doe, Jane\", ab12-3456 ,jane@example.org\r\nBo,CD34-5678,bo@example.org\r\n";
        let parsed = parse_candidates(file, &CodeHasher::plain()).unwrap();
        assert_eq!(parsed.columns, ["Name", "Email"]);
        assert_eq!(parsed.by_hash[&hash("AB12-3456")], ["Doe, Jane", "jane@example.org"]);
        assert_eq!(parsed.by_hash.len(), 2);
        assert!(parsed.bad_lines.is_empty(), "{:?}", parsed.bad_lines);
    }

    #[test]
    fn bad_and_repeated_codes_are_reported_by_line_and_the_rest_kept() {
        let file = b"code,name\nAB12-3456,first\nx,short\n\nab12-3456,again\nCD34-5678,ok\n";
        let parsed = parse_candidates(file, &CodeHasher::plain()).unwrap();
        let lines: Vec<u64> = parsed.bad_lines.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, [3, 5], "{:?}", parsed.bad_lines);
        assert!(parsed.bad_lines[1].1.contains("line 2"), "{:?}", parsed.bad_lines);
        assert_eq!(parsed.by_hash[&hash("AB12-3456")], ["first"]);
        assert_eq!(parsed.by_hash.len(), 2);
    }

    #[test]
    fn a_file_without_a_code_header_or_with_a_column_twice_is_refused() {
        assert!(matches!(parse_candidates(b"AB12-3456\n", &CodeHasher::plain()), Err(CandidatesError::NoCodeColumn)));
        assert!(matches!(parse_candidates(b"", &CodeHasher::plain()), Err(CandidatesError::NoCodeColumn)));
        assert!(matches!(
            parse_candidates(b"code,name,Name\n", &CodeHasher::plain()),
            Err(CandidatesError::DuplicateColumn(n)) if n == "Name"
        ));
    }
}
