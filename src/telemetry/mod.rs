//! Telemetry only records: metrics, logs and trace context. What it records is served by
//! `http::ops`; what decides (readiness, the jobs in progress) lives in `health` and `job`.

mod logs;
mod metrics;
pub mod traces;

pub use logs::{Origin, job_finished};
pub use metrics::Metrics;

/// JSON log lines on stderr with the trace and span ids of their span (see [`logs`];
/// `RUST_LOG` filters, default `info`) and trace spans (see
/// [`traces`]; their own filter, so a quiet log keeps its traces). Shut the returned provider
/// down at exit: that flushes the spans.
pub fn init_logging() -> opentelemetry_sdk::trace::SdkTracerProvider {
    use tracing_subscriber::filter::{EnvFilter, Targets};
    use tracing_subscriber::prelude::*;
    let provider = traces::provider_from_env();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer()
        .event_format(logs::JsonWithTrace)
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let spans = traces::layer(&provider)
        .with_filter(Targets::new().with_target("media_worker", tracing::Level::INFO));
    let _ = tracing_subscriber::registry()
        .with(logs)
        .with(spans)
        .try_init();
    provider
}
