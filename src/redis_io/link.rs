//! How seatrush reaches the Redis primary: a plain `redis://` URL, or Sentinel
//! (`redis+sentinel://h1:26379,h2:26379/master-name`), in which case every new connection asks the
//! Sentinels who the primary is now. Connections that fail, or that land on a demoted primary,
//! are dropped so the next call reconnects and follows a failover.
//!
//! Credentials: a `redis://user:password@host` URL's are the server's. Through Sentinel,
//! `redis+sentinel://user:password@h1:26379,h2:26379/master` carries the data nodes' (the
//! `requirepass` or ACL user of the primary and replicas, which is what every command goes to),
//! and the Sentinels' own come from `SEATRUSH_SENTINEL_PASSWORD` (and `SEATRUSH_SENTINEL_USERNAME`
//! for an ACL user): two different servers, so two credentials, each said once.
//!
//! Redis Cluster: `redis+cluster://h1:p1,h2:p2` (seed nodes; `rediss+cluster://` for TLS), with the
//! nodes' `user:password@` before the first host. The `redis` crate's cluster connection finds the
//! primaries and follows the slot map; it re-sends nothing on its own (no retries), because a
//! pipeline re-sent on a new connection would carry a `WAIT` that covers none of the first
//! sending's writes (docs/design.md#many-events-on-a-redis-cluster).
//!
//! TLS: `rediss://host:port`, and `rediss+sentinel://h1:26379,h2:26379/master-name` for TLS to the
//! Sentinels and to the primary they name. The servers' certificates are checked against the CA
//! file given ([`RedisLink::open`], `--redis-ca-file`), else against the system's roots; the
//! redis crate (rustls) does the TLS. A URL is only ever printed with its password masked.

use crate::domain::url::redacted;
use crate::redis_io::conn::RedisConn;
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
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
         redis+sentinel://host:port,host:port/master-name, rediss+sentinel://host:port,host:port/master-name (TLS), \
         redis+cluster://host:port,host:port or rediss+cluster://host:port,host:port (TLS)"
    )]
    Url(String),
    #[error(
        "{SENTINEL_PASSWORD_ENV} (or {SENTINEL_USERNAME_ENV}) is set but the redis URL {0:?} is not a Sentinel URL: \
         put the server's password in the URL (redis://user:password@host:port) and unset it"
    )]
    SentinelAuthWithoutSentinel(String),
    #[error(
        "--redis-ca-file is set but the redis URL {0:?} is not TLS: use rediss:// (or rediss+sentinel://, rediss+cluster://)"
    )]
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
     use a rediss:// URL (rediss+sentinel:// for Sentinel, rediss+cluster:// for a cluster) and --redis-ca-file with the CA that signed its certificate";
/// Shown after an authentication failure through Sentinel, where two credentials are in play.
const HINT_SENTINEL_AUTH: &str = ". Through Sentinel, the user:password@ in the URL is the data nodes' (requirepass or an \
     ACL user of the primary and replicas); the Sentinels' own is SEATRUSH_SENTINEL_PASSWORD (and SEATRUSH_SENTINEL_USERNAME \
     for an ACL user), read from the environment only";
const HINT_CERTIFICATE: &str = ". The server's certificate was not accepted: \
     --redis-ca-file must name the CA (PEM) that signed it, and the certificate must name the host of the URL";

enum Target {
    Direct(Client),
    Sentinel(Mutex<SentinelClient>),
    Cluster(ClusterClient),
}

/// The way to the current Redis primary, with one shared multiplexed connection for short
/// commands. Long-blocking work (WAIT) gets connections of its own from [`RedisLink::connect`].
pub struct RedisLink {
    /// The URL as it may be printed: password masked.
    url: String,
    tls: bool,
    target: Target,
    shared: Mutex<Option<RedisConn>>,
}

impl RedisLink {
    /// Parses the URL; connects lazily. TLS URLs check the servers against the system's roots.
    pub fn new(url: &str) -> Result<Self, LinkError> {
        Self::open(url, None)
    }

    /// Parses the URL, with the CA file (PEM) that signed the servers' certificates for a TLS URL
    /// (`--redis-ca-file`), and the Sentinels' credentials from the environment
    /// ([`SentinelAuth::from_env`]); connects lazily.
    pub fn open(url: &str, ca_file: Option<&Path>) -> Result<Self, LinkError> {
        Self::open_with(url, ca_file, &SentinelAuth::from_env())
    }

