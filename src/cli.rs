//! Command line: `run`, `demo`, `process`, `schemas`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::shutdown::Shutdown;
use crate::storage::S3Storage;
use crate::{commands, job, worker};

#[derive(Parser)]
#[command(
    name = "media-worker",
    version,
    about = "Kafka-driven media optimisation worker"
)]
struct Cli {
    /// Configuration file layered over the embedded defaults.
    #[arg(long, global = true, env = "MEDIA_WORKER_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Consume optimize requests from Kafka until SIGTERM/SIGINT, then drain.
    Run,
    /// Run the worker on an in-process Kafka cluster and local store over a folder of images
    /// and videos; writes a gallery page of what it made (index.html in the work directory).
    Demo {
        #[arg(default_value = "../shared/corpus")]
        dir: PathBuf,
        /// The work directory (outputs, page); a new temporary one by default.
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long, default_value = "showcase")]
        profile: String,
        /// hls.js for the page's player (scripts/setup.sh --demo installs it).
        #[arg(long, default_value_os_t = commands::demo::default_hls_js())]
        hls_js: PathBuf,
    },
    /// Process local files with a profile; one JSON response per line on stdout.
    Process {
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value = "default")]
        profile: String,
    },
    /// Compare face detection with the counts in a corpus' MANIFEST.tsv.
    EvalFaces {
        #[arg(default_value = "../shared/corpus")]
        dir: PathBuf,
    },
    /// (Internal) A sandbox child: runs media jobs sent by the worker on stdin.
    #[command(hide = true)]
    Sandbox {
        #[arg(long, default_value_t = 1)]
        vips_threads: usize,
        /// The address-space cap the worker set (to name it when an allocation fails).
        #[arg(long, default_value_t = 0)]
        memory_limit: u64,
        /// A sandbox layer turned off (`MEDIA_SANDBOX_DISABLE`).
        #[arg(long)]
        disable: Vec<String>,
    },
    /// Write the event contract's JSON Schemas.
    Schemas {
        #[arg(long, default_value = "schemas")]
        out: PathBuf,
    },
}

/// Exit codes: 0 done, 1 failure (or jobs abandoned at shutdown), 2 invalid configuration.
pub fn main() -> ExitCode {
    crate::allocator::tune();
    let cli = Cli::parse();
    let traces = crate::telemetry::init_logging();
    // A sandbox child needs no configuration, runtime or traces: jobs arrive complete.
    if let Command::Sandbox {
        vips_threads,
        memory_limit,
        disable,
    } = cli.command
    {
        return crate::sandbox::server::main(vips_threads, memory_limit, &disable);
    }
    // No process of this uid (a job process of a non-root worker above all) may read this
    // one's environment (the S3 secret), memory or descriptors, or trace it.
    // SAFETY: a plain prctl on the calling process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0) };
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("media-worker: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let code = runtime.block_on(async move {
        match execute(cli.command, settings).await {
            Ok(code) => code,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "fatal");
                eprintln!("media-worker: {e:#}");
                1
            }
        }
    });
    // Native work still running on blocking threads (an abandoned decode) must not hold the
    // exit: everything that matters is committed or flushed by now.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    let _ = traces.shutdown();
    ExitCode::from(code)
}

async fn execute(command: Command, settings: Settings) -> anyhow::Result<u8> {
    match command {
        Command::Run => {
            let shutdown = Shutdown::new();
            tokio::spawn(signals(shutdown.clone()));
            let storage = S3Storage::from_env(&settings.storage).await;
            let svc = job::services(Arc::new(settings), Arc::new(storage))?;
            Ok(match worker::run(svc, shutdown, None).await? {
                worker::Exit::Drained => 0,
                worker::Exit::Abandoned(_) | worker::Exit::ConsumerFailed => 1,
            })
        }
        Command::Demo {
            dir,
            out,
            profile,
            hls_js,
        } => {
            let opts = commands::demo::Options {
                dir,
                out,
                profile,
                hls_js,
            };
            commands::demo::run(settings, opts).await?;
            Ok(0)
        }
        Command::Process {
            inputs,
            out,
            profile,
        } => Ok(
            if commands::process::run(settings, inputs, out, profile).await? {
                0
            } else {
                1
            },
        ),
        Command::EvalFaces { dir } => Ok(if commands::eval_faces::run(&settings, &dir)? {
            0
        } else {
            1
        }),
        Command::Sandbox { .. } => unreachable!("handled before the runtime starts"),
        Command::Schemas { out } => {
            std::fs::create_dir_all(&out)?;
            for (name, text) in crate::contract::schemas() {
                std::fs::write(out.join(name), text)?;
            }
            Ok(0)
        }
    }
}

/// SIGTERM or SIGINT starts the drain.
async fn signals(shutdown: Shutdown) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
    }
    shutdown.drain();
}
