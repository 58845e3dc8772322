//! The open events as `serve` sees them: read from Redis (where `open` put them), kept in memory
//! for a short while so the read-only gates (level, window) cost no round trip, and re-read often
//! enough that `close` or a newly opened event shows within [`CATALOG_TTL`].
//!
//! Anyone may ask for any event id, so nothing here grows with what clients send: an id is looked
//! up in the set of loaded events (`seatrush:events`), read at most once per [`CATALOG_TTL`] for
//! all callers together; an id not in it is answered "unknown" without a Redis read and without a
//! cache entry. Only loaded events get a cached view, at most [`CATALOG_EVENTS_MAX`] of them.

use crate::domain::event::{EventId, LevelName};
use crate::domain::session::{bases_from_meta, seat_in_level, Session};
use crate::redis_io::keys::{EventKeys, EVENTS_KEY};
use crate::redis_io::link::RedisLink;
use redis::RedisResult;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, RwLock};

/// How long a cached view of an event, or the set of loaded event ids, is trusted.
pub const CATALOG_TTL: Duration = Duration::from_millis(250);
/// Most event views kept in memory. Views exist only for events `open` loaded, so this bounds an
/// operator's mistake (thousands of events), not a client's.
pub const CATALOG_EVENTS_MAX: usize = 1024;

/// One opened event: everything the gates need.
#[derive(Clone, Debug)]
pub struct EventView {
    pub id: EventId,
    /// Shared, not copied: every admit call of the event carries them (nine key names a request).
    pub keys: Arc<EventKeys>,
    pub total_seats: i64,
    pub hold_seconds: i64,
    pub opens_at_ms: Option<i64>,
    pub closes_at_ms: Option<i64>,
    /// `close` ran.
    pub closed: bool,
    pub levels: BTreeMap<LevelName, i64>,
    /// With per-level seat numbering, each level's block offset (`base:LEVEL` in the meta); empty
    /// for event-wide numbering.
    pub seat_bases: BTreeMap<LevelName, i64>,
    /// What is shown of the levels that have display fields.
    pub sessions: Arc<BTreeMap<LevelName, Session>>,
    /// The allowlist restricts some codes to some levels (`{ev:ID}:levels` exists).
    pub restricted: bool,
    /// Stamped by each `open`; a new value means the allowlist in Redis was replaced.
    pub allow_version: Option<String>,
    /// Counts `allowlist remove` runs (`lua/allow_remove.lua`); 0 when none ran.
    pub allow_removed: i64,
    /// The draw at the opening, if the event has one (docs/design.md#the-draw-at-the-opening).
    pub draw: Option<DrawView>,
}

/// The draw as last read: enough for the request path to know whether to enter it, and for the
/// availability answer to publish the commitment (and the secret, once done).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrawView {
    pub decides_at_ms: i64,
    pub commitment: String,
    pub done: bool,
    /// Only once the draw is done.
    pub secret: Option<String>,
}

/// Where the sale window stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    NotOpen,
    Open,
    Closed,
}

impl Window {
    pub fn as_str(self) -> &'static str {
        match self {
            Window::NotOpen => "not_open",
            Window::Open => "open",
            Window::Closed => "closed",
        }
    }
}

impl EventView {
    /// The seat a candidate is shown for an event-wide seat number: its place in the level's
    /// block with per-level numbering (docs/design.md#seat-numbering).
    pub fn seat(&self, level: &str, slot: i64) -> i64 {
        seat_in_level(&self.seat_bases, level, slot)
    }

    /// The seats a level's candidate may be shown: its cap with per-level numbering.
    pub fn seats_of(&self, level: &str) -> i64 {
        match LevelName::parse(level) {
            Some(l) if self.seat_bases.contains_key(&l) => self.levels.get(&l).copied().unwrap_or(self.total_seats),
            _ => self.total_seats,
        }
    }

    pub fn window(&self, now_ms: i64) -> Window {
        if self.closed || self.closes_at_ms.is_some_and(|c| now_ms >= c) {
            Window::Closed
        } else if self.opens_at_ms.is_some_and(|o| now_ms < o) {
            Window::NotOpen
        } else {
            Window::Open
        }
    }
}

