//! Configuration: the embedded `config/default.toml`, then an optional file
//! (`--config` / `MEDIA_WORKER_CONFIG`), then environment variables (every key as
//! `MEDIA_WORKER_<SECTION>__<KEY>`, see [`ENV_PREFIX`], and the short names of [`ENV_KEYS`]); loaded
//! and validated here. The media sections (limits, analysis, video, profiles) are the media
//! code's own types (`media::settings`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format, Toml};
use serde::Deserialize;

use crate::contract::{MediaType, OutputFormat};
use crate::media::settings::{AnalysisSettings, Limits, MediaJob, Profile, VideoSettings};

const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of the environment variable of every key: `MEDIA_WORKER_<SECTION>__<KEY>` (upper
/// case, `__` between levels), e.g. `MEDIA_WORKER_LIMITS__MAX_FRAMES`,
/// `MEDIA_WORKER_PROFILES__DEFAULT__WIDTHS="[320, 640]"`.
pub const ENV_PREFIX: &str = "MEDIA_WORKER_";

/// Short names kept for the documented settings, and the keys they set. The short name wins
/// when both are given.
pub const ENV_KEYS: &[(&str, &str)] = &[
    ("KAFKA_BOOTSTRAP_SERVERS", "kafka.bootstrap_servers"),
    ("KAFKA_GROUP_ID", "kafka.group_id"),
    ("KAFKA_GROUP_INSTANCE_ID", "kafka.group_instance_id"),
    ("KAFKA_GROUP_PROTOCOL", "kafka.group_protocol"),
    ("KAFKA_REQUEST_TOPIC", "kafka.request_topic"),
    ("KAFKA_RESPONSE_TOPIC", "kafka.response_topic"),
    ("KAFKA_DLQ_TOPIC", "kafka.dlq_topic"),
    ("KAFKA_PROGRESS_TOPIC", "kafka.progress_topic"),
    ("KAFKA_PUBLISH_ATTEMPTS", "kafka.publish_attempts"),
    ("KAFKA_COMMIT_INTERVAL_MS", "kafka.commit_interval_ms"),
    ("MAX_IN_FLIGHT", "kafka.max_in_flight"),
    ("REVOKE_DRAIN_SECS", "kafka.revoke_drain_secs"),
    ("KAFKA_INTAKE", "kafka.intake"),
    ("API_ADDR", "api.addr"),
    ("API_MAX_CONCURRENT", "api.max_concurrent"),
    ("API_TOKENS_FILE", "api.tokens_file"),
    ("API_MAX_CONNECTIONS", "api.max_connections"),
    ("API_NICE", "api.nice"),
    ("API_BODY_TIMEOUT_SECS", "api.body_timeout_secs"),
    ("CLAMD_ADDR", "scan.clamd_addr"),
    ("CLAMD_TIMEOUT_SECS", "scan.timeout_secs"),
    ("OUTPUT_BUCKET", "storage.output_bucket"),
    ("S3_FORCE_PATH_STYLE", "storage.force_path_style"),
    ("S3_TIMEOUT_SECS", "storage.timeout_secs"),
    ("S3_PROBE_INTERVAL_SECS", "storage.probe_interval_secs"),
    ("WORKER_ID", "worker.id"),
    ("WORKER_POOL_SIZE", "worker.pool_size"),
    ("RETRY_COUNT", "worker.retry_count"),
    ("RETRY_BASE_MS", "worker.retry_base_ms"),
    ("TMP_DIR", "worker.tmp_dir"),
    ("SHUTDOWN_TIMEOUT_SECS", "worker.shutdown_timeout_secs"),
    ("VIPS_THREADS", "worker.vips_threads"),
    ("MEDIA_TIMEOUT_SECS", "worker.media_timeout_secs"),
    ("MIN_SCRATCH_FREE_BYTES", "worker.min_scratch_free_bytes"),
    ("MEDIA_ISOLATION", "worker.isolation"),
    (
        "MEDIA_MEMORY_LIMIT_BYTES",
        "worker.media_memory_limit_bytes",
    ),
    ("MEDIA_SANDBOX_PROGRAM", "worker.sandbox_program"),
    ("MEDIA_SANDBOX_REQUIRE", "worker.sandbox_require"),
    ("MEDIA_SANDBOX_DISABLE", "worker.sandbox_disable"),
    ("MAX_INPUT_BYTES", "limits.max_input_bytes"),
    ("MAX_IMAGE_PIXELS", "limits.max_image_pixels"),
    ("MAX_VIDEO_SECONDS", "limits.max_video_seconds"),
    ("MAX_VIDEO_PIXELS", "limits.max_video_pixels"),
    ("MAX_FRAMES", "limits.max_frames"),
    ("MAX_ANIMATION_PIXELS", "limits.max_animation_pixels"),
    ("MAX_OUTPUT_FILE_BYTES", "limits.max_output_file_bytes"),
    ("MAX_VIDEO_FPS", "limits.max_video_fps"),
    ("MAX_VIDEO_FRAMES", "limits.max_video_frames"),
    ("MAX_VIDEO_STREAMS", "limits.max_video_streams"),
    ("FFMPEG_THREADS", "video.threads"),
    ("FFMPEG_PRESET", "video.preset"),
    ("VIDEO_TIMEOUT_BASE_SECS", "video.timeout_base_secs"),
    ("VIDEO_TIMEOUT_PER_SECOND", "video.timeout_per_second"),
    ("HTTP_ADDR", "http.addr"),
    ("HTTP_MAX_CONNECTIONS", "http.max_connections"),
    ("HTTP_HEADER_TIMEOUT_MS", "http.header_timeout_ms"),
    ("MAX_REQUEST_BYTES", "requests.max_request_bytes"),
    ("ALLOWED_SOURCE_BUCKETS", "requests.allowed_source_buckets"),
    ("REQUIRE_USER_PREFIX", "requests.require_user_prefix"),
    ("FACE_CASCADE", "analysis.face_cascade"),
    ("PROFILE_FACE_CASCADE", "analysis.profile_cascade"),
    ("BLUR_THRESHOLD", "analysis.blur_threshold"),
];

/// Keys whose values are text even when they look like numbers (`KAFKA_GROUP_ID=12345`).
const STRING_KEYS: &[&str] = &[
    "kafka.bootstrap_servers",
    "kafka.group_id",
    "kafka.group_instance_id",
    "kafka.request_topic",
    "kafka.response_topic",
    "kafka.dlq_topic",
    "kafka.progress_topic",
    "storage.output_bucket",
    "worker.id",
    "worker.tmp_dir",
    "worker.isolation",
    "worker.sandbox_program",
    "worker.sandbox_disable",
    "http.addr",
    "api.addr",
    "api.tokens_file",
    "scan.clamd_addr",
    "requests.allowed_source_buckets",
    "analysis.face_cascade",
    "analysis.profile_cascade",
    "video.preset",
    "video.ffmpeg",
    "video.ffprobe",
];

/// Prefix of environment variables passed to librdkafka: `KAFKA_PROPERTY_SESSION_TIMEOUT_MS`
/// sets `session.timeout.ms`.
pub const KAFKA_PROPERTY_PREFIX: &str = "KAFKA_PROPERTY_";

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    pub bootstrap_servers: String,
    pub group_id: String,
    #[serde(default)]
    pub group_instance_id: Option<String>,
    /// How the group assigns partitions (`KAFKA_GROUP_PROTOCOL`).
    pub group_protocol: GroupProtocol,
    pub request_topic: String,
    pub response_topic: String,
    /// Where a request goes, with its error, when its response cannot be published.
    pub dlq_topic: String,
    /// Response publish attempts before the dead-letter topic is tried.
    pub publish_attempts: u32,
    pub commit_interval_ms: u64,
    pub max_in_flight: usize,
    /// On revoke, how long to wait for the revoked partitions' jobs before letting them go.
    pub revoke_drain_secs: u64,
    /// Consume requests from Kafka; `false` runs only the job API (`KAFKA_INTAKE=false`).
    pub intake: bool,
    /// Where long jobs publish progress events (unset or empty: none are published).
    #[serde(default)]
    pub progress_topic: Option<String>,
    /// A job publishes progress once it has run this long (short jobs publish none)...
    pub progress_delay_secs: u64,
    /// ...then whenever it has advanced by this fraction of the job...
    pub progress_step: f32,
    /// ...or this long has passed since its last event (a heartbeat while a stage is long).
    pub progress_interval_secs: u64,
    #[serde(default)]
    pub properties: BTreeMap<String, PropertyValue>,
}

