//! Stage 1: turn a payload into a valid [`OptimizeRequest`], or say why not.

use serde_json::Value;

use crate::config::{RequestSettings, Settings};
use crate::contract::{OptimizeRequest, SCHEMA_VERSION, SourceRef};

/// A payload that is not a valid request, with whatever ids could be read from it.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub request_id: Option<String>,
    pub media_id: Option<String>,
    pub user_id: Option<String>,
    pub reason: String,
}

const MAX_ID: usize = 128;
const MAX_ECHO: usize = 256;
/// The longest reason given: a reason may quote the request (an unknown profile, a serde error
/// naming a bad value), and nothing a producer sends is copied back or logged unbounded.
const MAX_REASON: usize = 300;
/// S3's limit on an object key.
const MAX_KEY_BYTES: usize = 1024;

/// `s` cut to `max` characters, marked when cut.
fn bounded(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut cut: String = s.chars().take(max).collect();
    cut.push('…');
    cut
}

/// S3's bucket naming rules: 3-63 of lowercase letters, digits, dots and hyphens, starting and
/// ending with a letter or digit, no `..`, not an IP address.
pub fn is_valid_bucket(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
        && name.parse::<std::net::Ipv4Addr>().is_err()
}

/// `media_id` and `user_id` become parts of object keys: 1-128 of `[A-Za-z0-9_-]`.
pub fn is_valid_id(s: &str) -> bool {
    (1..=MAX_ID).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub fn parse(payload: Option<&[u8]>, settings: &Settings) -> Result<OptimizeRequest, Invalid> {
    let bytes = payload.unwrap_or_default();
    let rules = &settings.requests;
    let unread = |reason: String| Invalid {
        request_id: None,
        media_id: None,
        user_id: None,
        reason: bounded(&reason, MAX_REASON),
    };
    if bytes.len() > rules.max_request_bytes {
        return Err(unread(format!(
            "the request is {} bytes, over the {}-byte limit",
            bytes.len(),
            rules.max_request_bytes
        )));
    }
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| unread(format!("payload is not JSON: {e}")))?;
    let echo = |field: &str| {
        value
            .get(field)
            .and_then(Value::as_str)
            .map(|s| s.chars().take(MAX_ECHO).collect())
    };
    let invalid = |reason: String| Invalid {
        request_id: echo("request_id"),
        media_id: echo("media_id"),
        user_id: echo("user_id"),
        reason: bounded(&reason, MAX_REASON),
    };
    let req: OptimizeRequest = serde_json::from_value(value.clone())
        .map_err(|e| invalid(format!("not a request: {e}")))?;
    if req.schema_version != SCHEMA_VERSION {
        return Err(invalid(format!(
            "unsupported schema_version {}",
            req.schema_version
        )));
    }
    if req.request_id.is_empty() || req.request_id.chars().count() > MAX_ECHO {
        return Err(invalid("request_id must be 1-256 characters".into()));
    }
    for (name, id) in [("media_id", &req.media_id), ("user_id", &req.user_id)] {
        if !is_valid_id(id) {
            return Err(invalid(format!(
                "{name} must be 1-128 characters of [A-Za-z0-9_-]"
            )));
        }
    }
    check_source(&req.source, rules).map_err(invalid)?;
    let key = &req.source.key;
    if rules.require_user_prefix && !key.starts_with(&format!("{}/", req.user_id)) {
        return Err(invalid(format!(
            "source.key must start with `{}/` (the request's user_id)",
            req.user_id
        )));
    }
    if let Some(p) = &req.profile
        && settings.profile(p).is_none()
    {
        return Err(invalid(format!("unknown profile `{}`", bounded(p, 64))));
    }
    if let Some(m) = &req.metadata {
        check_metadata(m).map_err(invalid)?;
    }
    Ok(req)
}

/// Whether a source may be read: an S3 bucket name (allowed by `ALLOWED_SOURCE_BUCKETS`) and a
/// key of 1-1024 bytes (also `POST /scan`'s object).
pub fn check_source(src: &SourceRef, rules: &RequestSettings) -> Result<(), String> {
    let (bucket, key) = (&src.bucket, &src.key);
    if !is_valid_bucket(bucket) {
        return Err(format!(
            "source.bucket `{}` is not an S3 bucket name (3-63 of [a-z0-9.-])",
            bounded(bucket, 64)
        ));
    }
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "source.key must be 1-{MAX_KEY_BYTES} bytes (it is {})",
            key.len()
        ));
    }
    let allowed = rules.allowed_buckets();
    if !allowed.is_empty() && !allowed.contains(&bucket.as_str()) {
        return Err(format!("source bucket `{bucket}` is not allowed"));
    }
    Ok(())
}

