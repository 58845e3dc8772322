//! An event (one sale) as the operator writes it in TOML, and the identifier types that name
//! events and levels. Parsed and checked once, when the file is applied.

use crate::domain::session::{display_text, SeatNumbering, Session};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Most levels one event may have; every level is one hash field in Redis and one row in the database.
pub const LEVELS_MAX: usize = 64;
/// Most seats one event may have; the whole seat pool lives in one Redis sorted set.
pub const TOTAL_SEATS_MAX: i64 = 10_000_000;
/// Longest payment window: a week.
pub const HOLD_SECONDS_MAX: i64 = 7 * 24 * 3600;
/// Longest draw window at the opening (docs/design.md#the-draw-at-the-opening): an hour.
pub const FAIR_START_SECONDS_MAX: i64 = 3600;

fn is_slug(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn is_level_name(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// An event id: `[a-z0-9-]`, 1–64 characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(String);

impl EventId {
    pub fn parse(s: &str) -> Result<Self, EventError> {
        is_slug(s).then(|| Self(s.to_owned())).ok_or_else(|| EventError::Id(s.chars().take(80).collect()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A level name: `[A-Za-z0-9_-]`, 1–32 characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LevelName(String);

impl LevelName {
    pub fn parse(s: &str) -> Option<Self> {
        is_level_name(s).then(|| Self(s.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LevelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("event id {0:?} must be 1-64 characters of a-z, 0-9 and '-'")]
    Id(String),
    #[error("{0}")]
    Toml(String),
    #[error("total_seats must be between 1 and {TOTAL_SEATS_MAX}, got {0}")]
    TotalSeats(i64),
    #[error("hold_seconds must be between 1 and {HOLD_SECONDS_MAX}, got {0}")]
    HoldSeconds(i64),
    #[error("an event needs between 1 and {LEVELS_MAX} levels, got {0}")]
    LevelCount(usize),
    #[error("level name {0:?} must be 1-32 characters of A-Z, a-z, 0-9, '_' and '-'")]
    LevelName(String),
    #[error("level {0} has cap {1}; a cap must be between 1 and total_seats")]
    LevelCap(String, i64),
    #[error("{field} {value:?} is not an RFC 3339 time such as 2027-03-01T09:00:00Z")]
    Time { field: &'static str, value: String },
    #[error("closes_at must come after opens_at")]
    Window,
    #[error("{0}")]
    Level(String),
    #[error("seat_numbering must be \"event-wide\" or \"per-level\", got {0:?}")]
    SeatNumbering(String),
    #[error("with seat_numbering = \"per-level\", total_seats is the sum of the caps ({sum}); leave it out or set it to that, got {given}")]
    PerLevelTotal { sum: i64, given: i64 },
    #[error("fair_start_seconds must be between 0 and {FAIR_START_SECONDS_MAX}, got {0}")]
    FairStart(i64),
    #[error("fair_start_seconds needs opens_at (the draw's window starts there), and closes_at must come after opens_at + fair_start_seconds")]
    FairStartWindow,
    #[error("language {0:?} must be a language tag such as \"fr\" or \"pt-BR\"")]
    Language(String),
    #[error(transparent)]
    PaymentUrl(#[from] crate::domain::payment_url::PaymentUrlError),
}

/// One sale, as applied to the database.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub id: EventId,
    pub total_seats: i64,
    pub hold_seconds: i64,
    /// Milliseconds since the Unix epoch; `None` opens when `open` runs.
    pub opens_at_ms: Option<i64>,
    pub closes_at_ms: Option<i64>,
    /// Level → cap.
    pub levels: BTreeMap<LevelName, i64>,
    /// What is shown of the levels that have display fields (`[levels.NAME]` tables).
    pub sessions: BTreeMap<LevelName, Session>,
    pub seat_numbering: SeatNumbering,
    /// The booking page's language for this event (`language = "fr"`); None: the browser's
    /// `Accept-Language` chooses (`http/page_strings.rs`).
    pub language: Option<String>,
    /// The pay-link template the page shows after a `201` (`domain/payment_url.rs`).
    pub payment_url: Option<String>,
    /// Seconds after `opens_at` during which attempts enter a draw instead of being admitted in
    /// arrival order (docs/design.md#the-draw-at-the-opening); 0: first come from the start.
    pub fair_start_seconds: i64,
}

impl EventSpec {
    /// When the draw decides: `opens_at + fair_start_seconds`, or None without a draw.
    pub fn decides_at_ms(&self) -> Option<i64> {
        (self.fair_start_seconds > 0).then(|| self.opens_at_ms.map(|o| o + self.fair_start_seconds * 1000)).flatten()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventFile {
    id: String,
    total_seats: Option<i64>,
    hold_seconds: i64,
    opens_at: Option<String>,
    closes_at: Option<String>,
    seat_numbering: Option<String>,
    language: Option<String>,
    levels: BTreeMap<String, LevelEntry>,
    payment_url: Option<String>,
    fair_start_seconds: Option<i64>,
}

/// `B2 = 30`, or a table `[levels.B2]` with `cap` and optional display fields.
#[derive(Deserialize)]
#[serde(untagged)]
enum LevelEntry {
    Cap(i64),
    Table(LevelTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LevelTable {
    cap: i64,
    name: Option<String>,
    starts_at: Option<String>,
    venue: Option<String>,
}

fn parse_time(field: &'static str, value: Option<String>) -> Result<Option<i64>, EventError> {
    let Some(value) = value else { return Ok(None) };
    let t = OffsetDateTime::parse(&value, &Rfc3339).map_err(|_| EventError::Time { field, value })?;
    Ok(Some((t.unix_timestamp_nanos() / 1_000_000) as i64))
}

impl EventSpec {
    /// Parses and checks an event file; the error names the first problem found.
    pub fn from_toml(text: &str) -> Result<Self, EventError> {
        let file: EventFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            EventError::Toml(match line {
                Some(line) => format!("line {line}: {}", e.message()),
                None => e.message().to_owned(),
            })
        })?;
        let id = EventId::parse(&file.id)?;
        let seat_numbering = match file.seat_numbering {
            None => SeatNumbering::EventWide,
            Some(s) => SeatNumbering::parse(&s).ok_or(EventError::SeatNumbering(s))?,
        };
        if let Some(language) = file.language.as_ref().filter(|l| !is_language_tag(l)) {
            return Err(EventError::Language(language.clone()));
        }
        if !(1..=HOLD_SECONDS_MAX).contains(&file.hold_seconds) {
            return Err(EventError::HoldSeconds(file.hold_seconds));
        }
        if !(1..=LEVELS_MAX).contains(&file.levels.len()) {
            return Err(EventError::LevelCount(file.levels.len()));
        }
        let mut levels = BTreeMap::new();
        let mut sessions = BTreeMap::new();
        for (name, entry) in file.levels {
            let level = LevelName::parse(&name).ok_or_else(|| EventError::LevelName(name.clone()))?;
            let cap = match entry {
                LevelEntry::Cap(cap) => cap,
                LevelEntry::Table(table) => {
                    let text = |field, value: Option<String>| {
                        value.map(|v| display_text(field, &name, v)).transpose().map_err(EventError::Level)
                    };
                    let session = Session {
                        name: text("name", table.name)?,
                        starts_at_ms: parse_time("starts_at", table.starts_at)?,
                        venue: text("venue", table.venue)?,
                    };
                    if !session.is_empty() {
                        sessions.insert(level.clone(), session);
                    }
                    table.cap
                }
            };
            levels.insert(level, cap);
        }
        let sum: i64 = levels.values().map(|cap| (*cap).max(0)).sum();
        let total_seats = match (seat_numbering, file.total_seats) {
            (SeatNumbering::PerLevel, Some(given)) if given != sum => {
                return Err(EventError::PerLevelTotal { sum, given })
            }
            (SeatNumbering::PerLevel, _) => sum,
            (SeatNumbering::EventWide, Some(given)) => given,
            (SeatNumbering::EventWide, None) => {
                return Err(EventError::Toml(
                    "total_seats is missing (needed unless seat_numbering = \"per-level\")".into(),
                ))
            }
        };
        if !(1..=TOTAL_SEATS_MAX).contains(&total_seats) {
            return Err(EventError::TotalSeats(total_seats));
        }
        if let Some((name, cap)) = levels.iter().find(|(_, cap)| !(1..=total_seats).contains(*cap)) {
            return Err(EventError::LevelCap(name.to_string(), *cap));
        }
        let opens_at_ms = parse_time("opens_at", file.opens_at)?;
        let closes_at_ms = parse_time("closes_at", file.closes_at)?;
        if let (Some(o), Some(c)) = (opens_at_ms, closes_at_ms) {
            if c <= o {
                return Err(EventError::Window);
            }
        }
        let fair_start_seconds = file.fair_start_seconds.unwrap_or(0);
        if !(0..=FAIR_START_SECONDS_MAX).contains(&fair_start_seconds) {
            return Err(EventError::FairStart(fair_start_seconds));
        }
        if fair_start_seconds > 0 {
            match (opens_at_ms, closes_at_ms) {
                (None, _) => return Err(EventError::FairStartWindow),
                (Some(o), Some(c)) if c <= o + fair_start_seconds * 1000 => return Err(EventError::FairStartWindow),
                _ => {}
            }
        }
        Ok(Self {
            id,
            total_seats,
            hold_seconds: file.hold_seconds,
            opens_at_ms,
            closes_at_ms,
            levels,
            sessions,
            seat_numbering,
            language: file.language,
            payment_url: file.payment_url.as_deref().map(crate::domain::payment_url::parse_payment_url).transpose()?,
            fair_start_seconds,
        })
    }
}

/// A language tag as the page accepts it: `fr`, `pt-BR` (2–3 letters, optional region or script).
pub fn is_language_tag(tag: &str) -> bool {
    let mut parts = tag.split('-');
    let primary = parts.next().unwrap_or("");
    (2..=3).contains(&primary.len())
        && primary.bytes().all(|b| b.is_ascii_lowercase())
        && parts.all(|p| (2..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()))
        && tag.len() <= 16
}

/// Formats epoch milliseconds as RFC 3339 (UTC), as the API answers times.
pub fn rfc3339_ms(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    t.replace_nanosecond(0).unwrap_or(t).format(&Rfc3339).unwrap_or_default()
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    (OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
id = "spring-exam"
total_seats = 100
hold_seconds = 900
opens_at = "2027-03-01T09:00:00Z"
closes_at = "2027-03-01T12:00:00Z"
[levels]
A1 = 30
B1 = 50
"#;

    #[test]
    fn a_payment_url_is_read_and_checked() {
        assert_eq!(EventSpec::from_toml(GOOD).unwrap().payment_url, None);
        let with =
            GOOD.replace("[levels]", "payment_url = \"https://pay.example.org/{event}/{seat}?code={code}\"\n[levels]");
        assert_eq!(
            EventSpec::from_toml(&with).unwrap().payment_url.as_deref(),
            Some("https://pay.example.org/{event}/{seat}?code={code}")
        );
        let bad = GOOD.replace("[levels]", "payment_url = \"javascript:alert(1)\"\n[levels]");
        assert!(EventSpec::from_toml(&bad).unwrap_err().to_string().contains("https://"));
    }

    #[test]
    fn the_design_example_parses() {
        let spec = EventSpec::from_toml(GOOD).unwrap();
        assert_eq!(spec.id.as_str(), "spring-exam");
        assert_eq!(spec.levels.len(), 2);
        assert_eq!(spec.opens_at_ms, Some(1_803_891_600_000));
        assert_eq!(rfc3339_ms(spec.opens_at_ms.unwrap()), "2027-03-01T09:00:00Z");
    }

    #[test]
    fn bad_files_name_their_problem() {
        let bad_id = GOOD.replace("spring-exam", "Spring Exam");
        assert!(matches!(EventSpec::from_toml(&bad_id), Err(EventError::Id(_))));
        let zero = GOOD.replace("total_seats = 100", "total_seats = 0");
        assert!(matches!(EventSpec::from_toml(&zero), Err(EventError::TotalSeats(0))));
        let over_cap = GOOD.replace("B1 = 50", "B1 = 101");
        assert!(matches!(EventSpec::from_toml(&over_cap), Err(EventError::LevelCap(_, 101))));
        let bad_time = GOOD.replace("2027-03-01T12:00:00Z", "noon");
        assert!(matches!(EventSpec::from_toml(&bad_time), Err(EventError::Time { field: "closes_at", .. })));
        let backwards = GOOD.replace("12:00:00Z", "08:00:00Z");
        assert!(matches!(EventSpec::from_toml(&backwards), Err(EventError::Window)));
        let unknown = format!("colour = \"red\"\n{GOOD}");
        assert!(matches!(EventSpec::from_toml(&unknown), Err(EventError::Toml(_))));
        let bad_level = GOOD.replace("A1 = 30", "\"A 1\" = 30");
        assert!(matches!(EventSpec::from_toml(&bad_level), Err(EventError::LevelName(_))));
    }

    #[test]
    fn a_level_may_be_a_session_table_beside_the_short_form() {
        let file = GOOD.replace(
            "[levels]\nA1 = 30\nB1 = 50\n",
            "[levels]\nA1 = 30\n[levels.B2-0314-AM]\ncap = 50\nname = \"B2, 14 March, morning\"\n\
             starts_at = \"2027-03-14T09:00:00Z\"\nvenue = \"Hall 3\"\n",
        );
        let spec = EventSpec::from_toml(&file).unwrap();
        let b2 = LevelName::parse("B2-0314-AM").unwrap();
        assert_eq!(spec.levels[&b2], 50);
        assert_eq!(spec.levels[&LevelName::parse("A1").unwrap()], 30);
        let session = &spec.sessions[&b2];
        assert_eq!(session.name.as_deref(), Some("B2, 14 March, morning"));
        assert_eq!(session.venue.as_deref(), Some("Hall 3"));
        assert_eq!(session.starts_at_ms.map(rfc3339_ms).as_deref(), Some("2027-03-14T09:00:00Z"));
        assert_eq!(spec.sessions.len(), 1, "a short-form level has no session");
        assert_eq!(spec.seat_numbering, SeatNumbering::EventWide);
        let unknown = file.replace("venue =", "room =");
        assert!(EventSpec::from_toml(&unknown).is_err());
        let bad_time = file.replace("2027-03-14T09:00:00Z", "morning");
        assert!(matches!(EventSpec::from_toml(&bad_time), Err(EventError::Time { field: "starts_at", .. })));
    }

    #[test]
    fn per_level_numbering_makes_total_seats_the_sum_of_the_caps() {
        let per_level = GOOD.replace("total_seats = 100\n", "seat_numbering = \"per-level\"\n");
        let spec = EventSpec::from_toml(&per_level).unwrap();
        assert_eq!((spec.seat_numbering, spec.total_seats), (SeatNumbering::PerLevel, 80));
        let agreeing = GOOD.replace("total_seats = 100", "total_seats = 80\nseat_numbering = \"per-level\"");
        assert_eq!(EventSpec::from_toml(&agreeing).unwrap().total_seats, 80);
        let wrong = GOOD.replace("total_seats = 100", "total_seats = 100\nseat_numbering = \"per-level\"");
        assert!(matches!(EventSpec::from_toml(&wrong), Err(EventError::PerLevelTotal { sum: 80, given: 100 })));
        let typo = GOOD.replace("total_seats = 100", "total_seats = 100\nseat_numbering = \"per_level\"");
        assert!(matches!(EventSpec::from_toml(&typo), Err(EventError::SeatNumbering(_))));
        let missing = GOOD.replace("total_seats = 100\n", "");
        assert!(EventSpec::from_toml(&missing).unwrap_err().to_string().contains("total_seats"));
    }

    #[test]
    fn a_draw_window_needs_opens_at_and_ends_before_closes_at() {
        assert_eq!(EventSpec::from_toml(GOOD).unwrap().decides_at_ms(), None);
        let with = GOOD.replace("[levels]", "fair_start_seconds = 5\n[levels]");
        assert_eq!(EventSpec::from_toml(&with).unwrap().decides_at_ms(), Some(1_803_891_605_000));
        let negative = GOOD.replace("[levels]", "fair_start_seconds = -1\n[levels]");
        assert!(matches!(EventSpec::from_toml(&negative), Err(EventError::FairStart(-1))));
        let no_opening = with.replace("opens_at = \"2027-03-01T09:00:00Z\"\n", "");
        assert!(matches!(EventSpec::from_toml(&no_opening), Err(EventError::FairStartWindow)));
        let past_close =
            GOOD.replace("[levels]", "fair_start_seconds = 3600\n[levels]").replace("12:00:00Z", "10:00:00Z");
        assert!(matches!(EventSpec::from_toml(&past_close), Err(EventError::FairStartWindow)));
    }

    #[test]
    fn a_language_is_a_language_tag() {
        assert_eq!(EventSpec::from_toml(GOOD).unwrap().language, None);
        let fr = GOOD.replace("[levels]", "language = \"fr\"\n[levels]");
        assert_eq!(EventSpec::from_toml(&fr).unwrap().language.as_deref(), Some("fr"));
        let bad = GOOD.replace("[levels]", "language = \"French\"\n[levels]");
        assert!(matches!(EventSpec::from_toml(&bad), Err(EventError::Language(_))));
        assert!(is_language_tag("pt-BR") && !is_language_tag("f") && !is_language_tag("fr_FR"));
    }

    #[test]
    fn level_names_have_bounds() {
        assert!(LevelName::parse("B1").is_some());
        assert!(LevelName::parse(&"x".repeat(32)).is_some());
        assert!(LevelName::parse(&"x".repeat(33)).is_none());
        assert!(LevelName::parse("").is_none());
        assert!(LevelName::parse("B 1").is_none());
    }
}
