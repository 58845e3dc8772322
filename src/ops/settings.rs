//! Settings, scoped to the commands that use them, each a flag with a `SEATRUSH_*` environment
//! twin. [`Connections`] (Redis and the database) are global: every operator command reaches
//! one or both. [`ServeSettings`] (the request path and the background passes) belong to the
//! commands that serve: `serve`, `demo` and `bench`; any other command refuses them as unknown
//! flags. Ranges are checked by clap when the flags are parsed, so a bad value is an error that
//! names the range, never a silent clamp.

use clap::builder::RangedU64ValueParser;
use clap::{value_parser, Args};
use secrecy::SecretString;
use std::time::Duration;

/// Where Redis and the database are. The URLs may hold passwords: `--help` does not show their
/// environment values and `Debug` prints them masked.
#[derive(Args, Clone)]
pub struct Connections {
    /// Redis primary: redis://host:port, or Sentinel: redis+sentinel://h1:26379,h2:26379/master-name;
    /// rediss:// and rediss+sentinel:// for TLS
    #[arg(
        long,
        env = "SEATRUSH_REDIS_URL",
        global = true,
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// CA certificate (PEM) that signed the Redis servers' certificates, for rediss:// URLs
    /// (default: the system's roots)
    #[arg(long, env = "SEATRUSH_REDIS_CA_FILE", global = true)]
    pub redis_ca_file: Option<std::path::PathBuf>,
    /// Back-office database: sqlite://path or postgres://user@host/db
    /// (TLS: ?sslmode=verify-full&sslrootcert=ca.pem)
    #[arg(
        long,
        env = "SEATRUSH_DATABASE_URL",
        global = true,
        hide_env_values = true,
        default_value = "sqlite://seatrush.db"
    )]
    pub database_url: String,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { redis_url, redis_ca_file, database_url } = self;
        let redacted = crate::domain::url::redacted;
        f.debug_struct("Connections")
            .field("redis_url", &redacted(redis_url))
            .field("redis_ca_file", redis_ca_file)
            .field("database_url", &redacted(database_url))
            .finish()
    }
}

/// How `open` and `serve` treat a setting of the Redis primary they cannot read
/// (`redis_io/primary_settings.rs`): managed services often block `CONFIG`.
#[derive(Args, Debug, Clone, Default)]
pub struct RedisChecks {
    /// Go on when a setting of the Redis primary (maxmemory-policy, min-replicas-to-write,
    /// persistence) can be read neither from INFO nor with CONFIG GET, because you have checked it
    /// yourself (maxmemory-policy noeviction above all); without it such a primary is refused
    #[arg(long, env = "SEATRUSH_REDIS_SETTINGS_UNVERIFIABLE_OK")]
    pub redis_settings_unverifiable_ok: bool,
}

/// Most committer connections, persist writers, replicas to wait for.
const CONNECTIONS_MAX: u64 = 64;
/// Longest any of the millisecond settings may be: an hour.
const MILLISECONDS_MAX: u64 = 3_600_000;