/// The bounds of `metadata` (echoed in every response, so it must stay small).
fn check_metadata(m: &crate::contract::Metadata) -> Result<(), String> {
    use crate::contract::{MAX_METADATA_ENTRIES, MAX_METADATA_KEY, MAX_METADATA_VALUE};
    if m.len() > MAX_METADATA_ENTRIES {
        return Err(format!(
            "metadata has {} keys, over the {MAX_METADATA_ENTRIES} allowed",
            m.len()
        ));
    }
    for (k, v) in m {
        let key_ok = (1..=MAX_METADATA_KEY).contains(&k.len())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !key_ok {
            return Err(format!(
                "metadata key `{}` must be 1-{MAX_METADATA_KEY} characters of [A-Za-z0-9_.-]",
                bounded(k, 64)
            ));
        }
        if v.chars().count() > MAX_METADATA_VALUE {
            return Err(format!(
                "metadata value of `{k}` is over {MAX_METADATA_VALUE} characters"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::load_from(None, Vec::new()).unwrap()
    }

    fn good() -> serde_json::Value {
        serde_json::json!({"schema_version":1,"request_id":"r1","media_id":"m-1","user_id":"u_1",
            "source":{"bucket":"uploads","key":"u_1/k.jpg"}})
    }

    fn reason(v: &serde_json::Value, s: &Settings) -> String {
        parse(Some(v.to_string().as_bytes()), s).unwrap_err().reason
    }

    #[test]
    fn oversized_payloads_and_echoed_values_are_bounded() {
        let s = settings();
        let mut v = good();
        v["pad"] = "x".repeat(70_000).into();
        let e = parse(Some(v.to_string().as_bytes()), &s).unwrap_err();
        assert!(e.reason.contains("65536-byte limit"), "{}", e.reason);
        assert_eq!(e.request_id, None, "not parsed at all");
        // A 60 kB profile name or media_type: refused, and not copied back whole.
        for field in ["profile", "media_type"] {
            let mut v = good();
            v[field] = "p".repeat(60_000).into();
            let r = reason(&v, &s);
            assert!(
                r.chars().count() <= MAX_REASON + 1,
                "{field}: {} chars",
                r.len()
            );
        }
    }

    #[test]
    fn buckets_follow_s3_naming_and_keys_its_length() {
        let s = settings();
        for bad in [
            "",
            "ab",
            "Uploads",
            "a_b",
            "-ab",
            "ab-",
            "a..b",
            "192.168.1.1",
        ] {
            let mut v = good();
            v["source"]["bucket"] = bad.into();
            assert!(reason(&v, &s).contains("bucket"), "{bad}");
        }
        let mut v = good();
        v["source"]["bucket"] = "b".repeat(950_000).into();
        let mut big = settings();
        big.requests.max_request_bytes = 2 << 20;
        let r = reason(&v, &big);
        assert!(
            r.contains("not an S3 bucket name") && r.len() < 400,
            "{}",
            r.len()
        );
        let mut v = good();
        v["source"]["key"] = "k".repeat(1025).into();
        assert!(reason(&v, &s).contains("1-1024 bytes"));
        for ok in ["abc", "my.bucket-1", "a".repeat(63).as_str()] {
            let mut v = good();
            v["source"]["bucket"] = ok.into();
            assert!(parse(Some(v.to_string().as_bytes()), &s).is_ok(), "{ok}");
        }
    }

    #[test]
    fn the_tenant_guard_limits_buckets_and_key_prefixes() {
        let mut s = settings();
        s.requests.allowed_source_buckets = "uploads, avatars".into();
        s.requests.require_user_prefix = true;
        assert!(parse(Some(good().to_string().as_bytes()), &s).is_ok());
        let mut v = good();
        v["source"]["bucket"] = "billing".into();
        assert!(reason(&v, &s).contains("not allowed"));
        let mut v = good();
        v["source"]["key"] = "u_2/k.jpg".into();
        assert!(reason(&v, &s).contains("must start with `u_1/`"));
        // Off by default.
        let mut v = good();
        v["source"] = serde_json::json!({"bucket": "billing", "key": "u_2/k.jpg"});
        assert!(parse(Some(v.to_string().as_bytes()), &settings()).is_ok());
    }

    #[test]
    fn accepts_a_valid_request() {
        let r = parse(Some(good().to_string().as_bytes()), &settings()).unwrap();
        assert_eq!((r.media_id.as_str(), r.profile), ("m-1", None));
    }

    #[test]
    fn rejects_bad_ids_and_echoes_what_it_read() {
        for bad in ["", "../etc", "a b", &"x".repeat(129)] {
            let mut v = good();
            v["media_id"] = bad.into();
            let e = parse(Some(v.to_string().as_bytes()), &settings()).unwrap_err();
            assert!(e.reason.contains("media_id"), "{bad}: {}", e.reason);
            assert_eq!(e.request_id.as_deref(), Some("r1"));
            assert_eq!(e.user_id.as_deref(), Some("u_1"));
        }
    }

    #[test]
    fn metadata_is_bounded_and_kept_verbatim() {
        let s = settings();
        let mut v = good();
        v["metadata"] = serde_json::json!({"campaign": "spring-24", "tenant.id": "42 é"});
        let r = parse(Some(&serde_json::to_vec(&v).unwrap()), &s).unwrap();
        assert_eq!(r.metadata.unwrap()["tenant.id"], "42 é");
        let many = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
        for (bad, says) in [
            (serde_json::json!({"a b": "x"}), "metadata key"),
            (serde_json::json!({"k": "x".repeat(257)}), "metadata value"),
            (serde_json::Value::Object(many), "metadata has 17 keys"),
            (serde_json::json!({"k": 1}), "expected a string"),
        ] {
            v["metadata"] = bad.clone();
            let e = parse(Some(&serde_json::to_vec(&v).unwrap()), &s).unwrap_err();
            assert!(e.reason.contains(says), "{bad}: {}", e.reason);
        }
    }

    #[test]
    fn rejects_garbage_missing_fields_and_unknown_profiles() {
        let s = settings();
        assert!(
            parse(Some(b"{not json"), &s)
                .unwrap_err()
                .reason
                .contains("not JSON")
        );
        assert!(parse(None, &s).is_err());
        let mut v = good();
        v.as_object_mut().unwrap().remove("source");
        assert!(
            parse(Some(v.to_string().as_bytes()), &s)
                .unwrap_err()
                .reason
                .contains("source")
        );
        let mut v = good();
        v["profile"] = "nope".into();
        assert!(
            parse(Some(v.to_string().as_bytes()), &s)
                .unwrap_err()
                .reason
                .contains("nope")
        );
        let mut v = good();
        v["schema_version"] = 2.into();
        assert!(parse(Some(v.to_string().as_bytes()), &s).is_err());
    }
}