/// The consumer-group protocol (docs/operations.md has the figures behind the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupProtocol {
    /// The client-side protocol: members join, the leader assigns (cooperative-sticky).
    Classic,
    /// KIP-848: the broker assigns and reconciles each member on its own heartbeat; the
    /// session and heartbeat times are the broker's (`group.consumer.*`).
    Consumer,
}

/// librdkafka properties the consumer protocol takes from the broker instead: setting one is
/// refused at start-up rather than left for librdkafka to ignore or reject later.
pub const CLASSIC_ONLY_PROPERTIES: [&str; 4] = [
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "group.protocol.type",
];

/// A librdkafka property value; TOML numbers and booleans are accepted as well as strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PropertyValue {
    Text(String),
    Int(i64),
    Bool(bool),
    Float(f64),
}

impl std::fmt::Display for PropertyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(s) => f.write_str(s),
            Self::Int(i) => write!(f, "{i}"),
            Self::Bool(b) => write!(f, "{b}"),
            Self::Float(x) => write!(f, "{x}"),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    pub output_bucket: String,
    pub force_path_style: bool,
    pub multipart_threshold_bytes: u64,
    pub timeout_secs: u64,
    /// How often `/health/ready` checks the output bucket.
    pub probe_interval_secs: u64,
}

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub addr: SocketAddr,
    /// Connections served at once (probes, scrapes); more are closed as they arrive.
    pub max_connections: usize,
    /// A connection that takes longer to send its request headers is closed.
    pub header_timeout_ms: u64,
    pub max_body_bytes: usize,
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

