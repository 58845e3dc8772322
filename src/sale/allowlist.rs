//! The allowlist gate answered from memory. The allowlist is fixed before a sale opens (only a
//! re-run of `open` changes it), so `serve` copies each event's code hashes out of Redis once,
//! as sorted 32-byte binary hashes (32 MB per million codes), and answers the gate with a binary
//! search instead of a round trip. The hashes are uniform, so their first two bytes index the
//! sorted array (a 256 KB table): a search looks at the ~15 hashes of one prefix, not at 20 cache
//! misses across the whole array (that search was 3 % of `serve`'s CPU with a million codes).
//! `open` stamps every load with a fresh `allow_version` in the event's meta hash; the catalog
//! re-reads meta every `CATALOG_TTL`, and a changed version makes the next gate check reload the
//! set. The copy comes from Redis, never from the database, so there is still no database
//! fallback during the sale. Codes an operator removes while the sale runs (`allowlist remove`)
//! are not a reason to copy the whole set again: meta's `allow_removed` moves, and the next gate
//! check reads the few removed hashes of this `allow_version` into a small set beside the copy.

use crate::domain::code::CodeHash;
use crate::domain::event::EventId;
use crate::redis_io::keys::EVENTS_KEY;
use crate::redis_io::link::RedisLink;
use crate::sale::catalog::{Catalog, EventView};
use redis::{RedisError, RedisResult};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// Members asked for per SSCAN call while copying a set.
const SCAN_COUNT: usize = 10_000;
/// Copies attempted before giving up when `open` keeps replacing the set under us.
const LOAD_ATTEMPTS_MAX: usize = 3;
/// SSCAN calls per copy; a million codes take about a hundred.
const SCAN_CALLS_MAX: usize = 100_000;

/// One event's allowlist as loaded by one `open`.
pub(crate) struct AllowSet {
    pub version: String,
    hashes: Vec<[u8; 32]>,
    /// `hashes[starts[p]..starts[p + 1]]` are the hashes whose first two bytes are `p`.
    starts: Vec<u32>,
}

/// Hash prefixes the index tells apart: the first two bytes.
const PREFIXES: usize = 1 << 16;

fn prefix(hash: &[u8; 32]) -> usize {
    usize::from(u16::from_be_bytes([hash[0], hash[1]]))
}

impl AllowSet {
    /// Builds the set from lowercase hex hashes; anything else is skipped (open only loads hashes).
    #[cfg(test)]
    fn from_hex<'a>(version: String, hex: impl IntoIterator<Item = &'a str>) -> Self {
        Self::from_binary(version, hex.into_iter().filter_map(decode).collect())
    }

    fn from_binary(version: String, mut hashes: Vec<[u8; 32]>) -> Self {
        hashes.sort_unstable();
        hashes.dedup();
        hashes.shrink_to_fit();
        let mut starts = vec![0u32; PREFIXES + 1];
        for hash in &hashes {
            starts[prefix(hash) + 1] += 1;
        }
        for p in 0..PREFIXES {
            starts[p + 1] += starts[p];
        }
        Self { version, hashes, starts }
    }

    pub(crate) fn contains(&self, code: &CodeHash) -> bool {
        decode(code.as_str()).is_some_and(|h| {
            let p = prefix(&h);
            let (from, to) = (self.starts[p] as usize, self.starts[p + 1] as usize);
            self.hashes[from..to].binary_search(&h).is_ok()
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.hashes.len()
    }
}

fn decode(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex, &mut out).ok()?;
    Some(out)
}

/// The codes removed from one `allow_version` of an event's allowlist, as of one removal count.
struct RemovedSet {
    allow_version: String,
    /// meta's `allow_removed` when the set was read.
    count: i64,
    hashes: HashSet<String>,
}

/// The in-memory sets of every event this process has checked a code for.
pub struct AllowCache {
    link: Arc<RedisLink>,
    sets: RwLock<HashMap<EventId, Arc<AllowSet>>>,
    removed: RwLock<HashMap<EventId, Arc<RemovedSet>>>,
    /// One copy at a time: a reload of a million codes should not run once per waiting request.
    loading: tokio::sync::Mutex<()>,
}

impl AllowCache {
    pub fn new(link: Arc<RedisLink>) -> Self {
        Self {
            link,
            sets: RwLock::new(HashMap::new()),
            removed: RwLock::new(HashMap::new()),
            loading: tokio::sync::Mutex::new(()),
        }
    }

    /// `Some(allowed)` from memory, or `None` when the event carries no `allow_version` (opened by
    /// an older seatrush), in which case the caller asks Redis.
    pub async fn contains(&self, view: &EventView, code: &CodeHash) -> RedisResult<Option<bool>> {
        let Some(version) = &view.allow_version else { return Ok(None) };
        let listed = self.listed(view, version, code).await?;
        if !listed || view.allow_removed == 0 {
            return Ok(Some(listed));
        }
        Ok(Some(!self.removed_since_open(view, version).await?.hashes.contains(code.as_str())))
    }

    /// On the copy of the set `open` loaded, removals not counted.
    async fn listed(&self, view: &EventView, version: &str, code: &CodeHash) -> RedisResult<bool> {
        if let Some(set) = self.current(&view.id, version) {
            return Ok(set.contains(code));
        }
        let _one_copy = self.loading.lock().await;
        if let Some(set) = self.current(&view.id, version) {
            return Ok(set.contains(code));
        }
        let set = self.load(view).await?;
        let allowed = set.contains(code);
        self.sets.write().expect("allowlist lock never poisoned").insert(view.id.clone(), set);
        Ok(allowed)
    }

