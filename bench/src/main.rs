//! `presence-bench`: see the library for the scenarios.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    match presence_bench::run(std::env::args_os()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("presence-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
