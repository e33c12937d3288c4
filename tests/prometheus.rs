//! The alert rules and the dashboard against a real Prometheus (Debian's `prometheus` 2.42 and
//! its `promtool`): the rules check, every alert's unit tests, and every alert and panel
//! expression evaluated on a server that has scraped a worker after real jobs.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::prometheus::{Prometheus, panel_exprs, worker_scrape};
use common::*;
use media_worker::contract::{ErrorCode, Status};
use serde_json::Value;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The PrometheusRule's groups as a plain rules file in `dir` (what promtool reads).
fn rules_file(dir: &Path) -> (PathBuf, Value) {
    let text = std::fs::read_to_string(root().join("deploy/k8s/base/prometheus-rules.yaml"));
    let rule: Value = serde_yaml_ng::from_str(&text.unwrap()).unwrap();
    let groups = serde_json::json!({ "groups": rule["spec"]["groups"] });
    let path = dir.join("rules.yml");
    std::fs::write(&path, serde_yaml_ng::to_string(&groups).unwrap()).unwrap();
    (path, groups)
}

fn alerts(groups: &Value) -> Vec<(String, String)> {
    groups["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let name = r["alert"].as_str().unwrap().to_owned();
            (name, r["expr"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("promtool (make setup-test installs Debian's prometheus)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_rules_pass_promtool_check() {
    let dir = tempfile::tempdir().unwrap();
    let (path, groups) = rules_file(dir.path());
    let text = promtool(&["check", "rules", path.to_str().unwrap()]);
    let n = alerts(&groups).len();
    assert!(
        text.contains(&format!("SUCCESS: {n} rules found")),
        "{text}"
    );
}

/// tests/prometheus/alerts.test.yml: each alert fires on its scenario (with its labels and
/// annotations, verbatim) and not on a near miss; every alert has a firing case.
#[test]
fn every_alert_fires_on_its_scenario_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let (_, groups) = rules_file(dir.path());
    let tests = root().join("tests/prometheus/alerts.test.yml");
    let copy = dir.path().join("alerts.test.yml");
    std::fs::copy(&tests, &copy).unwrap();
    let text = promtool(&["test", "rules", copy.to_str().unwrap()]);
    assert!(text.contains("SUCCESS"), "{text}");

    let cases: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&tests).unwrap()).unwrap();
    let firing: BTreeSet<&str> = cases["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .filter(|c| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .map(|c| c["alertname"].as_str().unwrap())
        .collect();
    for (name, _) in alerts(&groups) {
        assert!(firing.contains(name.as_str()), "{name} has no firing test");
    }
}

/// A worker runs real jobs (two photos, one corrupt file: a producer's fault) while a real
/// Prometheus scrapes it. Every dashboard expression (variables set as Grafana would) returns
/// data; every alert expression evaluates; none fires on this healthy fleet, in particular
/// not the failure ratio for the producer's corrupt file and not the fleet-absent alert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_evaluates_every_panel_and_alert() {
    let stack = Stack::start(1).await;
    let worker = Worker::start(&stack.worker_env("g-prom"));
    worker.wait_ready();
    let dir = tempfile::tempdir().unwrap();
    let (rules, groups) = rules_file(dir.path());
    let prom = Prometheus::start(&worker_scrape(worker.http, "test"), Some(&rules));

    let responses = stack.responses();
    for (id, name) in [
        ("p1", "sharp_Landscape_1.jpg"),
        ("p2", "imageio_coffee.png"),
        ("bad", "sharp_truncated.jpg"),
    ] {
        stack.upload_corpus(name).await;
        stack.send(&request(id, name)).await;
    }
    let got = responses.take(3, MINUTE);
    let failed: Vec<_> = got
        .iter()
        .filter(|r| r.body.status == Status::Failed)
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(
        failed[0].body.error.as_ref().unwrap().code,
        ErrorCode::CorruptInput
    );

    // Scraped after the jobs, with samples enough for rates over 15 s.
    let scope = r#"namespace="test", job="media-worker""#;
    wait_for("the jobs in Prometheus", MINUTE, || {
        let done = prom.value(&format!("sum(media_worker_jobs_total{{{scope}}})"))?;
        let samples = prom.value(&format!(
            "min(count_over_time(media_worker_ready{{{scope}}}[15s]))"
        ))?;
        (done >= 3.0 && samples >= 5.0).then_some(())
    });
    let completed = format!(r#"sum(media_worker_jobs_total{{{scope}, outcome="completed"}})"#);
    assert_eq!(prom.value(&completed), Some(2.0));

    // The container panels (the kubelet's cAdvisor series) are evaluated in tests/k8s.rs.
    for e in panel_exprs().iter().filter(|e| !e.contains("container_")) {
        let q = e
            .replace("$namespace", "test")
            .replace("$job", "media-worker")
            .replace("$__rate_interval", "15s");
        assert!(
            !prom.query(&q).is_empty(),
            "panel query returned nothing: {q}"
        );
    }
    for (name, expr) in alerts(&groups) {
        let firing = prom.query(&expr);
        assert!(
            firing.is_empty(),
            "{name} fires on a healthy fleet: {firing:?}"
        );
    }
    // The alerts' signals exist (an expression over a missing series would never fire).
    for signal in [
        "sum by (namespace, job) (media_worker_kafka_assigned_partitions)",
        "min by (namespace, job) (media_worker_ready)",
        "sum by (namespace, job) (rate(media_worker_jobs_total[1m]))",
        "min by (namespace, job) (media_worker_scratch_free_bytes)",
        "max by (namespace, job) (media_worker_responses_held)",
    ] {
        let r = prom.query(signal);
        assert_eq!(r.len(), 1, "{signal}: {r:?}");
        assert_eq!(r[0]["metric"]["namespace"], "test", "{signal}");
    }
}
