//! The operator commands: `event apply`, `allowlist import`, `open`, `close`, `status`,
//! `reconcile`, `serve`. Each returns an error with one clear line for the binary to print.

use crate::domain::code::{CodeHash, CodeHasher, NormalisedCode};
use crate::domain::event::{EventId, EventSpec};
use crate::fault_hooks::FaultPlan;
use crate::http::{self, App, AppState, Edge};
use crate::ops::allowlist_file::parse_allowlist;
use crate::ops::loader;
use crate::ops::reconcile as recompute;
use crate::ops::settings::{Connections, PersistTimeout, RedisChecks, ServeSettings};
use crate::redis_io::link::RedisLink;
use crate::sale::committer::AckPolicy;
use crate::sale::persister::PersistPolicy;
use crate::sale::{Sale, SaleSettings};
use crate::store::Store;
use anyhow::{bail, Context};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub async fn apply_event(connections: &Connections, file: &Path) -> anyhow::Result<()> {
    use crate::ops::apply::Applied;
    use crate::ops::live_change::Amended;
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let spec = EventSpec::from_toml(&text).with_context(|| format!("{} is not a valid event file", file.display()))?;
    let (link, store) = connect(connections).await?;
    let applied = crate::ops::apply::apply_event(&mut link.check().await?, &store, &spec).await?;
    println!("applied event {} ({} seats, {} levels)", spec.id, spec.total_seats, spec.levels.len());
    match applied {
        Applied::Closed => {}
        Applied::WhileOpen(Amended::Redis { offered }) => {
            println!("the sale is open: every serve has the change within a second");
            if offered > 0 {
                println!("the raised caps made room for {offered} waiters: each was offered a seat, which a serve books within a second");
            }
        }
        Applied::WhileOpen(Amended::NotLoaded) => {
            println!(
                "the sale is open in the database but not loaded in Redis: run `seatrush open --event {}`",
                spec.id
            )
        }
    }
    Ok(())
}

pub async fn import_allowlist(connections: &Connections, event: &str, file: &Path) -> anyhow::Result<()> {
    let id = EventId::parse(event)?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let hasher = CodeHasher::from_env();
    warn_if_unpeppered(&hasher);
    let parsed = parse_allowlist(&bytes, &hasher);
    let store = Store::connect(&connections.database_url).await?;
    if let Some(levels) = &parsed.levels {
        // A restriction naming a level the event lacks would lock its code out of every level
        // it meant: refused whole, before anything is imported.
        let event = store.event(&id).await?;
        let unknown: std::collections::BTreeSet<&str> = levels
            .iter()
            .filter_map(|(_, l)| l.as_deref())
            .flat_map(|l| l.split(' '))
            .filter(|l| !event.spec.levels.keys().any(|known| known.as_str() == *l))
            .collect();
        if !unknown.is_empty() {
            let known: Vec<&str> = event.spec.levels.keys().map(|l| l.as_str()).collect();
            bail!(
                "the levels column of {} names levels {id} does not have: {}; its levels are {}. Nothing was imported",
                file.display(),
                unknown.into_iter().collect::<Vec<_>>().join(", "),
                known.join(", ")
            );
        }
    }
    store.set_allowlist_pepper(&id, &hasher.fingerprint()).await?;
    let added = store.import_allowlist(&id, &parsed.hashes).await?;
    println!(
        "imported {} codes into {id}: {added} new, {} already there",
        parsed.hashes.len(),
        parsed.hashes.len() as u64 - added
    );
    if let Some(levels) = &parsed.levels {
        store.set_allowed_levels(&id, levels).await?;
        let restricted = levels.iter().filter(|(_, l)| l.is_some()).count();
        println!("levels column: {restricted} codes may book only the levels named there, the others any level");
    }
    for (line, why) in parsed.bad_lines.iter().take(50) {
        eprintln!("{}:{line}: {why}", file.display());
    }
    if let Some(warning) = parsed.shapes.warning() {
        eprintln!("warning: {warning}");
    }
    if !parsed.bad_lines.is_empty() {
        bail!("{} bad lines in {} were skipped (the rest were imported)", parsed.bad_lines.len(), file.display());
    }
    Ok(())
}

