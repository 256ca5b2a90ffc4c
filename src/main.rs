//! The `rollboard` binary: arguments -> tracing -> settings -> subcommand -> exit status.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use rollboard::config::{resolve_path, LogFormat, Settings};
use rollboard::edges::cli::{execute, Cli, Command, EXIT_CONFIG};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// mimalloc, not the system allocator: the consumer makes and drops many small values per
/// event (commands, their arguments and replies) on several threads, and glibc's allocator
/// spent about a fifth of its CPU doing that (docs/benchmarks.md, *Judged in the worker*).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing(settings: &Settings) {
    // RUST_LOG, when set, wins over the configured level.
    // The scheduler crate narrates its own lifecycle at info; keep it to warnings.
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| {
            EnvFilter::try_new(format!("tokio_cron_scheduler=warn,{}", settings.log.level))
        })
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour codes only for a person at a terminal: a log file or a collector gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match settings.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

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
            Command::Run { roles } => {
                let mut settings = settings;
                if let Some(roles) = roles {
                    settings.roles = rollboard::domain::roles::Roles::of(&roles);
                }
                if let Err(e) = settings.check_exposure() {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
                init_tracing(&settings);
                let cancel = CancellationToken::new();
                tokio::spawn(rollboard::edges::shutdown::watch(cancel.clone()));
                match rollboard::edges::daemon::run(settings, cancel).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e)
                        if e.downcast_ref::<rollboard::store::Conflicts>().is_some()
                            || e.downcast_ref::<rollboard::store::Denied>().is_some()
                            || e.downcast_ref::<rollboard::store::Refused>().is_some() =>
                    {
                        tracing::error!(error = format!("{e:#}"), "rollboard refused to start");
                        eprintln!("error: {e:#}");
                        ExitCode::from(EXIT_CONFIG)
                    }
                    Err(e) => {
                        tracing::error!(error = format!("{e:#}"), "rollboard failed");
                        ExitCode::FAILURE
                    }
                }
            }
            command => execute(settings, command).await,
        }
    })
}