    /// [`RedisLink::open`] with the Sentinels' credentials given. With a Sentinel URL, a
    /// `user:password@` in it is the data nodes' (the primary the Sentinels name); `sentinel_auth`
    /// is what the Sentinels themselves require. Set for a plain URL, it is refused.
    pub fn open_with(url: &str, ca_file: Option<&Path>, sentinel_auth: &SentinelAuth) -> Result<Self, LinkError> {
        let shown = redacted(url);
        let bad = || LinkError::Url(shown.clone());
        let tls = ["rediss://", "rediss+sentinel://", "rediss+cluster://"].iter().any(|s| url.starts_with(s));
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
            let client = sentinel_client(scheme, rest, certificates, sentinel_auth).ok_or_else(bad)?;
            Target::Sentinel(Mutex::new(client))
        } else if let Some((scheme, rest)) = url
            .strip_prefix("redis+cluster://")
            .map(|r| ("redis", r))
            .or(url.strip_prefix("rediss+cluster://").map(|r| ("rediss", r)))
        {
            Target::Cluster(cluster_client(scheme, rest, certificates).ok_or_else(bad)?)
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
        if !matches!(target, Target::Sentinel(_)) && !sentinel_auth.is_empty() {
            return Err(LinkError::SentinelAuthWithoutSentinel(shown));
        }
        Ok(Self { url: shown, tls, target, shared: Mutex::new(None) })
    }

