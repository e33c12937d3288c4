//! OpenTelemetry traces. Each message is one span tree:
//!
//! ```text
//! media.process_event                      (continues the request's W3C traceparent)
//! ├─ media.process_job_with_retry
//! │  └─ media.process_job                  (one per attempt)
//! │     ├─ media.download
//! │     ├─ media.probe, media.analyze, media.transform  (from the media work's stage events)
//! │     └─ media.upload
//! └─ kafka.send_processing_result          (its context goes out as the response's traceparent)
//! ```
//!
//! A `POST /transcode` of the job API is the same tree under a server span `POST /transcode`
//! (continuing the request's `traceparent` header) instead of `media.process_event`.
//!
//! Spans are `tracing` spans bridged by `tracing-opentelemetry`; they are exported over
//! OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Without it the provider still gives
//! every span its ids, so the response's traceparent continues the producer's trace either way.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The provider: OTLP/HTTP export when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (the exporter
/// reads the standard `OTEL_*` variables itself), else ids only.
pub fn provider_from_env() -> SdkTracerProvider {
    let builder = SdkTracerProvider::builder().with_resource(resource());
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_default();
    if endpoint.is_empty() {
        return builder.build();
    }
    match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(exporter) => builder.with_batch_exporter(exporter).build(),
        Err(e) => {
            eprintln!("media-worker: OTLP exporter disabled: {e}");
            builder.build()
        }
    }
}

/// `service.name` (`OTEL_SERVICE_NAME` or `service.name` in `OTEL_RESOURCE_ATTRIBUTES` when
/// given, else `media-worker`), `service.version`, and the SDK's own attributes.
pub fn resource() -> opentelemetry_sdk::Resource {
    // The builder's detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; without
    // either the SDK says `unknown_service`.
    let detected = opentelemetry_sdk::Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::new("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    let builder = opentelemetry_sdk::Resource::builder().with_attribute(
        opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
    );
    if named {
        builder.build()
    } else {
        builder.with_service_name("media-worker").build()
    }
}

/// The `tracing` layer that turns spans into OpenTelemetry spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("media-worker"))
}

/// Makes `span` a child of the remote span named by a W3C `traceparent` (ignored when absent
/// or invalid: the span then starts a new trace).
pub fn continue_trace(span: &Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let carrier = HashMap::from([("traceparent".to_owned(), tp.to_owned())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// `span`'s W3C `traceparent`, for the headers of a message it sends.
pub fn traceparent_of(span: &Span) -> Option<String> {
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(r: &opentelemetry_sdk::Resource, key: &'static str) -> Option<String> {
        r.get(&opentelemetry::Key::new(key))
            .map(|v| v.as_str().into_owned())
    }

    #[test]
    fn the_service_is_named_and_versioned_and_otel_service_name_wins() {
        let r = resource();
        assert_eq!(
            attribute(&r, "service.name").as_deref(),
            Some("media-worker")
        );
        assert_eq!(
            attribute(&r, "service.version").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
        // SAFETY: this test runs in a process of its own (nextest), no other thread reads it.
        unsafe { std::env::set_var("OTEL_SERVICE_NAME", "media-worker-canary") };
        let r = resource();
        assert_eq!(
            attribute(&r, "service.name").as_deref(),
            Some("media-worker-canary")
        );
        assert_eq!(
            attribute(&r, "service.version").as_deref(),
            Some(env!("CARGO_PKG_VERSION"))
        );
    }
}
