//! Reading an allowlist file for `allowlist import`: one code per line, or CSV (RFC 4180, as
//! spreadsheets export it: quoted fields with commas, a UTF-8 byte-order mark, Windows line
//! endings) whose header has a `code` column, and optionally a `levels` column: the levels that
//! code may book, separated by spaces, `;` or `|` (empty: any level). Codes are normalised and
//! hashed here, so a raw code goes no further than this function.

use crate::domain::code::{CodeHash, CodeHasher, NormalisedCode};

/// The byte-order mark a spreadsheet puts before a UTF-8 export.
pub(super) const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
/// The header (case-insensitive, trimmed) of the column that holds the codes.
pub(super) const CODE_COLUMN: &str = "code";
/// The header of the optional column naming the levels a code may book.
pub(super) const LEVELS_COLUMN: &str = "levels";

/// What an allowlist file held.
#[derive(Debug, Default)]
pub struct ParsedAllowlist {
    pub hashes: Vec<CodeHash>,
    /// The codes' shapes, for the guessability warning (the codes themselves are not kept).
    pub shapes: super::code_strength::Shapes,
    /// (line number, reason) for every line that was not a valid code.
    pub bad_lines: Vec<(u64, String)>,
    /// With a `levels` column: each code's levels, space-separated (None: any level), in file
    /// order. None when the file has no such column (import then leaves restrictions alone).
    pub levels: Option<Vec<(CodeHash, Option<String>)>>,
}

/// One code per line, or CSV whose first line has a `code` column. Blank lines are skipped; a
/// bad line is reported with its line number (where its record starts) and the rest are read.
pub fn parse_allowlist(file: &[u8], hasher: &CodeHasher) -> ParsedAllowlist {
    let file = file.strip_prefix(UTF8_BOM).unwrap_or(file);
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(file);
    let mut lines = LineCounter::new(file);
    let mut out = ParsedAllowlist::default();
    let mut column = None;
    let mut levels_column = None;
    for (index, record) in reader.records().enumerate() {
        let record = match record {
            Ok(record) => record,
            Err(err) => {
                let line = err.position().map_or(0, |p| lines.line_at(p.byte()));
                out.bad_lines.push((line, csv_error(&err)));
                continue;
            }
        };
        let line = record.position().map_or(0, |p| lines.line_at(p.byte()));
        if index == 0 {
            column = record.iter().position(|field| field.trim().eq_ignore_ascii_case(CODE_COLUMN));
            if column.is_some() {
                levels_column = record.iter().position(|field| field.trim().eq_ignore_ascii_case(LEVELS_COLUMN));
                out.levels = levels_column.map(|_| Vec::new());
                continue;
            }
        }
        let raw = match column {
            Some(c) => record.get(c),
            None if record.len() == 1 => record.get(0),
            None => {
                out.bad_lines.push((line, "one code per line expected (or a CSV header with a `code` column)".into()));
                continue;
            }
        };
        match raw.map(str::trim) {
            Some("") if record.iter().all(|f| f.trim().is_empty()) => {}
            Some(raw) => match NormalisedCode::parse(raw) {
                Ok(code) => {
                    let levels = match levels_column.map(|c| level_list(record.get(c).unwrap_or(""))) {
                        Some(Err(bad)) => {
                            out.bad_lines.push((line, bad));
                            continue;
                        }
                        Some(Ok(levels)) => Some(levels),
                        None => None,
                    };
                    out.shapes.add(&code);
                    let hash = hasher.hash(&code);
                    if let (Some(all), Some(levels)) = (out.levels.as_mut(), levels) {
                        all.push((hash.clone(), levels));
                    }
                    out.hashes.push(hash);
                }
                Err(e) => out.bad_lines.push((line, e.to_string())),
            },
            None => out.bad_lines.push((line, "no code column on this line".into())),
        }
    }
    out
}

/// A `levels` cell: level names separated by spaces, `;`, `|` or `,`, as one space-separated
/// sorted list; empty is None (any level). Whether each level exists is checked by the import,
/// which knows the event.
fn level_list(cell: &str) -> Result<Option<String>, String> {
    let mut names = Vec::new();
    for name in cell.split([' ', ';', '|', ',']).map(str::trim).filter(|n| !n.is_empty()) {
        let level = crate::domain::event::LevelName::parse(name)
            .ok_or_else(|| format!("level name {name:?} in the levels column is not a level name"))?;
        names.push(level.to_string());
    }
    names.sort();
    names.dedup();
    Ok((!names.is_empty()).then(|| names.join(" ")))
}

/// Line numbers from byte offsets. The csv reader's own `Position::line` counts a record from the
/// line ending before it (so after `\r\n` or a blank line it names the line above); the byte
/// offset it gives is where that ending starts, so the record's line is found by counting the
/// newlines up to it and then skipping the line endings that follow. Offsets only grow, so the
/// count is carried forward: linear in the file, however many records.
pub(super) struct LineCounter<'a> {
    file: &'a [u8],
    offset: usize,
    line: u64,
}

impl<'a> LineCounter<'a> {
    pub(super) fn new(file: &'a [u8]) -> Self {
        Self { file, offset: 0, line: 1 }
    }

