//! The three Redis ways of booking the hot event.

use super::{Attempt, Strategy, LOCK_BACKOFF, LOCK_TTL_MS};
use redis::aio::MultiplexedConnection;
use redis::Client;
use seatrush::domain::code::CodeHash;
use seatrush::domain::event::EventId;
use seatrush::domain::nonce::Nonce;
use seatrush::redis_io::keys::EventKeys;
use seatrush::redis_io::scripts::{AdmitReply, Scripts};

const LEVEL: &str = "A1";
/// Keys of the WATCH and lock strategies (one hash tag, as a cluster would need).
const COUNT_KEY: &str = "{hot}:count";
const RECORDS_KEY: &str = "{hot}:records";
const LOCK_KEY: &str = "{hot}:lock";
/// Deletes the lock only if it still carries our token.
const UNLOCK: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn candidate_hash(candidate: u64) -> CodeHash {
    CodeHash::from_hex(&format!("{candidate:064x}")).expect("64 hex digits")
}

async fn connect(client: &Client) -> anyhow::Result<MultiplexedConnection> {
    Ok(client.get_multiplexed_async_connection().await?)
}

/// seatrush's admit script.
pub struct LuaScript {
    client: Client,
    scripts: Scripts,
    keys: EventKeys,
}

impl LuaScript {
    pub fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self { client: Client::open(url)?, scripts: Scripts::new(), keys: EventKeys::new(&EventId::parse("hot")?) })
    }
}

impl Strategy for LuaScript {
    type Client = MultiplexedConnection;

    fn name(&self) -> &'static str {
        "lua_script"
    }

    async fn reset(&self, seats: i64) -> anyhow::Result<()> {
        let mut c = connect(&self.client).await?;
        let k = &self.keys;
        redis::cmd("DEL")
            .arg(&k.adm)
            .arg(&k.taken)
            .arg(&k.cap)
            .arg(&k.free)
            .arg(&k.pending)
            .arg(&k.meta)
            .query_async::<()>(&mut c)
            .await?;
        redis::cmd("HSET").arg(&k.cap).arg(LEVEL).arg(seats).query_async::<()>(&mut c).await?;
        // admit.lua admits only while the event's state in Redis says open, as `open` leaves it.
        redis::cmd("HSET").arg(&k.meta).arg("state").arg("open").query_async::<()>(&mut c).await?;
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&k.free);
        for seat in 1..=seats {
            zadd.arg(seat).arg(seat);
        }
        zadd.query_async::<()>(&mut c).await?;
        self.scripts.admit.load_cmd().query_async::<String>(&mut c).await?;
        Ok(())
    }

    async fn client(&self) -> anyhow::Result<MultiplexedConnection> {
        connect(&self.client).await
    }

    async fn attempt(&self, c: &mut MultiplexedConnection, candidate: u64) -> anyhow::Result<Attempt> {
        let nonce = Nonce::parse(&format!("nonce-{candidate:08}")).expect("a valid nonce");
        let call =
            self.scripts.admit_call(&self.keys, &candidate_hash(candidate), &nonce, LEVEL, &format!("a{candidate}"));
        Ok(match AdmitReply::decode_single(call.query_async(c).await?)? {
            AdmitReply::Admitted { .. } => Attempt::Admitted,
            AdmitReply::SoldOut | AdmitReply::LevelFull => Attempt::SoldOut,
            AdmitReply::AlreadyAdmitted => anyhow::bail!("candidate {candidate} was handed out twice"),
            AdmitReply::NotARetry => anyhow::bail!("a plain admit answered as a retry-only one"),
            AdmitReply::Outside(why) => anyhow::bail!("the event's window refused the admission: {why:?}"),
        })
    }

    async fn stored(&self) -> anyhow::Result<(i64, i64)> {
        let mut c = connect(&self.client).await?;
        let records: i64 = redis::cmd("HLEN").arg(&self.keys.adm).query_async(&mut c).await?;
        let taken: Option<i64> = redis::cmd("HGET").arg(&self.keys.taken).arg(LEVEL).query_async(&mut c).await?;
        Ok((records, taken.unwrap_or(0)))
    }
}

/// What the WATCH and lock strategies share: a plain counter and a record per admission, and
/// the seat count they check against.
struct Counter {
    client: Client,
    seats: std::sync::atomic::AtomicI64,
}

