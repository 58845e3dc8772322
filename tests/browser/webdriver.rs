//! A headless Chromium driven over the W3C WebDriver protocol: `chromedriver` on a free port,
//! one session, and the handful of commands the page tests need, spoken as JSON through the
//! `reqwest` client the crate already has (no WebDriver crate to build for eight commands).
//!
//! chromedriver runs in a process group of its own, so dropping the [`Browser`] kills it and the
//! Chromium it started in one signal; it also dies with the test process (PR_SET_PDEATHSIG).

use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// How long chromedriver may take to answer `/status`, and a page to reach what a test waits for.
const START_TIMEOUT: Duration = Duration::from_secs(20);
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(20);
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// What the browser window looks like.
#[derive(Clone, Copy, Debug)]
pub enum Screen {
    /// A phone held upright (390×844 CSS pixels, as an iPhone 12-15), with a mobile viewport.
    Phone,
    /// A laptop screen.
    Desktop { width: u32, height: u32 },
}

pub struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

/// Fails, never skips: a CI without Chromium must say so.
fn require_installed() {
    for path in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: the browser tests need Chromium and its driver. \
             Install them with `apt-get install chromium chromium-driver` (Debian), then run `cargo nextest run` again."
        );
    }
}

fn chromium_args(profile: &Path, screen: Screen) -> Vec<String> {
    // Without the background-networking flags Chromium keeps dialing Google services and hangs
    // on the refused connections of a sandboxed network.
    let mut args: Vec<String> = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ]
    .map(String::from)
    .to_vec();
    args.push(format!("--user-data-dir={}", profile.display()));
    if let Screen::Desktop { width, height } = screen {
        args.push(format!("--window-size={width},{height}"));
    }
    args
}

impl Browser {
    pub async fn start(screen: Screen) -> Browser {
        require_installed();
        let port = seatrush::demo::redis_server::free_port().unwrap();
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg(format!("--port={port}")).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        // SAFETY: setpgid and prctl are async-signal-safe and touch no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                libc::setpgid(0, 0);
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let driver = cmd.spawn().expect("starting chromedriver");
        let profile = tempfile::Builder::new().prefix("seatrush-chromium-").tempdir().unwrap();
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _profile: profile,
        };
        browser.wait_driver_ready().await;
        browser.open_session(screen).await;
        browser
    }

    async fn wait_driver_ready(&self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(r) = self.http.get(format!("{}/status", self.base)).send().await {
                if r.json::<Value>().await.is_ok_and(|v| v["value"]["ready"] == true) {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "chromedriver did not become ready within {START_TIMEOUT:?}");
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    async fn open_session(&mut self, screen: Screen) {
        let mut options = json!({ "binary": CHROMIUM, "args": chromium_args(self._profile.path(), screen) });
        if let Screen::Phone = screen {
            options["mobileEmulation"] = json!({ "deviceMetrics": { "width": 390, "height": 844, "pixelRatio": 2.0 } });
        }
        let capabilities =
            json!({ "capabilities": { "alwaysMatch": { "browserName": "chrome", "goog:chromeOptions": options } } });
        let r = self.http.post(format!("{}/session", self.base)).json(&capabilities).send().await.unwrap();
        let body: Value = r.json().await.unwrap();
        let id =
            body["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("chromedriver refused the session: {body}"));
        self.base = format!("{}/session/{id}", self.base);
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method.clone(), format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        if answer["value"]["error"].is_string() {
            panic!("WebDriver {method} {path} failed: {}", answer["value"]["message"]);
        }
        answer["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.command(reqwest::Method::POST, "/url", Some(json!({ "url": url }))).await;
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns what it returns.
    pub async fn eval(&self, script: &str, args: Value) -> Value {
        self.command(reqwest::Method::POST, "/execute/sync", Some(json!({ "script": script, "args": args }))).await
    }

    /// Runs `script` (a function body whose last argument is a callback) and returns what it
    /// passes to that callback: for promises, such as axe-core's.
    pub async fn eval_async(&self, script: &str, args: Value) -> Value {
        self.command(reqwest::Method::POST, "/execute/async", Some(json!({ "script": script, "args": args }))).await
    }

    /// A Chrome DevTools Protocol command, through chromedriver.
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.command(reqwest::Method::POST, "/goog/cdp/execute", Some(json!({ "cmd": cmd, "params": params }))).await
    }

    /// Runs `source` in every page this session opens from now on, before the page's own scripts.
    pub async fn before_every_page(&self, source: &str) {
        self.cdp("Page.addScriptToEvaluateOnNewDocument", json!({ "source": source })).await;
    }

    /// Reloads the page, as a person pressing reload.
    pub async fn reload(&self) {
        self.command(reqwest::Method::POST, "/refresh", Some(json!({}))).await;
    }

    /// The first element matching `css`.
    pub async fn find(&self, css: &str) -> Element<'_> {
        let found = self
            .command(reqwest::Method::POST, "/element", Some(json!({ "using": "css selector", "value": css })))
            .await;
        let id = found.as_object().and_then(|o| o.values().next()).and_then(Value::as_str).expect("element reference");
        Element { browser: self, id: id.to_owned() }
    }

    /// Polls `condition` (a JS expression) until it is truthy, with a bound; on timeout the
    /// panic carries the page's visible text, which is what a person would have seen.
    pub async fn wait_until(&self, condition: &str) {
        let deadline = Instant::now() + WAIT_TIMEOUT;
        let script = format!("return Boolean({condition});");
        while self.eval(&script, json!([])).await != Value::Bool(true) {
            if Instant::now() >= deadline {
                let text = self.eval("return document.body.innerText;", json!([])).await;
                panic!("waited {WAIT_TIMEOUT:?} for `{condition}`; the page says:\n{}", text.as_str().unwrap_or(""));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Waits until the element matching `css` shows `needle` in its text, and returns the text
    /// (as rendered for HTML; the plain text of SVG elements, which have no rendered text).
    pub async fn wait_for_text(&self, css: &str, needle: &str) -> String {
        let text = format!(
            "(document.querySelector({css:?})?.innerText ?? document.querySelector({css:?})?.textContent ?? '')"
        );
        self.wait_until(&format!("{text}.includes({needle:?})")).await;
        self.eval(&format!("return {text};"), json!([])).await.as_str().unwrap_or("").to_owned()
    }

    /// Saves what the browser shows now to `artifacts/screenshots/{name}.png`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine;
        let encoded = self.command(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD.decode(encoded.as_str().unwrap()).unwrap();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts/screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group chromedriver leads (it and the Chromium it started).
        unsafe {
            libc::kill(-(self.driver.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.driver.wait();
    }
}

pub struct Element<'b> {
    browser: &'b Browser,
    id: String,
}

impl Element<'_> {
    fn path(&self, action: &str) -> String {
        format!("/element/{}/{action}", self.id)
    }

    pub async fn click(&self) {
        self.browser.command(reqwest::Method::POST, &self.path("click"), Some(json!({}))).await;
    }

    /// Types `text` as keystrokes (WebDriver key codes such as TAB included).
    pub async fn send_keys(&self, text: &str) {
        self.browser.command(reqwest::Method::POST, &self.path("value"), Some(json!({ "text": text }))).await;
    }

    pub async fn clear(&self) {
        self.browser.command(reqwest::Method::POST, &self.path("clear"), Some(json!({}))).await;
    }

    pub async fn text(&self) -> String {
        self.browser.command(reqwest::Method::GET, &self.path("text"), None).await.as_str().unwrap_or("").to_owned()
    }
}

/// The WebDriver key code of Tab.
pub const TAB: &str = "\u{E004}";
