//! The `check` mode (not built yet).

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::CheckArgs;

pub fn run(_args: CheckArgs) -> Result<ExitCode> {
    anyhow::bail!("check is not available yet")
}
