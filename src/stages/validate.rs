//! Stage 1: turn a payload into a valid [`OptimizeRequest`], or say why not.

use serde_json::Value;

use crate::config::Settings;
use crate::contract::{OptimizeRequest, SCHEMA_VERSION};

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

/// `media_id` and `user_id` become parts of object keys: 1-128 of `[A-Za-z0-9_-]`.
pub fn is_valid_id(s: &str) -> bool {
    (1..=MAX_ID).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub fn parse(payload: Option<&[u8]>, settings: &Settings) -> Result<OptimizeRequest, Invalid> {
    let bytes = payload.unwrap_or_default();
    let value: Value = serde_json::from_slice(bytes).map_err(|e| Invalid {
        request_id: None,
        media_id: None,
        user_id: None,
        reason: format!("payload is not JSON: {e}"),
    })?;
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
        reason,
    };
    let req: OptimizeRequest = serde_json::from_value(value.clone())
        .map_err(|e| invalid(format!("not a request: {e}")))?;
    if req.schema_version != SCHEMA_VERSION {
        return Err(invalid(format!(
            "unsupported schema_version {}",
            req.schema_version
        )));
    }
    if req.request_id.is_empty() || req.request_id.len() > MAX_ECHO {
        return Err(invalid("request_id must be 1-256 characters".into()));
    }
    for (name, id) in [("media_id", &req.media_id), ("user_id", &req.user_id)] {
        if !is_valid_id(id) {
            return Err(invalid(format!(
                "{name} must be 1-128 characters of [A-Za-z0-9_-]"
            )));
        }
    }
    if req.source.bucket.is_empty() || req.source.key.is_empty() || req.source.key.len() > 1024 {
        return Err(invalid(
            "source.bucket and source.key (1-1024 bytes) are required".into(),
        ));
    }
    if let Some(p) = &req.profile {
        if settings.profile(p).is_none() {
            return Err(invalid(format!("unknown profile `{p}`")));
        }
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::load_from(None, Vec::new()).unwrap()
    }

    fn good() -> serde_json::Value {
        serde_json::json!({"schema_version":1,"request_id":"r1","media_id":"m-1","user_id":"u_1",
            "source":{"bucket":"b","key":"k.jpg"}})
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