/// `allowlist remove`: the file's codes off the event's allowlist, also while the sale runs.
pub async fn remove_allowlist(connections: &Connections, event: &str, file: &Path) -> anyhow::Result<()> {
    let id = EventId::parse(event)?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let hasher = CodeHasher::from_env();
    let parsed = parse_allowlist(&bytes, &hasher);
    for (line, why) in parsed.bad_lines.iter().take(50) {
        eprintln!("{}:{line}: {why}", file.display());
    }
    if !parsed.bad_lines.is_empty() {
        bail!("{} bad lines in {}; nothing was removed", parsed.bad_lines.len(), file.display());
    }
    let (link, store) = connect(connections).await?;
    store.check_allowlist_pepper(&id, &hasher.fingerprint()).await?;
    let client = format!("cli {}", crate::redis_io::oplock::operator_name());
    let removed =
        crate::ops::allowlist_remove::remove_codes(&mut link.check().await?, &store, &id, &parsed.hashes, &client)
            .await?;
    println!(
        "removed {} of {} codes from {id}'s allowlist in the database; {}. Seats they hold stay theirs until cancelled",
        removed.in_database,
        parsed.hashes.len(),
        match removed.in_redis {
            Some(n) => format!("{n} from the live sale, refused by every serve within a second"),
            None => "the event is not loaded in Redis (the next open loads the database's list)".to_owned(),
        }
    );
    Ok(())
}

/// `allowlist generate`: fresh codes into a new file, their hashes into the event's allowlist.
pub async fn generate_allowlist(
    connections: &Connections,
    event: &str,
    count: usize,
    out: &Path,
) -> anyhow::Result<()> {
    use std::io::Write;
    let id = EventId::parse(event)?;
    let hasher = CodeHasher::from_env();
    warn_if_unpeppered(&hasher);
    let store = Store::connect(&connections.database_url).await?;
    store.set_allowlist_pepper(&id, &hasher.fingerprint()).await?;
    let codes = crate::ops::code_strength::generate(count);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .with_context(|| format!("cannot create {} (it must not exist yet)", out.display()))?;
    for code in &codes {
        writeln!(file, "{code}")?;
    }
    file.sync_all()?;
    let hashes: Vec<CodeHash> =
        codes.iter().map(|c| hasher.hash(&NormalisedCode::parse(c).expect("generated codes normalise"))).collect();
    let added = store.import_allowlist(&id, &hashes).await?;
    println!(
        "wrote {count} codes ({:.0} bits each) to {} and imported {added} into {id}. The file holds the raw codes: \
         send each candidate theirs, then delete it",
        crate::ops::code_strength::generated_bits(),
        out.display()
    );
    Ok(())
}

async fn connect(connections: &Connections) -> anyhow::Result<(RedisLink, Store)> {
    let link = RedisLink::open(&connections.redis_url, connections.redis_ca_file.as_deref())?;
    link.check().await?;
    let store = Store::connect(&connections.database_url).await?;
    Ok((link, store))
}

/// Says, at start, that code hashes without a pepper can be reversed from a dump.
pub fn warn_if_unpeppered(hasher: &CodeHasher) {
    if !hasher.is_peppered() {
        tracing::warn!(
            "{} is not set: code hashes are plain SHA-256, which a leaked database or Redis dump turns back \
             into short codes in seconds. Set it (a long random secret, the same on every host) before importing \
             the allowlist of a real sale",
            crate::domain::code::PEPPER_ENV
        );
    }
}

pub async fn open(connections: &Connections, event: &str, checks: &RedisChecks) -> anyhow::Result<()> {
    let id = EventId::parse(event)?;
    let hasher = CodeHasher::from_env();
    warn_if_unpeppered(&hasher);
    let (link, store) = connect(connections).await?;
    store.check_allowlist_pepper(&id, &hasher.fingerprint()).await?;
    let mut conn = link.check().await?;
    let report =
        loader::open_event_acknowledging(&mut conn, &store, &id, checks.redis_settings_unverifiable_ok).await?;
    for warning in report.settings.all() {
        eprintln!("warning: {warning}");
    }
    println!(
        "opened {id}: {} codes on the allowlist, {} free seats{}",
        report.allowlist,
        report.free_seats,
        if report.rebuilt {
            " (seats and counters built from the database)"
        } else {
            " (already loaded: allowlist, caps and window refreshed)"
        }
    );
    if let Some((before, after)) = report.resized {
        println!("seat pool resized from {before} to {after} seats");
    }
    Ok(())
}

pub async fn verify_draw(connections: &Connections, event: &str) -> anyhow::Result<()> {
    let id = EventId::parse(event)?;
    let store = Store::connect(&connections.database_url).await?;
    crate::ops::draw::verify(&store, &id).await
}