    pub(super) fn line_at(&mut self, byte: u64) -> u64 {
        let byte = usize::try_from(byte).unwrap_or(usize::MAX).clamp(self.offset, self.file.len());
        self.line += newlines(&self.file[self.offset..byte]);
        self.offset = byte;
        let skip = self.file[byte..].iter().take_while(|b| matches!(b, b'\r' | b'\n')).count();
        self.line + newlines(&self.file[byte..byte + skip])
    }
}

fn newlines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|b| **b == b'\n').count() as u64
}

/// A reader error in words, without the record's content (which may hold a code).
pub(super) fn csv_error(err: &csv::Error) -> String {
    match err.kind() {
        csv::ErrorKind::Utf8 { .. } => "not valid UTF-8 (save the file as UTF-8)".into(),
        _ => "unreadable CSV record".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(code: &str) -> CodeHash {
        CodeHasher::plain().hash(&NormalisedCode::parse(code).unwrap())
    }

    fn parse(file: &[u8]) -> ParsedAllowlist {
        parse_allowlist(file, &CodeHasher::plain())
    }

    fn lines(parsed: &ParsedAllowlist) -> Vec<u64> {
        parsed.bad_lines.iter().map(|(l, _)| *l).collect()
    }

    #[test]
    fn plain_lines_are_codes_and_bad_ones_are_reported_by_line_number() {
        let parsed = parse(b"AB-1234\n\n  cd5678 \nx\nEF 99\n");
        assert_eq!(parsed.hashes, vec![hash("AB-1234"), hash("CD5678")]);
        assert_eq!(lines(&parsed), vec![4, 5]);
    }

    #[test]
    fn csv_with_a_code_column_is_read_by_that_column_whatever_its_case() {
        let parsed = parse(b"name,Code\nAda,AB-1234\nBob,\"cd5678\"\nEve\n");
        assert_eq!(parsed.hashes, vec![hash("AB-1234"), hash("CD5678")]);
        assert_eq!(parsed.bad_lines, vec![(4, "no code column on this line".to_string())]);
    }

    #[test]
    fn a_quoted_name_with_a_comma_does_not_shift_the_code_column() {
        let parsed = parse(b"name,code\n\"Doe, Jane\",AB12-3456\n");
        assert_eq!(parsed.hashes, vec![hash("AB12-3456")]);
        assert!(parsed.bad_lines.is_empty(), "{:?}", parsed.bad_lines);
    }

    #[test]
    fn a_byte_order_mark_does_not_hide_the_header() {
        let parsed = parse(b"\xEF\xBB\xBFcode,name\nAB12-3456,\"Doe, Jane\"\n");
        assert_eq!(parsed.hashes, vec![hash("AB12-3456")]);
        assert!(parsed.bad_lines.is_empty(), "{:?}", parsed.bad_lines);
        let plain = parse(b"\xEF\xBB\xBFAB12-3456\nCD-5678\n");
        assert_eq!(plain.hashes, vec![hash("AB12-3456"), hash("CD-5678")]);
    }

    #[test]
    fn windows_line_endings_are_read_like_unix_ones() {
        let csv = parse(b"\xEF\xBB\xBFName,CODE\r\n\"Doe, Jane\",AB12-3456\r\nBob,x\r\n\r\nAda,cd-5678\r\n");
        assert_eq!(csv.hashes, vec![hash("AB12-3456"), hash("CD-5678")]);
        assert_eq!(lines(&csv), vec![3]);
        let plain = parse(b"AB12-3456\r\nx\r\nCD-5678\r\n");
        assert_eq!(plain.hashes, vec![hash("AB12-3456"), hash("CD-5678")]);
        assert_eq!(lines(&plain), vec![2]);
    }

    #[test]
    fn line_numbers_count_blank_lines_with_either_ending() {
        assert_eq!(lines(&parse(b"AB-1234\n\n\nx\n")), vec![4]);
        assert_eq!(lines(&parse(b"code\r\nAB-1234\r\n\r\n\r\nx\r\ny\r\n")), vec![5, 6]);
    }

    #[test]
    fn a_levels_column_says_which_levels_each_code_may_book() {
        let parsed = parse(
            b"name,code,levels\nAda,AB-1234,\"B2-AM; A1\"\nBob,CD-5678,\nEve,EF-9012,\"B 1\"|C1\nZed,GH-3456,bad!\n",
        );
        assert_eq!(parsed.hashes, vec![hash("AB-1234"), hash("CD-5678"), hash("EF-9012")]);
        assert_eq!(
            parsed.levels,
            Some(vec![
                (hash("AB-1234"), Some("A1 B2-AM".to_string())),
                (hash("CD-5678"), None),
                (hash("EF-9012"), Some("1 B C1".to_string())),
            ])
        );
        assert_eq!(lines(&parsed), vec![5]);
        assert!(parse(b"code\nAB-1234\n").levels.is_none(), "no levels column: restrictions are left alone");
    }

    #[test]
    fn a_line_with_several_fields_and_no_header_is_reported_not_guessed() {
        let parsed = parse(b"AB-1234\nDoe,AB12-3456\n");
        assert_eq!(parsed.hashes, vec![hash("AB-1234")]);
        assert_eq!(lines(&parsed), vec![2]);
    }

    #[test]
    fn a_line_that_is_not_utf8_is_reported_and_the_rest_imported() {
        let parsed = parse(b"code\nAB-1234\n\xFF\xFE-99\nCD-5678\n");
        assert_eq!(parsed.hashes, vec![hash("AB-1234"), hash("CD-5678")]);
        assert_eq!(lines(&parsed), vec![3]);
    }
}