/// The ids `open` loaded, as last read, and when.
struct LoadedIds {
    ids: Arc<HashSet<String>>,
    read_at: Option<Instant>,
}

/// Cached event views.
pub struct Catalog {
    link: Arc<RedisLink>,
    cache: RwLock<HashMap<EventId, Cached>>,
    /// Held while the set is re-read, so concurrent callers share one read.
    loaded: Mutex<LoadedIds>,
}

/// An event as last read (None: never opened), and when it was read.
type Cached = (Option<Arc<EventView>>, Instant);

impl Catalog {
    pub fn new(link: Arc<RedisLink>) -> Self {
        Self {
            link,
            cache: RwLock::new(HashMap::new()),
            loaded: Mutex::new(LoadedIds { ids: Arc::new(HashSet::new()), read_at: None }),
        }
    }

    /// The event as `open` loaded it, or None if it was never opened.
    pub async fn get(&self, id: &EventId) -> RedisResult<Option<Arc<EventView>>> {
        if let Some((view, at)) = self.cache.read().await.get(id) {
            if at.elapsed() < CATALOG_TTL {
                return Ok(view.clone());
            }
        }
        let view =
            if self.loaded_ids().await?.contains(id.as_str()) { self.fetch(id).await?.map(Arc::new) } else { None };
        let mut cache = self.cache.write().await;
        let known = cache.get(id).is_some_and(|(v, _)| v.is_some());
        if view.is_none() && known {
            // Nothing removes an opened event from Redis, so a known event gone missing means this
            // connection reaches a node without the sale's data (a replica still syncing, a
            // wrongly promoted node): a retry can succeed, a 404 would be a false final answer.
            tracing::warn!(event = %id, "an opened event is missing from this Redis node; reconnecting");
            let err = redis::RedisError::from((redis::ErrorKind::Io, "event missing from this Redis node"));
            self.link.report(&err).await;
            return Err(err);
        }
        if view.is_some() {
            if cache.len() >= CATALOG_EVENTS_MAX && !cache.contains_key(id) {
                cache.retain(|_, (_, at)| at.elapsed() < CATALOG_TTL);
            }
            if cache.len() < CATALOG_EVENTS_MAX || cache.contains_key(id) {
                cache.insert(id.clone(), (view.clone(), Instant::now()));
            }
        }
        Ok(view)
    }

    /// How many event views are cached (for the memory test and the benchmark).
    pub async fn cached_views(&self) -> usize {
        self.cache.read().await.len()
    }

    /// True when `open` has switched the event into place on the primary: its meta key exists.
    /// Read fresh, never from the cache. A release whose script found no record while this is
    /// false must stay unsynced: a rebuilding `open` may still install that record.
    pub async fn loaded_in_redis(&self, id: &EventId) -> RedisResult<bool> {
        let mut conn = self.link.shared().await?;
        let exists = is_loaded(&mut conn, &EventKeys::new(id)).await;
        if let Err(e) = &exists {
            self.link.report(e).await;
        }
        exists
    }

    /// The set of loaded event ids, re-read at most once per [`CATALOG_TTL`] for all callers.
    async fn loaded_ids(&self) -> RedisResult<Arc<HashSet<String>>> {
        let mut loaded = self.loaded.lock().await;
        if loaded.read_at.is_some_and(|at| at.elapsed() < CATALOG_TTL) {
            return Ok(loaded.ids.clone());
        }
        let mut conn = self.link.shared().await?;
        let ids: HashSet<String> = match redis::cmd("SMEMBERS").arg(EVENTS_KEY).query_async(&mut conn).await {
            Ok(ids) => ids,
            Err(err) => {
                self.link.report(&err).await;
                return Err(err);
            }
        };
        loaded.ids = Arc::new(ids);
        loaded.read_at = Some(Instant::now());
        Ok(loaded.ids.clone())
    }

