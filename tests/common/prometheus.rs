//! A Prometheus server of its own (Debian's `prometheus`) and the dashboard's expressions: what
//! tests/prometheus.rs evaluates against a worker, and tests/k8s.rs against the kubelet's
//! cAdvisor series.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::*;

/// A scrape config for one worker at `target`, with the labels a prometheus-operator
/// ServiceMonitor would give (`namespace`, `job: media-worker`).
pub fn worker_scrape(target: SocketAddr, namespace: &str) -> String {
    format!(
        "  - job_name: media-worker\n    static_configs:\n      \
         - targets: ['{target}']\n        labels: {{namespace: {namespace}}}\n"
    )
}

/// A Prometheus server scraping every second what `scrape_configs` (YAML list items under
/// `scrape_configs:`) name, with `rules` if any.
pub struct Prometheus {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(scrape_configs: &str, rules: Option<&Path>) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("prometheus.yml");
        let rules = rules.map_or(String::new(), |r| {
            format!("rule_files: [{}]\n", r.display())
        });
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n{rules}\
                 scrape_configs:\n{scrape_configs}"
            ),
        )
        .unwrap();
        let log = dir.path().join("prometheus.log");
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"));
        let child = start_server(&mut cmd, &log, port, "prometheus");
        Prometheus {
            child,
            port,
            _dir: dir,
        }
    }

    /// An instant query's result vector; panics on any error of the expression.
    pub fn query(&self, expr: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", encode(expr));
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{text}"));
        assert_eq!(v["status"], "success", "`{expr}`: {v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The first sample's value of an instant query.
    pub fn value(&self, expr: &str) -> Option<f64> {
        let r = self.query(expr);
        r.first()?["value"][1].as_str()?.parse().ok()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encoding for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every `expr` of the dashboard.
pub fn panel_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/grafana/media-worker.json"),
    )
    .unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            out.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    out
}
