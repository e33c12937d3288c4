//! Configuration, loaded in layers: the embedded `config/default.toml`, then an optional file
//! (`--config` / `MEDIA_WORKER_CONFIG`), then environment variables ([`env`]). Each section is
//! the type of the code it configures and checks itself there (`section::Section`):
//! `kafka::settings`, `storage::settings`, `scan::settings`, `http::HttpSettings`,
//! `media::settings` (limits, analysis, video, profiles), and [`sections`] for the parts above
//! this module (worker, api, requests). Here: the loading, the rules that span sections, and the
//! values derived from several of them (pool size, memory cap, threads).

pub mod env;
pub mod sections;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml};
use serde::Deserialize;

use crate::contract::MediaType;
use crate::http::HttpSettings;
use crate::kafka::settings::{KafkaSettings, PropertyValue};
use crate::media::settings::{AnalysisSettings, Limits, MediaJob, Profile, VideoSettings};
use crate::scan::ScanSettings;
use crate::section::{Invalid, Section};
use crate::storage::StorageSettings;
pub use env::{ENV_KEYS, ENV_PREFIX, env_name};
pub use sections::{ApiSettings, Isolation, RequestSettings, WorkerSettings};

const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub storage: StorageSettings,
    pub worker: WorkerSettings,
    pub limits: Limits,
    pub analysis: AnalysisSettings,
    pub video: VideoSettings,
    pub http: HttpSettings,
    pub api: ApiSettings,
    pub scan: ScanSettings,
    pub requests: RequestSettings,
    pub profiles: BTreeMap<String, Profile>,
}

/// A configuration problem, reported as one line naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Parse(String),
    #[error(transparent)]
    Invalid(#[from] Invalid),
}

/// The keys of [`Settings`] and what each holds, read from the types once.
static KEYS: LazyLock<BTreeMap<String, env::Kind>> = LazyLock::new(env::keys::<Settings>);

