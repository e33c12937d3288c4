//! W3C trace context: the response continues the request's trace (same trace id, a new span id).

/// `00-{trace id}-{new span id}-{flags}` for a valid `traceparent`, else `None`.
pub fn child_traceparent(parent: &str) -> Option<String> {
    let parts: Vec<&str> = parent.trim().split('-').collect();
    let [version, trace_id, span_id, flags] = parts[..] else {
        return None;
    };
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if version != "00" || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || span_id.bytes().all(|b| b == b'0') {
        return None;
    }
    let span = loop {
        let s = fastrand::u64(..);
        if s != 0 {
            break s;
        }
    };
    Some(format!(
        "00-{}-{span:016x}-{flags}",
        trace_id.to_ascii_lowercase()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_trace_and_replaces_the_span() {
        let p = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let c = child_traceparent(p).unwrap();
        assert!(c.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
        assert!(c.ends_with("-01"));
        assert_ne!(c, p);
        assert_eq!(c.len(), p.len());
        assert!(child_traceparent("garbage").is_none());
        assert!(
            child_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none()
        );
    }
}
