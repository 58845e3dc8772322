//! The Redis side of one event at one moment, read in one pipeline: what `status`, `reconcile`
//! and the invariant checks compare against the database.

use crate::redis_io::keys::EventKeys;
use redis::aio::MultiplexedConnection;
use std::collections::HashMap;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisSide {
    /// level -> seats counted as taken
    pub taken: HashMap<String, i64>,
    /// free seat numbers, lowest first
    pub free: Vec<i64>,
    /// code hash -> admission record
    pub records: HashMap<String, String>,
    /// code hashes of admissions not yet in the database
    pub pending: Vec<String>,
}

impl RedisSide {
    pub async fn read(conn: &mut MultiplexedConnection, keys: &EventKeys) -> redis::RedisResult<Self> {
        let (taken, free, records, pending) = redis::pipe()
            .hgetall(&keys.taken)
            .zrange(&keys.free, 0, -1)
            .hgetall(&keys.adm)
            .zrange(&keys.pending, 0, -1)
            .query_async(conn)
            .await?;
        Ok(Self { taken, free, records, pending })
    }
}
