//! The audit trail of operator actions (payments and cancels): written as each one ends, read
//! back by `seatrush status`. Code hashes only, as everywhere.

use super::{on_pool, Store, StoreError};
use crate::domain::code::CodeHash;
use crate::domain::event::{now_ms, EventId};

/// One operator action as the trail keeps it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct AuditEntry {
    pub at_ms: i64,
    pub event_id: String,
    /// `payment`, `cancel`, `extend`, `lookup` (an operator's) or `webhook_payment` (a provider's).
    pub action: String,
    pub code_hash: String,
    /// The client address as the edge saw it (the peer, or a trusted proxy's `X-Forwarded-For`).
    pub client: String,
    /// `done`, `repeated` (a provider's retry), `not_found`, `released`, `already_paid`,
    /// `reference_used` or `database_unavailable`.
    pub outcome: String,
}

impl AuditEntry {
    /// An action that ended now.
    pub fn new(event: &EventId, action: &str, code: &CodeHash, client: &str, outcome: &str) -> Self {
        Self {
            at_ms: now_ms(),
            event_id: event.as_str().to_owned(),
            action: action.to_owned(),
            code_hash: code.as_str().to_owned(),
            client: client.to_owned(),
            outcome: outcome.to_owned(),
        }
    }
}

impl Store {
    pub async fn audit(&self, entry: &AuditEntry) -> Result<(), StoreError> {
        on_pool!(self, pool => {
            sqlx::query(
                "INSERT INTO audit_log (at_ms, event_id, action, code_hash, client, outcome) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(entry.at_ms).bind(&entry.event_id).bind(&entry.action).bind(&entry.code_hash)
            .bind(&entry.client).bind(&entry.outcome)
            .execute(pool).await?;
        });
        Ok(())
    }

    /// The event's last `limit` actions, newest first.
    pub async fn recent_audit(&self, event: &EventId, limit: i64) -> Result<Vec<AuditEntry>, StoreError> {
        on_pool!(self, pool => {
            Ok(sqlx::query_as(
                "SELECT at_ms, event_id, action, code_hash, client, outcome FROM audit_log
                 WHERE event_id = $1 ORDER BY id DESC LIMIT $2",
            )
            .bind(event.as_str()).bind(limit).fetch_all(pool).await?)
        })
    }
}
