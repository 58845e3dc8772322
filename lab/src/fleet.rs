//! A fleet of real `seatrush serve` processes on loopback ports, as behind a load balancer,
//! each restarted when it dies. The crash tests and the fault runner use it to kill processes
//! mid-burst (by SIGKILL from outside, or by the injected crashes of `faults.rs`) and show that
//! nothing leaks.

use anyhow::{bail, Context};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// How long a `serve` may take to answer `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the supervisor looks for dead members.
const SUPERVISE_INTERVAL: Duration = Duration::from_millis(25);

/// How to start each member.
#[derive(Clone, Debug)]
pub struct ServeSpec {
    /// The `seatrush` binary.
    pub bin: PathBuf,
    /// `SEATRUSH_*` settings shared by every member (the listen address is added per member).
    pub env: Vec<(String, String)>,
    /// Where each member's stderr goes (`serve-<port>.log`, appended across restarts).
    pub log_dir: PathBuf,
}

struct Member {
    port: u16,
    child: Option<Child>,
    /// A member that keeps dying at start-up (Redis or the database down) is restarted at most
    /// once per RESTART_GAP.
    last_start: Instant,
}

const RESTART_GAP: Duration = Duration::from_millis(250);

/// Counts of what happened to the fleet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FleetReport {
    /// Members that died by SIGKILL (injected crashes and external kills alike).
    pub killed: usize,
    /// Members that exited any other way.
    pub exited: usize,
    pub restarts: usize,
}

pub struct Fleet {
    spec: ServeSpec,
    members: Arc<Mutex<Vec<Member>>>,
    killed: Arc<AtomicUsize>,
    exited: Arc<AtomicUsize>,
    restarts: Arc<AtomicUsize>,
    stop: CancellationToken,
    supervisor: Option<tokio::task::JoinHandle<()>>,
}

fn spawn(spec: &ServeSpec, port: u16) -> anyhow::Result<Child> {
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(spec.log_dir.join(format!("serve-{port}.log")))?;
    let mut cmd = Command::new(&spec.bin);
    cmd.arg("serve").envs(spec.env.iter().cloned()).env("SEATRUSH_LISTEN", format!("127.0.0.1:{port}"));
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::from(log));
    seatrush::demo::redis_server::spawn_tied(cmd).with_context(|| format!("starting {}", spec.bin.display()))
}

/// Polls `/readyz` until it answers 200.
pub async fn wait_healthy(url: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(1)).build()?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("{url} not healthy after {READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Fleet {
    /// Starts `n` members, waits until each is healthy, and keeps restarting the ones that die.
    pub async fn start(spec: ServeSpec, n: usize) -> anyhow::Result<Self> {
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            let port = seatrush::demo::redis_server::free_port()?;
            members.push(Member { port, child: Some(spawn(&spec, port)?), last_start: Instant::now() });
        }
        for m in &members {
            wait_healthy(&format!("http://127.0.0.1:{}", m.port)).await?;
        }
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let mut fleet = Self {
            spec,
            members: Arc::new(Mutex::new(members)),
            killed: Arc::default(),
            exited: Arc::default(),
            restarts: Arc::default(),
            stop,
            supervisor: None,
        };
        fleet.supervisor = Some(tokio::spawn(fleet.supervise(stopped)));
        Ok(fleet)
    }

    fn supervise(&self, stopped: CancellationToken) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (spec, members) = (self.spec.clone(), self.members.clone());
        let (killed, exited, restarts) = (self.killed.clone(), self.exited.clone(), self.restarts.clone());
        async move {
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tokio::time::sleep(SUPERVISE_INTERVAL) => {}
                }
                let mut members = members.lock().expect("fleet lock");
                for m in members.iter_mut() {
                    if let Some(child) = m.child.as_mut() {
                        let Ok(Some(status)) = child.try_wait() else { continue };
                        use std::os::unix::process::ExitStatusExt;
                        if status.signal() == Some(libc::SIGKILL) {
                            killed.fetch_add(1, Ordering::Relaxed);
                        } else {
                            exited.fetch_add(1, Ordering::Relaxed);
                        }
                        m.child = None;
                    }
                    if m.last_start.elapsed() >= RESTART_GAP {
                        m.child = spawn(&spec, m.port).ok();
                        m.last_start = Instant::now();
                        restarts.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.members.lock().expect("fleet lock").iter().map(|m| format!("http://127.0.0.1:{}", m.port)).collect()
    }

    /// SIGKILLs member `i` from outside; the supervisor restarts it.
    pub fn kill(&self, i: usize) {
        let members = self.members.lock().expect("fleet lock");
        if let Some(child) = members.get(i % members.len().max(1)).and_then(|m| m.child.as_ref()) {
            // SAFETY: kill(2) on our own child's pid.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
            }
        }
    }

    pub fn report(&self) -> FleetReport {
        FleetReport {
            killed: self.killed.load(Ordering::Relaxed),
            exited: self.exited.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
        }
    }

    /// Stops supervising and kills every member.
    pub async fn shutdown(mut self) -> FleetReport {
        self.stop.cancel();
        if let Some(s) = self.supervisor.take() {
            let _ = s.await;
        }
        self.kill_all();
        self.report()
    }

    fn kill_all(&self) {
        let mut members = self.members.lock().expect("fleet lock");
        for m in members.iter_mut() {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop.cancel();
        self.kill_all();
    }
}
