//! OpenTelemetry traces. Each message is one span tree:
//!
//! ```text
//! media.process_event                      (continues the request's W3C traceparent)
//! ├─ media.process_job_with_retry
//! │  └─ media.process_job                  (one per attempt)
//! │     ├─ media.download
//! │     ├─ image.analyze, image.compress   | media.process_video
//! │     └─ media.upload
//! └─ kafka.send_processing_result          (its context goes out as the response's traceparent)
//! ```
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
    let builder = SdkTracerProvider::builder().with_resource(
        opentelemetry_sdk::Resource::builder()
            .with_service_name("media-worker")
            .build(),
    );
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
