//! The HTTP edge: routes, shared state, and the server loop. `serve(listener, app, shutdown)`
//! takes the listener and the shutdown future from the caller, so tests run the real server on
//! port 0.
//!
//! Every API route is registered through [`api_router`], which documents it in the OpenAPI
//! document as it routes it; the pages are plain routes beside it.
//!
//! Under overload the edge answers rather than queues (`server.rs`): bodies are read under a
//! deadline before a request takes one of the process's `in_flight_max` permits, one more is
//! answered `503 retry` at once, and slow or idle connections time out; so a stalled database or
//! a crowd of trickling sockets parks a bounded amount of work and every other client gets a
//! fast answer.

pub(crate) mod availability;
pub(crate) mod bookings;
pub(crate) mod dashboard;
pub(crate) mod error;
pub mod guess_guard;
pub(crate) mod headers;
pub mod health;
pub(crate) mod metrics;
pub(crate) mod moving;
pub(crate) mod openapi;
pub(crate) mod operator;
mod page;
pub mod page_strings;
pub mod refusal_limit;
pub mod server;
pub(crate) mod sessions;
pub mod support;
pub(crate) mod waitlist;
pub mod webhook;

use crate::domain::code::CodeHasher;
use crate::sale::Sale;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequestParts};
use axum::http::request::Parts;
use axum::routing::get;
use axum::{Json, Router};
use ipnet::IpNet;
use refusal_limit::RefusalLimiter;
use secrecy::SecretString;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use utoipa::OpenApi;
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
    /// `SEATRUSH_PAYMENT_WEBHOOK_SECRET`: the key of the payment provider's signatures; None
    /// refuses every notice (`401`).
    pub payment_webhook_secret: Option<SecretString>,
    pub edge: Arc<Edge>,
    /// The booking page's words in every language it speaks.
    pub page_strings: Arc<page_strings::PageStrings>,
}

/// Settings of the HTTP edge (`serve` and `demo` flags).
#[derive(Clone, Debug)]
pub struct EdgeSettings {
    /// Code-revealing refusals a client address may get per minute before `429`; 0 = no limit.
    pub refusal_rate_per_minute: u32,
    /// Proxies whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<IpNet>,
    /// Requests handled at once in this process; one more is answered `503 retry` at once.
    pub in_flight_max: usize,
    /// Timeouts and the bound on open connections.
    pub connections: server::ConnectionLimits,
    /// When an address counts as a code guesser and is refused everything.
    pub guessing: guess_guard::GuessPolicy,
    /// Send `Strict-Transport-Security` (for operators who terminate TLS in front).
    pub hsts: bool,
}

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            refusal_rate_per_minute: 30,
            trusted_proxies: Vec::new(),
            in_flight_max: IN_FLIGHT_MAX_DEFAULT,
            connections: Default::default(),
            guessing: Default::default(),
            hsts: false,
        }
    }
}

/// What the edge keeps per process: the work bound, the refusal limiter and the guesser guard,
/// the availability snapshots and the readiness answer, the peak admission rate the dashboard
/// shows.
pub struct Edge {
    pub settings: EdgeSettings,
    pub in_flight: server::InFlight,
    pub refusals: RefusalLimiter,
    pub guesses: guess_guard::GuessGuard,
    pub availability: availability::AvailabilityCache,
    pub readiness: health::ReadinessCache,
    pub admitted_peak: dashboard::PeakRate,
}

impl Edge {
    pub fn new(settings: EdgeSettings) -> Arc<Self> {
        Arc::new(Self {
            in_flight: server::InFlight::new(settings.in_flight_max),
            refusals: RefusalLimiter::new(settings.refusal_rate_per_minute),
            guesses: guess_guard::GuessGuard::new(settings.guessing),
            readiness: Default::default(),
            availability: Default::default(),
            admitted_peak: Default::default(),
            settings,
        })
    }
}

/// The client's address (docs/design.md#client-address): the peer, or `X-Forwarded-For` from a
/// trusted proxy.
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
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
        .routes(routes!(availability::availability))
        .routes(routes!(bookings::create).layer(DefaultBodyLimit::max(bookings::BOOKING_BODY_BYTES_MAX)))
        .routes(routes!(waitlist::join).layer(DefaultBodyLimit::max(bookings::BOOKING_BODY_BYTES_MAX)))
        .routes(routes!(operator::pay))
        .routes(routes!(operator::cancel))
        .routes(routes!(operator::extend))
        .routes(routes!(moving::move_booking))
        .routes(routes!(support::lookup))
        .routes(routes!(webhook::webhook).layer(DefaultBodyLimit::max(webhook::WEBHOOK_BODY_BYTES_MAX)))
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
        .layer(axum::middleware::from_fn_with_state(state.clone(), server::read_then_admit))
        .layer(axum::middleware::from_fn_with_state(state.clone(), headers::protect))
        .with_state(state)
}

pub use server::serve;