pub async fn close(connections: &Connections, event: &str) -> anyhow::Result<()> {
    let id = EventId::parse(event)?;
    let (link, store) = connect(connections).await?;
    match loader::close_event(&mut link.check().await?, &store, &id).await? {
        loader::CloseOutcome::Closed => println!("closed {id}"),
        loader::CloseOutcome::NotLoaded { database_was_open } => println!(
            "{id} is not loaded in Redis (never opened, or Redis lost it): nothing to close there, Redis left unchanged{}",
            if database_was_open { "; the database now says closed" } else { "" }
        ),
    }
    Ok(())
}

/// Unsettled pending admissions `status` lists one by one (it counts them all).
const UNSETTLED_SHOWN_MAX: usize = 20;

pub async fn status(connections: &Connections, event: &str, persist_timeout: &PersistTimeout) -> anyhow::Result<()> {
    let id = EventId::parse(event)?;
    let (link, store) = connect(connections).await?;
    let stored = store.event(&id).await?;
    let mut conn = link.check().await?;
    // Drift is shown only from an exact comparison; a busy sale gets the figures and a note.
    let (c, exact) = match recompute::compare_quietly(&mut conn, &store, &id).await {
        Ok(c) => (c, true),
        Err(err) if err.is::<recompute::TooBusy>() => (recompute::compare(&mut conn, &store, &id).await?, false),
        Err(err) => return Err(err),
    };
    println!("event {id}: {} in the database, {} seats, {} free in Redis", stored.state, c.total_seats, c.redis_free);
    println!(
        "{:<12} {:>6} {:>12} {:>9} {:>9} {:>9} {:>10}",
        "level", "cap", "redis taken", "db held", "db paid", "pending", "remaining"
    );
    for (level, l) in &c.levels {
        println!(
            "{:<12} {:>6} {:>12} {:>9} {:>9} {:>9} {:>10}",
            level,
            l.cap,
            l.redis_taken,
            l.db_held,
            l.db_paid,
            l.pending,
            (l.cap - l.redis_taken).clamp(0, c.redis_free)
        );
    }
    if exact {
        for d in c.drift() {
            println!("drift: {d}");
        }
    } else {
        println!("(the sale changed Redis during every comparison: figures are approximate, drift not judged)");
    }
    let persist_timeout = Duration::from_millis(persist_timeout.persist_timeout_ms);
    let stuck = recompute::unsettled(&mut link.check().await?, &stored, persist_timeout).await?;
    if !stuck.is_empty() {
        println!(
            "{} pending admissions are older than the persist timeout and not yet settled by a reaper:",
            stuck.len()
        );
        for why in stuck.iter().take(UNSETTLED_SHOWN_MAX) {
            println!("  {why}");
        }
    }
    for line in crate::ops::draw::status_lines(&store, &stored.spec).await? {
        println!("{line}");
    }
    for line in crate::ops::waitlist::status_lines(&mut link.check().await?, &store, &stored.spec).await? {
        println!("{line}");
    }
    let audit = store.recent_audit(&id, AUDIT_SHOWN_MAX).await?;
    if !audit.is_empty() {
        println!("last {} operator actions (newest first):", audit.len());
        for a in &audit {
            println!(
                "  {}  {:<8} {}…  from {:<15} {}",
                crate::domain::event::rfc3339_ms(a.at_ms),
                a.action,
                &a.code_hash[..a.code_hash.len().min(12)],
                a.client,
                a.outcome
            );
        }
    }
    Ok(())
}

/// File descriptors `serve` needs beside its client connections.
const OPEN_FILES_SPARE: u64 = 256;

/// Operator actions `status` lists, newest first.
const AUDIT_SHOWN_MAX: i64 = 10;

pub async fn reconcile(connections: &Connections, event: &str, repair: bool) -> anyhow::Result<()> {
    let id = EventId::parse(event)?;
    let (link, store) = connect(connections).await?;
    let drift = recompute::reconcile(&link, &store, &id, repair).await?;
    if drift.is_empty() {
        println!("{id}: Redis and the database agree");
        return Ok(());
    }
    for d in &drift {
        println!("drift: {d}");
    }
    if repair {
        println!("{id}: repaired {} findings", drift.len());
        Ok(())
    } else {
        bail!("{} drift findings; run with --repair to rewrite Redis from the database", drift.len())
    }
}

/// The request path's settings from the flags.
pub fn sale_settings(settings: &ServeSettings) -> SaleSettings {
    SaleSettings {
        ack: AckPolicy { replicas: settings.wait_replicas, timeout: Duration::from_millis(settings.wait_timeout_ms) },
        commit_connections: settings.commit_connections,
        persist_timeout: Duration::from_millis(settings.persist_timeout.persist_timeout_ms),
        reaper_interval: Duration::from_millis(settings.reaper_interval_ms),
        commit_batch_max: settings.commit_batch_max,
        persist: PersistPolicy {
            batch_size_max: settings.persist_batch_max,
            linger: Duration::from_millis(settings.persist_linger_ms),
            writers: settings.persist_writers,
        },
        persist_deadline: Duration::from_millis(settings.persist_deadline_ms),
        waiters_max: settings.waitlist_max,
    }
}

