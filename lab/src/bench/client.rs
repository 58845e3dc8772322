//! One keep-alive HTTP/1.1 connection of the load tool, straight on hyper: no pool, no retries,
//! nothing between the measurement and the socket.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use std::net::SocketAddr;
use std::time::Duration;

/// Bound on one request, so a stalled server shows up as an error rather than a hung run.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the load goes: address, Host header, booking path, availability path, waiting-list
/// path.
#[derive(Clone, Debug)]
pub struct Target {
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
    pub availability_path: String,
    pub waitlist_path: String,
}

impl Target {
    /// `http://host:port` and an event id.
    pub async fn resolve(url: &str, event: &str) -> anyhow::Result<Self> {
        let host = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("--url must start with http:// (got {url:?})"))?;
        let host = host.trim_end_matches('/').to_owned();
        let addr =
            tokio::net::lookup_host(&host).await?.next().ok_or_else(|| anyhow::anyhow!("{host} does not resolve"))?;
        Ok(Self {
            addr,
            host,
            path: format!("/api/events/{event}/bookings"),
            availability_path: format!("/api/events/{event}"),
            waitlist_path: format!("/api/events/{event}/waitlist"),
        })
    }
}

pub struct Connection {
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Connection {
    pub fn new() -> Self {
        Self { sender: None }
    }

    /// Connects now, so the run's clock does not include connection set-up.
    pub async fn connect(&mut self, target: &Target) -> anyhow::Result<()> {
        self.sender(target).await.map(|_| ())
    }

    async fn sender(&mut self, target: &Target) -> anyhow::Result<&mut SendRequest<Full<Bytes>>> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(target.addr).await?;
            stream.set_nodelay(true)?;
            let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().expect("connected above"))
    }

    /// POSTs a JSON body; the status and the whole response body, or an error (the connection is
    /// then dropped and the next call reconnects).
    pub async fn post(&mut self, target: &Target, path: &str, body: String) -> anyhow::Result<(u16, Bytes)> {
        let request = hyper::Request::post(path)
            .header(HOST, &target.host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        self.bounded(target, request).await.map(|(status, _, body)| (status, body))
    }

    /// GETs the availability answer, revalidating `etag` when given; the status, the answer's
    /// `ETag` and its body.
    pub async fn poll(&mut self, target: &Target, etag: Option<&str>) -> anyhow::Result<(u16, Option<String>, Bytes)> {
        let mut request = hyper::Request::get(&target.availability_path).header(HOST, &target.host);
        if let Some(tag) = etag {
            request = request.header(hyper::header::IF_NONE_MATCH, tag);
        }
        self.bounded(target, request.body(Full::new(Bytes::new()))?).await
    }

    async fn bounded(
        &mut self,
        target: &Target,
        request: hyper::Request<Full<Bytes>>,
    ) -> anyhow::Result<(u16, Option<String>, Bytes)> {
        let result = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(target, request)).await;
        match result {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => {
                self.sender = None;
                Err(e)
            }
            Err(_) => {
                self.sender = None;
                anyhow::bail!("no answer within {REQUEST_TIMEOUT:?}")
            }
        }
    }

    async fn exchange(
        &mut self,
        target: &Target,
        request: hyper::Request<Full<Bytes>>,
    ) -> anyhow::Result<(u16, Option<String>, Bytes)> {
        let sender = self.sender(target).await?;
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let etag = response.headers().get(hyper::header::ETAG).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, etag, body))
    }
}

impl Default for Connection {
    fn default() -> Self {
        Self::new()
    }
}
