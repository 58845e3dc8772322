//! The HTTP edge: routes, shared state, and the server loop. `serve(listener, app, shutdown)`
//! takes the listener and the shutdown future from the caller, so tests run the real server on
//! port 0.
//!
//! Every API route is registered through [`api_router`], which documents it in the OpenAPI
//! document as it routes it; the pages are plain routes beside it.
//!
//! Under overload the edge answers rather than queues: at most `in_flight_max` requests run at
//! once in this process, and one more is answered `503 retry` with `Retry-After` at once (tower's
//! load-shed over its concurrency limit), so a stalled database parks a bounded number of
//! handlers and every other client gets a fast answer.

pub mod availability;
pub mod bookings;
pub mod dashboard;
pub mod error;
pub mod metrics;
pub mod openapi;
pub mod operator;
mod page;
pub mod refusal_limit;

use crate::domain::code::CodeHasher;
use crate::sale::Sale;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use ipnet::IpNet;
use refusal_limit::RefusalLimiter;
use secrecy::SecretString;
use serde::Serialize;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use tokio::net::TcpListener;
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

/// Requests one `serve` runs at once unless told otherwise; beyond it, `503 retry` at once.
pub const IN_FLIGHT_MAX_DEFAULT: usize = 1024;

/// What every handler can reach. axum clones the state for every request it routes, so it is one
/// `Arc`: a clone is one atomic increment, where the fields' own clones were several, an
/// allocation for a pepper and another for the operator token (zeroed again on every drop).
#[derive(Clone)]
pub struct AppState(Arc<App>);

impl AppState {
    pub fn new(app: App) -> Self {
        Self(Arc::new(app))
    }
}

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

/// The state's contents, shared by every request.
pub struct App {
    pub sale: Arc<Sale>,
    pub hasher: CodeHasher,
    pub operator_token: Option<SecretString>,
    /// Requests handled at once; one more is answered `503 retry` without waiting.
    pub in_flight_max: usize,
    pub edge: Arc<Edge>,
}

/// Settings of the HTTP edge (`serve` and `demo` flags).
#[derive(Clone, Debug)]
pub struct EdgeSettings {
    /// Code-revealing refusals a client address may get per minute before `429`; 0 = no limit.
    pub refusal_rate_per_minute: u32,
    /// Proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<IpNet>,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self { refusal_rate_per_minute: 30, trusted_proxies: Vec::new() }
    }
}

/// What the edge keeps per process: the refusal limiter, the availability snapshots, the peak
/// admission rate the dashboard shows.
pub struct Edge {
    pub settings: EdgeSettings,
    pub refusals: RefusalLimiter,
    pub availability: availability::AvailabilityCache,
    pub admitted_peak: dashboard::PeakRate,
}

impl Edge {
    pub fn new(settings: EdgeSettings) -> Arc<Self> {
        Arc::new(Self {
            refusals: RefusalLimiter::new(settings.refusal_rate_per_minute),
            availability: Default::default(),
            admitted_peak: Default::default(),
            settings,
        })
    }
}

/// The client's address as DESIGN defines it (peer, or `X-Forwarded-For` from a trusted proxy).
pub struct ClientAddr(pub IpAddr);

impl FromRequestParts<AppState> for ClientAddr {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Self::Rejection> {
        // Without connection info (a router driven in-process), every request is one client.
        let peer =
            parts.extensions.get::<ConnectInfo<SocketAddr>>().map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
        let forwarded: Vec<&str> =
            parts.headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok()).collect();
        Ok(ClientAddr(refusal_limit::client_address(peer, &forwarded, &app.edge.settings.trusted_proxies)))
    }
}

/// The documented routes, with the document they build.
pub fn api_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(metrics::metrics))
        .routes(routes!(availability::availability))
        .routes(routes!(bookings::create).layer(DefaultBodyLimit::max(bookings::BOOKING_BODY_BYTES_MAX)))
        .routes(routes!(operator::pay))
        .routes(routes!(operator::cancel))
        .routes(routes!(dashboard::summary))
}

pub fn router(state: AppState) -> Router {
    let (api, doc) = api_router().split_for_parts();
    let doc = Arc::new(doc);
    Router::new()
        .route("/", get(page::index))
        .route("/events/{event}", get(page::event_page))
        .route("/ops", get(dashboard::page))
        .route("/api/openapi.json", get(move || async move { Json(doc.as_ref().clone()) }))
        .merge(api)
        .with_state(state.clone())
        .layer(overload_layer(&state))
}

/// Load-shed over a concurrency limit: a request that finds every slot taken is answered
/// `503 retry` with `Retry-After` (our error body), never queued.
fn overload_layer(
    state: &AppState,
) -> impl tower::Layer<
    axum::routing::Route,
    Service: tower::Service<
        axum::extract::Request,
        Response = axum::response::Response,
        Error = std::convert::Infallible,
        Future: Send,
    > + Clone
                 + Send
                 + Sync
                 + 'static,
> + Clone
       + Send
       + Sync
       + 'static {
    let stats = state.sale.stats.clone();
    tower::ServiceBuilder::new()
        .layer(axum::error_handling::HandleErrorLayer::new(move |_: tower::BoxError| {
            let stats = stats.clone();
            async move {
                crate::sale::stats::Stats::bump(&stats.shed);
                error::ApiError::Retry("too many requests in flight")
            }
        }))
        .load_shed()
        .concurrency_limit(state.in_flight_max.max(1))
}

/// Whether this process can reach what a booking needs.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok` or `degraded`.
    #[schema(example = "ok")]
    status: &'static str,
    redis: bool,
    database: bool,
}

/// `GET /healthz`
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, description = "Redis and the database answer", body = Health),
        (status = 503, description = "Redis or the database does not answer", body = Health),
    ))]
async fn healthz(State(app): State<AppState>) -> (StatusCode, Json<Health>) {
    let redis_ok = match app.sale.link.shared().await {
        Ok(mut conn) => redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok(),
        Err(_) => false,
    };
    let database_ok = app.sale.store.ping().await;
    let healthy = redis_ok && database_ok;
    let status = if healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(Health { status: if healthy { "ok" } else { "degraded" }, redis: redis_ok, database: database_ok }))
}

/// Serves until `shutdown` resolves, then finishes the requests in flight.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}