/// Connects everything `serve` needs, after checking the primary will not evict.
pub async fn build_app(connections: &Connections, settings: &ServeSettings) -> anyhow::Result<AppState> {
    let operator_token = settings.operator_token()?;
    let hasher = CodeHasher::from_env();
    warn_if_unpeppered(&hasher);
    let (link, store) = connect(connections).await?;
    for id in store.open_events().await? {
        store.check_allowlist_pepper(&id, &hasher.fingerprint()).await?;
    }
    let mut conn = link.check().await?;
    let unverifiable_ok = settings.redis_checks.redis_settings_unverifiable_ok;
    for warning in crate::redis_io::primary_settings::check_primary(&mut conn, unverifiable_ok).await?.all() {
        tracing::warn!("{warning}");
    }
    let sale = Sale::new(Arc::new(link), store, sale_settings(settings), FaultPlan::from_env()?)?;
    sale.allowlist().warm(sale.catalog()).await?;
    Ok(AppState::new(App {
        sale: Arc::new(sale),
        hasher,
        operator_token,
        payment_webhook_secret: settings.payment_webhook_secret()?,
        edge: Edge::new(settings.edge()),
        page_strings: Arc::new(
            crate::http::page_strings::PageStrings::load(settings.page_strings_dir.as_deref())
                .context("the page strings directory")?,
        ),
    }))
}

/// Serves HTTP and runs the reaper until ctrl-c or SIGTERM.
pub async fn serve(connections: &Connections, settings: &ServeSettings) -> anyhow::Result<()> {
    match http::server::raise_open_file_limit() {
        Ok(files) => {
            tracing::info!(open_files_max = files, connections_max = settings.connections_max, "open-file limit");
            if files < settings.connections_max as u64 + OPEN_FILES_SPARE {
                tracing::warn!(
                    "the open-file limit ({files}) is below connections-max ({}) plus {OPEN_FILES_SPARE} for Redis, the \
                     database and the logs: raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower connections-max",
                    settings.connections_max
                );
            }
        }
        Err(err) => tracing::warn!(error = %err, "cannot read or raise the open-file limit"),
    }
    let app = build_app(connections, settings).await?;
    let listener = tokio::net::TcpListener::bind(&settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    tracing::info!(listen = %listener.local_addr()?, "seatrush serving");
    run_until_shutdown(app, listener).await
}

/// The HTTP server and the reaper, both stopped by ctrl-c or SIGTERM.
pub async fn run_until_shutdown(app: AppState, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        on_signal.cancel();
    });
    serve_until(app, listener, stop, Reaper::Run).await
}

/// Whether a server runs the reaper, the hold expiry and the heal loop beside it (tests that drive the passes by
/// hand leave it off).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reaper {
    Run,
    Off,
}

/// Serves HTTP, with the reaper beside it, until `stop` is cancelled; then finishes the requests
/// in flight and the reaper's pass. `serve`, the demo, the bench and the tests all serve through
/// this one function.
pub async fn serve_until(
    app: AppState,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
    reaper: Reaper,
) -> anyhow::Result<()> {
    let reaper = (reaper == Reaper::Run).then(|| {
        let sale = app.sale.clone();
        let stop = stop.clone();
        let healer = {
            let (sale, stop) = (sale.clone(), stop.clone());
            tokio::spawn(async move { crate::ops::heal::run(sale, stop.cancelled_owned()).await })
        };
        let drawer = {
            let (sale, stop) = (sale.clone(), stop.clone());
            tokio::spawn(async move { crate::ops::draw::run(sale, stop.cancelled_owned()).await })
        };
        (tokio::spawn(async move { sale.run_reaper(stop.cancelled_owned()).await }), healer, drawer)
    });
    // Offers are booked whether or not this server runs the reaper: a test that drives the passes
    // by hand still sees a freed seat reach its waiter.
    let offers = {
        let (sale, stop) = (app.sale.clone(), stop.clone());
        tokio::spawn(async move { sale.run_offers(stop.cancelled_owned()).await })
    };
    http::serve(listener, app, stop.cancelled_owned()).await?;
    offers.await?;
    if let Some((reaper, healer, drawer)) = reaper {
        reaper.await?;
        healer.await?;
        drawer.await?;
    }
    Ok(())
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
