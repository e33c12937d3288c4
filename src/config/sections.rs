//! The sections of the parts above `config`: the worker process (`[worker]`), the job API
//! (`[api]`) and what a request may ask (`[requests]`). Their code reads `config::Settings`,
//! so their sections live here rather than beside that code; each checks itself like the
//! sections below `config` (`kafka::settings`, `media::settings`, …).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use crate::section::{Invalid, Section, ensure};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    #[serde(default)]
    pub id: Option<String>,
    pub pool_size: usize,
    pub retry_count: u32,
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    pub tmp_dir: PathBuf,
    pub shutdown_timeout_secs: u64,
    pub vips_threads: usize,
    /// Time limit for the native media work of one attempt.
    pub media_timeout_secs: u64,
    /// Below this much free scratch space the worker reports not ready.
    pub min_scratch_free_bytes: u64,
    /// The scratch volume's size when less than its file system's (a Kubernetes emptyDir on
    /// the node's disk, whose limit the kubelet enforces by eviction); 0 = the file system's.
    #[serde(default)]
    pub scratch_bytes: u64,
    /// Where media work runs (`MEDIA_ISOLATION`).
    pub isolation: Isolation,
    /// Address-space cap of each sandbox child and its ffmpeg; 0 = derived
    /// ([`Settings::media_memory_limit`]).
    pub media_memory_limit_bytes: u64,
    /// Refuse to start unless every sandbox layer is active (`sandbox::Layers`).
    pub sandbox_require: bool,
    /// Sandbox layers turned off, comma-separated (`landlock`, `seccomp`, `unprivileged`, or
    /// `all`): for a kernel whose support misbehaves.
    #[serde(default)]
    pub sandbox_disable: String,
    /// The executable started as `<program> sandbox`; empty = this executable.
    #[serde(default)]
    pub sandbox_program: Option<PathBuf>,
}

impl WorkerSettings {
    /// The sandbox layers turned off, by name.
    pub fn sandbox_disabled(&self) -> Vec<String> {
        self.sandbox_disable
            .split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// Where the native media work of a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// In a sandboxed child process (see `sandbox`): a crash or a runaway decode costs one job.
    Process,
    /// On a thread of the worker (the `process` CLI may use it; a crash takes the process down).
    Inline,
}

/// The job API (`POST /transcode`, `POST /scan`), on a listener of its own (see `api`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSettings {
    /// Where the API listens; unset: no API.
    #[serde(default)]
    pub addr: Option<SocketAddr>,
    /// Jobs the API runs at once; 0 = 1 beside Kafka intake, all cores without it.
    pub max_concurrent: usize,
    /// Bearer tokens, one per line, re-read when the file changes; unset: no authentication
    /// (then the API must listen on loopback).
    #[serde(default)]
    pub tokens_file: Option<PathBuf>,
    /// Connections served at once; more are closed as they arrive.
    pub max_connections: usize,
    /// `Retry-After` of a 503 (seconds).
    pub retry_after_secs: u64,
    /// How long a request body (or each part of a streamed one) may take to arrive.
    pub body_timeout_secs: u64,
    /// CPU priority of the API's sandbox children (0-19): under contention the Kafka pool's
    /// children get the cores first.
    pub nice: i32,
}

/// What a request may ask (checked by `stages::validate`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSettings {
    pub max_request_bytes: usize,
    /// Comma-separated; empty allows any bucket (see [`RequestSettings::allowed_buckets`]).
    pub allowed_source_buckets: String,
    pub require_user_prefix: bool,
}

impl RequestSettings {
    /// The buckets a source may be read from; empty: any.
    pub fn allowed_buckets(&self) -> Vec<&str> {
        self.allowed_source_buckets
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .collect()
    }
}

/// What `worker.sandbox_disable` may name.
const SANDBOX_LAYERS: [&str; 4] = ["landlock", "seccomp", "unprivileged", "all"];

/// The smallest `media_memory_limit_bytes` an operator may set. Measured with a 1 MB photo: at
/// 150 MiB the job process cannot map its libraries (the sandbox restarts every second), at
/// 200 MiB the photo is answered `limits_exceeded`, at 256 MiB so is its AVIF; 280 MiB and up
/// complete.
pub const MIN_CONFIGURED_MEMORY_LIMIT: u64 = 512 << 20;

impl Section for WorkerSettings {
    fn validate(&self) -> Result<(), Invalid> {
        ensure(
            self.sandbox_disabled()
                .iter()
                .all(|l| SANDBOX_LAYERS.contains(&l.as_str())),
            "sandbox_disable",
            "names a layer that is not landlock, seccomp, unprivileged or all",
        )?;
        let cap = self.media_memory_limit_bytes;
        ensure(
            cap == 0 || cap >= MIN_CONFIGURED_MEMORY_LIMIT,
            "media_memory_limit_bytes",
            format!(
                "{} MiB is below the {} MiB floor: a job process maps 200-250 MiB of libraries, \
                 stacks and allocator space before it decodes anything, so a smaller cap fails \
                 ordinary photos as too large (0 derives the cap from the container's memory)",
                cap >> 20,
                MIN_CONFIGURED_MEMORY_LIMIT >> 20
            ),
        )
    }
}

impl Section for ApiSettings {
    fn validate(&self) -> Result<(), Invalid> {
        if let Some(addr) = self.addr {
            ensure(
                self.tokens_file.is_some() || addr.ip().is_loopback(),
                "tokens_file",
                format!("the API on {addr} is not on loopback: it needs API_TOKENS_FILE"),
            )?;
        }
        if let Some(path) = &self.tokens_file
            && let Err(e) = std::fs::metadata(path)
        {
            return Err(Invalid::new(
                "tokens_file",
                format!("cannot read {}: {e}", path.display()),
            ));
        }
        ensure((0..=19).contains(&self.nice), "nice", "must be 0-19")?;
        ensure(
            self.max_connections > 0 && self.retry_after_secs > 0,
            "",
            "max_connections and retry_after_secs must be positive",
        )
    }
}