/// Malware scanning with clamd (see `scan`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScanSettings {
    /// `tcp://host:port` or `unix:///path`; unset: no scanning (a profile with `scan = true`
    /// is then a configuration error).
    #[serde(default)]
    pub clamd_addr: Option<String>,
    /// Limit for one scan, streaming included.
    pub timeout_secs: u64,
    /// How often clamd is pinged for `media_worker_clamd_up`.
    pub probe_interval_secs: u64,
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

/// A configuration problem, reported as one line naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Parse(String),
    #[error("invalid value for key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

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
        // Every key by its full name (`MEDIA_WORKER_WORKER__POOL_SIZE` for `worker.pool_size`),
        // then the short names of [`ENV_KEYS`]. Values are parsed as figment parses
        // environment values ("6000" is a number, "true" a boolean, "[320, 640]" an array),
        // so type errors name the key like any other; [`STRING_KEYS`] stay text.
        let generic = env.iter().filter_map(|(name, raw)| {
            let rest = name.strip_prefix(ENV_PREFIX)?;
            // Every key is in a section: names without `__` are not keys (`MEDIA_WORKER_CONFIG`
            // names the file).
            rest.contains("__")
                .then(|| (rest.to_ascii_lowercase().replace("__", "."), raw))
        });
        let short = ENV_KEYS.iter().filter_map(|(name, key)| {
            let (_, raw) = env.iter().find(|(n, _)| n == name)?;
            Some(((*key).to_owned(), raw))
        });
        for (key, raw) in generic.collect::<Vec<_>>().into_iter().chain(short) {
            let value: figment::value::Value = if STRING_KEYS.contains(&key.as_str()) {
                raw.clone().into()
            } else {
                raw.parse().expect("infallible")
            };
            fig = fig.merge((key, value));
        }
        let mut settings: Settings = fig.extract().map_err(|e| ConfigError::Parse(one_line(e)))?;
        for (name, value) in &env {
            if let Some(prop) = name.strip_prefix(KAFKA_PROPERTY_PREFIX) {
                let prop = prop.to_ascii_lowercase().replace('_', ".");
                settings
                    .kafka
                    .properties
                    .insert(prop, PropertyValue::Text(value.clone()));
            }
        }
        // An empty profile cascade (`PROFILE_FACE_CASCADE=`) turns it off.
        if settings
            .analysis
            .profile_cascade
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            settings.analysis.profile_cascade = None;
        }
        // Empty optional settings (`CLAMD_ADDR=`) are unset.
        if settings
            .scan
            .clamd_addr
            .as_deref()
            .is_some_and(str::is_empty)
        {
            settings.scan.clamd_addr = None;
        }
        if settings
            .api
            .tokens_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            settings.api.tokens_file = None;
        }
        settings.validate()?;
        Ok(settings)
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

