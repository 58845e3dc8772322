//! Private `redis-server` processes, for `seatrush demo`, the lab (bench, fault runner) and the tests: a
//! primary, replicas and Sentinels on free loopback ports, data in a temp dir, killed on `Drop`
//! (and, through PR_SET_PDEATHSIG, when this process dies). Start-up is polled with a bound, and a
//! server that fails to start has its log printed. With [`RedisTls`] a server (or Sentinel) takes
//! TLS connections only, replicates over TLS, and is reached here through `rediss://`.

use super::temp_dir::TempDir;
use anyhow::{bail, Context};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer PING, or a replica to finish its first sync.
const START_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// Options for one server.
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// `maxmemory`, e.g. "2mb"; None for unlimited.
    pub maxmemory: Option<String>,
    /// `maxmemory-policy`; noeviction unless a test wants to see `open` refuse another.
    pub maxmemory_policy: Option<String>,
    /// Port of the primary this server replicates.
    pub replica_of: Option<u16>,
    /// Extra `--name value` pairs.
    pub extra: Vec<(String, String)>,
    /// A fixed port (to bring a killed server back where Sentinel expects it); else a free one.
    pub port: Option<u16>,
    /// TLS only: the port is the `tls-port` and the plain port is off (`port 0`).
    pub tls: Option<RedisTls>,
    /// `requirepass` (the default user's password), and `masterauth` for a replica; this
    /// module's own client and [`RedisServer::url`] then carry it.
    pub password: Option<String>,
    /// Commands renamed away (`rename-command NAME ""`), as managed Redis services do to `CONFIG`.
    pub renamed_away: Vec<String>,
}

/// A TLS-only server's files (PEM): its certificate and key, and the CA that signed the
/// certificates of its peers (the primary it replicates, the nodes a Sentinel watches) and that
/// this module's clients check the server against. Clients need no certificate of their own.
#[derive(Clone, Debug)]
pub struct RedisTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub ca_file: PathBuf,
}

impl RedisTls {
    /// The settings that make a server TLS-only on `port`.
    fn settings(&self, port: u16) -> Vec<(String, String)> {
        vec![
            ("port".into(), "0".into()),
            ("tls-port".into(), port.to_string()),
            ("tls-cert-file".into(), self.cert_file.display().to_string()),
            ("tls-key-file".into(), self.key_file.display().to_string()),
            ("tls-ca-cert-file".into(), self.ca_file.display().to_string()),
            ("tls-auth-clients".into(), "no".into()),
            ("tls-replication".into(), "yes".into()),
        ]
    }
}

/// One running `redis-server`, killed when dropped.
pub struct RedisServer {
    child: Child,
    pub port: u16,
    dir: TempDir,
    tls: Option<RedisTls>,
    password: Option<String>,
}

/// Bound on a synchronous command: a SIGSTOPped server accepts the connection (the kernel does)
/// but never answers, and a caller must not hang on it.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// `redis://127.0.0.1:{port}`, or `rediss://` for a TLS server; `redis://:PASSWORD@…` with a
/// password.
fn url_of(port: u16, tls: Option<&RedisTls>, password: Option<&str>) -> String {
    let scheme = if tls.is_some() { "rediss" } else { "redis" };
    let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
    format!("{scheme}://{auth}127.0.0.1:{port}")
}

/// A client of the server on `port`, checking a TLS server's certificate against its CA.
fn client_of(port: u16, tls: Option<&RedisTls>, password: Option<&str>) -> anyhow::Result<redis::Client> {
    let url = url_of(port, tls, password);
    Ok(match tls {
        None => redis::Client::open(url)?,
        Some(tls) => {
            let ca = std::fs::read(&tls.ca_file).with_context(|| format!("reading {}", tls.ca_file.display()))?;
            redis::Client::build_with_tls(url, redis::TlsCertificates { client_tls: None, root_cert: Some(ca) })?
        }
    })
}

