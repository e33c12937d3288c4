//! What every job shares, built once per process (by `run`, `demo`, `process` and the benches).

use std::sync::Arc;

use crate::config::Settings;
use crate::contract::WorkerInfo;
use crate::media;
use crate::scratch;
use crate::storage::Storage;
use crate::telemetry::{Health, Metrics, Registry};

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
    media::init(settings.worker.vips_threads);
    let health = Arc::new(Health::new(settings.worker.min_scratch_free_bytes));
    Ok(Services {
        worker: worker_info(&settings),
        settings,
        storage,
        metrics: Arc::new(Metrics::new()),
        registry: Registry::default(),
        health,
    })
}
