//! The command line: `cojob <command>`, also installed as the kubectl plugin `kubectl-cojob`.
//!
//! Operator commands (`controller`, `drain`, `crd`, `probe-store`), the commands a run's pod
//! uses (`sidecar`, `wrap`, `fenced-put`), and the commands people use ([`runs`](super::runs),
//! [`why`](super::why), [`trigger`](super::ask), `cancel`, `suspend`, `resume`).

use clap::{Parser, Subcommand};

/// Exactly-once Kubernetes jobs, coordinated through an object-storage bucket.
#[derive(Debug, Parser)]
#[command(name = "cojob", version, about)]
struct Cli {
    /// How log lines look: `json` (one object per line, with the span's fields, for log
    /// collectors), `text` (for people), or `auto`: json unless stderr is a terminal.
    #[arg(long, global = true, env = "COJOB_LOG_FORMAT", default_value = "auto")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The format of log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// json unless stderr is a terminal.
    Auto,
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Installs the global subscriber: `RUST_LOG` filters (default `info`), lines go to stderr.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init();
    } else {
        builder.init();
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lists a CoordinatedJob's decisions and runs as the bucket records them.
    Runs(super::runs::RunsArgs),
    /// Says what was decided for one tick of a CoordinatedJob, and why.
    Why(super::why::WhyArgs),
    /// Asks for a manual run, exactly once per key.
    Trigger(super::ask::TriggerArgs),
    /// Runs the ticks of a past range, each at most once (or, with --dry-run, says which).
    Backfill(super::backfill::BackfillArgs),
    /// Cancels an active run.
    Cancel(super::ask::CancelArgs),
    /// Suspends a CoordinatedJob's schedule (due ticks are skipped; runs continue).
    Suspend(super::ask::SuspendArgs),
    /// Resumes a suspended CoordinatedJob's schedule.
    Resume(super::ask::SuspendArgs),
    /// Runs the operator.
    Controller(Box<super::operator::ControllerArgs>),
    /// Deletes every CoordinatedJob and waits until their runs are cancelled (before uninstall).
    Drain(super::operator::DrainArgs),
    /// Prints the version.
    Version,
    /// Prints the CoordinatedJob CRD as YAML.
    Crd,
    /// Checks that a bucket honours conditional writes (the start-up probe).
    ProbeStore {
        /// The store URL, e.g. s3://bucket/prefix (credentials from the environment).
        #[arg(long, env = "COJOB_BUCKET")]
        bucket: String,
    },
    /// Writes a workload's result fenced by its attempt's epoch (exit 3: a newer attempt wrote).
    FencedPut(crate::fence::FencedPutArgs),
    /// Runs a workload command as a step of the run, once per run: an attempt after a respawn
    /// gets the first attempt's output back instead of running it again.
    Step(crate::workload::StepArgs),
    /// Calls the workload API of the run's sidecar (GET /v1/run, PUT /v1/progress, …).
    Api(crate::workload::CallArgs),
    /// Runs a workload command under the lease's self-fence (the pod builder prefixes each
    /// workload container's command with it).
    Wrap(crate::wrap::Args),
    /// Keeps a run's lease alive from inside its pod (the injected native sidecar).
    Sidecar(crate::sidecar::Args),
    /// The sidecar's start gate: exits 0 once the sidecar holds the lease (`--wait`: its postStart hook).
    #[command(hide = true)]
    Ready {
        /// The shared volume.
        #[arg(long, env = "COJOB_SHARED_DIR", default_value = crate::pod::SHARED_MOUNT)]
        shared_dir: std::path::PathBuf,
        /// Wait until ready, for at most this long (the sidecar's postStart hook), instead of
        /// answering at once.
        #[arg(long, value_parser = humantime::parse_duration)]
        wait: Option<std::time::Duration>,
        /// With `--wait`: also wait until this time (RFC 3339) by this node's clock, the run's
        /// tick, so a run decided ahead of it (`prestartSeconds`) starts its workload on time.
        /// Default: the container's `COJOB_FIRE_TIME`, when it is a time.
        #[arg(long, requires = "wait")]
        not_before: Option<chrono::DateTime<chrono::Utc>>,
    },
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed at once, when this is called,
/// not when the future is first polled, so a signal that arrives early is not lost (and does
/// not kill the process with the default action).
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
            _ => std::future::pending().await,
        }
    }
}

/// Parses the command line and runs the command; exits the process with its status. Invoked
/// as `kubectl-cojob` (a kubectl plugin), usage lines say `kubectl cojob`.
pub async fn main() {
    use clap::{CommandFactory, FromArgMatches};
    let as_plugin = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().starts_with("kubectl-"))
        })
        .unwrap_or(false);
    let mut command = Cli::command();
    if as_plugin {
        command = command.bin_name("kubectl cojob");
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_logging(cli.log_format);
    if let Err(e) = run(cli.command).await {
        // Logged like everything else (one JSON object in the cluster), with its causes.
        tracing::error!(error = format!("{e:#}"), "{e}");
        std::process::exit(1);
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Runs(args) => super::runs::run(args).await,
        Command::Why(args) => super::why::run(args).await,
        Command::Trigger(args) => super::ask::trigger(args).await,
        Command::Backfill(args) => super::backfill::run(args).await,
        Command::Cancel(args) => super::ask::cancel(args).await,
        Command::Suspend(args) => super::ask::set_suspended(args, true).await,
        Command::Resume(args) => super::ask::set_suspended(args, false).await,
        Command::Controller(args) => super::operator::controller(*args).await,
        Command::Drain(args) => super::operator::drain(args).await,
        Command::Version => {
            println!("cojob {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Crd => {
            print!("{}", crate::crd::crd_yaml()?);
            Ok(())
        }
        Command::ProbeStore { bucket } => {
            let store = cojob::Store::open(&bucket).await?;
            store.verify_conditional_writes().await?;
            println!("{}: conditional writes verified", store.description());
            Ok(())
        }
        Command::FencedPut(args) => {
            let code = crate::fence::run(args).await?;
            std::process::exit(code);
        }
        Command::Step(args) => {
            let code = crate::workload::run_step(args).await?;
            std::process::exit(code);
        }
        Command::Api(args) => {
            let code = crate::workload::run_call(args).await?;
            std::process::exit(code);
        }
        Command::Wrap(args) => {
            let code = crate::wrap::run(args).await?;
            std::process::exit(code);
        }
        Command::Sidecar(args) => {
            let outcome = crate::sidecar::run(args, shutdown_signal()).await?;
            std::process::exit(outcome.exit_code());
        }
        Command::Ready {
            shared_dir,
            wait,
            not_before,
        } => {
            let ready = match wait {
                Some(timeout) => crate::sidecar::wait_ready(
                    &shared_dir,
                    timeout,
                    not_before.or_else(crate::sidecar::fire_time_from_env),
                ),
                None => crate::sidecar::ready(&shared_dir),
            };
            if ready {
                Ok(())
            } else {
                std::process::exit(1);
            }
        }
    }
}