fn sync_connection(port: u16, tls: Option<&RedisTls>, password: Option<&str>) -> anyhow::Result<redis::Connection> {
    let conn = client_of(port, tls, password)?.get_connection_with_timeout(COMMAND_TIMEOUT)?;
    conn.set_read_timeout(Some(COMMAND_TIMEOUT))?;
    conn.set_write_timeout(Some(COMMAND_TIMEOUT))?;
    Ok(conn)
}

/// A synchronous command to the server on `port` of 127.0.0.1.
pub fn command_at<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> anyhow::Result<T> {
    command_with(port, None, None, cmd)
}

fn command_with<T: redis::FromRedisValue>(
    port: u16,
    tls: Option<&RedisTls>,
    password: Option<&str>,
    cmd: &redis::Cmd,
) -> anyhow::Result<T> {
    cmd.query(&mut sync_connection(port, tls, password)?).with_context(|| format!("redis on port {port}"))
}

/// A port the OS just handed out on 127.0.0.1.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` so that the child dies with this process, even when this process is SIGKILLed.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process; a
/// child forked from a Tokio blocking thread would be killed when that idle thread retires
/// (after ten seconds). So every child is forked from one spawner thread that lives as long as
/// the process.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<SpawnRequest>>> =
        std::sync::OnceLock::new();
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("seatrush-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("the spawner thread starts");
        std::sync::Mutex::new(tx)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    spawner
        .lock()
        .expect("spawner lock")
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("spawner thread gone"))?;
    answer.recv().map_err(|_| std::io::Error::other("spawner thread gone"))?
}

fn spawn_error(err: std::io::Error) -> anyhow::Error {
    if err.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!(
            "redis-server is not installed (or not on PATH). Install Redis 7 or later: \
             `sudo apt-get install redis-server` on Debian/Ubuntu, `brew install redis` on macOS"
        )
    } else {
        anyhow::Error::new(err).context("starting redis-server")
    }
}

