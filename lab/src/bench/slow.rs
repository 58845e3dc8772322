//! Slow clients beside the load (`bench --slow-connections N`): N sockets that each send a
//! booking's head and one byte of its body, then nothing, the way a slowloris script does; when
//! the server gives up on one (`408` after its body deadline) it connects again, so N stay open
//! for the whole run. The bench's own clients then show what the crowd gets while they are there.

use super::client::Target;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The slow sockets while they run, and how often the server closed one.
pub struct SlowClients {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    reconnects: Arc<AtomicU64>,
}

impl SlowClients {
    /// Opens `n` slow connections to `target` and keeps them open until [`SlowClients::stop`].
    pub async fn start(target: &Target, n: usize) -> Self {
        let stop = CancellationToken::new();
        let reconnects = Arc::new(AtomicU64::new(0));
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
            target.path, target.host
        );
        let mut tasks = Vec::with_capacity(n);
        for _ in 0..n {
            let (stop, reconnects, head, addr) = (stop.clone(), reconnects.clone(), head.clone(), target.addr);
            tasks.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    if let Ok(mut stream) = TcpStream::connect(addr).await {
                        if stream.write_all(head.as_bytes()).await.is_ok() {
                            let mut sink = [0u8; 512];
                            tokio::select! {
                                _ = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} } => {}
                                () = stop.cancelled() => return,
                            }
                        }
                    }
                    reconnects.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }));
        }
        // Let them connect before the measured load starts.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        Self { stop, tasks, reconnects }
    }

    /// Closes them all; how many times the server had closed one meanwhile.
    pub async fn stop(self) -> u64 {
        self.stop.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
        self.reconnects.load(Ordering::Relaxed)
    }
}
