//! What dashboards and on-call read: /metrics counters against the responses actually seen,
//! /health/ready following its dependencies, consumer lag.

mod common;

use std::collections::BTreeMap;

use common::*;
use media_worker::contract::Status;

/// Every sample of the counters and gauges this test reads, keyed by the whole series name.
fn samples(worker: &Worker) -> BTreeMap<String, f64> {
    let (_, text) = worker.http_get("/metrics").expect("metrics");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, series: &str) -> f64 {
    after.get(series).copied().unwrap_or(0.0) - before.get(series).copied().unwrap_or(0.0)
}

/// A batch of good, broken and invalid requests: the counters move by exactly the responses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_by_exactly_the_responses_seen() {
    let stack = Stack::start(2).await;
    let env = stack.worker_env("g-obs");
    let worker = Worker::start(&env);
    worker.wait_ready();
    let responses = stack.responses();
    for name in [
        "rails_racecar.jpg",
        "sharp_truncated.jpg",
        "sharp_check.svg",
    ] {
        stack.upload_corpus(name).await;
    }
    let before = samples(&worker);
    let files = [
        "rails_racecar.jpg",
        "sharp_truncated.jpg",
        "sharp_check.svg",
        "rails_racecar.jpg",
        "missing.jpg",
    ];
    for (i, f) in files.iter().enumerate() {
        stack.send(&request(&format!("obs-{i}"), f)).await;
    }
    stack.send_raw("junk", b"not json", None).await;
    let got = responses.take(files.len() + 1, 2 * MINUTE);
    let mut seen: BTreeMap<(String, String), f64> = BTreeMap::new();
    for r in &got {
        let outcome = r.body.status.as_str().to_owned();
        let code = r
            .body
            .error
            .as_ref()
            .map_or(String::new(), |e| e.code.as_str().to_owned());
        *seen.entry((outcome, code)).or_default() += 1.0;
    }
    // The outcome line is logged before the response is published; /metrics is read after.
    let after = samples(&worker);
    assert_eq!(
        delta(&before, &after, "media_worker_requests_received_total"),
        got.len() as f64
    );
    for ((outcome, code), n) in &seen {
        let series =
            format!("media_worker_jobs_total{{error_code=\"{code}\",outcome=\"{outcome}\"}}");
        assert_eq!(delta(&before, &after, &series), *n, "{series}");
    }
    let all_jobs: f64 = after
        .iter()
        .filter(|(k, _)| k.starts_with("media_worker_jobs_total{"))
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0.0))
        .sum();
    assert_eq!(all_jobs, got.len() as f64, "no job counted twice or missed");
    let completed = got
        .iter()
        .filter(|r| r.body.status == Status::Completed)
        .count() as f64;
    assert_eq!(completed, 2.0);
    let image_jobs = delta(
        &before,
        &after,
        "media_worker_job_duration_seconds_count{media_type=\"image\",outcome=\"completed\"}",
    );
    assert_eq!(image_jobs, completed);
    let uploaded: u64 = got
        .iter()
        .flat_map(|r| &r.body.outputs)
        .map(|o| o.size_bytes)
        .sum();
    assert_eq!(
        delta(&before, &after, "media_worker_uploaded_bytes_total"),
        uploaded as f64
    );
    // Process metrics come with the catalogue.
    assert!(
        after
            .get("process_resident_memory_bytes")
            .is_some_and(|v| *v > 0.0)
    );
    assert!(after.contains_key("process_open_fds"));
    // Lag per assigned partition arrives with librdkafka's statistics: all consumed, so 0 once
    // the statistics follow the last commit (a report taken just before it still says 2).
    wait_for("lag reported as 0 on both partitions", MINUTE, || {
        let s = samples(&worker);
        let lags: Vec<f64> = s
            .iter()
            .filter(|(k, _)| k.starts_with("media_worker_kafka_consumer_lag{"))
            .map(|(_, v)| *v)
            .collect();
        (lags.len() == 2 && lags.iter().all(|l| *l == 0.0)).then_some(())
    });
}

/// /health/ready says 503 (and why) while the output store is unreachable, 200 again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_output_store() {
    let mut stack = Stack::start(1).await;
    let mut env = stack.worker_env("g-ready");
    env.insert("S3_PROBE_INTERVAL_SECS".into(), "1".into());
    let worker = Worker::start(&env);
    worker.wait_ready();
    let ready = || {
        let (status, body) = worker.http_get("/health/ready")?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        Some((status, v))
    };
    let (_, v) = ready().unwrap();
    assert_eq!(v["ready"], true, "{v}");
    assert!(v["scratch_free_bytes"].as_u64().is_some_and(|b| b > 0));

    stack.s3.stop();
    let v = wait_for("not ready", MINUTE, || {
        ready().filter(|(status, _)| *status == 503).map(|(_, v)| v)
    });
    assert_eq!(
        (v["storage"].clone(), v["broker"].clone()),
        (false.into(), true.into())
    );
    assert_eq!(
        worker.metric("media_worker_ready "),
        Some(0.0),
        "the gauge agrees"
    );

    stack.s3.restart();
    wait_for("ready again", MINUTE, || {
        ready().filter(|(status, _)| *status == 200)
    });
}

/// Every `expr` (PromQL) in a JSON or YAML tree.
fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// Metric names in PromQL: ours and the process collector's.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    for prefix in ["media_worker_", "process_"] {
        let mut rest = expr;
        while let Some(at) = rest.find(prefix) {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.push(name);
        }
    }
    names
}

/// The Grafana dashboard and the alert rules parse, and every metric they use is exported by a
/// running worker (from its first scrape: every known label set starts at zero). Every
/// exported metric is documented in docs/metrics.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboards_and_alerts_use_only_exported_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/media-worker.json")).unwrap(),
    )
    .expect("dashboard is JSON");
    let rules: serde_json::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(root.join("deploy/k8s/base/prometheus-rules.yaml")).unwrap(),
    )
    .expect("rules are YAML");
    assert_eq!(rules["kind"], "PrometheusRule");
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    let panels = all.len();
    exprs(&rules, &mut all);
    assert!(
        panels >= 10 && all.len() > panels,
        "{panels} panel queries, {} in all",
        all.len()
    );

    let stack = Stack::start(1).await;
    // A worker that scans exports clamd's state (here: nothing listens, so 0); the API's
    // series are there from the start.
    let mut env = stack.worker_env("g-dash");
    env.insert(
        "CLAMD_ADDR".into(),
        format!("tcp://127.0.0.1:{}", free_port()),
    );
    let worker = Worker::start(&env);
    worker.wait_ready();
    wait_for("clamd's state", MINUTE, || {
        worker
            .metric("media_worker_clamd_up{")
            .filter(|up| *up == 0.0)
    });
    // Lag comes with the first librdkafka statistics.
    wait_for("consumer lag", MINUTE, || {
        worker
            .metric("media_worker_kafka_consumer_lag{")
            .map(|_| ())
    });
    let exported: std::collections::BTreeSet<String> = samples(&worker)
        .keys()
        .map(|k| k.split(['{', ' ']).next().unwrap().to_owned())
        .collect();
    for e in &all {
        for name in metric_names(e) {
            assert!(
                exported.contains(&name),
                "{name} (in `{e}`) is not exported"
            );
        }
    }
    let documented = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    for name in exported.iter().filter(|n| n.starts_with("media_worker_")) {
        let base = name
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count");
        assert!(
            documented.contains(base),
            "{base} is not in docs/metrics.md"
        );
    }
    // Credentials never reach the log.
    assert!(!worker.log().contains(SECRET_KEY));
}