impl RedisServer {
    pub fn start(options: &RedisOptions) -> anyhow::Result<Self> {
        let dir = TempDir::new("seatrush-redis-")?;
        let port = match options.port {
            Some(p) => p,
            None => free_port()?,
        };
        let mut cmd = Command::new("redis-server");
        let policy = options.maxmemory_policy.clone().unwrap_or_else(|| "noeviction".into());
        let mut args: Vec<(String, String)> = match &options.tls {
            None => vec![("port".into(), port.to_string())],
            Some(tls) => tls.settings(port),
        };
        args.extend([
            ("bind".into(), "127.0.0.1".into()),
            ("save".into(), String::new()),
            ("appendonly".into(), "no".into()),
            ("dir".into(), dir.path().display().to_string()),
            ("logfile".into(), dir.path().join("redis.log").display().to_string()),
            ("maxmemory-policy".into(), policy),
            ("repl-diskless-sync-delay".into(), "0".into()),
        ]);
        if let Some(max) = &options.maxmemory {
            args.push(("maxmemory".into(), max.clone()));
        }
        if let Some(primary) = options.replica_of {
            args.push(("replicaof".into(), format!("127.0.0.1 {primary}")));
        }
        if let Some(password) = &options.password {
            args.push(("requirepass".into(), password.clone()));
            args.push(("masterauth".into(), password.clone()));
        }
        args.extend(options.extra.iter().cloned());
        for (name, value) in &args {
            cmd.arg(format!("--{name}")).arg(value);
        }
        for command in &options.renamed_away {
            // Two arguments: one `NAME ""` would reach the config parser quoted as a single word.
            cmd.arg("--rename-command").arg(command).arg("");
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let child = spawn_tied(cmd).map_err(spawn_error)?;
        let mut server = Self { child, port, dir, tls: options.tls.clone(), password: options.password.clone() };
        server.wait_ready(options.replica_of.is_some())?;
        Ok(server)
    }

    /// A Sentinel watching the primary on `primary_port` under `master_name`, deciding with
    /// `quorum` votes; it marks a silent primary down after one second.
    pub fn start_sentinel(primary_port: u16, master_name: &str, quorum: u32) -> anyhow::Result<Self> {
        Self::start_sentinel_with(primary_port, master_name, quorum, None)
    }

    /// [`RedisServer::start_sentinel`], TLS-only with `tls` (to its clients and to the nodes it
    /// watches, which must be TLS-only too).
    pub fn start_sentinel_with(
        primary_port: u16,
        master_name: &str,
        quorum: u32,
        tls: Option<&RedisTls>,
    ) -> anyhow::Result<Self> {
        Self::start_sentinel_conf(primary_port, master_name, quorum, tls, &SentinelPasswords::default())
    }

    /// [`RedisServer::start_sentinel`] with passwords: the one it answers to (`requirepass` in
    /// sentinel.conf) and the one it gives the nodes it watches (`sentinel auth-pass`).
    pub fn start_sentinel_authenticated(
        primary_port: u16,
        master_name: &str,
        quorum: u32,
        passwords: &SentinelPasswords,
    ) -> anyhow::Result<Self> {
        Self::start_sentinel_conf(primary_port, master_name, quorum, None, passwords)
    }

    fn start_sentinel_conf(
        primary_port: u16,
        master_name: &str,
        quorum: u32,
        tls: Option<&RedisTls>,
        passwords: &SentinelPasswords,
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new("seatrush-sentinel-")?;
        let port = free_port()?;
        let conf = dir.path().join("sentinel.conf");
        let mut listen: String = match tls {
            None => format!("port {port}\n"),
            Some(tls) => tls.settings(port).iter().map(|(name, value)| format!("{name} {value}\n")).collect(),
        };
        if let Some(own) = &passwords.own {
            listen.push_str(&format!("requirepass {own}\n"));
        }
        std::fs::write(
            &conf,
            format!(
                "{listen}bind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {master_name} 127.0.0.1 {primary_port} {quorum}\n\
                 sentinel down-after-milliseconds {master_name} 1000\n\
                 sentinel failover-timeout {master_name} 4000\n\
                 sentinel parallel-syncs {master_name} 1\n{nodes}",
                dir = dir.path().display(),
                log = dir.path().join("redis.log").display(),
                nodes = passwords
                    .nodes
                    .as_ref()
                    .map(|p| format!("sentinel auth-pass {master_name} {p}\n"))
                    .unwrap_or_default(),
            ),
        )?;
        let mut cmd = Command::new("redis-server");
        cmd.arg(&conf).arg("--sentinel").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let child = spawn_tied(cmd).map_err(spawn_error)?;
        let mut server = Self { child, port, dir, tls: tls.cloned(), password: passwords.own.clone() };
        server.wait_ready(false)?;
        Ok(server)
    }

    /// A primary and one replica of it, the replica's first sync done and the replica online.
    pub fn start_pair() -> anyhow::Result<(Self, Self)> {
        Self::start_pair_with(&RedisOptions::default())
    }

    /// [`RedisServer::start_pair`], both servers started with `options` (TLS, say).
    pub fn start_pair_with(options: &RedisOptions) -> anyhow::Result<(Self, Self)> {
        let primary = Self::start(options)?;
        let replica = Self::start(&RedisOptions { replica_of: Some(primary.port), port: None, ..options.clone() })?;
        primary.wait_replicas_online(1)?;
        Ok((primary, replica))
    }

    /// Waits until a write on the primary is acknowledged by `n` replicas. INFO says "online"
    /// too early: after a diskless sync the primary streams nothing to a replica (not even the
    /// GETACK that WAIT sends) until the replica's first periodic ACK, up to a second later.
    pub fn wait_replicas_online(&self, n: usize) -> anyhow::Result<()> {
        wait_replicas_online_with(self.port, self.tls.as_ref(), self.password.as_deref(), n)
    }
}

/// A Sentinel's passwords (plain text: these are test and demo servers).
#[derive(Clone, Debug, Default)]
pub struct SentinelPasswords {
    /// What its clients must send (`requirepass` in sentinel.conf).
    pub own: Option<String>,
    /// What it sends to the primary and replicas it watches (`sentinel auth-pass`).
    pub nodes: Option<String>,
}

/// [`RedisServer::wait_replicas_online`] for the server on `port`, without holding the server.
pub fn wait_replicas_online_at(port: u16, n: usize) -> anyhow::Result<()> {
    wait_replicas_online_with(port, None, None, n)
}

fn wait_replicas_online_with(
    port: u16,
    tls: Option<&RedisTls>,
    password: Option<&str>,
    n: usize,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut probe = redis::pipe();
    probe
        .cmd("SET")
        .arg("seatrush:replica-probe")
        .arg(1)
        .ignore()
        .cmd("WAIT")
        .arg(n)
        .arg(50)
        .cmd("DEL")
        .arg("seatrush:replica-probe")
        .ignore();
    loop {
        // With min-replicas-to-write set, the probe itself is refused until the replica counts.
        let acked = match probe
            .query::<(usize,)>(&mut sync_connection(port, tls, password)?)
            .with_context(|| format!("redis on port {port}"))
        {
            Ok((acked,)) => acked,
            Err(e) if format!("{e:#}").contains("NOREPLICAS") => {
                std::thread::sleep(POLL_INTERVAL);
                0
            }
            Err(e) => return Err(e),
        };
        if acked >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("redis on port {port}: {n} replicas did not acknowledge a write within {START_TIMEOUT:?}");
        }
    }
}

