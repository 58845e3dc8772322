//! The settings of the Redis primary that the sale depends on — `maxmemory-policy`,
//! `min-replicas-to-write` and persistence — read without requiring `CONFIG`, which managed
//! Redis services commonly block or rename.
//!
//! `INFO` is read first: `maxmemory_policy` (INFO memory); `min_slaves_good_slaves` (INFO
//! replication), which Redis prints only while `min-replicas-to-write` and `min-replicas-max-lag`
//! are both non-zero, i.e. while the guard is on; `aof_enabled` (INFO persistence). `CONFIG GET`
//! is asked only where INFO is silent — the RDB schedule (`save`) is in no INFO section — and
//! only where it works. A setting that neither answers is *unverifiable*: `open` and `serve`
//! refuse to go on without the operator's acknowledgement ([`UNVERIFIABLE_OK_FLAG`]), since
//! guessing either way would be wrong: refusing blocks every managed service, assuming hides a
//! primary that evicts or forgets.

use crate::redis_io::conn::RedisConn;
use crate::redis_io::link::needs_reconnect;
use redis::aio::ConnectionLike;
use redis::RedisResult;
use std::collections::HashMap;

/// The flag (and, upper-cased, the `SEATRUSH_` environment variable) that lets `open` and `serve`
/// go on when a setting cannot be read.
pub const UNVERIFIABLE_OK_FLAG: &str = "--redis-settings-unverifiable-ok";
const UNVERIFIABLE_OK_ENV: &str = "SEATRUSH_REDIS_SETTINGS_UNVERIFIABLE_OK";

/// One setting as read: its value, or why it could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading<T> {
    Known(T),
    Unverifiable(String),
}

/// What the primary says about the settings the sale depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrimarySettings {
    pub maxmemory_policy: Reading<String>,
    /// True while `min-replicas-to-write` guards writes (at least 1, with a non-zero max lag).
    pub min_replicas_on: Reading<bool>,
    /// True when the primary keeps an append-only file or takes RDB snapshots.
    pub persistent: Reading<bool>,
}

/// Why `open` or `serve` will not go on.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "Redis maxmemory-policy is {0:?}; seatrush needs noeviction, or Redis may evict admission records and sell a seat twice. \
         Fix: redis-cli CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or your provider's parameter group"
    )]
    Evicting(String),
    #[error(
        "cannot verify these settings of the Redis primary: {}. Check them yourself (your provider's console or parameter \
         group): maxmemory-policy must be noeviction, min-replicas-to-write at least 1, and AOF or RDB snapshots on. Then run \
         again with {UNVERIFIABLE_OK_FLAG} ({UNVERIFIABLE_OK_ENV}=true) to go on without seatrush checking them",
        .0.join("; ")
    )]
    Unverifiable(Vec<String>),
    #[error(
        "the primaries of the Redis Cluster disagree on the settings the sale depends on: {0}. \
         Set maxmemory-policy, min-replicas-to-write and persistence alike on every primary"
    )]
    ClusterDisagrees(String),
}

/// What the check found that the operator should read, once it lets the command go on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettingsWarnings {
    pub min_replicas: Option<String>,
    pub persistence: Option<String>,
    /// One line per setting that could not be read, acknowledged with [`UNVERIFIABLE_OK_FLAG`].
    pub unverified: Vec<String>,
}

impl SettingsWarnings {
    pub fn all(&self) -> impl Iterator<Item = &String> {
        self.min_replicas.iter().chain(&self.persistence).chain(&self.unverified)
    }
}

const MIN_REPLICAS_WARNING: &str =
    "min-replicas-to-write is 0 (INFO replication shows no min_slaves_good_slaves): a primary \
     cut off from its replica will keep admitting writes that a failover can lose. \
     Fix: redis-cli CONFIG SET min-replicas-to-write 1 (or your provider's parameter group)";

const PERSISTENCE_WARNING: &str = "the Redis primary runs with neither AOF (appendonly no) nor RDB snapshots (save \"\"): if it \
     restarts before Sentinel marks it down, it comes back empty and its replicas resync from it and are wiped too. \
     Fix: redis-cli CONFIG SET appendonly yes (and in redis.conf); or keep a crashed primary down longer than Sentinel's \
     down-after-milliseconds. After a wipe, `seatrush open --event ID` rebuilds every held and paid seat from the database.";