/// How a serving process runs the request path and the background passes.
#[derive(Args, Debug, Clone)]
pub struct ServeSettings {
    /// Address to listen on
    #[arg(long, env = "SEATRUSH_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// File holding the bearer token for the operator endpoints (payment, cancel, the dashboard);
    /// or set SEATRUSH_OPERATOR_TOKEN. Never a flag: argv is visible to every user of the host.
    /// At least 32 characters; unset refuses every operator request
    #[arg(long, env = "SEATRUSH_OPERATOR_TOKEN_FILE")]
    pub operator_token_file: Option<std::path::PathBuf>,
    /// The operator token itself: from SEATRUSH_OPERATOR_TOKEN or the file, by
    /// [`ServeSettings::operator_token`]; code that builds a server in-process may set it.
    #[arg(skip)]
    pub operator_token: Option<SecretString>,
    /// The payment provider's signing secret: from SEATRUSH_PAYMENT_WEBHOOK_SECRET, by
    /// [`ServeSettings::payment_webhook_secret`] (never a flag); code that builds a server
    /// in-process may set it.
    #[arg(skip)]
    pub payment_webhook_secret: Option<SecretString>,
    /// Replicas that must acknowledge an admission before it counts (0 = no WAIT)
    #[arg(long, env = "SEATRUSH_WAIT_REPLICAS", default_value_t = 1, value_parser = value_parser!(u32).range(0..=CONNECTIONS_MAX as i64))]
    pub wait_replicas: u32,
    /// How long WAIT waits for the replicas, in milliseconds (0 would be WAIT's "forever": refused)
    #[arg(long, env = "SEATRUSH_WAIT_TIMEOUT_MS", default_value_t = 200, value_parser = value_parser!(u64).range(1..=MILLISECONDS_MAX))]
    pub wait_timeout_ms: u64,
    #[command(flatten)]
    pub persist_timeout: PersistTimeout,
    #[command(flatten)]
    pub redis_checks: RedisChecks,
    /// Time between reaper passes, in milliseconds
    #[arg(long, env = "SEATRUSH_REAPER_INTERVAL_MS", default_value_t = 1_000, value_parser = value_parser!(u64).range(1..=MILLISECONDS_MAX))]
    pub reaper_interval_ms: u64,
    /// Connections that group-commit admissions (each pipelines a batch, then one WAIT)
    #[arg(long, env = "SEATRUSH_COMMIT_CONNECTIONS", default_value_t = 4, value_parser = RangedU64ValueParser::<usize>::new().range(1..=CONNECTIONS_MAX))]
    pub commit_connections: usize,
    /// How long the request path waits for its database write before answering 503 retry, in milliseconds
    #[arg(long, env = "SEATRUSH_PERSIST_DEADLINE_MS", default_value_t = 2_000, value_parser = value_parser!(u64).range(1..=MILLISECONDS_MAX))]
    pub persist_deadline_ms: u64,
    /// Most candidates one event's waiting list holds; past it a join is 409 waitlist_full
    #[arg(long, env = "SEATRUSH_WAITLIST_MAX", default_value_t = crate::sale::waitlist::WAITERS_MAX_DEFAULT,
        value_parser = RangedU64ValueParser::<usize>::new().range(0..=10_000_000))]
    pub waitlist_max: usize,
    /// Most admits one committer pipelines under one WAIT (1 = a WAIT per admit)
    #[arg(long, env = "SEATRUSH_COMMIT_BATCH_MAX", default_value_t = 256,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=crate::sale::committer::BATCH_SIZE_MAX as u64))]
    pub commit_batch_max: usize,
    /// Most bookings written in one database transaction
    #[arg(long, env = "SEATRUSH_PERSIST_BATCH_MAX", default_value_t = 256, value_parser = RangedU64ValueParser::<usize>::new().range(1..=4096))]
    pub persist_batch_max: usize,
    /// How long a database writer waits for more bookings before writing a short batch, in milliseconds
    #[arg(long, env = "SEATRUSH_PERSIST_LINGER_MS", default_value_t = 0, value_parser = value_parser!(u64).range(0..=1_000))]
    pub persist_linger_ms: u64,
    /// Database writer tasks, each with one batch transaction in flight
    #[arg(long, env = "SEATRUSH_PERSIST_WRITERS", default_value_t = 1, value_parser = RangedU64ValueParser::<usize>::new().range(1..=CONNECTIONS_MAX))]
    pub persist_writers: usize,
    /// Requests one `serve` handles at once; one more is answered 503 retry (with Retry-After) at once
    #[arg(long, env = "SEATRUSH_IN_FLIGHT_MAX", default_value_t = crate::http::IN_FLIGHT_MAX_DEFAULT,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub in_flight_max: usize,
    /// Answers that tell a guesser something about codes (403 not_registered, 400 for a code that
    /// does not normalise) one client address may get per minute; past it they are 429
    /// rate_limited with Retry-After. Valid attempts are never limited. 0 = no limit
    #[arg(long, env = "SEATRUSH_REFUSAL_RATE_PER_MINUTE", default_value_t = 30)]
    pub refusal_rate_per_minute: u32,
    /// Proxies (addresses or CIDR blocks, comma-separated) whose X-Forwarded-For names the client;
    /// from anyone else the header is ignored
    #[arg(long, env = "SEATRUSH_TRUSTED_PROXIES", value_delimiter = ',', value_parser = crate::http::refusal_limit::parse_trusted_proxy)]
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Time a client has to send a whole request head, in milliseconds; also the longest a
    /// kept-alive connection may sit idle
    #[arg(long, env = "SEATRUSH_HEADER_READ_TIMEOUT_MS", default_value_t = 10_000,
        value_parser = value_parser!(u64).range(100..=60_000))]
    pub header_read_timeout_ms: u64,
    /// Time a client has to send a whole request body once its head arrived, in milliseconds (then 408)
    #[arg(long, env = "SEATRUSH_BODY_READ_TIMEOUT_MS", default_value_t = 10_000,
        value_parser = value_parser!(u64).range(100..=60_000))]
    pub body_read_timeout_ms: u64,
    /// Connections one `serve` keeps open at once; one more is closed as soon as it is accepted
    #[arg(long, env = "SEATRUSH_CONNECTIONS_MAX", default_value_t = 16_384,
        value_parser = RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub connections_max: usize,
    /// Code-revealing refusals from one address within a minute before it may count as a guesser
    /// (then refused everything); 0 = off
    #[arg(long, env = "SEATRUSH_GUESS_REFUSALS_MIN", default_value_t = 20)]
    pub guess_refusals_min: u32,
    /// Share of an address's attempts in that minute, in percent, that must be refusals for it to
    /// count as a guesser
    #[arg(long, env = "SEATRUSH_GUESS_SHARE_PERCENT", default_value_t = 50, value_parser = value_parser!(u32).range(1..=100))]
    pub guess_share_percent: u32,
    /// How long a guesser's address is answered 429 for every attempt, in seconds
    #[arg(long, env = "SEATRUSH_GUESS_PENALTY_SECONDS", default_value_t = 300,
        value_parser = value_parser!(u64).range(1..=86_400))]
    pub guess_penalty_seconds: u64,
    /// Send Strict-Transport-Security (when TLS is terminated in front of seatrush)
    #[arg(long, env = "SEATRUSH_HSTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub hsts: bool,
    /// A directory of the booking page's strings, one LANG.json each (keys of
    /// assets/strings/en.json): a bundled language's texts are replaced key by key, a new
    /// language must give every key. Read once at start
    #[arg(long, env = "SEATRUSH_PAGE_STRINGS_DIR")]
    pub page_strings_dir: Option<std::path::PathBuf>,
}

