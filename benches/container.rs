//! The shipped image against the host's release binary on the same requests: images/s and CPU
//! per image, and how long `docker run` takes to a consuming worker.
//!
//!   cargo bench --bench container -- [--image media-worker:latest] [--photos 6] [--rounds 6]
//!       [--profile default] [--ready 5]
//!
//! Both run side by side, each on a stack of its own (a request and a response topic on one
//! Apache Kafka node, an s3s-fs server), with the same settings: the container as the pod runs it
//! (tests/common/container.rs: the pod's uid, no capabilities, read-only root, its CPU and
//! memory limits, the host's network), the host's binary as `cargo bench` builds it (the release
//! profile, the build `make image` ships; the bench says whether the image holds the same
//! binary). Rounds alternate A B B A (host first in odd rounds), so that the machine's drift
//! (other work on a shared machine) falls on both sides alike; each round is every corpus photo
//! (at most `--photos`) under `--profile`, after one warm-up round each, not counted. CPU is the
//! worker's and every process under it (sandbox processes, their ffmpeg), the container's tini
//! included. `--ready N`: N containers started one after another, each timed from `docker run`
//! to consuming (ready, partitions assigned); `--rounds 0` measures only that (of any image
//! that runs as the pod, `--image`).

use std::path::Path;
use std::time::{Duration, Instant};

mod util;
use util::{arg, corpus_photos, proc_cpu_seconds};

#[path = "../tests/common/mod.rs"]
mod common;
use common::container::{Container, docker_ok, image_label};

/// One side's totals over the counted rounds.
#[derive(Default)]
struct Side {
    images: usize,
    wall: f64,
    cpu: f64,
    /// Images/s of each round.
    rates: Vec<f64>,
}

impl Side {
    fn line(&self, name: &str) -> String {
        format!(
            "{name}: {} images in {:.1} s, {:.2} images/s, {:.0} ms CPU per image",
            self.images,
            self.wall,
            self.images as f64 / self.wall,
            self.cpu * 1000.0 / self.images as f64
        )
    }
}

/// CPU seconds of process `pid` and every process under it.
fn tree_cpu(pid: i32) -> f64 {
    std::iter::once(pid)
        .chain(common::descendants_of(pid))
        .map(proc_cpu_seconds)
        .sum()
}

/// Sends `reqs` and awaits as many responses, each a success: wall and CPU seconds of `pid`'s tree.
async fn round(
    stack: &common::Stack,
    responses: &common::Responses,
    reqs: &[media_worker::contract::OptimizeRequest],
    pid: i32,
) -> (f64, f64) {
    let (t0, c0) = (Instant::now(), tree_cpu(pid));
    stack.send_all(reqs).await;
    for r in responses.take(reqs.len(), Duration::from_secs(600)) {
        assert!(r.body.success, "{:?}", r.body.error);
    }
    (t0.elapsed().as_secs_f64(), tree_cpu(pid) - c0)
}

fn main() {
    let image = arg("--image", "media-worker:latest");
    let n_photos: usize = arg("--photos", "6").parse().expect("--photos N");
    let rounds: usize = arg("--rounds", "6").parse().expect("--rounds N");
    let ready_runs: usize = arg("--ready", "5").parse().expect("--ready N");
    let profile = arg("--profile", "default");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let photos: Vec<String> = corpus_photos(&corpus).into_iter().take(n_photos).collect();

    let host_bin = env!("CARGO_BIN_EXE_media-worker");
    let sha = std::process::Command::new("sha256sum")
        .arg(host_bin)
        .output()
        .unwrap();
    let sha = String::from_utf8_lossy(&sha.stdout);
    let label = |k: &str| image_label(&image, k);
    let same = sha.starts_with(&label("media-worker.binary-sha256"));
    println!(
        "{image}: {} build, revision {}, {} MB; host: {host_bin} ({})",
        label("media-worker.profile"),
        label("media-worker.revision"),
        docker_ok(&["image", "inspect", "-f", "{{.Size}}", &image])
            .parse::<u64>()
            .unwrap()
            / 1_000_000,
        if same {
            "the binary the image holds"
        } else {
            "another build than the image's"
        }
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let stack = common::Stack::start(2).await;
        if ready_runs > 0 {
            let mut took = Vec::new();
            for i in 0..ready_runs {
                // A group of its own each: no wait for the previous (killed) member to expire.
                let env = stack.worker_env(&format!("container-ready-{i}"));
                let t0 = Instant::now();
                let c = Container::run(&image, &env, &[]);
                c.wait_consuming();
                took.push(t0.elapsed().as_secs_f64());
            }
            let shown: Vec<String> = took.iter().map(|t| format!("{t:.1}")).collect();
            println!(
                "docker run to consuming, {ready_runs} runs: {} s (mean {:.1} s)",
                shown.join(", "),
                took.iter().sum::<f64>() / took.len() as f64
            );
        }
        if rounds == 0 {
            return;
        }
        let host_stack = common::Stack::start(2).await;
        for p in &photos {
            stack.upload_corpus(p).await;
            host_stack.upload_corpus(p).await;
        }
        println!(
            "{} photos x {rounds} rounds, profile {profile}: {}",
            photos.len(),
            photos.join(", ")
        );
        let container = Container::run(&image, &stack.worker_env("container"), &[]);
        container.wait_consuming();
        let tini: i32 = container.inspect("{{.State.Pid}}").parse().unwrap();
        let host = common::Worker::start(&host_stack.worker_env("host"));
        host.ready().await;
        let (c_resp, h_resp) = (stack.responses(), host_stack.responses());
        let batch = |side: &str, round: usize| -> Vec<_> {
            photos
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let mut r = common::request(&format!("{side}-{round}-{i}"), name)
                        .with_profile(&profile);
                    r.force = true;
                    r
                })
                .collect()
        };
        let (mut c_side, mut h_side) = (Side::default(), Side::default());
        for k in 0..=rounds {
            let host_first = k % 2 == 1;
            for on_host in [host_first, !host_first] {
                let (stack, responses, pid, side, name) = if on_host {
                    (&host_stack, &h_resp, host.pid(), &mut h_side, "host")
                } else {
                    (&stack, &c_resp, tini, &mut c_side, "container")
                };
                let reqs = batch(name, k);
                let (wall, cpu) = round(stack, responses, &reqs, pid).await;
                // Round 0 warms both up (models, sandbox servers): not counted.
                if k > 0 {
                    side.images += reqs.len();
                    side.wall += wall;
                    side.cpu += cpu;
                    side.rates.push(reqs.len() as f64 / wall);
                }
            }
        }
        println!("{}", h_side.line("host     "));
        println!("{}", c_side.line("container"));
        let per_round: Vec<String> = c_side
            .rates
            .iter()
            .zip(&h_side.rates)
            .map(|(c, h)| format!("{:.3}", c / h))
            .collect();
        println!(
            "container / host: images/s {:.3}x (rounds: {}), CPU per image {:.3}x",
            (c_side.images as f64 / c_side.wall) / (h_side.images as f64 / h_side.wall),
            per_round.join(" "),
            (c_side.cpu / c_side.images as f64) / (h_side.cpu / h_side.images as f64)
        );
        println!("goal (issue 58): jobs in the container within 5 % of the host's release binary");
    });
}
