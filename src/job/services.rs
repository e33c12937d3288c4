//! What every job shares, built once per process (by `run`, `demo`, `process` and the benches).

use std::sync::Arc;

use crate::config::{Isolation, Settings};
use crate::contract::WorkerInfo;
use crate::health::Health;
use crate::media;
use crate::registry::Registry;
use crate::sandbox::{self, Executor};
use crate::scan::Scanner;
use crate::scratch;
use crate::storage::Storage;
use crate::telemetry::Metrics;

/// What every job shares.
#[derive(Clone)]
pub struct Services {
    pub settings: Arc<Settings>,
    pub storage: Arc<dyn Storage>,
    pub metrics: Arc<Metrics>,
    pub registry: Registry,
    /// What `/health/ready` reports; also what gates intake and holds jobs while the pod is
    /// sick (see `runner`).
    pub health: Arc<Health>,
    pub worker: WorkerInfo,
    /// Where jobs' native media work runs.
    pub media: Executor,
    /// clamd, when `CLAMD_ADDR` is set (profiles with `scan = true`, `POST /scan`).
    pub scanner: Option<Arc<Scanner>>,
    /// The job API's tokens, when `API_TOKENS_FILE` is set (also what `/jobs` shows).
    pub tokens: Option<Arc<crate::access::Tokens>>,
    /// Scratch reserved by the jobs running (admission by need, shared by Kafka and API jobs).
    pub admission: Arc<scratch::Admission>,
}

pub fn worker_info(settings: &Settings) -> WorkerInfo {
    WorkerInfo {
        id: settings.worker_id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// Builds the job services (shared by `run`, `demo` and `process`).
pub fn services(settings: Arc<Settings>, storage: Arc<dyn Storage>) -> anyhow::Result<Services> {
    let removed = scratch::sweep(&settings.worker.tmp_dir)?;
    if removed > 0 {
        tracing::warn!(removed, dir = %settings.worker.tmp_dir.display(), "swept scratch dirs left by a previous run");
    }
    let limit = settings.worker.scratch_bytes;
    if limit > 0 {
        let fs = scratch::Space::file_system(&settings.worker.tmp_dir).map(|s| s.total);
        tracing::info!(limit, file_system = ?fs, "scratch volume held to SCRATCH_BYTES");
        if fs.is_some_and(|total| total < limit) {
            tracing::warn!(limit, file_system = ?fs, "SCRATCH_BYTES is larger than its file system: the file system's size applies");
        }
    }
    let metrics = Arc::new(Metrics::new());
    // The Kafka pool's children and its parts lane's (the job API starts its own, see `api`).
    let kafka = if settings.kafka.intake {
        settings.pool_size() + settings.parts_lane()
    } else {
        0
    };
    let media = executor(&settings, &metrics, kafka, 0)?;
    let health = Arc::new(Health::new(
        settings.worker.min_scratch_free_bytes,
        settings.worker.scratch_bytes,
    ));
    let scanner = match &settings.scan.clamd_addr {
        Some(addr) => Some(Arc::new(Scanner::new(
            addr.parse().map_err(anyhow::Error::msg)?,
            std::time::Duration::from_secs(settings.scan.timeout_secs),
            metrics.clone(),
        ))),
        None => None,
    };
    let tokens = match &settings.api.tokens_file {
        Some(path) => Some(Arc::new(crate::access::Tokens::load(path)?)),
        None => None,
    };
    Ok(Services {
        admission: Arc::new(scratch::Admission::new(
            &settings.worker.tmp_dir,
            settings.worker.min_scratch_free_bytes,
            settings.worker.scratch_bytes,
        )),
        scanner,
        tokens,
        worker: worker_info(&settings),
        settings,
        storage,
        metrics,
        registry: Registry::default(),
        health,
        media,
    })
}

/// The media executor of `worker.isolation`: sandbox children (`slots` started now, at CPU
/// priority `nice`), or libvips started in this process for inline work. Needs a Tokio
/// runtime.
pub fn executor(
    settings: &Settings,
    metrics: &Metrics,
    slots: usize,
    nice: i32,
) -> anyhow::Result<Executor> {
    if settings.worker.isolation == Isolation::Inline {
        media::init(settings.worker.vips_threads);
        return Ok(Executor::Inline);
    }
    let program = match &settings.worker.sandbox_program {
        Some(p) if !p.as_os_str().is_empty() => p.clone(),
        _ => std::env::current_exe()?,
    };
    let memory_limit = settings.media_memory_limit();
    let disabled = settings.worker.sandbox_disabled();
    // The fork servers find the same on the same kernel (and say so when they start).
    let layers = sandbox::Layers::available(&disabled);
    for (layer, on) in layers.list() {
        metrics
            .sandbox_layers
            .with_label_values(&[layer])
            .set(i64::from(on));
    }
    let missing = layers.missing();
    if settings.worker.sandbox_require && !missing.is_empty() {
        anyhow::bail!(
            "MEDIA_SANDBOX_REQUIRE: sandbox layers not available here: {}",
            missing.join(", ")
        );
    }
    if layers.unprivileged {
        let scratch = &settings.worker.tmp_dir;
        std::fs::create_dir_all(scratch)?;
        if let Some(closed) = sandbox::layers::unreachable_by_sandbox(scratch) {
            anyhow::bail!(
                "TMP_DIR {}: job processes run as uid {} and cannot pass {} (give it o+x)",
                scratch.display(),
                sandbox::layers::SANDBOX_ID,
                closed.display()
            );
        }
    }
    let pool = sandbox::Pool::new(sandbox::PoolConfig {
        program,
        vips_threads: settings.worker.vips_threads,
        limits: sandbox::Limits {
            memory_bytes: memory_limit,
            file_bytes: settings.limits.max_output_file_bytes,
            nice,
        },
        disabled,
        deaths: metrics.sandbox_deaths.clone(),
    });
    pool.warm(slots)?;
    let active = layers.list();
    tracing::info!(
        servers = slots,
        nice,
        memory_limit = settings.media_memory_limit(),
        landlock_abi = sandbox::layers::landlock_abi(),
        layers = ?active,
        missing = ?missing,
        "media work runs in confined job processes"
    );
    Ok(Executor::Sandbox(pool))
}
