//! `/healthz` (liveness) and `/readyz` (readiness). A load balancer, or anyone, may poll them as
//! hard as it likes: liveness does no I/O at all, and readiness asks Redis and the database at
//! most once per [`READINESS_TTL`] per process, whatever the number of callers, on a Redis
//! connection and a database pool of its own, so polling never takes a connection that
//! bookings, payments or the reaper wait for.

use super::AppState;
use crate::redis_io::conn::RedisConn;
use crate::redis_io::link::RedisLink;
use crate::sale::stats::Stats;
use crate::store::Store;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use utoipa::ToSchema;

/// How long one readiness answer is reused.
pub const READINESS_TTL: Duration = Duration::from_secs(1);
/// How long each side of a readiness check may take.
const CHECK_TIMEOUT: Duration = Duration::from_millis(500);

/// Whether this process can reach what a booking needs.
#[derive(Clone, Copy, Serialize, ToSchema)]
pub struct Readiness {
    /// `ok` or `degraded`.
    #[schema(example = "ok")]
    status: &'static str,
    redis: bool,
    database: bool,
}

/// This process is up.
#[derive(Serialize, ToSchema)]
pub struct Liveness {
    /// Always `ok`.
    #[schema(example = "ok")]
    status: &'static str,
}

/// The last readiness answer and the connections it was read on.
pub struct ReadinessCache {
    state: Mutex<Cached>,
}

struct Cached {
    answer: Option<(Instant, Readiness)>,
    redis: Option<RedisConn>,
    database: Option<Store>,
}

impl Default for ReadinessCache {
    fn default() -> Self {
        Self { state: Mutex::new(Cached { answer: None, redis: None, database: None }) }
    }
}

impl ReadinessCache {
    /// The answer at most [`READINESS_TTL`] old; callers that arrive while it is being read wait
    /// for that one read.
    pub async fn get(&self, link: &Arc<RedisLink>, store: &Store, stats: &Stats) -> Readiness {
        let mut cached = self.state.lock().await;
        if let Some((at, answer)) = cached.answer {
            if at.elapsed() < READINESS_TTL {
                return answer;
            }
        }
        Stats::bump(&stats.readiness_checks);
        let redis = cached.check_redis(link).await;
        let database = cached.check_database(store).await;
        let answer = Readiness { status: if redis && database { "ok" } else { "degraded" }, redis, database };
        cached.answer = Some((Instant::now(), answer));
        answer
    }
}

impl Cached {
    async fn check_redis(&mut self, link: &RedisLink) -> bool {
        if self.redis.is_none() {
            self.redis =
                tokio::time::timeout(CHECK_TIMEOUT, link.connect(CHECK_TIMEOUT)).await.ok().and_then(Result::ok);
        }
        let Some(conn) = self.redis.as_mut() else { return false };
        let ok = redis::cmd("PING").query_async::<String>(conn).await.is_ok();
        if !ok {
            self.redis = None;
        }
        ok
    }

    async fn check_database(&mut self, store: &Store) -> bool {
        let own = self.database.get_or_insert_with(|| store.dedicated(1));
        tokio::time::timeout(CHECK_TIMEOUT, own.ping()).await.unwrap_or(false)
    }
}

/// `GET /healthz`
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "This process is up (no I/O: poll as often as you like)", body = Liveness)))]
pub async fn healthz() -> Json<Liveness> {
    Json(Liveness { status: "ok" })
}

/// `GET /readyz`
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Redis and the database answer (read at most once a second per process)", body = Readiness),
        (status = 503, description = "Redis or the database does not answer", body = Readiness),
    ))]
pub async fn readyz(State(app): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let answer = app.edge.readiness.get(app.sale.link(), app.sale.store(), app.sale.stats()).await;
    let status = if answer.redis && answer.database { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(answer))
}