/// Reads the settings and judges them: an evicting primary is refused whatever the flag says;
/// an unverifiable setting is refused unless `unverifiable_ok`; the rest are warnings. On a
/// Redis Cluster every primary is read, and primaries that disagree are refused: each event
/// lives on one of them, so one evicting or forgetting primary is as bad as all.
pub async fn check_primary(conn: &mut RedisConn, unverifiable_ok: bool) -> anyhow::Result<SettingsWarnings> {
    let RedisConn::Cluster(cluster) = conn else {
        return Ok(PrimarySettings::read(conn).await?.judge(unverifiable_ok)?);
    };
    let mut read: Vec<(String, PrimarySettings)> = Vec::new();
    for mut node in crate::redis_io::conn::primaries(cluster).await? {
        read.push((node.address(), PrimarySettings::read(&mut node).await?));
    }
    let (first_address, first) = read.first().ok_or_else(|| anyhow::anyhow!("the Redis Cluster named no primary"))?;
    if let Some((address, other)) = read.iter().find(|(_, settings)| settings != first) {
        let shown = format!("{first_address} has {first:?}, {address} has {other:?}");
        return Err(SettingsError::ClusterDisagrees(shown).into());
    }
    Ok(first.judge(unverifiable_ok)?)
}

impl PrimarySettings {
    /// INFO first, `CONFIG GET` only where INFO is silent. A connection error is an error; a
    /// refused command (renamed away, an ACL without it) only makes a setting unverifiable.
    pub async fn read<C: ConnectionLike>(conn: &mut C) -> RedisResult<Self> {
        let info = match refused_as_none(
            redis::cmd("INFO").arg("memory").arg("replication").arg("persistence").query_async::<String>(conn).await,
        )? {
            Ok(text) => parse_info(&text),
            Err(why) => {
                tracing::warn!("the Redis primary refused INFO ({why}); trying CONFIG GET");
                HashMap::new()
            }
        };
        let maxmemory_policy = match info.get("maxmemory_policy") {
            Some(policy) => Reading::Known(policy.clone()),
            None => {
                config_value(conn, "maxmemory-policy").await?.map(Reading::Known).unwrap_or_else(Reading::Unverifiable)
            }
        };
        let min_replicas_on = if info.contains_key("role") {
            Reading::Known(info.contains_key("min_slaves_good_slaves"))
        } else {
            match config_value(conn, "min-replicas-to-write").await? {
                Ok(n) => Reading::Known(n.trim().parse::<u64>().unwrap_or(0) >= 1),
                Err(why) => Reading::Unverifiable(why),
            }
        };
        let persistent = read_persistence(conn, &info).await?;
        Ok(Self { maxmemory_policy, min_replicas_on, persistent })
    }

    /// The verdict on what was read; see [`check_primary`].
    pub fn judge(&self, unverifiable_ok: bool) -> Result<SettingsWarnings, SettingsError> {
        let mut unverifiable = Vec::new();
        match &self.maxmemory_policy {
            Reading::Known(policy) if policy != "noeviction" => return Err(SettingsError::Evicting(policy.clone())),
            Reading::Known(_) => {}
            Reading::Unverifiable(why) => unverifiable.push(format!("maxmemory-policy ({why})")),
        }
        let mut warnings = SettingsWarnings::default();
        match &self.min_replicas_on {
            Reading::Known(true) => {}
            Reading::Known(false) => warnings.min_replicas = Some(MIN_REPLICAS_WARNING.to_owned()),
            Reading::Unverifiable(why) => unverifiable.push(format!("min-replicas-to-write ({why})")),
        }
        match &self.persistent {
            Reading::Known(true) => {}
            Reading::Known(false) => warnings.persistence = Some(PERSISTENCE_WARNING.to_owned()),
            Reading::Unverifiable(why) => unverifiable.push(format!("persistence ({why})")),
        }
        if !unverifiable.is_empty() && !unverifiable_ok {
            return Err(SettingsError::Unverifiable(unverifiable));
        }
        warnings.unverified = unverifiable
            .into_iter()
            .map(|setting| format!("not verified, as acknowledged with {UNVERIFIABLE_OK_FLAG}: {setting}"))
            .collect();
        Ok(warnings)
    }
}

