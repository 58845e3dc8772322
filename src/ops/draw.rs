//! The draw at the opening from the operator's side (docs/design.md#the-draw-at-the-opening): the
//! commitment `open` makes, the loop every `serve` runs to draw when the window closes, and
//! `seatrush draw verify`, which anyone with the database's record can run.

use crate::domain::draw;
use crate::domain::event::{EventId, EventSpec};
use crate::redis_io::conn::RedisConn;
use crate::redis_io::keys::EventKeys;
use crate::sale::draw::DrawRun;
use crate::sale::Sale;
use crate::store::{Store, StoredDraw};
use std::sync::Arc;
use std::time::Duration;

/// How often a `serve` looks for a draw that is due.
pub const DRAW_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// At `open`, before the switch makes the event visible: the secret the database already holds
/// for this event (a re-open) or a fresh one, stored there first, then the draw's hash in Redis.
/// The state of a draw already under way or done is left as it is. An event without a draw loses
/// any draw hash an earlier configuration left.
pub async fn commit_at_open(
    conn: &mut RedisConn,
    store: &Store,
    spec: &EventSpec,
) -> anyhow::Result<Option<StoredDraw>> {
    let keys = EventKeys::new(&spec.id);
    let Some(decides_at_ms) = spec.decides_at_ms() else {
        redis::cmd("DEL").arg(&keys.draw).query_async::<()>(conn).await?;
        return Ok(None);
    };
    let secret = draw::fresh_secret();
    let stored = store.commit_draw(&spec.id, &secret, &draw::commitment(&secret)).await?;
    redis::cmd("HSET")
        .arg(&keys.draw)
        .arg("decides_at_ms")
        .arg(decides_at_ms)
        .arg("commitment")
        .arg(&stored.commitment)
        .arg("secret")
        .arg(&stored.secret)
        .query_async::<()>(conn)
        .await?;
    Ok(Some(stored))
}

/// Runs until `shutdown` resolves: every [`DRAW_CHECK_INTERVAL`], each loaded event whose draw is
/// due and not done by this host's clock is drawn (if no other serve holds its lock).
pub async fn run(sale: Arc<Sale>, shutdown: impl std::future::Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(DRAW_CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        let events = match sale.store().open_events().await {
            Ok(events) => events,
            Err(e) => {
                tracing::debug!(error = %e, "cannot list the open events for the draw");
                continue;
            }
        };
        for id in events {
            let due = match sale.catalog().get(&id).await {
                Ok(Some(view)) => {
                    view.draw.as_ref().is_some_and(|d| !d.done && d.decides_at_ms <= crate::domain::event::now_ms())
                }
                _ => false,
            };
            if !due {
                continue;
            }
            match sale.run_draw(&id).await {
                Ok(DrawRun::Done { entries }) => tracing::info!(event = %id, entries, "draw done"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(event = %id, error = %e, "the draw stopped; the next check goes on from its marks")
                }
            }
        }
    }
}

/// What `draw verify` found wrong, first difference only.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("event {0} has no draw in the database")]
    NoDraw(String),
    #[error("the draw of {0} is not done yet: its secret is not published")]
    NotDone(String),
    #[error("the secret does not match the commitment published at open: SHA-256(secret) = {computed}, committed {committed}")]
    Commitment { computed: String, committed: String },
    #[error("rank {rank}: the draw used {used}, the recomputation gives {recomputed}")]
    Order { rank: i64, used: String, recomputed: String },
    #[error("the recorded ranks are not 1..{0} in order")]
    Ranks(usize),
}

/// The checks of `draw verify`, on the database's record: the secret hashes to the commitment,
/// and the order recomputed from the secret and the recorded code hashes is the recorded one.
pub fn verify_record(
    event: &EventId,
    stored: Option<&StoredDraw>,
    used: &[crate::store::DrawnEntry],
) -> Result<usize, VerifyError> {
    let stored = stored.ok_or_else(|| VerifyError::NoDraw(event.to_string()))?;
    if stored.drawn_ms.is_none() {
        return Err(VerifyError::NotDone(event.to_string()));
    }
    let computed = draw::commitment(&stored.secret);
    if computed != stored.commitment {
        return Err(VerifyError::Commitment { computed, committed: stored.commitment.clone() });
    }
    if used.iter().enumerate().any(|(i, e)| e.rank != i as i64 + 1) {
        return Err(VerifyError::Ranks(used.len()));
    }
    let codes: Vec<&str> = used.iter().map(|e| e.code_hash.as_str()).collect();
    let recomputed = draw::order(&stored.secret, &codes);
    for (entry, code) in used.iter().zip(&recomputed) {
        if entry.code_hash != *code {
            return Err(VerifyError::Order {
                rank: entry.rank,
                used: entry.code_hash.clone(),
                recomputed: code.clone(),
            });
        }
    }
    Ok(used.len())
}