/// The environment variable of a key: `worker.pool_size` → `MEDIA_WORKER_WORKER__POOL_SIZE`.
pub fn env_name(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.to_ascii_uppercase().replace('.', "__")
    )
}

impl Settings {
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                message: message.to_owned(),
            })
        };
        let k = &self.kafka;
        if k.properties.contains_key("group.protocol") {
            return invalid("kafka.properties", "set kafka.group_protocol instead");
        }
        if k.group_protocol == GroupProtocol::Consumer
            && let Some(p) = CLASSIC_ONLY_PROPERTIES
                .iter()
                .find(|p| k.properties.contains_key(**p))
        {
            return invalid(
                "kafka.properties",
                &format!(
                    "{p} is the broker's under group_protocol = \"consumer\" (group.consumer.*)"
                ),
            );
        }
        if !(k.progress_step > 0.0 && k.progress_step <= 1.0) {
            return invalid("kafka.progress_step", "need a fraction in (0, 1]");
        }
        if k.progress_interval_secs == 0 {
            return invalid("kafka.progress_interval_secs", "need at least 1 s");
        }
        for name in ["default", "variants"] {
            if !self.profiles.contains_key(name) {
                return invalid(&format!("profiles.{name}"), "built-in profile is missing");
            }
        }
        for (name, p) in &self.profiles {
            if p.widths.is_empty() || p.widths.iter().any(|w| *w == 0 || *w > 16384) {
                return invalid(
                    &format!("profiles.{name}.widths"),
                    "need 1 to 16384 px each, at least one",
                );
            }
            if p.formats.is_empty() {
                return invalid(
                    &format!("profiles.{name}.formats"),
                    "need at least one format",
                );
            }
            if p.formats.iter().any(|f| f.quality == 0 || f.quality > 100) {
                return invalid(&format!("profiles.{name}.formats"), "quality must be 1-100");
            }
            // Every format holds a thumbnail up to WebP's limit; variants are fitted per format.
            if let Some(t) = p.thumbnail {
                let max = OutputFormat::Webp.max_side();
                if !(1..=max).contains(&t.width) || !(1..=max).contains(&t.height) {
                    return invalid(
                        &format!("profiles.{name}.thumbnail"),
                        &format!("need 1 to {max} px on each side"),
                    );
                }
            }
        }
        let a = &self.analysis;
        let cascades = std::iter::once(("analysis.face_cascade", &a.face_cascade)).chain(
            a.profile_cascade
                .iter()
                .map(|p| ("analysis.profile_cascade", p)),
        );
        for (key, path) in cascades {
            if !path.is_file() {
                let msg = format!(
                    "cascade file {} not found (apt-get install opencv-data)",
                    path.display()
                );
                return invalid(key, &msg);
            }
        }
        let ratio = |r: f64| r > 0.0 && r <= 1.0;
        if !ratio(a.min_face_ratio) || !ratio(a.first_pass_face_ratio) {
            return invalid(
                "analysis",
                "min_face_ratio and first_pass_face_ratio must be in (0, 1]",
            );
        }
        if a.scale_factor <= 1.0 || a.min_neighbors < 1 || a.max_side < 64 {
            return invalid(
                "analysis",
                "need scale_factor > 1, min_neighbors >= 1, max_side >= 64",
            );
        }
        for (name, p) in &self.profiles {
            if let Some(t) = p.thumbnail
                && (t.width == 0 || t.height == 0 || t.width > 4096 || t.height > 4096)
            {
                return invalid(&format!("profiles.{name}.thumbnail"), "need 1 to 4096 px");
            }
        }
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return invalid("kafka.bootstrap_servers", "must not be empty");
        }
        if self.storage.output_bucket.trim().is_empty() {
            return invalid("storage.output_bucket", "must not be empty");
        }
        for (name, p) in &self.profiles {
            if p.renditions.is_empty()
                || p.renditions
                    .iter()
                    .any(|r| r.height < 16 || r.height > 4320 || r.crf > 51)
            {
                return invalid(
                    &format!("profiles.{name}.renditions"),
                    "need at least one, height 16-4320, crf 0-51",
                );
            }
        }
        let v = &self.video;
        if v.timeout_base_secs == 0 || v.timeout_per_second <= 0.0 || v.poster_candidates == 0 {
            return invalid(
                "video",
                "timeout_base_secs, timeout_per_second and poster_candidates must be positive",
            );
        }
        if self.limits.max_video_seconds == 0 || self.limits.max_video_pixels == 0 {
            return invalid("limits", "limits must be positive");
        }
        if self.limits.max_input_bytes == 0 || self.limits.max_image_pixels == 0 {
            return invalid("limits", "limits must be positive");
        }
        if self.storage.probe_interval_secs == 0 {
            return invalid("storage.probe_interval_secs", "must be positive");
        }
        if self.kafka.publish_attempts == 0 {
            return invalid("kafka.publish_attempts", "must be at least 1");
        }
        if self.kafka.commit_interval_ms == 0 {
            return invalid("kafka.commit_interval_ms", "must be positive");
        }
        let layers = ["landlock", "seccomp", "unprivileged", "all"];
        if !self
            .worker
            .sandbox_disabled()
            .iter()
            .all(|l| layers.contains(&l.as_str()))
        {
            return invalid(
                "worker.sandbox_disable",
                "names a layer that is not landlock, seccomp, unprivileged or all",
            );
        }
        self.validate_api_and_scan()
    }

    fn validate_api_and_scan(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                message,
            })
        };
        if !self.kafka.intake && self.api.addr.is_none() {
            return invalid(
                "kafka.intake",
                "without Kafka intake the API must be on (API_ADDR)".into(),
            );
        }
        if let Some(addr) = self.api.addr {
            if self.api.tokens_file.is_none() && !addr.ip().is_loopback() {
                return invalid(
                    "api.tokens_file",
                    format!("the API on {addr} is not on loopback: it needs API_TOKENS_FILE"),
                );
            }
            if addr.port() != 0 && addr == self.http.addr {
                return invalid("api.addr", "must differ from http.addr".into());
            }
        }
        if let Some(path) = &self.api.tokens_file
            && let Err(e) = std::fs::metadata(path)
        {
            return invalid(
                "api.tokens_file",
                format!("cannot read {}: {e}", path.display()),
            );
        }
        if !(0..=19).contains(&self.api.nice) {
            return invalid("api.nice", "must be 0-19".into());
        }
        if self.api.max_connections == 0 || self.api.retry_after_secs == 0 {
            return invalid(
                "api",
                "max_connections and retry_after_secs must be positive".into(),
            );
        }
        if let Some(addr) = &self.scan.clamd_addr
            && let Err(e) = addr.parse::<crate::scan::ClamdAddr>()
        {
            return invalid("scan.clamd_addr", e);
        }
        if self.scan.timeout_secs == 0 || self.scan.probe_interval_secs == 0 {
            return invalid(
                "scan",
                "timeout_secs and probe_interval_secs must be positive".into(),
            );
        }
        let scanning = self.profiles.iter().find(|(_, p)| p.scan);
        if let (Some((name, _)), None) = (scanning, &self.scan.clamd_addr) {
            return invalid(
                &format!("profiles.{name}.scan"),
                "scanning needs clamd: set CLAMD_ADDR".into(),
            );
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

    /// Native jobs at once in this pod: the Kafka pool (with intake) and the API's.
    pub fn native_slots(&self) -> usize {
        let kafka = if self.kafka.intake {
            self.pool_size()
        } else {
            0
        };
        (kafka + self.api_concurrency()).max(1)
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
        }
    }

    /// The progress topic, when progress events are on (`KAFKA_PROGRESS_TOPIC` set, not empty).
    pub fn progress_topic(&self) -> Option<&str> {
        self.kafka
            .progress_topic
            .as_deref()
            .filter(|t| !t.is_empty())
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

    /// ffmpeg threads per video job (`video.threads`, or cores / pool size).
    pub fn ffmpeg_threads(&self) -> usize {
        if self.video.threads > 0 {
            return self.video.threads;
        }
        (cores() / self.native_slots()).max(1)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_consumer_protocol_refuses_the_classic_group_timings() {
        let session = ("KAFKA_PROPERTY_SESSION_TIMEOUT_MS", "6000");
        let e = Settings::load_from(None, env(&[session])).unwrap_err();
        assert!(e.to_string().contains("session.timeout.ms"), "{e}");
        let classic = ("KAFKA_GROUP_PROTOCOL", "classic");
        let s = Settings::load_from(None, env(&[session, classic])).unwrap();
        assert_eq!(s.kafka.group_protocol, GroupProtocol::Classic);
        let chosen_twice = ("KAFKA_PROPERTY_GROUP_PROTOCOL", "consumer");
        assert!(Settings::load_from(None, env(&[chosen_twice])).is_err());
    }

    #[test]
    fn defaults_load_and_env_overrides_apply() {
        let s = Settings::load_from(
            None,
            env(&[
                ("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1234"),
                ("WORKER_POOL_SIZE", "3"),
                ("S3_FORCE_PATH_STYLE", "true"),
                ("KAFKA_PROPERTY_MAX_POLL_INTERVAL_MS", "6000"),
                ("KAFKA_GROUP_ID", "12345"),
            ]),
        )
        .unwrap();
        assert_eq!(s.kafka.bootstrap_servers, "127.0.0.1:1234");
        assert_eq!(s.kafka.group_id, "12345", "numeric-looking text stays text");
        assert_eq!(s.pool_size(), 3);
        assert_eq!(s.max_in_flight(), 6);
        assert!(s.storage.force_path_style);
        assert_eq!(
            s.kafka.properties["max.poll.interval.ms"].to_string(),
            "6000"
        );
        assert_eq!(s.profiles["default"].widths, vec![320, 640, 1280, 1920]);
        assert!(!s.profiles["variants"].analysis);
    }

    /// Every leaf of the embedded defaults, as `(key, value)`.
    fn leaves(
        prefix: &str,
        dict: &figment::value::Dict,
        out: &mut Vec<(String, figment::value::Value)>,
    ) {
        for (k, v) in dict {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                figment::value::Value::Dict(_, d) if !d.is_empty() => leaves(&key, d, out),
                _ => out.push((key, v.clone())),
            }
        }
    }

    /// A different valid value for a key of the defaults, as an environment value.
    fn another(key: &str, value: &figment::value::Value) -> String {
        use figment::value::{Num, Value};
        match (key, value) {
            ("worker.isolation", _) => "inline".into(),
            ("kafka.group_protocol", _) => "classic".into(),
            ("worker.sandbox_disable", _) => "seccomp".into(),
            ("http.addr", _) => "127.0.0.1:9999".into(),
            ("api.nice", _) => "5".into(),
            ("kafka.properties", _) => "{socket_timeout_ms = 1000}".into(),
            (k, _) if k.ends_with("face_cascade") || k.ends_with("profile_cascade") => {
                "/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml".into()
            }
            (k, _) if k.ends_with(".widths") => "[300, 600]".into(),
            (k, _) if k.ends_with(".formats") => "[{format = \"jpeg\", quality = 50}]".into(),
            (k, _) if k.ends_with(".renditions") => "[{height = 360, crf = 30}]".into(),
            (k, _) if k.ends_with(".thumbnail") => "{width = 100, height = 50}".into(),
            (_, Value::Bool(_, b)) => (!b).to_string(),
            (_, Value::Num(_, Num::F64(f))) => (f * 1.5).to_string(),
            (_, Value::Num(_, n)) => (n.to_i128().expect("an integer") + 1).to_string(),
            (_, Value::String(_, s)) => format!("{s}x"),
            (k, v) => panic!("no test value for {k} = {v:?}"),
        }
    }

    #[test]
    fn every_key_of_the_defaults_can_be_set_from_the_environment() {
        let dict: figment::value::Dict =
            Figment::from(Toml::string(DEFAULT_TOML)).extract().unwrap();
        let mut keys = Vec::new();
        leaves("", &dict, &mut keys);
        assert!(keys.len() > 70, "{} keys", keys.len());
        let default = format!(
            "{:?}",
            Settings::load_from(None, env(&[("API_ADDR", "127.0.0.1:9998")])).unwrap()
        );
        for (key, value) in &keys {
            let name = env_name(key);
            let raw = another(key, value);
            // Without intake the API must be on.
            let api = ("API_ADDR", "127.0.0.1:9998");
            let set = Settings::load_from(None, env(&[(&name, &raw), api]))
                .unwrap_or_else(|e| panic!("{name}={raw}: {e}"));
            assert_ne!(format!("{set:?}"), default, "{name}={raw} changed nothing");
        }
        // The documented short names are aliases: the same value by either name, the same
        // settings (keys without a default are optional ones).
        const OPTIONAL: [&str; 7] = [
            "kafka.group_instance_id",
            "kafka.progress_topic",
            "worker.id",
            "worker.sandbox_program",
            "api.addr",
            "api.tokens_file",
            "scan.clamd_addr",
        ];
        for (short, key) in ENV_KEYS {
            let Some((_, value)) = keys.iter().find(|(k, _)| k == key) else {
                assert!(
                    OPTIONAL.contains(key),
                    "{short}: {key} is not a key of the defaults"
                );
                continue;
            };
            let raw = another(key, value);
            let api = ("API_ADDR", "127.0.0.1:9998");
            let by_short = Settings::load_from(None, env(&[(short, &raw), api])).unwrap();
            let by_name = Settings::load_from(None, env(&[(&env_name(key), &raw), api])).unwrap();
            assert_eq!(format!("{by_short:?}"), format!("{by_name:?}"), "{short}");
        }
        // The short name wins when both are given.
        let s = Settings::load_from(
            None,
            env(&[
                ("MEDIA_WORKER_WORKER__POOL_SIZE", "5"),
                ("WORKER_POOL_SIZE", "3"),
            ]),
        )
        .unwrap();
        assert_eq!(s.worker.pool_size, 3);
        // Names without a section are not keys (the config file's own variable, and others).
        let s = Settings::load_from(
            None,
            env(&[
                ("MEDIA_WORKER_KAFKA__GROUP_ID", "12345"),
                ("MEDIA_WORKER_CONFIG", "/not/read/here.toml"),
                ("MEDIA_WORKER_REVISION", "abc"),
            ]),
        )
        .unwrap();
        assert_eq!(s.kafka.group_id, "12345", "numeric-looking text stays text");
    }

    #[test]
    fn a_bad_value_names_its_key_and_variable() {
        let e = Settings::load_from(None, env(&[("WORKER_POOL_SIZE", "lots")])).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("worker.pool_size"), "{text}");
        assert!(
            text.contains("WORKER_POOL_SIZE or MEDIA_WORKER_WORKER__POOL_SIZE"),
            "{text}"
        );
        assert!(!text.contains('\n'));
    }

    #[test]
    fn an_unknown_key_in_a_file_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[worker]\npool_sise = 2\n").unwrap();
        let text = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(text.contains("pool_sise"), "{text}");
    }

    #[test]
    fn the_api_shares_the_cores_and_needs_tokens_off_loopback() {
        let cores = cores();
        let on = |extra: &[(&str, &str)]| {
            // The first of a name counts: `extra` overrides the loopback address.
            let mut e = extra.to_vec();
            e.push(("API_ADDR", "127.0.0.1:8081"));
            Settings::load_from(None, env(&e))
        };
        let s = on(&[]).unwrap();
        assert_eq!(s.api_concurrency(), 1);
        assert_eq!(
            s.pool_size(),
            cores.saturating_sub(1).max(1),
            "a core for the API"
        );
        assert_eq!(s.native_slots(), s.pool_size() + 1);
        let s = on(&[("KAFKA_INTAKE", "false")]).unwrap();
        assert_eq!((s.api_concurrency(), s.native_slots()), (cores, cores));
        let s = on(&[("API_MAX_CONCURRENT", "3"), ("WORKER_POOL_SIZE", "2")]).unwrap();
        assert_eq!((s.api_concurrency(), s.pool_size()), (3, 2));
        let off = Settings::load_from(None, env(&[])).unwrap();
        assert_eq!((off.api_concurrency(), off.pool_size()), (0, cores));

        let e = on(&[("API_ADDR", "0.0.0.0:8081")]).unwrap_err().to_string();
        assert!(
            e.contains("api.tokens_file") && e.contains("loopback"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "t\n").unwrap();
        let t = tokens.to_str().unwrap();
        assert!(on(&[("API_ADDR", "0.0.0.0:8081"), ("API_TOKENS_FILE", t)]).is_ok());
        let e = Settings::load_from(None, env(&[("KAFKA_INTAKE", "false")])).unwrap_err();
        assert!(e.to_string().contains("API_ADDR"), "{e}");
        let e = on(&[("CLAMD_ADDR", "localhost:3310")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("scan.clamd_addr"), "{e}");
        let e = on(&[("MEDIA_WORKER_PROFILES__DEFAULT__SCAN", "true")]).unwrap_err();
        assert!(e.to_string().contains("profiles.default.scan"), "{e}");
    }

    #[test]
    fn a_missing_cascade_is_a_clear_error() {
        let e = Settings::load_from(None, env(&[("FACE_CASCADE", "/nope/face.xml")])).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("analysis.face_cascade") && text.contains("/nope/face.xml"),
            "{text}"
        );
    }

    #[test]
    fn profile_validation_names_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[profiles.small]\nanalysis = false\nwidths = []\nformats = []\n",
        )
        .unwrap();
        let text = Settings::load_from(Some(&path), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(text.contains("profiles.small.widths"), "{text}");
    }
}
