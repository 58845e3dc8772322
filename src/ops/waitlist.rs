//! The waiting list in `seatrush status` (docs/design.md#the-waiting-list): per level, how many
//! wait (Redis) and how many offers were made and are held now (the database).

use crate::domain::event::EventSpec;
use crate::redis_io::keys::EventKeys;
use crate::store::Store;

/// The lines `status` prints; none for an event nobody waited for.
pub async fn status_lines(
    conn: &mut crate::redis_io::conn::RedisConn,
    store: &Store,
    spec: &EventSpec,
) -> anyhow::Result<Vec<String>> {
    let keys = EventKeys::new(&spec.id);
    let mut pipe = redis::pipe();
    for level in spec.levels.keys() {
        pipe.cmd("ZLEXCOUNT").arg(&keys.waitq).arg(format!("[{level} ")).arg(format!("({level}!"));
    }
    let waiting: Vec<i64> = pipe.query_async(conn).await?;
    let offers = store.offer_counts(&spec.id).await?;
    if waiting.iter().all(|w| *w == 0) && offers.is_empty() {
        return Ok(Vec::new());
    }
    let mut lines = vec![format!("{:<12} {:>9} {:>9} {:>9}", "waiting list", "waiting", "offered", "holding")];
    for (level, waiting) in spec.levels.keys().zip(waiting) {
        let (offered, holding) = offers.get(level.as_str()).copied().unwrap_or((0, 0));
        lines.push(format!("{level:<12} {waiting:>9} {offered:>9} {holding:>9}"));
    }
    Ok(lines)
}
