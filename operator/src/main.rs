//! The `kortex` binary: parses the command line and hands over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = kortex::cli::Cli::parse();
    kortex::cli::run(cli)
}
