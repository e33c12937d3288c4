//! `media-worker demo [DIR]`: the real worker (same consumer, job runner and storage interface
//! as `run`) against an in-process Kafka cluster (rdkafka's MockCluster) and a local store.
//! Submits every file in DIR (images and videos) with one profile (`showcase`: everything the
//! worker makes), prints a table of the responses and writes the gallery page of them
//! (`gallery`) into its work directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
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

use super::gallery::{self, Gallery};

const UPLOADS: &str = "uploads";
const PARTITIONS: i32 = 4;

/// What `media-worker demo` is asked.
pub struct Options {
    pub dir: PathBuf,
    /// The work directory (page, store, scratch); a new temporary one when absent.
    pub out: Option<PathBuf>,
    pub profile: String,
    /// hls.js (`hls.min.js`), copied beside the page.
    pub hls_js: PathBuf,
}

/// Where scripts/setup.sh installs the npm players (hls.js with `--demo`; with `--test` also
/// dash.js and playwright-core): `$PLAYER_MODULES` or `~/.cache/media-worker/player`.
pub fn player_modules() -> PathBuf {
    std::env::var_os("PLAYER_MODULES").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/media-worker/player")
        },
        PathBuf::from,
    )
}

/// hls.js as scripts/setup.sh installs it.
pub fn default_hls_js() -> PathBuf {
    player_modules().join("node_modules/hls.js/dist/hls.min.js")
}

pub async fn run(mut settings: Settings, opts: Options) -> anyhow::Result<()> {
    let Options {
        dir,
        out: work_dir,
        profile,
        hls_js,
    } = opts;
    anyhow::ensure!(
        settings.profile(&profile).is_some(),
        "unknown profile `{profile}`"
    );
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
    // Kept: the outputs and the page are what the demo is for.
    let work = match work_dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            d.canonicalize()?
        }
        None => tempfile::tempdir()?.keep(),
    };
    settings.kafka.bootstrap_servers = cluster.bootstrap_servers();
    // The mock cluster's consumer group protocol stalls a long run (the dispatch bench stopped
    // at 15,263 of 20,000 messages; the real broker and the classic protocol do not).
    settings.kafka.group_protocol = GroupProtocol::Classic;
    settings.http.addr = "127.0.0.1:0".parse()?;
    settings.worker.tmp_dir = work.join("scratch");
    let out = work.join("store");
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
    let mut inputs: HashMap<String, PathBuf> = HashMap::new();
    for file in &files {
        let media_id = super::media_id_for(file);
        let key = file.file_name().unwrap().to_string_lossy().into_owned();
        let req = OptimizeRequest::new(
            format!("demo-{media_id}"),
            media_id.clone(),
            "demo",
            UPLOADS,
            key,
        )
        .with_profile(&profile);
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
        inputs.insert(media_id, file.clone());
    }
    eprintln!("submitted {} files from {}", files.len(), dir.display());

    let mut got: Vec<OptimizeResponse> = Vec::new();
    // A bound on silence, not on the run: the showcase profile's AVIF and video ladders take
    // minutes over a whole folder on a small machine, but every job answers within its limits.
    let mut last = Instant::now();
    while got.len() < files.len() && last.elapsed() < Duration::from_secs(600) {
        let polled = tokio::task::block_in_place(|| responses.poll(Duration::from_millis(200)));
        if let Some(Ok(m)) = polled
            && let Some(r) = m.payload().and_then(|p| serde_json::from_slice(p).ok())
        {
            got.push(r);
            last = Instant::now();
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
            .and_then(|m| inputs.get(m))
            .and_then(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
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
    let hls_copied = match std::fs::copy(&hls_js, work.join("hls.min.js")) {
        Ok(_) => true,
        Err(e) => {
            eprintln!(
                "hls.js not found at {} ({e}): the page plays the MP4s instead of the streams \
                 (`scripts/setup.sh --demo` installs it)",
                hls_js.display()
            );
            false
        }
    };
    let store = format!("store/{}", settings.storage.output_bucket);
    let page = gallery::write(
        &Gallery {
            responses: &got,
            inputs: &inputs,
            input_dir: &dir,
            store: &store,
            profile: &profile,
            blur_threshold: settings.analysis.blur_threshold,
            pool: settings.pool_size(),
            wall,
            hls_js: hls_copied,
        },
        &work,
    )?;
    println!("gallery: {}", page.display());
    // Players fetch the streams and the storyboards: a page opened from file:// cannot.
    if got
        .iter()
        .flat_map(|r| &r.outputs)
        .any(|o| o.role == "stream")
    {
        println!(
            "to play the streams: python3 -m http.server -d {} 8000, then open http://localhost:8000/",
            work.display()
        );
    }
    anyhow::ensure!(
        got.len() == files.len(),
        "missing responses: {} of {}",
        got.len(),
        files.len()
    );
    Ok(())
}
