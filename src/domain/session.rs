//! A level as a session: what a candidate is shown of it (a display name, when it starts, where),
//! and how an event numbers its seats. Display fields never decide anything; the seat numbering
//! does: with `seat_numbering = "per-level"` each level owns one block of the event's seat
//! numbers (docs/design.md#seat-numbering), and a seat is shown as its place in that block.

use super::event::LevelName;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest display name and venue accepted.
pub const SESSION_TEXT_CHARS_MAX: usize = 200;

/// What the page, the answers and `/ops` show of a level besides its name; every field optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starts_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub venue: Option<String>,
}

impl Session {
    pub fn is_empty(&self) -> bool {
        self.name.is_none() && self.starts_at_ms.is_none() && self.venue.is_none()
    }
}

/// Checks a display name or a venue: 1–200 characters, no control characters.
pub fn display_text(field: &'static str, level: &str, value: String) -> Result<String, String> {
    let trimmed = value.trim();
    if trimmed.is_empty() || trimmed.chars().count() > SESSION_TEXT_CHARS_MAX || trimmed.chars().any(char::is_control) {
        return Err(format!(
            "{field} of level {level} must be 1-{SESSION_TEXT_CHARS_MAX} characters without control characters"
        ));
    }
    Ok(trimmed.to_owned())
}

/// How an event numbers its seats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SeatNumbering {
    /// One range 1..total_seats for the whole event; any level may take any seat.
    #[default]
    EventWide,
    /// Each level its own seats 1..cap; `total_seats` is the sum of the caps.
    PerLevel,
}

impl SeatNumbering {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "event-wide" => Some(Self::EventWide),
            "per-level" => Some(Self::PerLevel),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::EventWide => "event-wide",
            Self::PerLevel => "per-level",
        }
    }
}

/// Per-level numbering's blocks: each level, in name order, owns the event-wide seat numbers
/// `base + 1 ..= base + cap`, the blocks one after another from 0. Redis, the database and every
/// invariant keep working on the event-wide numbers (unique per event, so unique per level and
/// seat); a candidate is shown `slot - base`. Empty for event-wide numbering.
pub fn seat_bases(numbering: SeatNumbering, levels: &BTreeMap<LevelName, i64>) -> BTreeMap<LevelName, i64> {
    if numbering == SeatNumbering::EventWide {
        return BTreeMap::new();
    }
    let mut next = 0;
    levels
        .iter()
        .map(|(level, cap)| {
            let base = next;
            next += cap;
            (level.clone(), base)
        })
        .collect()
}

/// The blocks as `open` wrote them into the event's meta hash (`base:LEVEL` fields).
pub fn bases_from_meta(meta: &std::collections::HashMap<String, String>) -> BTreeMap<LevelName, i64> {
    meta.iter()
        .filter_map(|(field, base)| Some((LevelName::parse(field.strip_prefix("base:")?)?, base.parse().ok()?)))
        .collect()
}

/// The seat a candidate is shown: the place in the level's block, or the event-wide number.
pub fn seat_in_level(bases: &BTreeMap<LevelName, i64>, level: &str, slot: i64) -> i64 {
    match LevelName::parse(level).and_then(|l| bases.get(&l).copied()) {
        Some(base) => slot - base,
        None => slot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_level_blocks_follow_each_other_in_name_order() {
        let l = |s: &str| LevelName::parse(s).unwrap();
        let levels = BTreeMap::from([(l("B"), 5), (l("A"), 3), (l("C"), 2)]);
        let bases = seat_bases(SeatNumbering::PerLevel, &levels);
        assert_eq!(bases, BTreeMap::from([(l("A"), 0), (l("B"), 3), (l("C"), 8)]));
        assert_eq!(seat_in_level(&bases, "B", 4), 1);
        assert_eq!(seat_in_level(&bases, "C", 10), 2);
        assert!(seat_bases(SeatNumbering::EventWide, &levels).is_empty());
        assert_eq!(seat_in_level(&BTreeMap::new(), "B", 4), 4);
    }

    #[test]
    fn display_text_is_trimmed_and_bounded() {
        assert_eq!(display_text("name", "A", "  Room 3 ".into()).unwrap(), "Room 3");
        assert!(display_text("name", "A", " ".into()).is_err());
        assert!(display_text("venue", "A", "a\u{7}b".into()).is_err());
        assert!(display_text("venue", "A", "x".repeat(201)).is_err());
    }
}
