//! How seatrush reaches the Redis primary: a plain `redis://` URL, or Sentinel
//! (`redis+sentinel://h1:26379,h2:26379/master-name`), in which case every new connection asks the
//! Sentinels who the primary is now. Connections that fail, or that land on a demoted primary,
//! are dropped so the next call reconnects and follows a failover.
//!
//! TLS: `rediss://host:port`, and `rediss+sentinel://h1:26379,h2:26379/master-name` for TLS to the
//! Sentinels and to the primary they name. The servers' certificates are checked against the CA
//! file given ([`RedisLink::open`], `--redis-ca-file`), else against the system's roots; the
//! redis crate (rustls) does the TLS. A URL is only ever printed with its password masked.

use crate::domain::url::redacted;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind, TlsCertificates,
    TlsMode,
};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::Mutex;

/// Bound on a single command on the shared connection, so a dead primary turns into a 503
/// instead of a hung request.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The URL, its password masked.
    #[error(
        "redis URL {0:?} must be redis://host:port, rediss://host:port (TLS), \
         redis+sentinel://host:port,host:port/master-name or rediss+sentinel://host:port,host:port/master-name (TLS)"
    )]
    Url(String),
    #[error("--redis-ca-file is set but the redis URL {0:?} is not TLS: use rediss:// (or rediss+sentinel://)")]
    CaWithoutTls(String),
    #[error("cannot read the Redis CA file {path:?}: {source}")]
    CaFile { path: PathBuf, source: std::io::Error },
    #[error("the Redis CA file {path:?} holds no usable PEM certificate: {source}")]
    CaParse { path: PathBuf, source: RedisError },
    /// `url` with its password masked; `hint` says what to try when the cause is likely. The
    /// cause is part of the message (not a `source`), so a printed chain says it once.
    #[error("cannot reach Redis at {url}: {cause}{hint}")]
    Connect { url: String, cause: RedisError, hint: &'static str },
}

/// Shown after a failed plain connection: a TLS-only server closes the connection on the first
/// plaintext byte, so this is what a forgotten `rediss://` looks like.
const HINT_PLAIN: &str = ". If the server accepts only TLS connections (port 0, tls-port set), \
     use a rediss:// URL (rediss+sentinel:// for Sentinel) and --redis-ca-file with the CA that signed its certificate";
const HINT_CERTIFICATE: &str = ". The server's certificate was not accepted: \
     --redis-ca-file must name the CA (PEM) that signed it, and the certificate must name the host of the URL";

enum Target {
    Direct(Client),
    Sentinel(Mutex<SentinelClient>),
}

/// The way to the current Redis primary, with one shared multiplexed connection for short
/// commands. Long-blocking work (WAIT) gets connections of its own from [`RedisLink::connect`].
pub struct RedisLink {
    /// The URL as it may be printed: password masked.
    url: String,
    tls: bool,
    target: Target,
    shared: Mutex<Option<MultiplexedConnection>>,
}

impl RedisLink {
    /// Parses the URL; connects lazily. TLS URLs check the servers against the system's roots.
    pub fn new(url: &str) -> Result<Self, LinkError> {
        Self::open(url, None)
    }

    /// Parses the URL, with the CA file (PEM) that signed the servers' certificates for a TLS URL
    /// (`--redis-ca-file`); connects lazily.
    pub fn open(url: &str, ca_file: Option<&Path>) -> Result<Self, LinkError> {
        let shown = redacted(url);
        let bad = || LinkError::Url(shown.clone());
        let tls = url.starts_with("rediss://") || url.starts_with("rediss+sentinel://");
        let certificates = match ca_file {
            None => None,
            Some(_) if !tls => return Err(LinkError::CaWithoutTls(shown)),
            Some(path) => Some(read_ca(path)?),
        };
        let target = if let Some((scheme, rest)) = url
            .strip_prefix("redis+sentinel://")
            .map(|r| ("redis", r))
            .or(url.strip_prefix("rediss+sentinel://").map(|r| ("rediss", r)))
        {
            let (hosts, master) = rest.split_once('/').ok_or_else(bad)?;
            let master = master.trim_end_matches('/');
            if hosts.is_empty() || master.is_empty() {
                return Err(bad());
            }
            let sentinels: Vec<String> = hosts.split(',').map(|h| format!("{scheme}://{h}")).collect();
            let client = if tls {
                tls_sentinel(sentinels, master, certificates).map_err(|_| bad())?
            } else {
                SentinelClient::build(sentinels, master, None, SentinelServerType::Master).map_err(|_| bad())?
            };
            Target::Sentinel(Mutex::new(client))
        } else if tls {
            let client = match certificates {
                Some(certificates) => Client::build_with_tls(url, certificates),
                None => Client::open(url),
            };
            Target::Direct(client.map_err(|_| bad())?)
        } else if url.starts_with("redis://") || url.starts_with("unix://") {
            Target::Direct(Client::open(url).map_err(|_| bad())?)
        } else {
            return Err(bad());
        };
        Ok(Self { url: shown, tls, target, shared: Mutex::new(None) })
    }

