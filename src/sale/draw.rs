//! The draw at the opening (docs/design.md#the-draw-at-the-opening): entering it on the request
//! path, and running it — any `serve` may, exactly one at a time does (the draw lock), and a
//! drawer that dies is finished by the next.
//!
//! An entry is admitted through admit.lua with its own nonce, in one `MULTI` with its mark
//! (draw_mark.lua) under `WATCH` of the marks: an admission and its mark reach a replica together
//! or not at all, and two drawers that read the same marks cannot both write. That `WATCH` is the
//! guard against admitting an entry twice.

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::event::{now_ms, EventId};
use crate::domain::nonce::Nonce;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::{parse_pending_member, EventKeys};
use crate::redis_io::link::RESPONSE_TIMEOUT;
use crate::redis_io::scripts::{self, admit_replies, decode_attempt, AdmitArgs, AdmitReply, Script};
use crate::sale::booking::{Booked, BookingRequest, Refusal};
use crate::sale::catalog::EventView;
use crate::sale::Sale;
use crate::store::DrawnEntry;
use anyhow::{bail, Context};
use futures::future::BoxFuture;
use futures::StreamExt;
use redis::Value;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

static ENTER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/draw_enter.lua")));
static START: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/draw_start.lua")));
static MARK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/draw_mark.lua")));
static FINISH: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/draw_finish.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/lock_renew.lua")));

/// How long the draw lock outlives a drawer that stopped renewing it: the wait before another
/// `serve` finishes a dead drawer's draw.
pub const DRAW_LOCK_TTL: Duration = Duration::from_secs(5);
/// Entries admitted in one `MULTI` (admit.lua takes at most 1,000 attempts a call).
pub const DRAW_BATCH: usize = 500;
/// A dead drawer's admissions booked at once by its successor, as their candidates' retries.
const RETRIES_AT_ONCE: usize = 64;
/// Short `WAIT`s a batch repeats before the drawer gives the draw up to the next try.
const WAIT_TRIES: u32 = 50;

/// The draw's outcome for one entry, as draw_mark.lua writes it.
fn refusal_of(outcome: &str) -> Refusal {
    match outcome {
        "level_full" => Refusal::LevelFull,
        "sold_out" => Refusal::SoldOut,
        "closed" => Refusal::Closed,
        "already_admitted" => Refusal::AlreadyAdmitted(None),
        _ => Refusal::Retry("unknown draw outcome"),
    }
}

/// What one drawer's run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrawRun {
    /// The draw is done (by this run or an earlier one).
    Done { entries: usize },
    /// Not yet `decides_at`, by Redis's clock.
    NotYet,
    /// Another serve holds the draw lock.
    Busy,
    /// The event has no draw.
    NoDraw,
}

impl Sale {
    /// A booking while the draw is not done: Ok to go on to the admit script, or the answer
    /// (`Refusal::Queued` among them).
    pub(crate) async fn enter_draw(&self, view: &EventView, req: &BookingRequest) -> Result<(), Refusal> {
        let keys = &view.keys;
        let cmd = ENTER.call(
            &[&keys.draw, &keys.entries, &keys.drawn, &keys.adm, &keys.meta],
            &[req.code.as_str(), req.nonce.as_str(), &req.level],
        );
        let reply = self.run_script(&ENTER, cmd).await.map_err(|e| self.redis_failed(e))?;
        match reply {
            Value::Int(-5) => Err(Refusal::NotOpen),
            Value::Int(-6) => Err(Refusal::Closed),
            Value::Int(-7) => Err(Refusal::Retry("the event is not loaded in Redis")),
            Value::Array(items) => {
                let words: Vec<String> = items.iter().filter_map(text).collect();
                match words.iter().map(String::as_str).collect::<Vec<_>>()[..] {
                    ["open"] => Ok(()),
                    ["queued", at] => Err(Refusal::Queued(at.parse().unwrap_or(0))),
                    ["drawing"] => Err(Refusal::Retry("the draw is deciding")),
                    ["refused", outcome] => Err(refusal_of(outcome)),
                    _ => Err(Refusal::Retry("unexpected draw reply")),
                }
            }
            _ => Err(Refusal::Retry("unexpected draw reply")),
        }
    }

