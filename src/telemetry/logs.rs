//! JSON log lines, one per event, that carry the `trace_id` and `span_id` of the span they
//! were logged in (when it is an OpenTelemetry span), so a log line leads to its trace:
//! `{"timestamp","level","fields":{"message",...},"target","trace_id","span_id"}`.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of the worker's logs.
pub struct JsonWithTrace;

impl<S, N> FormatEvent<S, N> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Map::new();
        event.record(&mut Fields(&mut fields));
        let meta = event.metadata();
        let mut line = Map::new();
        let now = humantime::format_rfc3339_micros(std::time::SystemTime::now());
        line.insert("timestamp".into(), now.to_string().into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("fields".into(), Value::Object(fields));
        line.insert("target".into(), meta.target().into());
        // The innermost span that is an OpenTelemetry span (filtered ones are not).
        let ids = ctx.lookup_current().and_then(|span| {
            span.scope().find_map(|s| {
                let ext = s.extensions();
                let otel = ext.get::<OtelData>()?;
                Some((otel.trace_id()?, otel.span_id()?))
            })
        });
        if let Some((trace, span)) = ids {
            line.insert("trace_id".into(), trace.to_string().into());
            line.insert("span_id".into(), span.to_string().into());
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// An event's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_owned(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
}

/// Where a finished job's request came from, for its log line.
pub enum Origin {
    Kafka { partition: i32, offset: i64 },
    Api { http_status: u16 },
}

/// The one log line per job outcome (`"job finished"`), whichever way the request came.
pub fn job_finished(r: &crate::contract::OptimizeResponse, origin: Origin) {
    let (partition, offset, http_status) = match origin {
        Origin::Kafka { partition, offset } => (Some(partition), Some(offset), None),
        Origin::Api { http_status } => (None, None, Some(http_status)),
    };
    tracing::info!(
        request_id = r.request_id.as_deref().unwrap_or(""),
        media_id = r.media_id.as_deref().unwrap_or(""),
        partition,
        offset,
        http_status,
        status = r.status.as_str(),
        error_code = r.error.as_ref().map_or("", |e| e.code.as_str()),
        stage = r.error.as_ref().map_or("", |e| e.stage.as_str()),
        attempts = r.attempts,
        outputs = r.outputs.len(),
        replayed = r.replayed,
        duration_ms = r.duration_ms,
        "job finished"
    );
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::prelude::*;

    use super::*;

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_logged_in_a_span_names_its_trace_and_span() {
        use opentelemetry::trace::TraceContextExt;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let out = Buffer::default();
        let sink = out.clone();
        let subscriber = tracing_subscriber::registry()
            .with(super::super::traces::layer(&provider))
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(JsonWithTrace)
                    .with_writer(move || sink.clone()),
            );
        let (trace, span_id) = tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("job");
            let _in = span.enter();
            tracing::info!(partition = 3, ok = true, "inside");
            let cx = span.context();
            let sc = cx.span().span_context().clone();
            drop(_in);
            tracing::info!("outside");
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["fields"]["message"], "inside");
        assert_eq!(lines[0]["fields"]["partition"], 3);
        assert_eq!(lines[0]["trace_id"], trace.as_str());
        assert_eq!(lines[0]["span_id"], span_id.as_str());
        assert_eq!(lines[1]["fields"]["message"], "outside");
        assert!(lines[1].get("trace_id").is_none(), "{}", lines[1]);
    }
}
