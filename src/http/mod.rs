//! The HTTP edge: routes, shared state, and the server loop. `serve(listener, app, shutdown)`
//! takes the listener and the shutdown future from the caller, so tests run the real server on
//! port 0.

pub mod bookings;
pub mod error;
pub mod operator;
mod page;

use crate::code::CodeHasher;
use crate::sale::Sale;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub sale: Arc<Sale>,
    pub hasher: CodeHasher,
    pub operator_token: Option<String>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(page::index))
        .route("/events/{event}", get(page::event_page))
        .route("/healthz", get(healthz))
        .route("/api/events/{event}", get(bookings::availability))
        .route("/api/events/{event}/bookings", post(bookings::create))
        .route("/api/events/{event}/bookings/{code}/payment", post(operator::pay))
        .route("/api/events/{event}/bookings/{code}/cancel", post(operator::cancel))
        .with_state(state)
}

async fn healthz(State(app): State<AppState>) -> impl IntoResponse {
    let redis_ok = match app.sale.link.shared().await {
        Ok(mut conn) => redis::cmd("PING").query_async::<String>(&mut conn).await.is_ok(),
        Err(_) => false,
    };
    let database_ok = app.sale.store.ping().await;
    let status = if redis_ok && database_ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(json!({ "status": if status == StatusCode::OK { "ok" } else { "degraded" }, "redis": redis_ok, "database": database_ok })))
}

/// Serves until `shutdown` resolves, then finishes the requests in flight.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}