    /// Runs the event's draw if it is due and no other serve is running it.
    pub async fn run_draw(&self, id: &EventId) -> anyhow::Result<DrawRun> {
        let keys = EventKeys::new(id);
        let mut conn = self.link.connect(RESPONSE_TIMEOUT).await.context("connecting for the draw")?;
        let owner = draw_owner();
        let taken: Option<String> = redis::cmd("SET")
            .arg(&keys.drawlock)
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(DRAW_LOCK_TTL.as_millis() as u64)
            .query_async(&mut conn)
            .await?;
        if taken.is_none() {
            return Ok(DrawRun::Busy);
        }
        // Its own connection: the draw's connection holds a WATCH and a MULTI, which a renewal
        // sent between them would join.
        let renew_conn = self.link.connect(RESPONSE_TIMEOUT).await.context("connecting for the draw lock")?;
        let renewer = Renewer(tokio::spawn(renew(renew_conn, keys.drawlock.clone(), owner.clone())));
        let run = self.draw_locked(id, &keys, &mut conn, &owner).await;
        drop(renewer);
        let freed = scripts::run_as::<i64, _>(&mut conn, &RENEW, &RENEW.call(&[&keys.drawlock], &[&owner, "0"])).await;
        if let Err(e) = freed {
            tracing::debug!(event = %id, error = %e, "cannot free the draw lock; it expires by itself");
        }
        run
    }

