//! The `kortex` binary: parses the command line and hands over to the library.

use clap::Parser;

/// mimalloc instead of the C library's allocator: the gateway's hot path allocates a lot
/// (JSON in, JSON out), and the static musl build's allocator is slow at that.
/// (`--features system-allocator` keeps the C library's, for heap profilers.)
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = kortex::cli::Cli::parse();
    kortex::cli::run(cli)
}
