//! The command line: `kortex serve | crds | migrate`.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Kortex: an in-cluster LLM chat server for platform teams, configured by custom resources.
#[derive(Parser, Debug)]
#[command(name = "kortex", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print every CustomResourceDefinition as YAML (what `crds/` holds).
    Crds,
}

/// Runs a parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crds => match crate::crd::crds_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot render CRDs: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
