//! Redis key names. Every key of an event carries the event in a hash tag (`{ev:ID}`), so all the
//! keys one script touches sit on one shard of a Redis Cluster.

use crate::domain::event::EventId;

/// Set of event ids that `open` has loaded, so `serve` can find events opened after it started.
pub const EVENTS_KEY: &str = "seatrush:events";

/// The keys of one event.
#[derive(Clone, Debug)]
pub struct EventKeys {
    /// hash: total_seats, hold_seconds, opens_at_ms, closes_at_ms, state, opened_at_ms,
    /// allow_version, generation (bumped by every `open` switch and every `close`)
    pub meta: String,
    /// set of code hashes allowed to book
    pub allow: String,
    /// hash: code hash -> the allow_version it was removed from during the sale
    /// (`lua/allow_remove.lua`); meta's `allow_removed` counts the removals
    pub allow_removed: String,
    /// hash: level -> cap
    pub cap: String,
    /// hash: level -> seats held (pending, persisted or paid)
    pub taken: String,
    /// zset of free seat numbers, score = seat number
    pub free: String,
    /// hash: code hash -> "nonce admission-id slot level admitted-ms"
    pub adm: String,
    /// zset: "code-hash admission-id" ([`pending_member`]) -> admitted-ms, admissions not yet in
    /// the database
    pub pending: String,
    /// counter of release-script runs; each run writes it so its WAIT covers the release
    pub syncs: String,
    /// string: the operator command that holds the event (owner), with an expiry
    pub lock: String,
    /// hash: code hash -> the levels it may book, space-separated; only codes the allowlist
    /// restricts (absent when none is)
    pub levels: String,
    /// hash: the draw at the opening: decides_at_ms, commitment, secret, state
    /// (docs/design.md#the-draw-at-the-opening)
    pub draw: String,
    /// hash: code hash -> "nonce level", the draw's entries
    pub entries: String,
    /// hash: code hash -> "rank outcome", the entries the draw decided
    pub drawn: String,
    /// string: the serve running the draw (owner), with an expiry
    pub drawlock: String,
    /// hash: code hash -> "move-id nonce admission-id old-slot old-level new-slot new-level",
    /// a move Redis made and the database has not yet settled (`lua/move.lua`)
    pub moves: String,
    /// zset: code hash -> when its move began (Redis's clock), for the settle of a move left behind
    pub moving: String,
    /// zset, every score 0: "LEVEL SEQ CODE-HASH", the waiting list, one lexical range per level
    /// in join order (`lua/waitlist.lua`, `lua/with_offer.lua`)
    pub waitq: String,
    /// hash: code hash -> "nonce level seq joined-ms", the waiters
    pub waiters: String,
    /// string: the last join's sequence number
    pub waitseq: String,
    /// list: offers made outside a `serve` (`lua/amend.lua`), for the next reaper pass of a
    /// `serve` to take and book, each "CODE-HASH NONCE ADMISSION-ID SLOT LEVEL ADMITTED-MS JOINED-MS"
    pub adopt: String,
}

impl EventKeys {
    pub fn new(event: &EventId) -> Self {
        let tag = format!("{{ev:{}}}", event.as_str());
        Self {
            meta: format!("{tag}:meta"),
            allow: format!("{tag}:allow"),
            allow_removed: format!("{tag}:allow_removed"),
            cap: format!("{tag}:cap"),
            taken: format!("{tag}:taken"),
            free: format!("{tag}:free"),
            adm: format!("{tag}:adm"),
            pending: format!("{tag}:pending"),
            syncs: format!("{tag}:syncs"),
            lock: format!("{tag}:lock"),
            levels: format!("{tag}:levels"),
            draw: format!("{tag}:draw"),
            entries: format!("{tag}:entries"),
            drawn: format!("{tag}:drawn"),
            drawlock: format!("{tag}:drawlock"),
            moves: format!("{tag}:moves"),
            moving: format!("{tag}:moving"),
            waitq: format!("{tag}:waitq"),
            waiters: format!("{tag}:waiters"),
            waitseq: format!("{tag}:waitseq"),
            adopt: format!("{tag}:adopt"),
        }
    }

    /// The keys lua/with_offer.lua reads beside a script's own, in the order the scripts that
    /// splice it take them: meta, waitq, waiters, allow, cap.
    pub fn offer_keys(&self) -> [&str; 5] {
        [&self.meta, &self.waitq, &self.waiters, &self.allow, &self.cap]
    }

    /// Where one `open` run builds a key before the atomic switch renames it into place; `run`
    /// is unique per run, so two runs never stage into the same key.
    pub fn staged(key: &str, run: &str) -> String {
        format!("{key}:staged:{run}")
    }
}

/// A pending entry's name: the code hash and the admission id. Named by the admission, an entry
/// can only be dropped by its own admission's mark, so the database writer's mark is a plain
/// `ZREM` with no record to read (a script reading each mark's record cost about a fifth of an
/// admission's instructions on the primary: issue 32). Every script that writes or removes a
/// record's admission writes or removes this entry in the same call, so an entry always names its
/// code's record.
pub fn pending_member(code: &str, admission_id: &str) -> String {
    format!("{code} {admission_id}")
}

/// A pending entry's code hash and admission id (code hashes and admission ids have no spaces).
pub fn parse_pending_member(member: &str) -> Option<(&str, &str)> {
    member.split_once(' ').filter(|(code, id)| !code.is_empty() && !id.is_empty() && !id.contains(' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_shares_the_event_hash_tag() {
        let keys = EventKeys::new(&EventId::parse("spring-exam").unwrap());
        for key in [
            &keys.meta,
            &keys.allow,
            &keys.allow_removed,
            &keys.cap,
            &keys.taken,
            &keys.free,
            &keys.adm,
            &keys.pending,
            &keys.syncs,
            &keys.lock,
            &keys.levels,
            &keys.draw,
            &keys.entries,
            &keys.drawn,
            &keys.drawlock,
            &keys.moves,
            &keys.moving,
            &keys.waitq,
            &keys.waiters,
            &keys.waitseq,
            &keys.adopt,
        ] {
            assert!(key.starts_with("{ev:spring-exam}:"), "{key}");
        }
        assert!(EventKeys::staged(&keys.allow, "r1").starts_with("{ev:spring-exam}:"));
        assert_ne!(EventKeys::staged(&keys.allow, "r1"), EventKeys::staged(&keys.allow, "r2"));
    }
}