impl RedisServer {
    fn poll_info(&self, done: impl Fn(&str) -> bool, what: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let info: String = self.command(redis::cmd("INFO").arg("replication"))?;
            if done(&info) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("redis on port {}: no {what} after {START_TIMEOUT:?}", self.port);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// `redis://127.0.0.1:PORT`, or `rediss://` for a TLS server, with `:PASSWORD@` when the
    /// server has one.
    pub fn url(&self) -> String {
        url_of(self.port, self.tls.as_ref(), self.password.as_deref())
    }

    /// The CA file a TLS server's certificate is checked against (None for a plain server).
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|tls| tls.ca_file.as_path())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn wait_ready(&mut self, replica: bool) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server on port {} exited at start-up ({status}); its log:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            if self.is_ready(replica) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server on port {} not ready after {START_TIMEOUT:?}; its log:\n{}",
                    self.port,
                    self.log_tail()
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    fn is_ready(&self, replica: bool) -> bool {
        let Ok(client) = client_of(self.port, self.tls.as_ref(), self.password.as_deref()) else { return false };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else { return false };
        let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut conn) else { return false };
        if replica {
            let Ok(replication) = redis::cmd("INFO").arg("replication").query::<String>(&mut conn) else {
                return false;
            };
            return replication.contains("master_link_status:up");
        }
        info.contains("redis_version")
    }

    /// A synchronous command, for tests and the fault runner.
    pub fn command<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> anyhow::Result<T> {
        command_with(self.port, self.tls.as_ref(), self.password.as_deref(), cmd)
    }

    /// Sets `min-replicas-to-write` and waits until the primary counts that many good replicas
    /// (it re-counts once a second, so writes would fail with NOREPLICAS until then).
    pub fn require_replicas(&self, n: u32) -> anyhow::Result<()> {
        self.command::<()>(redis::cmd("CONFIG").arg("SET").arg("min-replicas-to-write").arg(n))?;
        let want = format!("min_slaves_good_slaves:{n}");
        self.poll_info(|info| info.contains(&want), &format!("{n} good replicas"))
    }

    /// SIGSTOP: the server stops answering, as a stalled or partitioned replica would.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        self.resume();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
