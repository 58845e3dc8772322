//! The reaper: releases admissions that never reached the database (a crash after admit, a lost
//! undo, a phantom left by a failover). It runs inside every `serve`; several at once are safe
//! because the database row decides (the reaper claims it `released` for the admission, the
//! request path claims it `held`, one wins) and the Redis scripts are guarded by nonce and
//! admission id.
//!
//! Each pass also expires unpaid holds and retries releases Redis has not yet heard of.

use crate::domain::admission::Admission;
use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::redis_io::keys::{parse_pending_member, EventKeys, EVENTS_KEY};
use crate::redis_io::scripts::Offer;
use crate::sale::settle::Settled;
use crate::sale::stats::Stats;
use crate::sale::Sale;
use crate::store::StoreError;
use redis::RedisResult;
use std::future::Future;

/// Pending admissions examined per event per pass.
pub(crate) const REAP_BATCH_MAX: isize = 500;
/// Offers an `event apply` left for adoption taken per event per pass.
const ADOPT_BATCH_MAX: usize = 256;

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReapReport {
    pub released: usize,
    pub persisted: usize,
    /// Entries the database refused to settle; left pending, tried again next pass.
    pub skipped: usize,
}

impl Sale {
    /// Runs passes every `reaper_interval` until `shutdown` resolves.
    pub async fn run_reaper(&self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(self.settings.reaper_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => self.background_pass().await,
            }
        }
    }

    /// One reaper pass over every opened event, then hold expiry and release sync.
    pub async fn background_pass(&self) {
        match self.reap_all_once().await {
            Ok(r) if r.released > 0 => {
                tracing::info!(released = r.released, "reaper released admissions that never reached the database")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "reaper pass failed; next pass retries"),
        }
        if let Err(e) = self.expire_holds_once().await {
            tracing::warn!(error = %e, "hold expiry pass failed; next pass retries");
        }
        if let Err(e) = self.sync_releases_once().await {
            tracing::warn!(error = %e, "release sync pass failed; next pass retries");
        }
        if let Err(e) = self.settle_moves_once().await {
            tracing::warn!(error = %e, "settle of moves left behind failed; next pass retries");
        }
    }

    /// Reaper passes and release syncs until `event` has nothing pending or `timeout` has
    /// passed, for the end of a test or a fault run. Returns how many are still pending.
    pub async fn drain(&self, event: &EventId, timeout: std::time::Duration) -> anyhow::Result<i64> {
        let deadline = std::time::Instant::now() + timeout;
        let pause = (self.settings.persist_timeout / 2).max(std::time::Duration::from_millis(10));
        let keys = EventKeys::new(event);
        loop {
            // A pass can fail while Redis or the database is still coming back; the next one retries.
            let _ = self.reap_all_once().await;
            let _ = self.sync_releases_once().await;
            let _ = self.settle_moves_once().await;
            self.book_queued_offers().await;
            // A fresh connection each time: after a failover it finds the current primary. A move
            // Redis made and the database has not settled counts as pending too.
            let pending: anyhow::Result<i64> = match self.link.check().await {
                Ok(mut conn) => redis::pipe()
                    .zcard(&keys.pending)
                    .zcard(&keys.moving)
                    .query_async(&mut conn)
                    .await
                    .map(|(p, m): (i64, i64)| p + m)
                    .map_err(Into::into),
                Err(e) => Err(e.into()),
            };
            match pending {
                Ok(0) => return Ok(0),
                Ok(n) if std::time::Instant::now() > deadline => return Ok(n),
                Err(e) if std::time::Instant::now() > deadline => return Err(e),
                _ => tokio::time::sleep(pause).await,
            }
        }
    }

    pub async fn reap_all_once(&self) -> anyhow::Result<ReapReport> {
        let mut conn = self.link.shared().await?;
        let events: Vec<String> = match redis::cmd("SMEMBERS").arg(EVENTS_KEY).query_async(&mut conn).await {
            Ok(events) => events,
            Err(e) => {
                self.link.report(&e).await;
                return Err(e.into());
            }
        };
        let mut report = ReapReport::default();
        for event in events.iter().filter_map(|e| EventId::parse(e).ok()) {
            self.adopt_offers(&event).await;
            let r = self.reap_once(&event).await?;
            report.released += r.released;
            report.persisted += r.persisted;
            report.skipped += r.skipped;
        }
        Ok(report)
    }

    /// Takes the offers an `event apply` made ({ev:ID}:adopt, `lua/amend.lua`) into this
    /// process's offer loop. One a `serve` takes and then dies holding is pending like any offer:
    /// this pass settles it in time, and the seat passes to the next waiter.
    async fn adopt_offers(&self, event: &EventId) {
        let keys = EventKeys::new(event);
        let taken: RedisResult<Option<Vec<String>>> = match self.link.shared().await {
            Ok(mut conn) => redis::cmd("LPOP").arg(&keys.adopt).arg(ADOPT_BATCH_MAX).query_async(&mut conn).await,
            Err(e) => Err(e),
        };
        match taken {
            Ok(entries) => {
                for entry in entries.unwrap_or_default() {
                    match Offer::from_adopted(&entry) {
                        Some(offer) => self.offer_made(event, offer),
                        None => {
                            tracing::error!(%event, "an offer left for adoption cannot be read; the reaper settles it")
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(%event, error = %e, "offers left for adoption not read; next pass"),
        }
    }

    /// One pass over one event's pending admissions older than `persist_timeout`.
    pub async fn reap_once(&self, event: &EventId) -> anyhow::Result<ReapReport> {
        let keys = EventKeys::new(event);
        let (cutoff_ms, stale) = self.stale_pending(&keys).await?;
        let mut report = ReapReport::default();
        for (code, entry_id, record) in stale {
            let Some(admission) = record.and_then(|r| Admission::from_record(code, &r)) else { continue };
            // Judge the record itself: the code may have been released and admitted afresh
            // since its pending entry was read (then the record is another admission's).
            if admission.id != entry_id || admission.admitted_ms > cutoff_ms {
                continue;
            }
            let settled = match self.settle(event, &keys, &admission, false).await {
                Ok(settled) => settled,
                // One entry the database refuses (its level was dropped, say) must not stop the
                // pass: every entry after it would wait forever. Skip it, say so, count it.
                Err(e) if e.downcast_ref::<StoreError>().is_some_and(StoreError::is_refusal_of_the_row) => {
                    tracing::error!(%event, level = %admission.level, slot = admission.slot, error = %e,
                        "reaper cannot settle a pending admission; skipped (see `seatrush status`)");
                    Stats::bump(&self.stats.reaper_skipped);
                    report.skipped += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match settled {
                Settled::Persisted => {
                    Stats::bump(&self.stats.reaper_persisted);
                    report.persisted += 1;
                }
                Settled::Undone => {
                    Stats::bump(&self.stats.reaper_released);
                    report.released += 1;
                }
                Settled::AlreadyGone => {}
            }
        }
        Ok(report)
    }

    /// Pending entries older than the persist timeout, judged by Redis's clock (the clock that
    /// stamped them): each entry's code and admission id, with the code's record.
    async fn stale_pending(&self, keys: &EventKeys) -> RedisResult<(i64, Vec<(CodeHash, String, Option<String>)>)> {
        let mut conn = self.link.shared().await?;
        let cutoff_ms = conn.now_ms(&keys.pending).await? - self.settings.persist_timeout.as_millis() as i64;
        let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(&keys.pending)
            .arg("-inf")
            .arg(cutoff_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(REAP_BATCH_MAX)
            .query_async(&mut conn)
            .await?;
        let (codes, ids): (Vec<CodeHash>, Vec<String>) = members
            .iter()
            .filter_map(|m| {
                let (code, id) = parse_pending_member(m)?;
                Some((CodeHash::from_hex(code)?, id.to_owned()))
            })
            .unzip();
        if codes.is_empty() {
            return Ok((cutoff_ms, Vec::new()));
        }
        let records: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&keys.adm)
            .arg(codes.iter().map(CodeHash::as_str).collect::<Vec<_>>())
            .query_async(&mut conn)
            .await?;
        Ok((cutoff_ms, codes.into_iter().zip(ids).zip(records).map(|((c, id), r)| (c, id, r)).collect()))
    }
}