/// `seatrush draw verify --event ID`: exit 0 with a summary, or the first difference (exit 1).
pub async fn verify(store: &Store, event: &EventId) -> anyhow::Result<()> {
    let stored = store.draw(event).await?;
    let used = store.drawn_entries(event).await?;
    let entries = verify_record(event, stored.as_ref(), &used)?;
    let stored = stored.expect("verified");
    println!("draw of {event}: verified");
    println!("  commitment (published at open): {}", stored.commitment);
    println!("  secret (published after the draw): {}", stored.secret);
    println!("  {entries} entries; the order recomputed from the secret and their code hashes is the order used");
    for e in used.iter().take(10) {
        println!("  {:>6}  {}  {}", e.rank, e.code_hash, e.outcome);
    }
    if used.len() > 10 {
        println!("  … {} more", used.len() - 10);
    }
    Ok(())
}

/// The draw's lines of `seatrush status`.
pub async fn status_lines(store: &Store, spec: &EventSpec) -> anyhow::Result<Vec<String>> {
    let Some(decides_at_ms) = spec.decides_at_ms() else { return Ok(vec![]) };
    let at = crate::domain::event::rfc3339_ms(decides_at_ms);
    Ok(match store.draw(&spec.id).await? {
        None => vec![format!("draw: decides at {at}; no commitment yet (made by open)")],
        Some(d) => {
            let mut lines = vec![format!("draw: decides at {at}, commitment {}", d.commitment)];
            if let Some(done) = d.drawn_ms {
                lines.push(format!(
                    "draw: done at {}, secret {} (check with `seatrush draw verify --event {}`)",
                    crate::domain::event::rfc3339_ms(done),
                    d.secret,
                    spec.id
                ));
            }
            lines
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DrawnEntry;

    fn record(secret: &str, codes: &[String]) -> (StoredDraw, Vec<DrawnEntry>) {
        let used = draw::order(secret, codes)
            .into_iter()
            .enumerate()
            .map(|(i, code_hash)| DrawnEntry { rank: i as i64 + 1, code_hash, outcome: "admitted".into() })
            .collect();
        (StoredDraw { secret: secret.into(), commitment: draw::commitment(secret), drawn_ms: Some(1) }, used)
    }

    #[test]
    fn a_changed_order_or_secret_fails_verification() {
        let event = EventId::parse("exam").unwrap();
        let codes: Vec<String> = (0..8).map(|i| format!("{i:064x}")).collect();
        let secret = draw::fresh_secret();
        let (stored, used) = record(&secret, &codes);
        assert_eq!(verify_record(&event, Some(&stored), &used), Ok(8));

        let mut swapped = used.clone();
        let (a, b) = (swapped[0].code_hash.clone(), swapped[1].code_hash.clone());
        swapped[0].code_hash = b;
        swapped[1].code_hash = a;
        assert!(matches!(verify_record(&event, Some(&stored), &swapped), Err(VerifyError::Order { rank: 1, .. })));

        // Another secret (one the operator re-drew until a favourite won) does not match the
        // commitment; and its own order, committed afresh, is not the order of the first.
        let other = StoredDraw { secret: draw::fresh_secret(), ..stored.clone() };
        assert!(matches!(verify_record(&event, Some(&other), &used), Err(VerifyError::Commitment { .. })));
        let recommitted = StoredDraw { commitment: draw::commitment(&other.secret), ..other };
        assert!(matches!(verify_record(&event, Some(&recommitted), &used), Err(VerifyError::Order { .. })));

        let undone = StoredDraw { drawn_ms: None, ..stored };
        assert!(matches!(verify_record(&event, Some(&undone), &used), Err(VerifyError::NotDone(_))));
        assert!(matches!(verify_record(&event, None, &used), Err(VerifyError::NoDraw(_))));
    }
}