    /// The URL, its password masked.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the URL names a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.target, Target::Cluster(_))
    }

    /// A new connection to the current primary (on a cluster, a connection of its own to each
    /// primary). `response_timeout` bounds each command on it.
    pub async fn connect(&self, response_timeout: Duration) -> RedisResult<RedisConn> {
        let client = match &self.target {
            Target::Direct(client) => client.clone(),
            Target::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
            Target::Cluster(cluster) => {
                let config =
                    ClusterConfig::new().set_connection_timeout(CONNECT_TIMEOUT).set_response_timeout(response_timeout);
                return Ok(RedisConn::Cluster(cluster.get_async_connection_with_config(config).await?));
            }
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(response_timeout));
        Ok(RedisConn::Node(client.get_multiplexed_async_connection_with_config(&config).await?))
    }

    /// Connects once and checks the server answers, for commands that should fail fast with a
    /// clear message when Redis is unreachable.
    pub async fn check(&self) -> Result<RedisConn, LinkError> {
        let mut conn = self.connect(RESPONSE_TIMEOUT).await.map_err(|source| self.connect_error(source))?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.map_err(|source| self.connect_error(source))?;
        Ok(conn)
    }

    fn connect_error(&self, cause: RedisError) -> LinkError {
        let sentinel = matches!(self.target, Target::Sentinel(_));
        let hint = if sentinel && is_auth_failure(&cause) {
            HINT_SENTINEL_AUTH
        } else if !self.tls && (cause.is_io_error() || cause.is_connection_dropped()) {
            HINT_PLAIN
        } else if self.tls && cause.to_string().contains("certificate") {
            HINT_CERTIFICATE
        } else {
            ""
        };
        LinkError::Connect { url: self.url.clone(), cause, hint }
    }

    /// The shared connection for short commands (gates, mark-persisted, the reaper).
    pub async fn shared(&self) -> RedisResult<RedisConn> {
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

/// The environment variables that hold what the Sentinels require; never flags, as argv shows
/// in `ps`.
pub const SENTINEL_PASSWORD_ENV: &str = "SEATRUSH_SENTINEL_PASSWORD";
pub const SENTINEL_USERNAME_ENV: &str = "SEATRUSH_SENTINEL_USERNAME";

/// What the Sentinels themselves require (`requirepass`, or an ACL user, in sentinel.conf). The
/// data nodes' credentials are the Sentinel URL's `user:password@`.
#[derive(Clone, Default)]
pub struct SentinelAuth {
    pub username: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

impl SentinelAuth {
    /// `SEATRUSH_SENTINEL_USERNAME` and `SEATRUSH_SENTINEL_PASSWORD`; an empty one counts as unset.
    pub fn from_env() -> Self {
        let read = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        Self { username: read(SENTINEL_USERNAME_ENV), password: read(SENTINEL_PASSWORD_ENV) }
    }

    fn is_empty(&self) -> bool {
        self.username.is_none() && self.password.is_none()
    }
}

/// A Sentinel client from the part of a `redis+sentinel://` (or `rediss+sentinel://`) URL after
/// the scheme: `[user:password@]h1:p1,h2:p2/master`. The `user:password@` (percent-encoded as in
/// any Redis URL) goes to the data nodes the Sentinels name; `sentinel_auth` to the Sentinels.
/// With TLS both are checked against `certificates` when given. None for a malformed URL.
fn sentinel_client(
    scheme: &str,
    rest: &str,
    certificates: Option<TlsCertificates>,
    sentinel_auth: &SentinelAuth,
) -> Option<SentinelClient> {
    let (authority, master) = rest.split_once('/')?;
    let master = master.trim_end_matches('/');
    let (userinfo, hosts) = seed_hosts(authority)?;
    if master.is_empty() {
        return None;
    }
    let mut addrs = Vec::new();
    for host in hosts {
        addrs.push(format!("{scheme}://{host}").into_connection_info().ok()?.addr().clone());
    }
    let mut builder = SentinelClientBuilder::new(addrs, master, SentinelServerType::Master).ok()?;
    if let Some(userinfo) = userinfo {
        // The redis crate decodes the user and password, as it does for a redis:// URL.
        let node = format!("redis://{userinfo}@localhost").into_connection_info().ok()?;
        let settings = node.redis_settings();
        if let Some(username) = settings.username() {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_redis_password(password);
        }
    }
    if let Some(username) = &sentinel_auth.username {
        builder = builder.set_client_to_sentinel_username(username);
    }
    if let Some(password) = &sentinel_auth.password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if scheme == "rediss" {
        builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
        if let Some(certificates) = certificates {
            builder = builder
                .set_client_to_sentinel_certificates(certificates.clone())
                .set_client_to_redis_certificates(certificates);
        }
    }
    builder.build().ok()
}

/// `[user:password@]h1:p1,h2:p2` of a Sentinel or cluster URL: the credentials (once, before the
/// hosts) and every host. None when a host is empty.
fn seed_hosts(authority: &str) -> Option<(Option<&str>, Vec<&str>)> {
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let hosts: Vec<&str> = hosts.split(',').collect();
    (!hosts.iter().any(|h| h.is_empty())).then_some((userinfo, hosts))
}

/// A cluster client from the part of a `redis+cluster://` (or `rediss+cluster://`) URL after the
/// scheme: `[user:password@]h1:p1,h2:p2`, the seed nodes; the credentials are every node's. None
/// for a malformed URL.
fn cluster_client(scheme: &str, rest: &str, certificates: Option<TlsCertificates>) -> Option<ClusterClient> {
    let authority = rest.trim_end_matches('/');
    if authority.contains('/') {
        return None;
    }
    let (userinfo, hosts) = seed_hosts(authority)?;
    let mut nodes = Vec::new();
    for host in hosts {
        let node = match userinfo {
            Some(userinfo) => format!("{scheme}://{userinfo}@{host}"),
            None => format!("{scheme}://{host}"),
        };
        nodes.push(node.into_connection_info().ok()?);
    }
    // No retries: the crate would re-send a whole pipeline after a lost connection, and the
    // committer's WAIT inside it would then cover none of the first sending's writes. A MOVED,
    // ASK or TRYAGAIN comes back to the caller, which sends again once the slot map is rebuilt.
    let mut builder = ClusterClientBuilder::new(nodes).retries(0);
    if scheme == "rediss" {
        builder = builder.tls(TlsMode::Secure);
        if let Some(certificates) = certificates {
            builder = builder.certs(certificates);
        }
    }
    builder.build().ok()
}

/// True when the server refused the credentials, or wanted some and got none.
fn is_auth_failure(err: &RedisError) -> bool {
    let text = err.to_string();
    err.kind() == redis::ErrorKind::AuthenticationFailed
        || ["WRONGPASS", "NOAUTH", "NoAuth", "WrongPass", "invalid password", "Authentication", "authentication"]
            .iter()
            .any(|s| text.contains(s))
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
        assert!(RedisLink::new("redis+cluster://127.0.0.1:7000,127.0.0.1:7001").is_ok_and(|l| l.is_cluster()));
        assert!(RedisLink::new("rediss+cluster://:pw@127.0.0.1:7000").is_ok());
        assert!(RedisLink::new("redis+cluster://127.0.0.1:7000,").is_err(), "an empty host");
        assert!(RedisLink::new("redis+cluster://127.0.0.1:7000/mymaster").is_err(), "a cluster has no master name");
        assert!(RedisLink::new("redis+cluster://").is_err());
        assert!(!RedisLink::new("redis://127.0.0.1:6379").unwrap().is_cluster());
    }

    #[test]
    fn sentinel_urls_take_the_data_nodes_credentials_once_before_the_hosts() {
        let auth = SentinelAuth { username: None, password: Some("sentinel-secret".into()) };
        assert!(
            RedisLink::open_with("redis+sentinel://app:p%40ss@127.0.0.1:26379,127.0.0.1:26380/m", None, &auth).is_ok()
        );
        assert!(RedisLink::open_with("redis+sentinel://:pw@127.0.0.1:26379/m", None, &SentinelAuth::default()).is_ok());
        assert!(RedisLink::new("redis+sentinel://:pw@127.0.0.1:26379,/m").is_err(), "an empty host");
        assert!(RedisLink::new("redis+sentinel://:pw@/m").is_err(), "no host");
    }

    #[test]
    fn a_sentinel_password_with_a_plain_url_is_refused_without_showing_either_password() {
        let auth = SentinelAuth { username: None, password: Some("sentinel-secret".into()) };
        let err = RedisLink::open_with("redis://:node-secret@127.0.0.1:6379", None, &auth).err().unwrap().to_string();
        assert!(err.contains(SENTINEL_PASSWORD_ENV) && err.contains("not a Sentinel URL"), "{err}");
        assert!(!err.contains("node-secret") && !err.contains("sentinel-secret"), "{err}");
        assert!(!format!("{auth:?}").contains("sentinel-secret"));
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
