//! A loopback TCP proxy in front of one `serve` that loses replies on purpose: it forwards the
//! request, lets the server do the work, and then — with the configured probability — closes the
//! client's connection instead of forwarding the response. The client sees a lost reply and must
//! retry with its nonce.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes read at once from either side.
const CHUNK_BYTES: usize = 16 * 1024;

/// The proxy's dial: per-million chance of dropping a reply, and how many it dropped.
#[derive(Debug, Default)]
pub struct LossDial {
    drop_per_million: AtomicU32,
    pub dropped: AtomicU64,
}

impl LossDial {
    pub fn set(&self, probability: f64) {
        self.drop_per_million.store((probability.clamp(0.0, 1.0) * 1e6) as u32, Ordering::Relaxed);
    }

    fn roll(&self) -> bool {
        rand::random_range(0..1_000_000) < self.drop_per_million.load(Ordering::Relaxed)
    }
}

/// Listens on a free loopback port and proxies to `upstream`; returns the proxy's address.
pub async fn start(upstream: String, dial: Arc<LossDial>) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, dial) = (upstream.clone(), dial.clone());
            tokio::spawn(async move {
                if let Ok(server) = TcpStream::connect(&upstream).await {
                    let _ = relay(client, server, dial).await;
                }
            });
        }
    });
    Ok(addr)
}

async fn relay(client: TcpStream, server: TcpStream, dial: Arc<LossDial>) -> std::io::Result<()> {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = client_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            server_write.write_all(&buf[..n]).await?;
        }
    };
    let downstream = async {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = server_read.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            // The server answered: the request was done. Lose the answer, sometimes.
            if dial.roll() {
                dial.dropped.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            client_write.write_all(&buf[..n]).await?;
        }
    };
    // Whichever side ends first ends the connection (dropping both halves closes the sockets).
    tokio::select! {
        r = upstream => r,
        r = downstream => r,
    }
}

/// The switch of a link proxy: while it is off, the proxy reads nothing from either side, so the
/// bytes stay where a cut network would leave them (the senders' buffers) while both ends run.
#[derive(Debug)]
pub struct LinkSwitch(tokio::sync::watch::Sender<bool>);

impl LinkSwitch {
    /// Stops (false) or restores (true) forwarding on every connection of the proxy.
    pub fn forward(&self, on: bool) {
        self.0.send_replace(on);
    }
}

/// A plain two-way proxy to `upstream` (a Redis replica's link to its primary) with a switch
/// instead of a loss dial. Returns the proxy's address, its switch, and the accept loop's handle
/// (abort it to stop taking new connections).
pub async fn start_link(upstream: String) -> std::io::Result<(String, Arc<LinkSwitch>, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let switch = Arc::new(LinkSwitch(tokio::sync::watch::Sender::new(true)));
    let on = switch.clone();
    let accept = tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (upstream, on) = (upstream.clone(), on.0.subscribe());
            tokio::spawn(async move {
                if let Ok(server) = TcpStream::connect(&upstream).await {
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::select! {
                        _ = pump(client_read, server_write, on.clone()) => {}
                        _ = pump(server_read, client_write, on) => {}
                    }
                }
            });
        }
    });
    Ok((addr, switch, accept))
}

/// Copies one direction, reading only while the switch is on.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut on: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        if on.wait_for(|on| *on).await.is_err() {
            return Ok(());
        }
        // A read waiting when the switch goes off is abandoned (reads are cancel-safe), so
        // nothing that arrives during the cut is carried; a chunk already read waits for the heal.
        let n = tokio::select! {
            n = from.read(&mut buf) => n?,
            _ = on.wait_for(|on| !*on) => continue,
        };
        if n == 0 {
            return Ok(());
        }
        if on.wait_for(|on| *on).await.is_err() {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}
