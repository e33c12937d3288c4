//! Environment variables: every key by its full name (`MEDIA_WORKER_<SECTION>__<KEY>`), the
//! documented short names of [`ENV_KEYS`], and librdkafka properties
//! (`KAFKA_PROPERTY_<NAME>`). Which keys hold text is read from the settings' own types
//! ([`keys`]), not kept in a list beside them, and the short names are checked against them.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};

/// Prefix of the environment variable of every key: `MEDIA_WORKER_<SECTION>__<KEY>` (upper
/// case, `__` between levels), e.g. `MEDIA_WORKER_LIMITS__MAX_FRAMES`,
/// `MEDIA_WORKER_PROFILES__DEFAULT__WIDTHS="[320, 640]"`.
pub const ENV_PREFIX: &str = "MEDIA_WORKER_";

/// Prefix of environment variables passed to librdkafka: `KAFKA_PROPERTY_SESSION_TIMEOUT_MS`
/// sets `session.timeout.ms`.
pub const KAFKA_PROPERTY_PREFIX: &str = "KAFKA_PROPERTY_";

/// Short names kept for the documented settings, and the keys they set (each a key of
/// [`keys`], which a test checks). The short name wins when both are given.
pub const ENV_KEYS: &[(&str, &str)] = &[
    ("KAFKA_BOOTSTRAP_SERVERS", "kafka.bootstrap_servers"),
    ("KAFKA_GROUP_ID", "kafka.group_id"),
    ("KAFKA_GROUP_INSTANCE_ID", "kafka.group_instance_id"),
    ("KAFKA_GROUP_PROTOCOL", "kafka.group_protocol"),
    ("KAFKA_REQUEST_TOPIC", "kafka.request_topic"),
    ("KAFKA_RESPONSE_TOPIC", "kafka.response_topic"),
    ("KAFKA_DLQ_TOPIC", "kafka.dlq_topic"),
    ("KAFKA_PROGRESS_TOPIC", "kafka.progress_topic"),
    ("KAFKA_UNIT_TOPIC", "kafka.unit_topic"),
    ("KAFKA_UNIT_GROUP_ID", "kafka.unit_group_id"),
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
    ("SCRATCH_BYTES", "worker.scratch_bytes"),
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

/// The environment variable of a key: `worker.pool_size` → `MEDIA_WORKER_WORKER__POOL_SIZE`.
pub fn env_name(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.to_ascii_uppercase().replace('.', "__")
    )
}

/// The environment's keys and raw values, in the order they apply: full names, then short
/// names (which win).
pub fn overrides(env: &[(String, String)]) -> Vec<(String, &String)> {
    // Every key is in a section: names without `__` are not keys (`MEDIA_WORKER_CONFIG` names
    // the file).
    let full = env.iter().filter_map(|(name, raw)| {
        let rest = name.strip_prefix(ENV_PREFIX)?;
        rest.contains("__")
            .then(|| (rest.to_ascii_lowercase().replace("__", "."), raw))
    });
    let short = ENV_KEYS.iter().filter_map(|(name, key)| {
        let (_, raw) = env.iter().find(|(n, _)| n == name)?;
        Some(((*key).to_owned(), raw))
    });
    full.chain(short).collect()
}

/// librdkafka properties from the environment: `KAFKA_PROPERTY_SESSION_TIMEOUT_MS=6000` is
/// `session.timeout.ms`.
pub fn kafka_properties(env: &[(String, String)]) -> impl Iterator<Item = (String, &String)> {
    env.iter().filter_map(|(name, value)| {
        let prop = name.strip_prefix(KAFKA_PROPERTY_PREFIX)?;
        Some((prop.to_ascii_lowercase().replace('_', "."), value))
    })
}

/// What a key holds, as far as reading it from the environment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Text (a string, a path, an address, a name): `KAFKA_GROUP_ID=12345` stays text.
    Text,
    /// A number, a boolean, a list or a table: parsed as figment parses environment values.
    Parsed,
}

/// Every key of `T` (a struct of sections, as `Settings`) and what it holds, read from its
/// `Deserialize` implementation; tables of arbitrary names (`profiles`, `kafka.properties`)
/// are one key each.
pub fn keys<'de, T: Deserialize<'de>>() -> BTreeMap<String, Kind> {
    let mut found = BTreeMap::new();
    T::deserialize(Probe {
        key: String::new(),
        found: &mut found,
    })
    .expect("every field of the settings takes the probe's stand-in values");
    found
}

/// A deserializer that records the key it is asked for and answers with a stand-in value
/// every field type accepts.
struct Probe<'a> {
    key: String,
    found: &'a mut BTreeMap<String, Kind>,
}

impl Probe<'_> {
    fn record(self, kind: Kind) {
        self.found.insert(self.key, kind);
    }
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        self.record(Kind::Parsed);
        v.visit_u64(1)
    }
    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        self.record(Kind::Parsed);
        v.visit_bool(false)
    }
    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        self.record(Kind::Text);
        // A socket address is the strictest of the text types.
        v.visit_str("127.0.0.1:0")
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        self.deserialize_str(v)
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        v.visit_some(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        self.record(Kind::Parsed);
        v.visit_seq(de::value::SeqDeserializer::<_, Self::Error>::new(
            std::iter::empty::<u64>(),
        ))
    }
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error> {
        self.record(Kind::Parsed);
        v.visit_map(de::value::MapDeserializer::<_, Self::Error>::new(
            std::iter::empty::<(u64, u64)>(),
        ))
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Self::Error> {
        v.visit_map(Fields {
            probe: self,
            fields: fields.iter(),
            next: None,
        })
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Self::Error> {
        self.record(Kind::Text);
        v.visit_enum(variants[0].into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf unit
        unit_struct newtype_struct tuple tuple_struct identifier ignored_any
    }
}

/// A struct's fields, each answered by a probe one level down.
struct Fields<'a> {
    probe: Probe<'a>,
    fields: std::slice::Iter<'static, &'static str>,
    next: Option<&'static str>,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = de::value::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Self::Error> {
        self.next = self.fields.next().copied();
        self.next
            .map(|f| seed.deserialize(f.into_deserializer()))
            .transpose()
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<S::Value, Self::Error> {
        let field = self.next.expect("a key before its value");
        let key = match self.probe.key.as_str() {
            "" => field.to_owned(),
            parent => format!("{parent}.{field}"),
        };
        seed.deserialize(Probe {
            key,
            found: self.probe.found,
        })
    }
}
