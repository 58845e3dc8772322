//! The accept loop and what protects it from slow or idle clients
//! (docs/design.md#timeouts-and-the-connection-cap, docs/design.md#the-in-flight-bound).
//!
//! `axum::serve` starts hyper without a timer, so no header timeout applies: a socket that sends
//! half a request head and then nothing stays open for good. Here each connection is served by
//! hyper's HTTP/1 builder with a Tokio timer and a header-read timeout. hyper arms that timer as
//! soon as the connection waits for a request head, so it is also the idle keep-alive timeout.
//!
//! The body is read in full, under its own deadline, *before* the request takes one of the
//! in-flight permits: a client that trickles its body holds a socket and a small buffer, never a
//! slot of the work bound. The work bound is one semaphore for the whole process, so a flood of
//! one route sheds the others too (a layer per route would give each its own copy).
//!
//! Open connections are bounded as well: past `connections_max` a new connection is accepted and
//! closed at once (and counted), so file descriptors run out for nobody else in the process.

use super::error::ApiError;
use super::AppState;
use crate::sale::stats::Stats;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Largest body any route accepts (the booking's is the largest); a longer one is refused before
/// more of it is buffered.
pub const BODY_BYTES_MAX: usize = super::bookings::BOOKING_BODY_BYTES_MAX;
/// How long an accept error (out of file descriptors, say) pauses the loop, so it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// How long a graceful shutdown waits for open connections before dropping them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Limits of the connection layer (`serve` flags; [`super::EdgeSettings`]).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Time to send a whole request head, and the most a kept-alive connection may sit idle.
    pub header_read_timeout: Duration,
    /// Time to send a whole request body once its head has arrived.
    pub body_read_timeout: Duration,
    /// Connections open at once; one more is closed as soon as it is accepted.
    pub connections_max: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            connections_max: 16_384,
        }
    }
}

/// Serves until `shutdown` resolves, then lets open connections finish (at most
/// [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.edge.settings.connections;
    let stats = state.sale.stats.clone();
    let router = super::router(state);
    let open = Arc::new(Semaphore::new(limits.connections_max.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = open.clone().try_acquire_owned() else {
            Stats::bump(&stats.connections_refused);
            drop(stream);
            continue;
        };
        let service = connection_service(router.clone(), peer);
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A connection's own error (a reset, a header timeout) is the client's business.
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open {}s after shutdown; dropping them", SHUTDOWN_GRACE.as_secs());
    }
    Ok(())
}

/// The router for one connection, with its peer address where `ConnectInfo` finds it.
fn connection_service(
    router: Router,
    peer: SocketAddr,
) -> TowerToHyperService<
    impl tower::Service<
            Request<hyper::body::Incoming>,
            Response = Response,
            Error = std::convert::Infallible,
            Future: Send,
        > + Clone,
> {
    let service = tower::ServiceExt::map_request(router, move |mut request: Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        request.map(Body::new)
    });
    TowerToHyperService::new(service)
}

/// The process's one bound on work in flight: `permits` requests at once; one more is answered
/// `503 retry` at once, never queued.
pub struct InFlight {
    permits: Arc<Semaphore>,
}

impl InFlight {
    pub fn new(permits: usize) -> Self {
        Self { permits: Arc::new(Semaphore::new(permits.max(1))) }
    }

    /// Permits free now (for tests and the dashboard).
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }
}

/// Middleware over every route: read the body under its deadline, then take an in-flight permit
/// for the handler. Reading first is the point: a trickled body holds no permit.
pub async fn read_then_admit(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let deadline = app.edge.settings.connections.body_read_timeout;
    let bytes = match tokio::time::timeout(deadline, axum::body::to_bytes(body, BODY_BYTES_MAX)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(err)) if is_length_limit(&err) => {
            return ApiError::InvalidRequest(format!("body over {BODY_BYTES_MAX} bytes")).into_response()
        }
        Ok(Err(_)) => return ApiError::InvalidRequest("the body could not be read".into()).into_response(),
        Err(_) => {
            Stats::bump(&app.sale.stats.body_timeouts);
            return ApiError::BodyTimeout.into_response();
        }
    };
    let Ok(_permit) = app.edge.in_flight.permits.try_acquire() else {
        Stats::bump(&app.sale.stats.shed);
        return ApiError::Retry("too many requests in flight").into_response();
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

fn is_length_limit(err: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Raises this process's open-file limit to its hard limit, so `connections_max` sockets fit;
/// returns the limit now in force.
pub fn raise_open_file_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}