/// AOF from INFO (`aof_enabled`); with AOF off, the RDB schedule from `CONFIG GET save`, the
/// only place Redis shows it.
async fn read_persistence<C: ConnectionLike>(
    conn: &mut C,
    info: &HashMap<String, String>,
) -> RedisResult<Reading<bool>> {
    let aof = match info.get("aof_enabled") {
        Some(flag) => Ok(flag == "1"),
        None => config_value(conn, "appendonly").await?.map(|v| v == "yes"),
    };
    Ok(match aof {
        Ok(true) => Reading::Known(true),
        Ok(false) => match config_value(conn, "save").await? {
            Ok(save) => Reading::Known(!save.trim().is_empty()),
            Err(why) => Reading::Unverifiable(format!(
                "AOF is off (aof_enabled:0) and the RDB snapshot schedule is readable only with CONFIG GET save: {why}"
            )),
        },
        Err(why) => Reading::Unverifiable(why),
    })
}

/// One `CONFIG GET` value: `Ok(Err(why))` when the server refuses the command or does not
/// expose the parameter; `Err` only for a broken connection.
async fn config_value<C: ConnectionLike>(conn: &mut C, name: &str) -> RedisResult<Result<String, String>> {
    let reply = refused_as_none(redis::cmd("CONFIG").arg("GET").arg(name).query_async::<Vec<String>>(conn).await)?;
    Ok(reply.and_then(|pairs| pairs.get(1).cloned().ok_or_else(|| format!("CONFIG GET {name} answered nothing"))))
}

/// A server's refusal (`ERR unknown command`, `NOPERM`) as `Ok(Err(its message))`; errors a
/// reconnect could cure stay errors.
fn refused_as_none<T>(reply: RedisResult<T>) -> RedisResult<Result<T, String>> {
    match reply {
        Ok(value) => Ok(Ok(value)),
        Err(err) if needs_reconnect(&err) => Err(err),
        Err(err) => Ok(Err(format!("the server refused it: {err}"))),
    }
}

/// `name:value` lines of an INFO reply; section headers and blank lines skipped.
fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.trim_end().split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(policy: Reading<String>, min: Reading<bool>, persistent: Reading<bool>) -> PrimarySettings {
        PrimarySettings { maxmemory_policy: policy, min_replicas_on: min, persistent }
    }

    fn known_policy(policy: &str) -> Reading<String> {
        Reading::Known(policy.to_owned())
    }

    #[test]
    fn info_lines_parse_into_names_and_values() {
        let info = parse_info("# Memory\r\nmaxmemory_policy:noeviction\r\n\r\n# Replication\r\nrole:master\r\n");
        assert_eq!(info.get("maxmemory_policy").map(String::as_str), Some("noeviction"));
        assert_eq!(info.get("role").map(String::as_str), Some("master"));
        assert_eq!(info.len(), 2);
    }

    #[test]
    fn an_evicting_primary_is_refused_even_when_unverifiable_settings_are_acknowledged() {
        let evicting = settings(known_policy("allkeys-lru"), Reading::Known(true), Reading::Known(true));
        assert!(matches!(evicting.judge(true), Err(SettingsError::Evicting(p)) if p == "allkeys-lru"));
    }

    #[test]
    fn an_unverifiable_setting_needs_the_flag_and_is_named_in_the_refusal() {
        let blind =
            settings(known_policy("noeviction"), Reading::Known(true), Reading::Unverifiable("CONFIG refused".into()));
        let err = blind.judge(false).unwrap_err().to_string();
        assert!(err.contains("persistence (CONFIG refused)") && err.contains(UNVERIFIABLE_OK_FLAG), "{err}");
        let warnings = blind.judge(true).unwrap();
        assert_eq!(warnings.unverified.len(), 1);
        assert!(warnings.unverified[0].contains("persistence"), "{warnings:?}");
    }

    #[test]
    fn known_weak_settings_are_warnings_not_refusals() {
        let weak = settings(known_policy("noeviction"), Reading::Known(false), Reading::Known(false));
        let warnings = weak.judge(false).unwrap();
        assert!(warnings.min_replicas.is_some() && warnings.persistence.is_some());
        assert!(warnings.unverified.is_empty());
        let sound = settings(known_policy("noeviction"), Reading::Known(true), Reading::Known(true));
        assert_eq!(sound.judge(false).unwrap(), SettingsWarnings::default());
    }
}
