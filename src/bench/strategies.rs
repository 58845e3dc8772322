//! placeholder
pub async fn run(_args: &crate::cli::StrategiesArgs) -> anyhow::Result<()> { anyhow::bail!("not yet") }
