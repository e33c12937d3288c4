//! The Prometheus catalogue: one registry, names prefixed `media_worker_`, base units.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use prometheus::{
    Counter, Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::contract::{ErrorCode, MediaType, OptimizeResponse, Stage};

pub struct Metrics {
    pub registry: Registry,
    pub requests_received: IntCounter,
    pub jobs: IntCounterVec,
    pub job_duration: HistogramVec,
    pub stage_duration: HistogramVec,
    pub in_flight: IntGauge,
    pub pool_size: IntGauge,
    pub pool_busy: IntGauge,
    pub retries: IntCounterVec,
    pub held_jobs: IntGauge,
    pub publish_failures: IntCounter,
    pub commits: IntCounter,
    pub commit_failures: IntCounter,
    pub rebalances: IntCounterVec,
    pub paused: IntGauge,
    pub assigned_partitions: IntGauge,
    pub consumer_lag: IntGaugeVec,
    /// The unit topic's partitions assigned to this member (its own group).
    pub unit_partitions: IntGauge,
    pub unit_lag: IntGaugeVec,
    /// Sum of `consumer_lag` (for the backlog estimate).
    lag_total: AtomicI64,
    /// Recent mean job wall time in seconds, as f64 bits (see `job_finished`).
    mean_job_seconds: AtomicU64,
    pub backlog_seconds: Gauge,
    pub bytes_downloaded: IntCounter,
    pub bytes_uploaded: IntCounter,
    pub scratch_free_bytes: IntGauge,
    pub video_encoded_seconds: Counter,
    /// Video renditions uploaded, by `origin`: `encoded` by this attempt, or `resumed` (made
    /// by an earlier attempt for the same source and profile, not made again).
    pub renditions: IntCounterVec,
    /// Progress events by `result` (`published`, `failed`), see `worker::progress`.
    pub progress_events: IntCounterVec,
    pub replays: IntCounter,
    /// Sandbox children that died on their own (a crash, the memory cap), see `sandbox`.
    pub sandbox_deaths: IntCounter,
    pub dead_lettered: IntCounter,
    pub minimal_responses: IntCounter,
    pub responses_held: IntGauge,
    pub responses_dropped: IntCounter,
    pub producer_restarts: IntCounter,
    pub ready: IntGauge,
    /// Malware scans by verdict (`clean`, `infected`, `error`), see `scan`.
    pub scans: IntCounterVec,
    pub scan_duration: prometheus::Histogram,
    /// Scans that could not reach clamd (connection refused, reset, timed out).
    pub clamd_errors: IntCounter,
    /// 1 while clamd answers (pinged every `scan.probe_interval_secs`, and set by each scan).
    pub clamd_up: IntGaugeVec,
    /// Job API requests by route and HTTP status.
    pub api_requests: IntCounterVec,
    pub api_duration: HistogramVec,
    /// Job API requests being answered.
    pub api_in_flight: IntGauge,
    /// 1, labelled with the version, source revision and build profile of this binary.
    pub build_info: IntGaugeVec,
    /// 1 for each sandbox layer active on this kernel, 0 for each that is not (`sandbox::layers`).
    pub sandbox_layers: IntGaugeVec,
}

/// The mean job time assumed until jobs have been measured.
const PRIOR_JOB_SECONDS: f64 = 1.0;

/// Up to an hour: the longest ffmpeg run allowed by default is 30 s + 4 s x 600 s = 2430 s.
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1200.0, 2400.0, 3600.0,
];

