//! The `window-sidecar` binary: configuration, logging, signals, then the server.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use window_sidecar::cli::dead_letters::DeadLettersCli;
use window_sidecar::cli::{self, Cli, Command, exit};
use window_sidecar::config::{Config, redact_url};
use window_sidecar::telemetry::{self, TraceExport};
use window_sidecar::{dev, server};

// glibc's malloc was a fifth of the sidecar's CPU under load (perf, Performance in
// docs/development.md): every read and flush allocates frames, entries and messages across
// worker threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// sysexits' EX_USAGE: the command line or the configuration cannot work.
const EXIT_CONFIG: u8 = exit::USAGE;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => err.exit(), // --help, --version
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let mut config = match cli.command {
        Some(Command::DeadLetters(command)) => return dead_letters(*command),
        Some(Command::Completions { shell }) => {
            let script = cli::completions(shell);
            return match std::io::stdout().lock().write_all(&script) {
                Ok(()) => ExitCode::SUCCESS,
                // A reader that stopped early (`| head`) took what it wanted.
                Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("window-sidecar completions: cannot write the script: {err}");
                    ExitCode::from(exit::FAILURE)
                }
            };
        }
        None => cli.config,
    };
    if let Err(err) = config.validate() {
        eprintln!("window-sidecar: invalid configuration: {err}");
        return ExitCode::from(EXIT_CONFIG);
    }
    // The OTEL_* variables are configuration too: one the sidecar cannot honour would lose
    // every span while the sidecar looked healthy.
    let traces = match TraceExport::from_env() {
        Ok(traces) => traces,
        Err(err) => {
            eprintln!("window-sidecar: invalid configuration: {err}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if config.check_config {
        println!("window-sidecar: configuration is valid");
        return ExitCode::SUCCESS;
    }
    if config.worker_threads == 0 {
        config.worker_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    }
    let runtime = match runtime(config.worker_threads) {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("window-sidecar: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(config, traces))
}

/// `window-sidecar dead-letters …`: 0 done, else the sysexits code of what failed (said on
/// stderr; the table is in `window-sidecar dead-letters --help`).
fn dead_letters(command: DeadLettersCli) -> ExitCode {
    let result = runtime(1).map(|runtime| runtime.block_on(command.run()));
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(err)) => {
            eprintln!("window-sidecar dead-letters: {err}");
            ExitCode::from(err.exit_code())
        }
        Err(err) => {
            eprintln!("window-sidecar dead-letters: cannot start the async runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

/// One thread by default, as linkerd2-proxy runs with one core unless given more: in a pod
/// the sidecar shares the CPU with the application and Redis, and a message between the
/// client's stream, the subscription, its flusher and fred that crosses no thread needs no
/// wake-up of another (measured: 15% less sidecar CPU per delivery than two workers).
fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    };
    builder.enable_all().build()
}

async fn serve(config: Config, traces: Option<TraceExport>) -> ExitCode {
    let telemetry = telemetry::init(config.log_format, traces);
    let code = run(config, telemetry.tracing_enabled()).await;
    // The exporter's flush blocks until its batch is sent, over tasks of this runtime: from
    // a blocking thread, so that (with one thread) this one goes on running them.
    let _ = tokio::task::spawn_blocking(move || drop(telemetry)).await;
    code
}

async fn run(mut config: Config, tracing_enabled: bool) -> ExitCode {
    // Kept alive until exit: dropping it stops the throwaway Redis.
    let mut _dev_redis = None;
    if config.dev && !dev::reachable(&config.redis_url).await {
        match dev::start().await {
            Ok(redis) => {
                warn!(
                    unreachable = %redact_url(&config.redis_url),
                    started = %redis.url,
                    "--dev: no Redis answered, started a throwaway redis-server (nothing is persisted)"
                );
                config.redis_url = redis.url.clone();
                _dev_redis = Some(redis);
            }
            Err(err) => {
                error!(error = %err, "--dev: could not start redis-server");
                return ExitCode::FAILURE;
            }
        }
    }

    let listener = match server::Listener::bind(&config.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            error!(error = %err, "cannot start");
            return ExitCode::FAILURE;
        }
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(on_signal(shutdown.clone()));
    match server::run(config, listener, shutdown, tracing_enabled).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err @ server::ServeError::Keep(_)) => {
            error!(error = %err, "invalid configuration");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(err) => {
            error!(error = %err, "window-sidecar failed");
            ExitCode::FAILURE
        }
    }
}

/// SIGTERM (Kubernetes starts a graceful shutdown with it) or SIGINT (Ctrl-C) begins the
/// drain; a second signal exits at once.
async fn on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
    shutdown.cancel();
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    warn!("second signal: exiting without draining");
    #[expect(
        clippy::disallowed_methods,
        reason = "a second signal asks to skip the drain"
    )]
    std::process::exit(1);
}
