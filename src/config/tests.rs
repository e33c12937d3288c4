use super::*;
use crate::kafka::GroupProtocol;

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
        ("worker.media_memory_limit_bytes", _) => (1u64 << 30).to_string(),
        ("kafka.properties", _) => "{socket_timeout_ms = 1000}".into(),
        (k, _) if k.ends_with("face_cascade") || k.ends_with("profile_cascade") => {
            "/usr/share/opencv4/haarcascades/haarcascade_frontalface_default.xml".into()
        }
        (k, _) if k.ends_with(".widths") => "[300, 600]".into(),
        (k, _) if k.ends_with(".formats") => "[{format = \"jpeg\", quality = 50}]".into(),
        (k, _) if k.ends_with(".renditions") => "[{height = 360, crf = 30}]".into(),
        (k, _) if k.ends_with(".thumbnail") => "{width = 100, height = 50}".into(),
        (k, _) if k.ends_with(".storyboard.format") => "jpeg".into(),
        (k, _) if k.ends_with(".streaming") => "[\"dash\"]".into(),
        (k, _) if k.ends_with(".max_true_peak_dbtp") => "-2.0".into(),
        (_, Value::Bool(_, b)) => (!b).to_string(),
        (_, Value::Num(_, Num::F64(f))) => (f * 1.5).to_string(),
        (_, Value::Num(_, n)) => (n.to_i128().expect("an integer") + 1).to_string(),
        (_, Value::String(_, s)) => format!("{s}x"),
        (k, v) => panic!("no test value for {k} = {v:?}"),
    }
}

#[test]
fn every_key_of_the_defaults_can_be_set_from_the_environment() {
    let dict: figment::value::Dict = Figment::from(Toml::string(DEFAULT_TOML)).extract().unwrap();
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
    // The documented short names are aliases of keys of the settings: the same value by
    // either name, the same settings (keys without a default are optional ones).
    for (short, key) in ENV_KEYS {
        assert!(
            KEYS.contains_key(*key),
            "{short}: {key} is not a key of the settings"
        );
        let Some((_, value)) = keys.iter().find(|(k, _)| k == key) else {
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
    // A one-permit pod taking unit tasks runs them on a lane of their own beside its permit.
    let units = |pool| on(&[("KAFKA_UNIT_TOPIC", "units"), ("WORKER_POOL_SIZE", pool)]).unwrap();
    assert_eq!((units("1").parts_lane(), units("1").native_slots()), (1, 3));
    assert_eq!((units("2").parts_lane(), units("2").native_slots()), (0, 3));
    let no_units = on(&[("WORKER_POOL_SIZE", "1")]).unwrap();
    assert_eq!((no_units.parts_lane(), no_units.native_slots()), (0, 2));
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

/// Which keys stay text is read from the types: every string, path, address and name, and
/// no number, flag, list or table.
#[test]
fn the_text_keys_are_read_from_the_settings_types() {
    use env::Kind::{Parsed, Text};
    let kind = |key: &str| KEYS.get(key).copied();
    for key in [
        "kafka.group_id",
        "kafka.group_instance_id",
        "kafka.progress_topic",
        "kafka.unit_topic",
        "kafka.group_protocol",
        "worker.tmp_dir",
        "worker.isolation",
        "worker.sandbox_program",
        "http.addr",
        "api.addr",
        "scan.clamd_addr",
        "video.ffprobe",
        "requests.allowed_source_buckets",
    ] {
        assert_eq!(kind(key), Some(Text), "{key}");
    }
    for key in [
        "kafka.max_in_flight",
        "kafka.progress_step",
        "kafka.intake",
        "kafka.properties",
        "worker.pool_size",
        "limits.max_video_fps",
        "profiles",
    ] {
        assert_eq!(kind(key), Some(Parsed), "{key}");
    }
    assert_eq!(
        kind("profiles.default.widths"),
        None,
        "a table of names is one key"
    );
    // The numeric-looking group id through the full name stays text too.
    let s = Settings::load_from(None, env(&[("MEDIA_WORKER_KAFKA__GROUP_INSTANCE_ID", "7")]));
    assert_eq!(s.unwrap().kafka.group_instance_id.as_deref(), Some("7"));
}

#[test]
fn a_memory_cap_too_small_for_a_job_process_is_refused_naming_its_key() {
    let e = Settings::load_from(None, env(&[("MEDIA_MEMORY_LIMIT_BYTES", "268435456")]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("worker.media_memory_limit_bytes") && e.contains("256 MiB is below the 512 MiB"),
        "{e}"
    );
    for ok in ["0", "536870912"] {
        let s = Settings::load_from(None, env(&[("MEDIA_MEMORY_LIMIT_BYTES", ok)])).unwrap();
        assert_eq!(s.worker.media_memory_limit_bytes.to_string(), ok);
    }
}