impl Counter {
    fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self { client: Client::open(url)?, seats: 0.into() })
    }

    fn seats(&self) -> i64 {
        self.seats.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn reset(&self, seats: i64) -> anyhow::Result<()> {
        self.seats.store(seats, std::sync::atomic::Ordering::Relaxed);
        let mut c = connect(&self.client).await?;
        redis::cmd("DEL").arg(COUNT_KEY).arg(RECORDS_KEY).arg(LOCK_KEY).query_async::<()>(&mut c).await?;
        Ok(())
    }

    async fn stored(&self) -> anyhow::Result<(i64, i64)> {
        let mut c = connect(&self.client).await?;
        let (records, count): (i64, Option<i64>) =
            redis::pipe().hlen(RECORDS_KEY).get(COUNT_KEY).query_async(&mut c).await?;
        Ok((records, count.unwrap_or(0)))
    }
}

/// Optimistic: WATCH, read, check, MULTI/EXEC; aborted EXECs retried.
pub struct WatchMultiExec(Counter);

impl WatchMultiExec {
    pub fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self(Counter::new(url)?))
    }
}

impl Strategy for WatchMultiExec {
    // WATCH is per connection: every client has its own, and nothing else shares it.
    type Client = MultiplexedConnection;

    fn name(&self) -> &'static str {
        "watch_multi_exec"
    }

    async fn reset(&self, seats: i64) -> anyhow::Result<()> {
        self.0.reset(seats).await
    }

    async fn client(&self) -> anyhow::Result<MultiplexedConnection> {
        connect(&self.0.client).await
    }

    async fn attempt(&self, c: &mut MultiplexedConnection, candidate: u64) -> anyhow::Result<Attempt> {
        redis::cmd("WATCH").arg(COUNT_KEY).query_async::<()>(c).await?;
        let count: Option<i64> = redis::cmd("GET").arg(COUNT_KEY).query_async(c).await?;
        let count = count.unwrap_or(0);
        if count >= self.0.seats() {
            redis::cmd("UNWATCH").query_async::<()>(c).await?;
            return Ok(Attempt::SoldOut);
        }
        let done: Option<(i64, i64)> = redis::pipe()
            .atomic()
            .incr(COUNT_KEY, 1)
            .hset(RECORDS_KEY, candidate_hash(candidate).as_str(), count + 1)
            .query_async(c)
            .await?;
        Ok(if done.is_some() { Attempt::Admitted } else { Attempt::Again })
    }

    async fn stored(&self) -> anyhow::Result<(i64, i64)> {
        self.0.stored().await
    }
}

/// A lock around read-check-write.
pub struct SetNxLock(Counter);

impl SetNxLock {
    pub fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self(Counter::new(url)?))
    }
}

impl Strategy for SetNxLock {
    type Client = MultiplexedConnection;

    fn name(&self) -> &'static str {
        "set_nx_lock"
    }

    async fn reset(&self, seats: i64) -> anyhow::Result<()> {
        self.0.reset(seats).await
    }

    async fn client(&self) -> anyhow::Result<MultiplexedConnection> {
        connect(&self.0.client).await
    }

    async fn attempt(&self, c: &mut MultiplexedConnection, candidate: u64) -> anyhow::Result<Attempt> {
        let token = format!("t{candidate}");
        let locked: Option<String> =
            redis::cmd("SET").arg(LOCK_KEY).arg(&token).arg("NX").arg("PX").arg(LOCK_TTL_MS).query_async(c).await?;
        if locked.is_none() {
            tokio::time::sleep(LOCK_BACKOFF).await;
            return Ok(Attempt::Again);
        }
        let count: Option<i64> = redis::cmd("GET").arg(COUNT_KEY).query_async(c).await?;
        let count = count.unwrap_or(0);
        let outcome = if count >= self.0.seats() {
            Attempt::SoldOut
        } else {
            redis::pipe()
                .incr(COUNT_KEY, 1)
                .ignore()
                .hset(RECORDS_KEY, candidate_hash(candidate).as_str(), count + 1)
                .ignore()
                .query_async::<()>(c)
                .await?;
            Attempt::Admitted
        };
        redis::cmd("EVAL").arg(UNLOCK).arg(1).arg(LOCK_KEY).arg(&token).query_async::<i64>(c).await?;
        Ok(outcome)
    }

    async fn stored(&self) -> anyhow::Result<(i64, i64)> {
        self.0.stored().await
    }
}