    /// The URL, its password masked.
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

    fn connect_error(&self, cause: RedisError) -> LinkError {
        let hint = if !self.tls && (cause.is_io_error() || cause.is_connection_dropped()) {
            HINT_PLAIN
        } else if self.tls && cause.to_string().contains("certificate") {
            HINT_CERTIFICATE
        } else {
            ""
        };
        LinkError::Connect { url: self.url.clone(), cause, hint }
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

/// The CA file as the redis crate takes it. Parsed here once, so a file that is not PEM fails at
/// start-up and not at the first connection.
fn read_ca(path: &Path) -> Result<TlsCertificates, LinkError> {
    let pem = std::fs::read(path).map_err(|source| LinkError::CaFile { path: path.to_owned(), source })?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        let source = RedisError::from((redis::ErrorKind::InvalidClientConfig, "no BEGIN CERTIFICATE block"));
        return Err(LinkError::CaParse { path: path.to_owned(), source });
    }
    let certificates = TlsCertificates { client_tls: None, root_cert: Some(pem) };
    // A throwaway client, only to have the crate parse the PEM.
    Client::build_with_tls("rediss://localhost", certificates.clone())
        .map_err(|source| LinkError::CaParse { path: path.to_owned(), source })?;
    Ok(certificates)
}

/// A Sentinel client that speaks TLS to the Sentinels and to the nodes they name, both checked
/// against `certificates` when given. A user and password on a Sentinel's host are the
/// Sentinels' (`requirepass` in sentinel.conf), as with `redis+sentinel://`.
fn tls_sentinel(
    sentinels: Vec<String>,
    master: &str,
    certificates: Option<TlsCertificates>,
) -> RedisResult<SentinelClient> {
    let mut addrs = Vec::with_capacity(sentinels.len());
    let mut auth = None;
    for sentinel in sentinels {
        let info = sentinel.into_connection_info()?;
        let settings = info.redis_settings();
        if settings.password().is_some() || settings.username().is_some() {
            auth = Some((settings.username().map(str::to_owned), settings.password().map(str::to_owned)));
        }
        addrs.push(info.addr().clone());
    }
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)?
        .set_client_to_redis_tls_mode(TlsMode::Secure);
    if let Some((username, password)) = auth {
        if let Some(username) = username {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_sentinel_password(password);
        }
    }
    if let Some(certificates) = certificates {
        builder = builder
            .set_client_to_sentinel_certificates(certificates.clone())
            .set_client_to_redis_certificates(certificates);
    }
    builder.build()
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
        assert!(RedisLink::new("rediss://127.0.0.1:6380").is_ok());
        assert!(RedisLink::new("rediss+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster").is_ok());
        assert!(RedisLink::new("rediss+sentinel://127.0.0.1:26379").is_err());
    }

    #[test]
    fn a_bad_url_is_shown_without_its_password() {
        let err = RedisLink::new("rediss+sentinel://:s3cret@127.0.0.1:26379").err().unwrap();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let err = RedisLink::new("http://:s3cret@127.0.0.1:6379").err().unwrap();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn a_ca_file_with_a_plain_url_is_refused() {
        let err = RedisLink::open("redis://127.0.0.1:6379", Some(Path::new("/nonexistent/ca.pem"))).err().unwrap();
        assert!(err.to_string().contains("rediss://"), "{err}");
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let err = RedisLink::open("rediss://127.0.0.1:6380", Some(Path::new("/nonexistent/ca.pem"))).err().unwrap();
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }
}
