//! Does the job API starve Kafka? Kafka throughput of one worker alone and under a saturating
//! `POST /transcode` load, at the documented split (`default`: one API permit, the Kafka pool
//! the other cores), and with the Kafka pool on every core and the API's permit on top at nice
//! 19 (`shared`, the API's default priority) or nice 0 (`shared-nice0`).
//!
//!   cargo bench --bench api_split [-- --rounds 3 --requests 40 --clients 3 --modes split,...]
//!
//! Real parts as in the tests: the worker binary, Apache Kafka, s3s-fs. Each round produces
//! `--requests` photo requests (new media ids, default profile) and times them from the first
//! produce to the last response; "loaded" rounds run `--clients` threads posting photo jobs to
//! the API the whole time (a 503 `busy` is retried after 50 ms), so its permit is never idle.
//! Rounds alternate alone / loaded on the same worker, starting and ending alone, so drifts in
//! machine speed fall on both; each loaded round is compared with the alone rounds beside it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use media_worker::contract::Status;

mod util;
use util::{arg, corpus_photos};

#[path = "../tests/common/mod.rs"]
mod common;
use common::{Stack, Worker, free_port, http, request};

/// What a loaded round's clients did.
#[derive(Default)]
struct Load {
    done: AtomicU64,
    busy: AtomicU64,
}

fn clients(
    api: SocketAddr,
    photos: &[String],
    n: usize,
    stop: &Arc<AtomicBool>,
    load: &Arc<Load>,
    tag: &str,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|c| {
            let (photos, stop, load) = (photos.to_vec(), stop.clone(), load.clone());
            let tag = format!("{tag}-c{c}");
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let req = request(&format!("{tag}-{i}"), &photos[i % photos.len()]);
                    let body = serde_json::to_vec(&req).unwrap();
                    let a = http::post(
                        api,
                        "/transcode",
                        &[("Content-Type", "application/json")],
                        &body,
                    );
                    match a.status {
                        200 => {
                            load.done.fetch_add(1, Ordering::Relaxed);
                            i += 1;
                        }
                        503 => {
                            load.busy.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        s => panic!("API answered {s}: {}", String::from_utf8_lossy(&a.body)),
                    }
                }
            })
        })
        .collect()
}

fn main() {
    let rounds: usize = arg("--rounds", "3").parse().unwrap();
    let per_round: usize = arg("--requests", "40").parse().unwrap();
    let n_clients: usize = arg("--clients", "3").parse().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let corpus = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus");
    let photos = corpus_photos(&corpus);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stack = rt.block_on(Stack::start(2));
    for p in &photos {
        rt.block_on(stack.upload_corpus(p));
    }
    println!(
        "{cores} cores, {} photos, {per_round} Kafka requests a round, {} rounds alone and {rounds} loaded, {n_clients} API clients",
        photos.len(),
        rounds + 1
    );
    // One reader for all modes: each round takes only the responses that are new.
    let responses = stack.responses();
    // (name, Kafka pool, API children's nice): the documented split leaves both at their
    // defaults (cores - 1, and 19).
    let every = cores.to_string();
    let modes = [
        ("default", None, "19"),
        ("shared", Some(every.as_str()), "19"),
        ("shared-nice0", Some(every.as_str()), "0"),
    ];
    // `--modes a,b`: which, in that order (all by default).
    let only = arg("--modes", "default,shared,shared-nice0");
    let chosen = only
        .split(',')
        .map(|m| *modes.iter().find(|(n, ..)| *n == m).expect("a known mode"));
    for (name, pool, nice) in chosen {
        let api: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        // One group for all modes: each worker starts where the last one committed.
        let mut env = stack.worker_env("bench");
        env.insert("API_ADDR".into(), api.to_string());
        env.insert("API_MAX_CONCURRENT".into(), "1".into());
        env.insert("API_NICE".into(), nice.into());
        env.insert("RUST_LOG".into(), "warn".into());
        if let Some(p) = pool {
            env.insert("WORKER_POOL_SIZE".into(), p.into());
        }
        let mut worker = Worker::start(&env);
        worker.wait_ready();
        let kafka_pool = worker.metric("media_worker_pool_size").unwrap();
        let (mut alone, mut loaded) = (Vec::new(), Vec::new());
        let (mut api_done, mut api_busy, mut api_secs) = (0, 0, 0.0);
        // alone, loaded, alone, ..., alone: every loaded round has an alone round on each side.
        for round in 0..=2 * rounds {
            let with_load = round % 2 == 1;
            let (stop, load) = (Arc::new(AtomicBool::new(false)), Arc::new(Load::default()));
            let threads = if with_load {
                let t = clients(
                    api,
                    &photos,
                    n_clients,
                    &stop,
                    &load,
                    &format!("{name}-r{round}"),
                );
                // The API's permit is taken before the Kafka round starts.
                common::wait_for("the API busy", Duration::from_secs(30), || {
                    (!worker.jobs().is_empty()).then_some(())
                });
                t
            } else {
                Vec::new()
            };
            let reqs: Vec<_> = (0..per_round)
                .map(|i| request(&format!("{name}-r{round}-k{i}"), &photos[i % photos.len()]))
                .collect();
            let t = Instant::now();
            rt.block_on(stack.send_all(&reqs));
            let got = responses.take(per_round, Duration::from_secs(600));
            let secs = t.elapsed().as_secs_f64();
            stop.store(true, Ordering::Relaxed);
            for th in threads {
                th.join().unwrap();
            }
            let prefix = format!("{name}-r{round}-k");
            let theirs = |r: &common::Received| {
                r.body
                    .media_id
                    .as_deref()
                    .is_some_and(|m| m.starts_with(&prefix))
                    && !r.body.replayed
                    && r.body.status != Status::Failed
            };
            assert!(
                got.iter().all(theirs),
                "a Kafka job failed, was replayed or is not this round's"
            );
            let rate = per_round as f64 / secs;
            if with_load {
                loaded.push(rate);
                api_done += load.done.load(Ordering::Relaxed);
                api_busy += load.busy.load(Ordering::Relaxed);
                api_secs += secs;
            } else {
                alone.push(rate);
            }
            println!(
                "  {name} round {round}: {} {rate:.2} images/s",
                if with_load { "loaded" } else { "alone " }
            );
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let (a, l) = (mean(&alone), mean(&loaded));
        // Each loaded round against the alone rounds beside it: the machine's drift (rounds
        // alone differ by up to 10 % here) falls on both sides of each pair.
        let mut paired: Vec<f64> = loaded
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let beside = &alone[i..(i + 2).min(alone.len())];
                (l / mean(beside) - 1.0) * 100.0
            })
            .collect();
        paired.sort_by(f64::total_cmp);
        println!(
            "{name}: Kafka pool {kafka_pool}, API permits 1 at nice {nice}: Kafka alone {a:.2} images/s, under API load {l:.2} images/s ({:+.1} % of the means, median of pairs {:+.1} %); API {:.2} jobs/s, {api_busy} answered busy",
            (l / a - 1.0) * 100.0,
            paired[paired.len() / 2],
            api_done as f64 / api_secs,
        );
        // Committed before the next mode's worker joins the group.
        worker.sigterm();
        assert!(worker.wait_exit(Duration::from_secs(60)).success());
    }
}
