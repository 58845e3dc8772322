//! The per-event operator lock. `event apply`, `open`, `close` and `reconcile --repair` each
//! change an event in several steps; two of them interleaved on one event corrupt it (a re-open's
//! staging wiped by another, a switch landing after `close`). Each takes this lock first: a
//! Redis key with the owner's name and an expiry, renewed while the command runs. A second
//! command is refused with a message that names the holder; a holder that died frees the lock
//! when it expires. The lock is a courtesy between operators, not the last guard: `open`'s switch
//! and `close` are also conditional on the state they read (see `ops/loader.rs`).

use crate::domain::event::EventId;
use crate::redis_io::conn::{RedisConn, OPERATOR_RESEND_PAUSES};
use crate::redis_io::keys::EventKeys;
use crate::redis_io::scripts::{self, Script};
use std::time::Duration;

/// How long a lock outlives a holder that stopped renewing it (crashed, or cut off from Redis).
pub const LOCK_TTL: Duration = Duration::from_secs(30);
/// Renewals per [`LOCK_TTL`], so one or two lost renewals do not lose the lock.
const RENEWALS_PER_TTL: u32 = 3;

static RENEW: std::sync::LazyLock<Script> =
    std::sync::LazyLock::new(|| Script::new(include_str!("../../lua/lock_renew.lua")));

/// Renews the lock for `ttl_ms` (0 frees it) if `owner` still holds it: 1 if it did. Sent again
/// after a reply that ran nothing, for as long as a cluster's failover lasts
/// ([`OPERATOR_RESEND_PAUSES`]): a release lost to a `MOVED` would hold the lock for the rest of
/// [`LOCK_TTL`] and refuse the next operator command.
async fn renew_once(conn: &RedisConn, key: &str, owner: &str, ttl_ms: u64) -> redis::RedisResult<i64> {
    let call = &RENEW.call(&[key], &[owner, &ttl_ms.to_string()]);
    conn.resending_with(
        &OPERATOR_RESEND_PAUSES,
        |mut conn| async move { scripts::run_as(&mut conn, &RENEW, call).await },
    )
    .await
}

/// `SET key owner NX PX ttl`: the owner's name when taken, none when another holds the lock.
async fn take(conn: &RedisConn, key: &str, owner: &str) -> redis::RedisResult<Option<String>> {
    let mut set = redis::cmd("SET");
    set.arg(key).arg(owner).arg("NX").arg("PX").arg(LOCK_TTL.as_millis() as u64);
    let set = &set;
    conn.resending_with(&OPERATOR_RESEND_PAUSES, |mut conn| async move { set.query_async(&mut conn).await }).await
}

/// Who holds the lock and for how much longer, for the refusal.
async fn holder(conn: &RedisConn, key: &str) -> redis::RedisResult<(Option<String>, i64)> {
    let mut read = redis::pipe();
    read.get(key).pttl(key);
    let read = &read;
    conn.resending_with(&OPERATOR_RESEND_PAUSES, |mut conn| async move { read.query_async(&mut conn).await }).await
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "event {event} is locked by another operator command: {holder} (expires in {expires_in_ms} ms unless renewed). \
         Wait for it to finish; if that process is gone, the lock frees itself when it expires"
    )]
    Held { event: String, holder: String, expires_in_ms: i64 },
    #[error("cannot take the operator lock of event {event}: {source}")]
    Redis { event: String, source: redis::RedisError },
}

/// A held lock. [`OperatorLock::release`] frees it; dropped without release, it stops renewing
/// and expires after [`LOCK_TTL`].
pub struct OperatorLock {
    conn: RedisConn,
    key: String,
    owner: String,
    renewer: tokio::task::JoinHandle<()>,
}

impl OperatorLock {
    /// Takes the lock of `event` for `command` (a few words naming it, e.g. "open"), or says who holds it.
    pub async fn acquire(conn: &RedisConn, event: &EventId, command: &str) -> Result<Self, LockError> {
        let conn = conn.clone();
        let key = EventKeys::new(event).lock;
        let owner = owner_name(command);
        let redis_err = |source| LockError::Redis { event: event.to_string(), source };
        let taken = take(&conn, &key, &owner).await.map_err(redis_err)?;
        if taken.is_none() {
            let (holder, expires_in_ms) = holder(&conn, &key).await.map_err(redis_err)?;
            return Err(LockError::Held {
                event: event.to_string(),
                holder: holder.unwrap_or_else(|| "a command that just finished (try again)".into()),
                expires_in_ms,
            });
        }
        let renewer = tokio::spawn(renew(conn.clone(), key.clone(), owner.clone()));
        Ok(Self { conn, key, owner, renewer })
    }

    /// The value the lock key holds while this lock is held; scripts that must only run under
    /// the lock compare it.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Frees the lock if it is still ours.
    pub async fn release(self) -> redis::RedisResult<()> {
        self.renewer.abort();
        renew_once(&self.conn, &self.key, &self.owner, 0).await?;
        Ok(())
    }
}

impl Drop for OperatorLock {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

async fn renew(conn: RedisConn, key: String, owner: String) {
    let mut tick = tokio::time::interval(LOCK_TTL / RENEWALS_PER_TTL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let renewed = renew_once(&conn, &key, &owner, LOCK_TTL.as_millis() as u64).await;
        match renewed {
            Ok(1) => {}
            Ok(_) => {
                tracing::warn!(lock = %key, "operator lock lost: it expired and another command may hold it");
                return;
            }
            Err(e) => tracing::warn!(lock = %key, error = %e, "cannot renew the operator lock; retrying"),
        }
    }
}

/// "open by alice@host pid 4242 at 2026-11-30T01:02:03Z run 1a2b3c4d": enough for an operator
/// to find the other command; unique per run, so only this run's scripts match it.
fn owner_name(command: &str) -> String {
    let at = crate::domain::event::rfc3339_ms(crate::domain::event::now_ms());
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    format!("{command} by {} pid {} at {at} run {run}", operator_name(), std::process::id())
}

/// "alice@host": who runs this operator command, for the lock and the audit trail.
pub(crate) fn operator_name() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into());
    let host =
        std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "unknown-host".into());
    format!("{user}@{host}")
}
