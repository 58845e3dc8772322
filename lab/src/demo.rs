//! `seatrush-lab demo --burst N`: the product's demo ([`seatrush::demo::Demo`]), started
//! in-process with the same flags as `seatrush demo`, and a burst of simulated candidates sent at
//! it; then it serves on until ctrl-c, or exits (`--exit-after-burst`).

use crate::crowd::{self, Candidate, Tally};
use clap::Args;
use seatrush::demo::{Demo, DemoArgs, DEMO_EVENT};
use seatrush::ops::settings::Connections;

#[derive(Args, Debug)]
pub struct BurstArgs {
    #[command(flatten)]
    pub demo: DemoArgs,
    /// After opening, send this many simulated candidates at the sale and print what they got
    #[arg(long, default_value_t = 0)]
    pub burst: usize,
    /// Exit after the burst instead of serving until ctrl-c
    #[arg(long)]
    pub exit_after_burst: bool,
}

pub async fn run(connections: &Connections, args: &BurstArgs) -> anyhow::Result<()> {
    let demo = Demo::start(connections, &args.demo).await?;
    if args.burst > 0 {
        let tally = burst(&demo.url, &demo.codes, args.burst).await;
        println!("burst of {} candidates: {}", args.burst, tally.summary());
        if args.exit_after_burst {
            return Ok(());
        }
    }
    demo.serve().await
}

/// A crowd against the demo: mostly registered codes (some clicking twice), some unregistered,
/// some bots.
async fn burst(url: &str, codes: &[String], n: usize) -> Tally {
    let levels = ["A1", "B1", "C1"];
    let candidates = (0..n)
        .map(|i| Candidate {
            code: match i % 10 {
                9 => format!("NOPE-{i:05}"),
                8 => codes[(i / 2) % codes.len()].to_lowercase(),
                _ => codes[i % codes.len()].clone(),
            },
            level: levels[i % levels.len()].to_owned(),
            bot: i % 20 == 7,
        })
        .collect();
    Tally::of(&crowd::run(url, DEMO_EVENT, candidates, 64).await)
}