    async fn fetch(&self, id: &EventId) -> RedisResult<Option<EventView>> {
        let keys = EventKeys::new(id);
        let mut conn = self.link.shared().await?;
        let result: RedisResult<(Meta, HashMap<String, i64>, DrawFields)> = redis::pipe()
            .hgetall(&keys.meta)
            .hgetall(&keys.cap)
            .cmd("HMGET")
            .arg(&keys.draw)
            .arg(&["decides_at_ms", "commitment", "state", "secret"])
            .query_async(&mut conn)
            .await;
        let (meta, caps, draw) = match result {
            Ok(found) => found,
            Err(err) => {
                self.link.report(&err).await;
                return Err(err);
            }
        };
        Ok(view_from(id, keys, &meta, caps).map(|view| EventView { draw: draw_from(draw), ..view }))
    }
}

/// True when `open` has switched the event into place on the server `conn` reaches (its meta key
/// exists). A release script that found no record while this was false must not mark its row
/// synced: a rebuilding `open` may still install that record. Asked before the script runs, on
/// its connection: the switch is atomic, so an event loaded then has its records in place.
pub async fn is_loaded(conn: &mut crate::redis_io::conn::RedisConn, keys: &EventKeys) -> RedisResult<bool> {
    redis::cmd("EXISTS").arg(&keys.meta).query_async(conn).await
}

type Meta = HashMap<String, String>;

/// `{ev:ID}:draw`'s decides_at_ms, commitment, state, secret.
type DrawFields = (Option<i64>, Option<String>, Option<String>, Option<String>);

fn draw_from((decides_at_ms, commitment, state, secret): DrawFields) -> Option<DrawView> {
    let done = state.as_deref() == Some("done");
    Some(DrawView { decides_at_ms: decides_at_ms?, commitment: commitment?, done, secret: secret.filter(|_| done) })
}

fn view_from(
    id: &EventId,
    keys: EventKeys,
    meta: &HashMap<String, String>,
    caps: HashMap<String, i64>,
) -> Option<EventView> {
    let int = |name: &str| meta.get(name).and_then(|v| v.parse::<i64>().ok());
    Some(EventView {
        id: id.clone(),
        keys: Arc::new(keys),
        total_seats: int("total_seats")?,
        hold_seconds: int("hold_seconds")?,
        opens_at_ms: int("opens_at_ms"),
        closes_at_ms: int("closes_at_ms"),
        closed: meta.get("state").is_some_and(|s| s == "closed"),
        levels: caps.into_iter().filter_map(|(name, cap)| Some((LevelName::parse(&name)?, cap))).collect(),
        seat_bases: bases_from_meta(meta),
        sessions: Arc::new(sessions_from(meta.get("sessions"))),
        restricted: meta.get("restricted").is_some_and(|r| r == "1"),
        allow_version: meta.get("allow_version").cloned(),
        draw: None,
        allow_removed: int("allow_removed").unwrap_or(0),
    })
}

/// The `sessions` meta field `open` wrote; display only, so a field that does not parse shows
/// nothing rather than refusing the event.
fn sessions_from(json: Option<&String>) -> BTreeMap<LevelName, Session> {
    let parsed: BTreeMap<String, Session> = json.and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default();
    parsed.into_iter().filter_map(|(name, s)| Some((LevelName::parse(&name)?, s))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(opens: Option<i64>, closes: Option<i64>, closed: bool) -> EventView {
        let id = EventId::parse("e").unwrap();
        EventView {
            keys: Arc::new(EventKeys::new(&id)),
            id,
            total_seats: 1,
            hold_seconds: 1,
            opens_at_ms: opens,
            closes_at_ms: closes,
            closed,
            levels: BTreeMap::new(),
            seat_bases: BTreeMap::new(),
            sessions: Arc::default(),
            restricted: false,
            allow_version: None,
            draw: None,
            allow_removed: 0,
        }
    }

    #[test]
    fn the_window_opens_at_opens_at_and_closes_at_closes_at() {
        let v = view(Some(100), Some(200), false);
        assert_eq!(v.window(99), Window::NotOpen);
        assert_eq!(v.window(100), Window::Open);
        assert_eq!(v.window(199), Window::Open);
        assert_eq!(v.window(200), Window::Closed);
        assert_eq!(view(None, None, false).window(0), Window::Open);
        assert_eq!(view(None, None, true).window(0), Window::Closed);
    }
}