    /// The codes removed from this `allow_version`, re-read when the view counts more removals
    /// than the copy held (a view older than the copy never makes it read again).
    async fn removed_since_open(&self, view: &EventView, version: &str) -> RedisResult<Arc<RemovedSet>> {
        let fresh = |set: &Arc<RemovedSet>| set.allow_version == version && set.count >= view.allow_removed;
        if let Some(set) =
            self.removed.read().expect("allowlist lock never poisoned").get(&view.id).filter(|s| fresh(s))
        {
            return Ok(set.clone());
        }
        let mut conn = self.link.shared().await?;
        // The count first: a removal landing between the two reads is in the hash, and only
        // makes the next check read again.
        let (count, removed): (Option<i64>, HashMap<String, String>) = redis::pipe()
            .hget(&view.keys.meta, "allow_removed")
            .hgetall(&view.keys.allow_removed)
            .query_async(&mut conn)
            .await?;
        let hashes = removed.into_iter().filter(|(_, v)| v == version).map(|(hash, _)| hash).collect();
        let set = Arc::new(RemovedSet { allow_version: version.to_owned(), count: count.unwrap_or(0), hashes });
        self.removed.write().expect("allowlist lock never poisoned").insert(view.id.clone(), set.clone());
        Ok(set)
    }

    fn current(&self, id: &EventId, version: &str) -> Option<Arc<AllowSet>> {
        let sets = self.sets.read().expect("allowlist lock never poisoned");
        sets.get(id).filter(|s| s.version == version).cloned()
    }

    /// Copies the set with SSCAN; the version read before and after must match and the copy must
    /// hold SCARD members, or `open` switched the set mid-copy and the copy is taken again.
    async fn load(&self, view: &EventView) -> RedisResult<Arc<AllowSet>> {
        let mut conn = self.link.shared().await?;
        for _ in 0..LOAD_ATTEMPTS_MAX {
            let before: Option<String> =
                redis::cmd("HGET").arg(&view.keys.meta).arg("allow_version").query_async(&mut conn).await?;
            // Decoded page by page: a million hex Strings at once would double the peak footprint.
            let mut members: Vec<[u8; 32]> = Vec::new();
            let mut cursor: u64 = 0;
            for _ in 0..SCAN_CALLS_MAX {
                let (next, page): (u64, Vec<String>) = redis::cmd("SSCAN")
                    .arg(&view.keys.allow)
                    .arg(cursor)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query_async(&mut conn)
                    .await?;
                members.extend(page.iter().filter_map(|h| decode(h)));
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            let (after, count): (Option<String>, usize) = redis::pipe()
                .hget(&view.keys.meta, "allow_version")
                .scard(&view.keys.allow)
                .query_async(&mut conn)
                .await?;
            let Some(version) = after.filter(|a| Some(a) == before.as_ref()) else { continue };
            let set = AllowSet::from_binary(version, members);
            if cursor == 0 && set.len() == count {
                tracing::info!(event = %view.id, codes = set.len(), "allowlist copied into memory");
                return Ok(Arc::new(set));
            }
        }
        Err(RedisError::from((redis::ErrorKind::Io, "allowlist kept changing while it was copied")))
    }
}

impl AllowCache {
    /// Copies the allowlist of every opened event before serving, so the first request of a sale
    /// does not wait for a million codes.
    pub async fn warm(&self, catalog: &Catalog) -> anyhow::Result<()> {
        let mut conn = self.link.shared().await?;
        let events: Vec<String> = redis::cmd("SMEMBERS").arg(EVENTS_KEY).query_async(&mut conn).await?;
        for id in events.iter().filter_map(|e| EventId::parse(e).ok()) {
            if let Some(view) = catalog.get(&id).await? {
                let probe = CodeHash::from_hex(&"0".repeat(64)).expect("64 hex digits");
                self.contains(&view, &probe).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::code::{CodeHasher, NormalisedCode};

    fn hash(code: &str) -> CodeHash {
        CodeHasher::plain().hash(&NormalisedCode::parse(code).unwrap())
    }

    #[test]
    fn a_set_holds_exactly_the_hashes_it_was_built_from() {
        let members = [hash("AAAA-1"), hash("BBBB-2"), hash("AAAA-1")];
        let set = AllowSet::from_hex("v1".into(), members.iter().map(|h| h.as_str()));
        assert_eq!(set.len(), 2);
        assert!(set.contains(&hash("AAAA-1")));
        assert!(set.contains(&hash("bbbb-2")));
        assert!(!set.contains(&hash("CCCC-3")));
    }

    #[test]
    fn the_prefix_index_answers_as_a_search_of_the_whole_set_would() {
        let codes: Vec<CodeHash> = (0..20_000).map(|i| hash(&format!("CODE-{i}"))).collect();
        let (members, strangers) = codes.split_at(10_000);
        let mut binary: Vec<[u8; 32]> = members.iter().filter_map(|h| decode(h.as_str())).collect();
        // The first and last prefixes, and one prefix crowded with neighbours.
        binary.extend([[0u8; 32], [0xff; 32], [0x12; 32]]);
        binary.extend((0..50u8).map(|i| {
            let mut h = [0x12; 32];
            h[31] = i;
            h
        }));
        let set = AllowSet::from_binary("v".into(), binary.clone());
        let whole: std::collections::BTreeSet<[u8; 32]> = binary.into_iter().collect();
        for h in whole.iter().chain(strangers.iter().filter_map(|c| decode(c.as_str())).collect::<Vec<_>>().iter()) {
            assert_eq!(
                set.contains(&CodeHash::from_hex(&hex::encode(h)).unwrap()),
                whole.contains(h),
                "{}",
                hex::encode(h)
            );
        }
        let mut near = [0x12; 32];
        near[31] = 200;
        assert!(!set.contains(&CodeHash::from_hex(&hex::encode(near)).unwrap()));
    }
}
