use clap::Parser;
use seatrush::cli::{AllowlistAction, Cli, Command, DrawAction, EventAction, LogFormat};
use seatrush::demo;
use seatrush::ops;
use tracing_subscriber::EnvFilter;

/// jemalloc, not the system allocator: a booking makes some sixty small allocations across hyper,
/// redis and serde, and glibc's malloc and free were a tenth of `serve`'s CPU (issue 10). mimalloc
/// was as fast but tripled the resident memory after the allowlist load; jemalloc kept it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let filter = EnvFilter::try_from_env("SEATRUSH_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    if let Err(err) = run(cli).await {
        eprintln!("seatrush: {err:#}");
        let busy = err.downcast_ref::<ops::reconcile::TooBusy>().is_some();
        std::process::exit(if busy { ops::reconcile::TooBusy::EXIT_CODE } else { 1 });
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    seatrush::fault_hooks::check_environment()?;
    let s = &cli.connections;
    match cli.command {
        Command::Event { action: EventAction::Apply { file } } => ops::apply_event(s, &file).await?,
        Command::Allowlist { action: AllowlistAction::Import { event, file } } => {
            ops::import_allowlist(s, &event, &file).await?
        }
        Command::Allowlist { action: AllowlistAction::Remove { event, file } } => {
            ops::remove_allowlist(s, &event, &file).await?
        }
        Command::Allowlist { action: AllowlistAction::Generate { event, count, out } } => {
            ops::generate_allowlist(s, &event, count as usize, &out).await?
        }
        Command::Open { event, redis_checks } => ops::open(s, &event.event, &redis_checks).await?,
        Command::Close(e) => ops::close(s, &e.event).await?,
        Command::Status { event, persist_timeout } => ops::status(s, &event.event, &persist_timeout).await?,
        Command::Reconcile { event, repair } => ops::reconcile(s, &event.event, repair).await?,
        Command::Export { event, out, codes } => {
            ops::export::export(s, &event.event, out.as_deref(), codes.as_deref()).await?
        }
        Command::Draw { action: DrawAction::Verify(e) } => ops::verify_draw(s, &e.event).await?,
        Command::Serve(serve) => ops::serve(s, &serve).await?,
        Command::Demo(args) => demo::run(s, &args).await?,
    }
    Ok(())
}
