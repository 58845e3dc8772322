//! `allowlist remove`: takes codes off an event's allowlist, also while the sale runs. Under the
//! event's operator lock (so an `open` cannot stage the old allowlist around it), the database
//! loses them first, then Redis (`lua/allow_remove.lua`): every `serve` refuses them from its
//! catalog's next read of the event's meta (within 250 ms), its in-memory copy included
//! (`sale/allowlist.rs`). A code that holds a seat keeps it: admission records, booking rows and
//! a same-nonce retry are untouched; `cancel` frees the seat. Each code is audited by its hash.

use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::EventKeys;
use crate::redis_io::oplock::OperatorLock;
use crate::redis_io::scripts::{self, Script};
use crate::store::{AuditEntry, Store};
use anyhow::{bail, Context};

/// What one removal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Removed {
    /// Codes the database's allowlist held.
    pub in_database: u64,
    /// Codes the live Redis set held; None when the event is not loaded in Redis.
    pub in_redis: Option<i64>,
}

/// Hashes per script call: keeps one call short while the sale runs.
const REMOVE_BATCH_MAX: usize = 1_000;

/// Removes `hashes` from the event's allowlist in the database and in Redis; `client` names who
/// asked, for the audit trail.
pub async fn remove_codes(
    conn: &mut RedisConn,
    store: &Store,
    event: &EventId,
    hashes: &[CodeHash],
    client: &str,
) -> anyhow::Result<Removed> {
    let lock = OperatorLock::acquire(conn, event, "allowlist remove").await?;
    let removed = remove_locked(conn, store, event, hashes, &lock).await;
    if let Err(e) = lock.release().await {
        tracing::warn!(event = %event, error = %e, "cannot free the operator lock; it expires by itself");
    }
    let outcome = if removed.is_ok() { "done" } else { "failed" };
    for hash in hashes {
        if let Err(e) = store.audit(&AuditEntry::new(event, "allowlist_remove", hash, client, outcome)).await {
            tracing::warn!(event = %event, error = %e, "cannot write the audit trail of an allowlist removal");
        }
    }
    removed
}

async fn remove_locked(
    conn: &mut RedisConn,
    store: &Store,
    event: &EventId,
    hashes: &[CodeHash],
    lock: &OperatorLock,
) -> anyhow::Result<Removed> {
    let in_database = store.remove_from_allowlist(event, hashes).await?;
    let keys = EventKeys::new(event);
    let script = Script::new(include_str!("../../lua/allow_remove.lua"));
    let keys = [keys.meta.as_str(), keys.allow.as_str(), keys.allow_removed.as_str(), keys.lock.as_str()];
    let mut in_redis = Some(0);
    for batch in hashes.chunks(REMOVE_BATCH_MAX) {
        let args: Vec<&str> = std::iter::once(lock.owner()).chain(batch.iter().map(CodeHash::as_str)).collect();
        let answer: i64 = scripts::run_as(conn, &script, &script.call(&keys, &args))
            .await
            .context("removing the codes from Redis (the database has lost them already; run the command again)")?;
        match answer {
            -1 => in_redis = None,
            -2 => bail!("the operator lock of {event} expired during the removal; run it again"),
            n => in_redis = in_redis.map(|sum| sum + n),
        }
    }
    Ok(Removed { in_database, in_redis })
}