    async fn draw_locked(
        &self,
        id: &EventId,
        keys: &EventKeys,
        conn: &mut RedisConn,
        owner: &str,
    ) -> anyhow::Result<DrawRun> {
        let started: i64 = scripts::run_as(conn, &START, &START.call(&[&keys.draw, &keys.drawlock], &[owner])).await?;
        match started {
            1 | 0 => {}
            -2 => return Ok(DrawRun::NotYet),
            -3 => return Ok(DrawRun::NoDraw),
            -1 => return Ok(DrawRun::Busy),
            other => bail!("draw_start answered {other}"),
        }
        let view = self.event(id).await.map_err(|r| anyhow::anyhow!("{r}"))?;
        self.scripts.admit.load(conn).await?;
        MARK.load(conn).await?;
        let (order, entries) = loop {
            let (secret, entries, marks) = read_draw(conn, keys).await?;
            let order = crate::domain::draw::order(&secret, &entries.keys().collect::<Vec<_>>());
            let undecided: Vec<(usize, &String)> =
                order.iter().enumerate().filter(|(_, code)| !marks.contains_key(*code)).collect();
            let Some(batch) = undecided.chunks(DRAW_BATCH).next() else { break (order, entries) };
            let batch: Vec<(usize, String)> = batch.iter().map(|(i, c)| (*i + 1, (*c).clone())).collect();
            self.draw_batch(&view, keys, conn, owner, &batch, &entries, marks.len()).await?;
        };
        // Entries admitted by a drawer that died before their database write, or whose write
        // failed: each is booked as its candidate's retry would be (check 1, WAIT, persist).
        let (_, _, marks) = read_draw(conn, keys).await?;
        let pending: Vec<String> = redis::cmd("ZRANGE").arg(&keys.pending).arg(0).arg(-1).query_async(conn).await?;
        let retries: Vec<BookingRequest> = pending
            .iter()
            .filter_map(|member| parse_pending_member(member).map(|(code, _)| code))
            .filter(|c| marks.get(*c).is_some_and(|m| m.ends_with(" admitted")))
            .filter_map(|code| {
                let (nonce, level) = entries.get(code)?.split_once(' ')?;
                Some(BookingRequest {
                    event: id.clone(),
                    code: CodeHash::from_hex(code)?,
                    level: level.to_owned(),
                    nonce: Nonce::parse(nonce)?,
                })
            })
            .collect();
        let booked = futures::stream::iter(retries)
            .map(|retry| -> BoxFuture<'_, Result<Booked, Refusal>> { Box::pin(async move { self.book(&retry).await }) })
            .buffer_unordered(RETRIES_AT_ONCE);
        for result in booked.collect::<Vec<_>>().await {
            if let Err(refusal) = result {
                tracing::info!(event = %id, %refusal, "a drawn admission's write did not finish; its candidate's retry will");
            }
        }
        let recorded: Vec<DrawnEntry> = order
            .iter()
            .enumerate()
            .map(|(i, code)| DrawnEntry {
                rank: i as i64 + 1,
                code_hash: code.clone(),
                outcome: marks.get(code).and_then(|m| m.split_once(' ')).map_or("", |(_, o)| o).to_owned(),
            })
            .collect();
        self.store.record_draw(id, &recorded, now_ms()).await?;
        let finished: i64 = scripts::run_as(
            conn,
            &FINISH,
            &FINISH.call(&[&keys.draw, &keys.drawlock, &keys.entries, &keys.drawn], &[owner]),
        )
        .await?;
        match finished {
            1 => {
                tracing::info!(event = %id, entries = order.len(), "the draw is done");
                Ok(DrawRun::Done { entries: order.len() })
            }
            -1 => Ok(DrawRun::Busy),
            other => bail!("draw_finish answered {other}"),
        }
    }

    /// One batch of undecided entries, in rank order: `WATCH` the marks, check they are as read
    /// and the lock is ours, then admit and mark in one `MULTI`, `WAIT` until a replica has it,
    /// and write each admission to the database. A transaction the `WATCH` aborted writes
    /// nothing: the caller reads the marks again.
    #[allow(clippy::too_many_arguments)]
    async fn draw_batch(
        &self,
        view: &EventView,
        keys: &EventKeys,
        conn: &mut RedisConn,
        owner: &str,
        batch: &[(usize, String)],
        entries: &HashMap<String, String>,
        marks_read: usize,
    ) -> anyhow::Result<()> {
        let attempts: Vec<(String, String, String, String)> = batch
            .iter()
            .filter_map(|(rank, code)| {
                let (nonce, level) = entries.get(code)?.split_once(' ')?;
                Some((code.clone(), nonce.to_owned(), level.to_owned(), rank.to_string()))
            })
            .collect();
        let parsed: Vec<(CodeHash, Nonce, String)> = attempts
            .iter()
            .filter_map(|(c, n, _, _)| {
                Some((CodeHash::from_hex(c)?, Nonce::parse(n)?, uuid::Uuid::new_v4().simple().to_string()))
            })
            .collect();
        if parsed.len() != attempts.len() {
            bail!("an entry of the draw does not parse");
        }
        redis::cmd("WATCH").arg(&keys.drawn).query_async::<()>(conn).await?;
        let (marks, holder): (usize, Option<String>) =
            redis::pipe().hlen(&keys.drawn).get(&keys.drawlock).query_async(conn).await?;
        if marks != marks_read || holder.as_deref() != Some(owner) {
            redis::cmd("UNWATCH").query_async::<()>(conn).await?;
            if holder.as_deref() != Some(owner) {
                bail!("the draw lock was lost");
            }
            return Ok(());
        }
        let admit = self.scripts.admit_batch_call(
            keys,
            parsed.iter().zip(&attempts).map(|((code, nonce, id), (_, _, level, _))| AdmitArgs {
                code,
                nonce,
                level,
                admission: id,
                retry_only: false,
            }),
        );
        let mark_args: Vec<&str> =
            attempts.iter().flat_map(|(c, n, l, r)| [c.as_str(), n.as_str(), l.as_str(), r.as_str()]).collect();
        let mark = MARK.call(&[&keys.adm, &keys.taken, &keys.cap, &keys.free, &keys.meta, &keys.drawn], &mark_args);
        let mut pipe = redis::pipe();
        pipe.ignore_errors().cmd("MULTI").add_command(admit).add_command(mark).cmd("EXEC");
        let mut replies: Vec<Value> = pipe.query_async(conn).await?;
        let (admitted, marked) = match replies.pop() {
            Some(Value::Array(mut done)) if done.len() == 2 => {
                let marked = done.pop().expect("two replies");
                (done.pop().expect("two replies"), marked)
            }
            // The WATCH saw another drawer's marks: nothing was written.
            Some(Value::Nil) => return Ok(()),
            other => bail!("the draw's transaction answered {other:?}"),
        };
        match marked {
            Value::Int(n) if n == attempts.len() as i64 => {}
            Value::Int(-7) => bail!("Redis lost the event during the draw"),
            other => bail!("draw_mark answered {other:?}: the admit did not run"),
        }
        self.wait_for_replica(conn, keys).await?;
        let written =
            admit_replies(admitted, parsed.len()).into_iter().zip(&parsed).filter_map(|(reply, (code, nonce, _))| {
                match decode_attempt(reply) {
                    Ok(AdmitReply::Admitted { slot, admitted_ms, admission, level }) => Some(Admission {
                        code: code.clone(),
                        nonce: nonce.clone(),
                        id: admission,
                        slot,
                        level,
                        admitted_ms,
                    }),
                    _ => None,
                }
            });
        let writes = written.map(|admission| self.persist(view, admission));
        for result in futures::future::join_all(writes).await {
            if let Err(refusal) = result {
                tracing::info!(event = %view.id, %refusal, "a drawn admission was not written; its candidate's retry decides");
            }
        }
        Ok(())
    }

    /// `WAIT` on the drawer's connection until a replica holds the batch. A short `WAIT` is tried
    /// again, never undone: the admission keeps its place. A broken connection is an error; the
    /// next drawer reads the marks again and redoes what a failover lost, in rank order.
    async fn wait_for_replica(&self, conn: &mut RedisConn, keys: &EventKeys) -> anyhow::Result<()> {
        for _ in 0..WAIT_TRIES {
            if self.settings.ack.acknowledged(conn, keys).await? {
                return Ok(());
            }
        }
        bail!("no replica acknowledged the draw's batch")
    }
}

type Fields = HashMap<String, String>;

/// The draw's secret, its entries (code hash -> "nonce level") and its marks (code hash ->
/// "rank outcome").
async fn read_draw(conn: &mut RedisConn, keys: &EventKeys) -> anyhow::Result<(String, Fields, Fields)> {
    let (secret, entries, marks): (Option<String>, Fields, Fields) =
        redis::pipe().hget(&keys.draw, "secret").hgetall(&keys.entries).hgetall(&keys.drawn).query_async(conn).await?;
    let secret = secret.context("the draw has no secret in Redis")?;
    Ok((secret, entries, marks))
}

/// Stops renewing when dropped: a drawer cancelled mid-draw (its task aborted) lets its lock
/// expire, so another serve finishes the draw.
struct Renewer(tokio::task::JoinHandle<()>);

impl Drop for Renewer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn renew(mut conn: RedisConn, key: String, owner: String) {
    let mut tick = tokio::time::interval(DRAW_LOCK_TTL / 3);
    tick.tick().await;
    loop {
        tick.tick().await;
        let ttl = DRAW_LOCK_TTL.as_millis().to_string();
        match scripts::run_as::<i64, _>(&mut conn, &RENEW, &RENEW.call(&[&key], &[&owner, &ttl])).await {
            Ok(1) => {}
            Ok(_) => return tracing::warn!(lock = %key, "draw lock lost: another serve may be drawing"),
            Err(e) => tracing::debug!(lock = %key, error = %e, "cannot renew the draw lock; retrying"),
        }
    }
}

/// "draw by host pid 4242 run 1a2b3c4d", unique per run.
fn draw_owner() -> String {
    let host =
        std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "unknown-host".into());
    let run = &uuid::Uuid::new_v4().simple().to_string()[..8];
    format!("draw by {host} pid {} run {run}", std::process::id())
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}