/// Where the payment provider's signing secret comes from (the environment only).
pub const PAYMENT_WEBHOOK_SECRET_ENV: &str = "SEATRUSH_PAYMENT_WEBHOOK_SECRET";

/// Shortest operator token accepted: 32 characters, so it cannot be guessed in the time a sale
/// runs even without the 401 limit.
pub const OPERATOR_TOKEN_CHARS_MIN: usize = 32;

impl ServeSettings {
    /// The HTTP edge's part of the settings.
    pub fn edge(&self) -> crate::http::EdgeSettings {
        crate::http::EdgeSettings {
            refusal_rate_per_minute: self.refusal_rate_per_minute,
            trusted_proxies: self.trusted_proxies.clone(),
            in_flight_max: self.in_flight_max,
            connections: crate::http::server::ConnectionLimits {
                header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
                body_read_timeout: Duration::from_millis(self.body_read_timeout_ms),
                connections_max: self.connections_max,
            },
            guessing: crate::http::guess_guard::GuessPolicy {
                refusals_min: self.guess_refusals_min,
                share_percent: self.guess_share_percent,
                window: Duration::from_secs(60),
                penalty: Duration::from_secs(self.guess_penalty_seconds),
            },
            hsts: self.hsts,
        }
    }

    /// The operator token: the one set in code, else the file's (its first line), else
    /// `SEATRUSH_OPERATOR_TOKEN`; None when there is none. Shorter than
    /// [`OPERATOR_TOKEN_CHARS_MIN`] is an error that says so.
    pub fn operator_token(&self) -> anyhow::Result<Option<SecretString>> {
        use anyhow::Context;
        use secrecy::ExposeSecret;
        let token = match (&self.operator_token, &self.operator_token_file) {
            (Some(token), _) => Some(token.clone()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the operator token file {}", path.display()))?;
                Some(SecretString::from(text.lines().next().unwrap_or("").trim().to_owned()))
            }
            (None, None) => std::env::var("SEATRUSH_OPERATOR_TOKEN").ok().map(SecretString::from),
        };
        if let Some(token) = &token {
            let chars = token.expose_secret().chars().count();
            anyhow::ensure!(
                chars >= OPERATOR_TOKEN_CHARS_MIN,
                "the operator token has {chars} characters; at least {OPERATOR_TOKEN_CHARS_MIN} are needed \
                 (make one with: openssl rand -hex 32)"
            );
        }
        Ok(token)
    }

    /// The webhook's signing secret: the one set in code, else `SEATRUSH_PAYMENT_WEBHOOK_SECRET`;
    /// None when unset (every notice is then `401`). Shorter than 32 characters is an error.
    pub fn payment_webhook_secret(&self) -> anyhow::Result<Option<SecretString>> {
        use secrecy::ExposeSecret;
        let secret = match &self.payment_webhook_secret {
            Some(secret) => Some(secret.clone()),
            None => std::env::var(PAYMENT_WEBHOOK_SECRET_ENV).ok().filter(|s| !s.is_empty()).map(SecretString::from),
        };
        if let Some(secret) = &secret {
            let chars = secret.expose_secret().chars().count();
            anyhow::ensure!(
                chars >= OPERATOR_TOKEN_CHARS_MIN,
                "{PAYMENT_WEBHOOK_SECRET_ENV} has {chars} characters; at least {OPERATOR_TOKEN_CHARS_MIN} are needed \
                 (use the signing secret your payment provider shows, or make one with: openssl rand -hex 32)"
            );
        }
        Ok(secret)
    }

    /// What `serve` runs with when given no flags: the defaults, with any `SEATRUSH_*` twin set in
    /// the environment applied. For code that builds a server in-process (the tests).
    pub fn from_env() -> Result<Self, clap::Error> {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            settings: ServeSettings,
        }
        <Only as clap::Parser>::try_parse_from(["seatrush"]).map(|only| only.settings)
    }
}

/// When a pending admission counts as stuck: `serve`'s reaper releases it then, `status` lists it.
#[derive(Args, Debug, Clone)]
pub struct PersistTimeout {
    /// How old a pending admission must be before the reaper releases it, in milliseconds
    #[arg(long, env = "SEATRUSH_PERSIST_TIMEOUT_MS", default_value_t = 10_000, value_parser = value_parser!(u64).range(1..=MILLISECONDS_MAX))]
    pub persist_timeout_ms: u64,
}
