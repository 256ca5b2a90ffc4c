//! The `rollboard` binary: arguments -> settings -> subcommand -> exit status.

use std::process::ExitCode;

use clap::Parser;
use rollboard::cli::{execute, Cli, Command, EXIT_CONFIG};
use rollboard::config::{resolve_path, Settings};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let path = resolve_path(cli.config.clone());
    let settings = match Settings::load(&path) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Run => ExitCode::FAILURE,
            command => execute(settings, command).await,
        }
    })
}
