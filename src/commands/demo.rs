//! `media-worker demo [DIR]`: the real worker (same consumer, job runner and storage interface
//! as `run`) against an in-process Kafka cluster (rdkafka's MockCluster) and a local store.
//! Submits every file in DIR (images and videos) and prints a table of the responses.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::config::Settings;
use crate::contract::{OptimizeRequest, OptimizeResponse};
use crate::kafka::GroupProtocol;
use crate::shutdown::Shutdown;
use crate::storage::LocalStorage;
use crate::{job, worker};

const UPLOADS: &str = "uploads";
const PARTITIONS: i32 = 4;

pub async fn run(mut settings: Settings, dir: PathBuf) -> anyhow::Result<()> {
    let dir = dir
        .canonicalize()
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
    let files: Vec<PathBuf> = super::expand_inputs(std::slice::from_ref(&dir))?
        .into_iter()
        .filter(|p| !matches!(p.extension().and_then(|e| e.to_str()), Some("md" | "tsv")))
        .collect();
    anyhow::ensure!(!files.is_empty(), "no files in {}", dir.display());

    let cluster = MockCluster::new(1)?;
    cluster.create_topic(&settings.kafka.request_topic, PARTITIONS, 1)?;
    cluster.create_topic(&settings.kafka.response_topic, 1, 1)?;
    let work = tempfile::tempdir()?;
    settings.kafka.bootstrap_servers = cluster.bootstrap_servers();
    // The mock cluster's consumer group protocol stalls a long run (the dispatch bench stopped
    // at 15,263 of 20,000 messages; the real broker and the classic protocol do not).
    settings.kafka.group_protocol = GroupProtocol::Classic;
    settings.http.addr = "127.0.0.1:0".parse()?;
    settings.worker.tmp_dir = work.path().join("scratch");
    let out = work.path().join("store");
    let storage = LocalStorage::new(&out).with_bucket(UPLOADS, &dir);

    let svc = job::services(Arc::new(settings.clone()), Arc::new(storage))?;
    let stop = Shutdown::new();
    let worker_task = tokio::spawn(worker::run(svc, stop.clone(), None));

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .create()?;
    let responses: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.kafka.bootstrap_servers)
        .set("group.id", "media-worker-demo-reader")
        .set("auto.offset.reset", "earliest")
        .create()?;
    responses.subscribe(&[settings.kafka.response_topic.as_str()])?;

    let started = Instant::now();
    let mut names = HashMap::new();
    for file in &files {
        let media_id = super::media_id_for(file);
        let key = file.file_name().unwrap().to_string_lossy().into_owned();
        let req = OptimizeRequest::new(
            format!("demo-{media_id}"),
            media_id.clone(),
            "demo",
            UPLOADS,
            key,
        );
        let payload = serde_json::to_vec(&req)?;
        producer
            .send(
                FutureRecord::to(&settings.kafka.request_topic)
                    .key(&media_id)
                    .payload(&payload),
                Timeout::Never,
            )
            .await
            .map_err(|(e, _)| e)?;
        names.insert(
            media_id,
            file.file_name().unwrap().to_string_lossy().into_owned(),
        );
    }
    eprintln!("submitted {} files from {}", files.len(), dir.display());

    let mut got: Vec<OptimizeResponse> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    while got.len() < files.len() && Instant::now() < deadline {
        let polled = tokio::task::block_in_place(|| responses.poll(Duration::from_millis(200)));
        if let Some(Ok(m)) = polled
            && let Some(r) = m.payload().and_then(|p| serde_json::from_slice(p).ok())
        {
            got.push(r);
        }
    }
    let wall = started.elapsed();
    stop.drain();
    worker_task.await??;

    println!(
        "{:<40} {:<10} {:<28} {:>7}",
        "file", "status", "variants / error", "ms"
    );
    println!("{}", "-".repeat(88));
    got.sort_by(|a, b| a.media_id.cmp(&b.media_id));
    for r in &got {
        let name = r
            .media_id
            .as_ref()
            .and_then(|m| names.get(m))
            .cloned()
            .unwrap_or_default();
        let detail = match &r.error {
            Some(e) => e.code.as_str().to_owned(),
            None => {
                let renditions: Vec<String> = r
                    .outputs
                    .iter()
                    .filter(|o| o.role == "rendition")
                    .map(|o| format!("{}x{}", o.width, o.height))
                    .collect();
                let widths: std::collections::BTreeSet<u32> =
                    r.outputs.iter().map(|o| o.width).collect();
                let w: Vec<String> = widths.iter().map(|w| format!("{w}w")).collect();
                let what = if renditions.is_empty() { w } else { renditions };
                format!("{} ({})", r.outputs.len(), what.join(","))
            }
        };
        println!(
            "{:<40} {:<10} {:<28} {:>7}",
            name,
            format!("{:?}", r.status).to_lowercase(),
            detail,
            r.duration_ms
        );
    }
    let ok = got.iter().filter(|r| r.success).count();
    println!("{}", "-".repeat(88));
    println!(
        "{} responses ({} succeeded, {} failed) for {} files in {:.1} s; outputs under {}",
        got.len(),
        ok,
        got.len() - ok,
        files.len(),
        wall.as_secs_f64(),
        out.display()
    );
    anyhow::ensure!(
        got.len() == files.len(),
        "missing responses: {} of {}",
        got.len(),
        files.len()
    );
    // Keep the outputs for inspection.
    let kept = work.keep();
    eprintln!("(work dir kept at {})", kept.display());
    Ok(())
}