impl Settings {
    /// Loads the embedded defaults, then `file` if given, then the process environment.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_from(file, std::env::vars())
    }

    /// As [`Settings::load`], with an explicit environment (tests).
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let mut fig = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::Parse(format!(
                    "config file not found: {}",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file(path));
        }
        // Values are parsed as figment parses environment values ("6000" is a number, "true" a
        // boolean, "[320, 640]" an array), so type errors name the key like any other; keys
        // that hold text stay text.
        for (key, raw) in env::overrides(&env) {
            let value: figment::value::Value = match KEYS.get(&key) {
                Some(env::Kind::Text) => raw.clone().into(),
                _ => raw.parse().expect("infallible"),
            };
            fig = fig.merge((key, value));
        }
        let mut settings: Settings = fig.extract().map_err(|e| ConfigError::Parse(one_line(e)))?;
        for (prop, value) in env::kafka_properties(&env) {
            let value = PropertyValue::Text(value.clone());
            settings.kafka.properties.insert(prop, value);
        }
        // An empty optional setting (`CLAMD_ADDR=`, `PROFILE_FACE_CASCADE=`) is unset.
        let empty = |p: &std::path::PathBuf| p.as_os_str().is_empty();
        settings.analysis.profile_cascade = settings.analysis.profile_cascade.filter(|p| !empty(p));
        settings.api.tokens_file = settings.api.tokens_file.filter(|p| !empty(p));
        settings.scan.clamd_addr = settings.scan.clamd_addr.filter(|a| !a.is_empty());
        settings.validate()?;
        Ok(settings)
    }

    /// Each section's own rules, then those that span sections.
    fn validate(&self) -> Result<(), Invalid> {
        let sections: [(&str, &dyn Section); 8] = [
            ("kafka", &self.kafka),
            ("storage", &self.storage),
            ("worker", &self.worker),
            ("limits", &self.limits),
            ("analysis", &self.analysis),
            ("video", &self.video),
            ("api", &self.api),
            ("scan", &self.scan),
        ];
        for (key, section) in sections {
            section.validate().map_err(|e| e.within(key))?;
        }
        for (name, profile) in &self.profiles {
            let key = format!("profiles.{name}");
            profile.validate().map_err(|e| e.within(&key))?;
        }
        for name in ["default", "variants"] {
            if !self.profiles.contains_key(name) {
                return Err(Invalid::new(
                    format!("profiles.{name}"),
                    "built-in profile is missing",
                ));
            }
        }
        if !self.kafka.intake && self.api.addr.is_none() {
            return Err(Invalid::new(
                "kafka.intake",
                "without Kafka intake the API must be on (API_ADDR)",
            ));
        }
        if let Some(addr) = self.api.addr
            && addr.port() != 0
            && addr == self.http.addr
        {
            return Err(Invalid::new("api.addr", "must differ from http.addr"));
        }
        let scanning = self.profiles.iter().find(|(_, p)| p.scan);
        if let (Some((name, _)), None) = (scanning, &self.scan.clamd_addr) {
            return Err(Invalid::new(
                format!("profiles.{name}.scan"),
                "scanning needs clamd: set CLAMD_ADDR",
            ));
        }
        Ok(())
    }

    /// Concurrent Kafka jobs: `worker.pool_size`, or the cores available to this process (std
    /// reads the cgroup CPU quota, so a pod limited to 2 CPUs gets 2) less the API's permits
    /// ([`Settings::api_concurrency`]), at least 1: a core per job, whoever asked for it.
    pub fn pool_size(&self) -> usize {
        if self.worker.pool_size > 0 {
            self.worker.pool_size
        } else {
            cores().saturating_sub(self.api_concurrency()).max(1)
        }
    }

    /// Jobs the API runs at once, with permits of its own: `api.max_concurrent`, or 1 beside
    /// Kafka intake and all cores without it; 0 when the API is off.
    pub fn api_concurrency(&self) -> usize {
        match (self.api.addr, self.api.max_concurrent, self.kafka.intake) {
            (None, _, _) => 0,
            (Some(_), n, _) if n > 0 => n,
            (Some(_), _, true) => 1,
            (Some(_), _, false) => cores(),
        }
    }

    /// Native jobs at once in this pod: the Kafka pool (with intake) and its parts lane, and
    /// the API's.
    pub fn native_slots(&self) -> usize {
        let kafka = if self.kafka.intake {
            self.pool_size() + self.parts_lane()
        } else {
            0
        };
        (kafka + self.api_concurrency()).max(1)
    }

    /// Permits of a lane of their own for a long video's tasks (its units, its audio, its
    /// stitch): one on a one-permit pod taking unit tasks, else none (they take the pool's, at
    /// most all but one: `kafka::flow`). A task never holds a one-permit pod's only permit, so
    /// a request does not wait for one (a core for 10-20 s); the task runs beside it at a lower
    /// priority (`job::runner::PART_NICE`), and alone at full speed. The lane counts in the
    /// memory cap's share (a child more may run), not in the threads' (it oversubscribes).
    pub fn parts_lane(&self) -> usize {
        usize::from(self.kafka.intake && self.kafka.unit_topic().is_some() && self.pool_size() == 1)
    }

    /// What the media code needs for one input with `profile` (which must exist: requests
    /// are validated against the profiles).
    pub fn media_job(&self, profile: &str, hint: Option<MediaType>) -> MediaJob {
        MediaJob {
            profile: self.profiles[profile].clone(),
            limits: self.limits.clone(),
            analysis: self.analysis.clone(),
            video: self.video.clone(),
            ffmpeg_threads: self.ffmpeg_threads(),
            hint,
            resume: Vec::new(),
            resumed_tracks: Vec::new(),
            part: Default::default(),
        }
    }

    /// The address-space cap of one sandbox child: `worker.media_memory_limit_bytes`, or what
    /// leaves the worker [`PARENT_RESERVE`] of the container's memory (cgroup limit, else the
    /// machine's) shared by the pool, at least [`MIN_MEMORY_LIMIT`].
    pub fn media_memory_limit(&self) -> u64 {
        if self.worker.media_memory_limit_bytes > 0 {
            return self.worker.media_memory_limit_bytes;
        }
        let total = container_memory().unwrap_or(u64::MAX / 2);
        (total.saturating_sub(PARENT_RESERVE) / self.native_slots() as u64).max(MIN_MEMORY_LIMIT)
    }

    /// ffmpeg threads per video job (`video.threads`, or cores / permits, the parts lane's
    /// aside).
    pub fn ffmpeg_threads(&self) -> usize {
        if self.video.threads > 0 {
            return self.video.threads;
        }
        (cores() / (self.native_slots() - self.parts_lane()).max(1)).max(1)
    }

    /// Messages dispatched but unfinished before the consumer pauses.
    pub fn max_in_flight(&self) -> usize {
        if self.kafka.max_in_flight > 0 {
            self.kafka.max_in_flight
        } else {
            2 * self.pool_size()
        }
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.worker.shutdown_timeout_secs)
    }

    /// This worker's id in responses: `worker.id`, else the host name.
    pub fn worker_id(&self) -> String {
        self.worker.id.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "media-worker".to_owned())
        })
    }

    pub fn profile(&self, name: &str) -> Option<&Profile> {
        self.profiles.get(name)
    }
}

/// Memory kept for the worker process itself when the children's cap is derived.
pub const PARENT_RESERVE: u64 = 512 << 20;
/// The smallest derived cap: the child's own mappings (libraries, thread stacks, allocator
/// arenas) take about 200 MiB of address space before any decode.
pub const MIN_MEMORY_LIMIT: u64 = 1 << 30;

/// The memory this process may use: the cgroup v2 or v1 limit, else the machine's memory.
fn container_memory() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let cgroup = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|n| *n < 1 << 60);
    cgroup.or_else(|| {
        let info = read("/proc/meminfo")?;
        let kb = info.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kb: u64 = kb.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    })
}

/// The cores available to this process (cgroup CPU quota aware).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// figment's error text, on one line, naming the environment variables of the key.
fn one_line(e: figment::Error) -> String {
    let key = e.path.join(".");
    let text = e.to_string().replace('\n', " ");
    if key.is_empty() {
        return text;
    }
    let short = ENV_KEYS.iter().find(|(_, k)| *k == key);
    let short = short.map(|(n, _)| format!("{n} or ")).unwrap_or_default();
    format!("{text} (environment variable {short}{})", env_name(&key))
}

#[cfg(test)]
mod tests;
