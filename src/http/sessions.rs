//! A level as the answers show it: its display name, start and venue (`[levels.NAME]` in the
//! event file), and a seat as the candidate reads it, the place in the level's room with
//! per-level numbering (docs/design.md#seat-numbering).

use crate::domain::event::{rfc3339_ms, LevelName};
use crate::domain::session::Session;
use crate::sale::catalog::EventView;
use serde::Serialize;
use utoipa::ToSchema;

/// What the event file says of a level besides its cap; each field absent when not set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct SessionBody {
    /// The level's display name.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "B2, 14 March, morning")]
    pub name: Option<String>,
    /// When the session starts (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "2027-03-14T09:00:00Z")]
    pub starts_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "Hall 3")]
    pub venue: Option<String>,
}

impl From<&Session> for SessionBody {
    fn from(s: &Session) -> Self {
        Self { name: s.name.clone(), starts_at: s.starts_at_ms.map(rfc3339_ms), venue: s.venue.clone() }
    }
}

/// The level's display fields, or None when it has none.
pub(crate) fn session_of(view: &EventView, level: &str) -> Option<SessionBody> {
    view.sessions.get(&LevelName::parse(level)?).map(SessionBody::from)
}
