//! How seatrush reaches the Redis primary: a plain `redis://` URL, or Sentinel
//! (`redis+sentinel://h1:26379,h2:26379/master-name`), in which case every new connection asks the
//! Sentinels who the primary is now. Connections that fail, or that land on a demoted primary,
//! are dropped so the next call reconnects and follows a failover.

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult, ServerErrorKind};
use std::time::Duration;
use tokio::sync::Mutex;

/// Bound on a single command on the shared connection, so a dead primary turns into a 503
/// instead of a hung request.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("redis URL {0:?} must be redis://host:port or redis+sentinel://host:port,host:port/master-name")]
    Url(String),
    #[error("cannot reach Redis at {url}: {source}")]
    Connect { url: String, source: RedisError },
}

enum Target {
    Direct(Client),
    Sentinel(Mutex<SentinelClient>),
}

/// The way to the current Redis primary, with one shared multiplexed connection for short
/// commands. Long-blocking work (WAIT) gets connections of its own from [`RedisLink::connect`].
pub struct RedisLink {
    url: String,
    target: Target,
    shared: Mutex<Option<MultiplexedConnection>>,
}

impl RedisLink {
    /// Parses the URL; connects lazily.
    pub fn new(url: &str) -> Result<Self, LinkError> {
        let bad = || LinkError::Url(url.to_owned());
        let target = if let Some(rest) = url.strip_prefix("redis+sentinel://") {
            let (hosts, master) = rest.split_once('/').ok_or_else(bad)?;
            let master = master.trim_end_matches('/');
            if hosts.is_empty() || master.is_empty() {
                return Err(bad());
            }
            let sentinels: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
            let client = SentinelClient::build(sentinels, master.to_owned(), None, SentinelServerType::Master)
                .map_err(|_| bad())?;
            Target::Sentinel(Mutex::new(client))
        } else if url.starts_with("redis://") || url.starts_with("unix://") {
            Target::Direct(Client::open(url).map_err(|_| bad())?)
        } else {
            return Err(bad());
        };
        Ok(Self { url: url.to_owned(), target, shared: Mutex::new(None) })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A new connection to the current primary. `response_timeout` bounds each command on it.
    pub async fn connect(&self, response_timeout: Duration) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(response_timeout));
        let client = match &self.target {
            Target::Direct(client) => client.clone(),
            Target::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
        };
        client.get_multiplexed_async_connection_with_config(&config).await
    }

    /// Connects once and checks the server answers, for commands that should fail fast with a
    /// clear message when Redis is unreachable.
    pub async fn check(&self) -> Result<MultiplexedConnection, LinkError> {
        let mut conn = self.connect(RESPONSE_TIMEOUT).await.map_err(|source| self.connect_error(source))?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.map_err(|source| self.connect_error(source))?;
        Ok(conn)
    }

    fn connect_error(&self, source: RedisError) -> LinkError {
        LinkError::Connect { url: self.url.clone(), source }
    }

    /// The shared connection for short commands (gates, mark-persisted, the reaper).
    pub async fn shared(&self) -> RedisResult<MultiplexedConnection> {
        let mut shared = self.shared.lock().await;
        if let Some(conn) = shared.as_ref() {
            return Ok(conn.clone());
        }
        let conn = self.connect(RESPONSE_TIMEOUT).await?;
        *shared = Some(conn.clone());
        Ok(conn)
    }

    /// Called with every Redis error from the shared connection: drops it when the error means
    /// the link is broken or points at a server that is no longer the primary.
    pub async fn report(&self, err: &RedisError) {
        if needs_reconnect(err) {
            *self.shared.lock().await = None;
        }
    }
}

/// True for errors that a fresh connection (perhaps to a new primary) could cure.
pub fn needs_reconnect(err: &RedisError) -> bool {
    use redis::ErrorKind;
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown | ServerErrorKind::BusyLoading)
        )
}

/// True for `NOREPLICAS`: the primary refuses writes because too few replicas are connected
/// (`min-replicas-to-write`); it may be cut off and about to be replaced.
pub fn is_no_replicas(err: &RedisError) -> bool {
    err.code() == Some("NOREPLICAS")
}

/// Reads one `CONFIG GET` value from the primary.
pub async fn config_get(conn: &mut MultiplexedConnection, name: &str) -> RedisResult<Option<String>> {
    let pairs: Vec<String> = redis::cmd("CONFIG").arg("GET").arg(name).query_async(conn).await?;
    Ok(pairs.get(1).cloned())
}

#[derive(Debug, thiserror::Error)]
#[error(
    "Redis maxmemory-policy is {0:?}; seatrush needs noeviction, or Redis may evict admission records and sell a seat twice. \
     Fix: redis-cli CONFIG SET maxmemory-policy noeviction (and set it in redis.conf)"
)]
pub struct EvictionPolicyError(pub String);

/// Refuses a primary that may evict keys.
pub async fn require_noeviction(conn: &mut MultiplexedConnection) -> anyhow::Result<()> {
    let policy = config_get(conn, "maxmemory-policy").await?.unwrap_or_default();
    if policy != "noeviction" {
        return Err(EvictionPolicyError(policy).into());
    }
    Ok(())
}

/// A warning when the primary keeps neither an append-only file nor RDB snapshots. Such a
/// primary that restarts before Sentinel marks it down comes back empty, and its replicas resync
/// from it and are wiped too: the sale's Redis side is gone (the database still holds every held
/// and paid booking, and `open` rebuilds Redis from it).
pub async fn persistence_warning(conn: &mut MultiplexedConnection) -> RedisResult<Option<String>> {
    let appendonly = config_get(conn, "appendonly").await?.unwrap_or_default();
    let save = config_get(conn, "save").await?.unwrap_or_default();
    if appendonly == "yes" || !save.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(
        "the Redis primary runs with neither AOF (appendonly no) nor RDB snapshots (save \"\"): if it restarts before Sentinel \
         marks it down, it comes back empty and its replicas resync from it and are wiped too. \
         Fix: redis-cli CONFIG SET appendonly yes (and in redis.conf); or keep a crashed primary down longer than Sentinel's \
         down-after-milliseconds. After a wipe, `seatrush open --event ID` rebuilds every held and paid seat from the database."
            .to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_before_any_connection() {
        assert!(RedisLink::new("redis://127.0.0.1:6379").is_ok());
        assert!(RedisLink::new("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster").is_ok());
        assert!(RedisLink::new("redis+sentinel://127.0.0.1:26379").is_err());
        assert!(RedisLink::new("redis+sentinel:///mymaster").is_err());
        assert!(RedisLink::new("http://127.0.0.1:6379").is_err());
    }
}
