//! Telemetry in one place: metrics, logs, trace context, and the HTTP endpoints serving them.

pub mod health;
pub mod http;
mod metrics;
pub mod tracecontext;

pub use health::Health;
pub use metrics::Metrics;

/// JSON log lines on stderr; `RUST_LOG` filters (default `info`).
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_current_span(false)
        .try_init();
}