fn name(n: &str) -> String {
    format!("media_worker_{n}")
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        // process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds, ...
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("process collector registers once");
        fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
            r.register(Box::new(c.clone()))
                .expect("metric names are unique");
            c
        }
        let counter = |n: &str, help: &str| reg(&registry, IntCounter::new(name(n), help).unwrap());
        let gauge = |n: &str, help: &str| reg(&registry, IntGauge::new(name(n), help).unwrap());
        let counter_vec = |n: &str, help: &str, labels: &[&str]| {
            reg(
                &registry,
                IntCounterVec::new(Opts::new(name(n), help), labels).unwrap(),
            )
        };
        let histogram = |n: &str, help: &str, labels: &[&str]| {
            let opts = HistogramOpts::new(name(n), help).buckets(DURATION_BUCKETS.to_vec());
            reg(&registry, HistogramVec::new(opts, labels).unwrap())
        };
        let m = Metrics {
            requests_received: counter(
                "requests_received_total",
                "Request messages received from Kafka",
            ),
            jobs: counter_vec(
                "jobs_total",
                "Finished jobs by outcome (completed, degraded, failed) and error code",
                &["outcome", "error_code"],
            ),
            job_duration: histogram(
                "job_duration_seconds",
                "Wall time of a job, from receipt to response",
                &["media_type", "outcome"],
            ),
            stage_duration: histogram(
                "stage_duration_seconds",
                "Wall time of one stage, by media type (`unknown` before it is detected)",
                &["stage", "media_type"],
            ),
            in_flight: gauge("jobs_in_flight", "Jobs received and not yet answered"),
            pool_size: gauge("pool_size", "Permits in the job pool"),
            pool_busy: gauge("pool_busy", "Pool permits in use"),
            retries: counter_vec(
                "retries_total",
                "Attempts retried, by error code",
                &["error_code"],
            ),
            held_jobs: gauge(
                "jobs_held",
                "Jobs out of attempts for a fault of this pod or a dependency, held (unanswered, \
                 uncommitted) until the pod is well",
            ),
            publish_failures: counter(
                "kafka_publish_failures_total",
                "Response publish attempts that failed",
            ),
            commits: counter("kafka_commits_total", "Offset commits sent"),
            commit_failures: counter("kafka_commit_failures_total", "Offset commits that failed"),
            rebalances: counter_vec("kafka_rebalances_total", "Rebalance events", &["kind"]),
            paused: gauge(
                "kafka_paused",
                "1 while the partitions are paused (the in-flight bound held for 1 s, the pod not \
                 ready, or draining)",
            ),
            assigned_partitions: gauge("kafka_assigned_partitions", "Partitions assigned"),
            consumer_lag: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        name("kafka_consumer_lag"),
                        "Messages behind the end of each assigned request partition (from \
                         librdkafka statistics, every 5 s)",
                    ),
                    &["partition"],
                )
                .unwrap(),
            ),
            unit_partitions: gauge(
                "kafka_unit_partitions",
                "Unit-topic partitions assigned to this member (in the unit topic's own group)",
            ),
            unit_lag: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        name("kafka_unit_lag"),
                        "Unit tasks behind the end of each assigned unit-topic partition (from \
                         librdkafka statistics, every 5 s)",
                    ),
                    &["partition"],
                )
                .unwrap(),
            ),
            bytes_downloaded: counter("downloaded_bytes_total", "Source bytes downloaded"),
            bytes_uploaded: counter("uploaded_bytes_total", "Output bytes uploaded"),
            scratch_free_bytes: gauge(
                "scratch_free_bytes",
                "Free bytes on the scratch file system",
            ),
            video_encoded_seconds: reg(
                &registry,
                Counter::new(
                    name("video_encoded_seconds_total"),
                    "Seconds of video written by ffmpeg (from its progress reports); its rate \
                     over the busy pool is the encoding speed",
                )
                .unwrap(),
            ),
            lag_total: AtomicI64::new(0),
            mean_job_seconds: AtomicU64::new(PRIOR_JOB_SECONDS.to_bits()),
            backlog_seconds: reg(
                &registry,
                Gauge::new(
                    name("backlog_seconds"),
                    "Estimated seconds of work queued for this worker: consumer lag x recent \
                     mean job seconds + what its in-flight jobs still need (the autoscaling \
                     signal: lag counts a 60 s video and a 50 ms thumbnail the same)",
                )
                .unwrap(),
            ),
            minimal_responses: counter(
                "minimal_responses_total",
                "Responses replaced by a minimal failure response (response and dead letter \
                 rejected by the broker)",
            ),
            responses_held: gauge(
                "responses_held",
                "Responses the broker cannot take now, retried for as long as it takes (their \
                 offsets held, intake paused)",
            ),
            responses_dropped: counter(
                "responses_dropped_total",
                "Requests for which nothing could be published (logged with their coordinates, \
                 committed)",
            ),
            dead_lettered: counter(
                "kafka_dead_lettered_total",
                "Requests sent to the dead-letter topic because their response could not be published",
            ),
            producer_restarts: counter(
                "kafka_producer_restarts_total",
                "Producers replaced after a fatal (idempotence) error",
            ),
            renditions: counter_vec(
                "video_renditions_total",
                "Video renditions in responses, by origin: encoded by this attempt, or resumed \
                 (uploaded by an earlier attempt for the same source ETag and profile)",
                &["origin"],
            ),
            progress_events: counter_vec(
                "progress_events_total",
                "Progress events for long jobs (KAFKA_PROGRESS_TOPIC), by result",
                &["result"],
            ),
            replays: counter(
                "replays_total",
                "Requests answered from a stored manifest (same source ETag and profile)",
            ),
            sandbox_deaths: counter(
                "sandbox_deaths_total",
                "Sandbox job processes that died (a decoder crash, the memory cap) or broke the protocol; each costs at most that job",
            ),
            ready: gauge("ready", "1 when ready to take work"),
            scans: counter_vec(
                "scans_total",
                "Malware scans by verdict (clean, infected, error)",
                &["verdict"],
            ),
            scan_duration: reg(
                &registry,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        name("scan_duration_seconds"),
                        "Wall time of one clamd scan, streaming included",
                    )
                    .buckets(DURATION_BUCKETS.to_vec()),
                )
                .unwrap(),
            ),
            clamd_errors: counter(
                "clamd_errors_total",
                "Scans that could not reach clamd (refused, reset, timed out)",
            ),
            clamd_up: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        name("clamd_up"),
                        "1 while clamd answers PING, by its address (absent without CLAMD_ADDR)",
                    ),
                    &["clamd"],
                )
                .unwrap(),
            ),
            api_requests: counter_vec(
                "api_requests_total",
                "Job API requests by route and HTTP status",
                &["route", "status"],
            ),
            api_duration: histogram(
                "api_request_duration_seconds",
                "Wall time of a job API request, by route",
                &["route"],
            ),
            api_in_flight: gauge("api_in_flight", "Job API requests being answered"),
            build_info: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        name("build_info"),
                        "1, labelled with this binary's version, source revision and build profile",
                    ),
                    &["version", "revision", "profile"],
                )
                .unwrap(),
            ),
            sandbox_layers: reg(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        name("sandbox_layers"),
                        "1 for each sandbox layer active for job processes, 0 for each that is not (absent inline)",
                    ),
                    &["layer"],
                )
                .unwrap(),
            ),
            registry,
        };
        m.init_series();
        m.build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                env!("MEDIA_WORKER_REVISION"),
                env!("MEDIA_WORKER_PROFILE"),
            ])
            .set(1);
        m
    }

    /// Every known label combination starts at 0, so `rate()` and alerts see a zero rather
    /// than a missing series before the first event.
    fn init_series(&self) {
        self.jobs.with_label_values(&["completed", ""]);
        self.jobs.with_label_values(&["degraded", ""]);
        for code in ErrorCode::ALL {
            self.jobs.with_label_values(&["failed", code.as_str()]);
            if code == ErrorCode::StorageUnavailable {
                self.retries.with_label_values(&[code.as_str()]);
            }
        }
        for origin in ["encoded", "resumed"] {
            self.renditions.with_label_values(&[origin]);
        }
        for result in ["published", "failed"] {
            self.progress_events.with_label_values(&[result]);
        }
        for media_type in ["image", "video", "unknown"] {
            for outcome in ["completed", "degraded", "failed"] {
                self.job_duration.with_label_values(&[media_type, outcome]);
            }
            for stage in Stage::ALL {
                self.stage_duration
                    .with_label_values(&[stage.as_str(), media_type]);
            }
        }
        for kind in ["assign", "revoke", "error"] {
            self.rebalances.with_label_values(&[kind]);
        }
        for verdict in ["clean", "infected", "error"] {
            self.scans.with_label_values(&[verdict]);
        }
        for route in ["/transcode", "/scan"] {
            self.api_duration.with_label_values(&[route]);
            self.api_requests.with_label_values(&[route, "200"]);
        }
    }

    /// A job finished after `d`: feeds the recent mean (exponentially weighted, 1/20 per job).
    /// A finished job: its outcome, code and duration.
    pub fn observe_response(&self, r: &OptimizeResponse, elapsed: Duration) {
        let (outcome, code) = (
            r.status.as_str(),
            r.error.as_ref().map_or("", |e| e.code.as_str()),
        );
        let media_type = r.media_type.map_or("unknown", |m| m.as_str());
        self.jobs.with_label_values(&[outcome, code]).inc();
        self.job_finished(elapsed);
        self.job_duration
            .with_label_values(&[media_type, outcome])
            .observe(elapsed.as_secs_f64());
    }

    pub fn job_finished(&self, d: Duration) {
        let old = f64::from_bits(self.mean_job_seconds.load(Ordering::Relaxed));
        let new = old + (d.as_secs_f64() - old) / 20.0;
        self.mean_job_seconds
            .store(new.to_bits(), Ordering::Relaxed);
    }

    pub fn set_lag_total(&self, lag: i64) {
        self.lag_total.store(lag, Ordering::Relaxed);
    }

    /// Updates `backlog_seconds` from the lag, the recent mean and the in-flight jobs' ages.
    pub fn update_backlog(&self, in_flight_elapsed: impl Iterator<Item = Duration>) -> f64 {
        let mean = f64::from_bits(self.mean_job_seconds.load(Ordering::Relaxed));
        let queued = self.lag_total.load(Ordering::Relaxed).max(0) as f64 * mean;
        let running: f64 = in_flight_elapsed
            .map(|e| (mean - e.as_secs_f64()).max(0.0))
            .sum();
        self.backlog_seconds.set(queued + running);
        queued + running
    }

    pub fn observe_stage(&self, stage: Stage, media_type: Option<MediaType>, d: Duration) {
        let kind = media_type.map_or("unknown", MediaType::as_str);
        self.stage_duration
            .with_label_values(&[stage.as_str(), kind])
            .observe(d.as_secs_f64());
    }

    /// Counts a pool permit as busy until the guard drops.
    pub fn busy_permit(&self) -> Counted {
        Counted::new(&self.pool_busy)
    }

    /// Counts a job as held until the guard drops (also when the job is dropped meanwhile).
    pub fn held_job(&self) -> Counted {
        Counted::new(&self.held_jobs)
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encodable");
        String::from_utf8(buf).expect("utf-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One unit of a gauge, from creation until drop (it may move to another thread).
pub struct Counted(IntGauge);

impl Counted {
    fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_is_lag_times_the_mean_job_plus_what_running_jobs_still_need() {
        let m = Metrics::new();
        m.set_lag_total(10);
        let running = [Duration::from_millis(500), Duration::from_secs(3)];
        // Prior mean 1 s: 10 x 1 + (1 - 0.5) + 0 (the 3 s job is past the mean).
        assert_eq!(m.update_backlog(running.into_iter()), 10.5);
        m.job_finished(Duration::from_secs(21)); // mean 1 + (21 - 1) / 20 = 2
        assert_eq!(m.update_backlog(std::iter::empty()), 20.0);
        assert!(m.render().contains("media_worker_backlog_seconds 20"));
    }
}
