//! The Redis side of one event at one moment, read in one pipeline: what `status`, `reconcile`
//! and the invariant checks compare against the database.

use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::EventKeys;
use std::collections::HashMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisSide {
    /// level -> seats counted as taken
    pub taken: HashMap<String, i64>,
    /// free seat numbers, lowest first
    pub free: Vec<i64>,
    /// code hash -> admission record
    pub records: HashMap<String, String>,
    /// admissions not yet in the database, as their entries are named: "code-hash admission-id"
    /// (`keys::pending_member`)
    pub pending: Vec<String>,
    /// code hash -> a move in flight (move.lua's marker, until move_settle.lua)
    pub moves: HashMap<String, String>,
}

/// A move in flight as its marker names it: the booking holds both seats, counted in both
/// levels, until move_settle.lua frees one (docs/design.md#moving-a-booking).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveInFlight {
    pub admission: String,
    pub old_slot: i64,
    pub old_level: String,
    pub new_slot: i64,
    pub new_level: String,
}

impl MoveInFlight {
    /// The marker's text: "id nonce admission old-slot old-level new-slot new-level".
    pub fn parse(marker: &str) -> Option<Self> {
        let parts: Vec<&str> = marker.split(' ').collect();
        let [_id, _nonce, admission, old_slot, old_level, new_slot, new_level] = parts[..] else { return None };
        Some(Self {
            admission: admission.to_owned(),
            old_slot: old_slot.parse().ok()?,
            old_level: old_level.to_owned(),
            new_slot: new_slot.parse().ok()?,
            new_level: new_level.to_owned(),
        })
    }
}

impl RedisSide {
    pub async fn read(conn: &mut RedisConn, keys: &EventKeys) -> redis::RedisResult<Self> {
        let (taken, free, records, pending, moves) = redis::pipe()
            .hgetall(&keys.taken)
            .zrange(&keys.free, 0, -1)
            .hgetall(&keys.adm)
            .zrange(&keys.pending, 0, -1)
            .hgetall(&keys.moves)
            .query_async(conn)
            .await?;
        Ok(Self { taken, free, records, pending, moves })
    }
}
