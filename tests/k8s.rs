//! deploy/k8s in a real Kubernetes: the one-node cluster of `scripts/k8s.sh` (built from the
//! Go module proxy; containerd and runc from Debian), the shipped base and clamav component
//! through `deploy/k8s/overlays/local-cluster` (the host's network, this machine's images, a
//! one-line ClamAV database), against Apache Kafka and s3s-fs on 127.0.0.1. `make test-k8s`
//! builds the images, starts the cluster (nextest's setup script) and runs these one at a
//! time: the pods of one node share its ports. Not in `make test` (docs/operations.md, "The
//! cluster tests").

mod common;

use std::time::{Duration, Instant};

use common::cluster::{Cluster, Deployment, Options, PodLogs};
use common::prometheus::{Prometheus, panel_exprs, worker_scrape};
use common::*;
use media_worker::contract::{ErrorCode, Stage, Status};

/// A profile that scans with clamd before anything decodes the upload.
const SCANNED_PROFILE: &str = "[profiles.scanned]\nanalysis = true\nwidths = [320]\n\
     formats = [{ format = \"webp\", quality = 80 }]\nscan = true\n";

/// The shipped deployment starts: the pod is Ready with both ClamAV sidecars running (none
/// restarted), and a job of a scanning profile is scanned by the pod's clamd: the EICAR upload
/// refused `malware_detected` with clamd's signature, a clean one completed with its verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_start_with_their_sidecars_and_clamd_scans_jobs() {
    let cluster = Cluster::shared();
    let stack = Stack::start(1).await;
    let d = Deployment::apply(
        &cluster,
        &stack,
        "k8s-scan",
        &Options {
            config: SCANNED_PROFILE.into(),
            ..Options::default()
        },
    );
    let pods = d.wait_ready(1, 4 * MINUTE);
    let pod = &pods[0];
    let name = pod["metadata"]["name"].as_str().unwrap();
    for sidecar in ["clamd", "freshclam"] {
        let s = pod["status"]["initContainerStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == sidecar)
            .unwrap_or_else(|| panic!("no {sidecar} sidecar:\n{}", d.describe()));
        assert!(
            s["state"]["running"].is_object() && s["restartCount"] == 0,
            "{sidecar} not running, or restarted: {s}\n{}",
            d.describe()
        );
    }

    let responses = stack.responses();
    let dir = tempfile::tempdir().unwrap();
    let eicar = dir.path().join("eicar.jpg");
    std::fs::write(&eicar, EICAR).unwrap();
    stack.upload_file("user-1/eicar.jpg", &eicar).await;
    stack.upload_corpus("imageio_coffee.png").await;
    for (id, key) in [
        ("infected", "user-1/eicar.jpg"),
        ("clean", "imageio_coffee.png"),
    ] {
        stack.send(&request(id, key).with_profile("scanned")).await;
    }
    let got = responses.take(2, 2 * MINUTE);
    let bad = answer_to(&got, "infected");
    let e = bad.error.as_ref().unwrap();
    assert_eq!(
        (e.code, e.stage, bad.status),
        (ErrorCode::MalwareDetected, Stage::Scan, Status::Failed),
        "{bad:?}"
    );
    assert!(e.message.contains(EICAR_SIGNATURE), "{}", e.message);
    let good = answer_to(&got, "clean");
    assert_eq!(good.status, Status::Completed, "{good:?}");
    assert!(good.analysis.as_ref().unwrap().scan().unwrap().clean);
    // The scan was the pod's clamd's: it logged the signature it found.
    let clamd = d.logs(name, "clamd");
    assert!(
        clamd.contains("Test.EICAR.UNOFFICIAL FOUND"),
        "clamd's log:\n{clamd}"
    );
}

/// A scratch volume the kubelet holds to 8 MiB (the emptyDir's `sizeLimit` and the container's
/// `ephemeral-storage` limit, as an operator sizes it) and an upload larger than that: a 13 MB
/// 720p video with the streaming profile. The pod must answer it `limits_exceeded` and stay:
/// no `Evicted` event, the same pod Ready, the next request completed. (The node's disk, which
/// `statvfs` shows inside an emptyDir, has tens of GiB free.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_larger_than_the_scratch_volume_is_answered_not_evicted() {
    let cluster = Cluster::shared();
    let stack = Stack::start(1).await;
    let dir = tempfile::tempdir().unwrap();
    let video = common::synthetic::camera_like_video(dir.path(), 20, 1280, 720);
    let size = std::fs::metadata(&video).unwrap().len();
    assert!(size > 8 << 20, "{size} bytes: not larger than the volume");
    let d = Deployment::apply(
        &cluster,
        &stack,
        "k8s-scratch",
        &Options {
            patch: "- op: replace\n  path: /spec/template/spec/volumes/0/emptyDir/sizeLimit\n  value: 8Mi\n\
                    - op: add\n  path: /spec/template/spec/containers/0/resources/requests/ephemeral-storage\n  value: 8Mi\n\
                    - op: add\n  path: /spec/template/spec/containers/0/resources/limits/ephemeral-storage\n  value: 8Mi\n"
                .into(),
            // The readiness floor, for a volume this small.
            env: vec![("MIN_SCRATCH_FREE_BYTES".into(), "1048576".into())],
            ..Options::default()
        },
    );
    let pods = d.wait_ready(1, 4 * MINUTE);
    let pod = pods[0]["metadata"]["name"].as_str().unwrap().to_owned();
    let responses = stack.responses();
    stack.upload_file("large.mp4", &video).await;
    stack.upload_corpus("imageio_coffee.png").await;
    stack
        .send(&request("large", "large.mp4").with_profile("streaming"))
        .await;
    // The kubelet looks at the volume every 2 s and evicts within 10 s of seeing it past its
    // limit: the answer, or the eviction, comes first.
    let got = wait_for("an answer or an eviction", 3 * MINUTE, || {
        let evicted: Vec<_> = d
            .events()
            .into_iter()
            .filter(|(reason, _, _)| reason == "Evicted")
            .collect();
        assert!(evicted.is_empty(), "evicted: {evicted:?}\n{}", d.describe());
        responses.next(Duration::from_millis(500))
    });
    let error = got
        .body
        .error
        .as_ref()
        .unwrap_or_else(|| panic!("{:?}", got.body));
    eprintln!("large: {:?} {}", error.code, error.message);
    assert_eq!(
        (error.code, error.retryable, got.body.attempts),
        (ErrorCode::LimitsExceeded, false, 1),
        "{error:?}"
    );
    stack.send(&request("next", "imageio_coffee.png")).await;
    let next = responses.take(1, 2 * MINUTE);
    assert_eq!(next[0].body.status, Status::Completed, "{:?}", next[0].body);
    let pods = d.wait_ready(1, MINUTE);
    assert_eq!(
        pods[0]["metadata"]["name"],
        pod.as_str(),
        "the pod was replaced"
    );
    let evictions = d.events().iter().filter(|e| e.0 == "Evicted").count();
    assert_eq!(evictions, 0, "{}", d.describe());
}

/// A small, quick profile for the requests that flow through the restarts.
const THUMB_PROFILE: &str = "[profiles.thumb]\nanalysis = false\nwidths = [160]\n\
     formats = [{ format = \"webp\", quality = 70 }]\n";

/// `kubectl rollout restart` twice while requests flow and a long video is mid-encode (96 s
/// under `streaming`, past its `units_after_secs` here: 12 units over the unit topic): each
/// old pod drains its jobs on SIGTERM (within the grace period), its replacement takes the
/// partitions on, and every request is answered once, the video too. Each restart comes once
/// a unit more has landed (and before the video's answer). The work redone, from every pod's
/// whole log (`PodLogs`): parts of the video encoded again after a pod that began them went,
/// at most 15 % of its parts. On one node the pods of the host's network share their ports,
/// so the rollout replaces a pod before starting the next (maxSurge 0, maxUnavailable 1: the
/// base's surge would leave the new pod Pending, "didn't have free ports").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restarts_answer_every_request_once() {
    let n: usize = std::env::var("K8S_REQUESTS").map_or(300, |v| v.parse().unwrap());
    let cluster = Cluster::shared();
    let stack = Stack::start(2).await;
    stack
        .broker
        .create_topic(&stack.own("media.optimize.units"), 4);
    let d = Deployment::apply(
        &cluster,
        &stack,
        "k8s-rolling",
        &Options {
            config: THUMB_PROFILE.into(),
            env: vec![(
                "MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS".into(),
                "20".into(),
            )],
            patch: ONE_AT_A_TIME.into(),
            ..Options::default()
        },
    );
    let logs = PodLogs::follow(&d);
    d.wait_ready(1, 4 * MINUTE);
    let responses = stack.responses();
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic::camera_like_video(dir.path(), 96, 640, 360);
    stack.upload_file("long.mp4", &video).await;
    stack.upload_corpus("imageio_coffee.png").await;
    stack
        .send(&request("long", "long.mp4").with_profile("streaming"))
        .await;
    let reqs: Vec<_> = (0..n)
        .map(|i| request(&format!("r{i}"), "imageio_coffee.png").with_profile("thumb"))
        .collect();
    stack.send_all(&reqs).await;
    let landed = || -> usize {
        logs.snapshot()
            .iter()
            .map(|(_, log)| logged(log, "unit landed").len())
            .sum()
    };
    let mut got: Vec<Received> = Vec::new();
    let started = Instant::now();
    for round in 0..2 {
        // Mid-encode: a unit more landed since the last restart, the video not answered.
        let deadline = Instant::now() + 3 * MINUTE;
        while landed() <= round {
            if let Some(r) = responses.next(Duration::from_millis(200)) {
                got.push(r);
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no unit landed:\n{}",
                d.describe()
            );
        }
        let answered = |id: &str| got.iter().any(|r| r.body.media_id.as_deref() == Some(id));
        assert!(
            !answered("long"),
            "round {round}: the video done before the restart"
        );
        let old: Vec<String> = d.pods().iter().map(pod_name).collect();
        d.kubectl_ok(&["rollout", "restart", "deployment/media-worker"]);
        d.kubectl_ok(&[
            "rollout",
            "status",
            "deployment/media-worker",
            "--timeout=300s",
        ]);
        let new = d.wait_ready(1, 2 * MINUTE);
        assert!(
            !old.contains(&pod_name(&new[0])),
            "round {round}: not replaced"
        );
    }
    while got.len() < n + 1 {
        match responses.next(4 * MINUTE) {
            Some(r) => got.push(r),
            None => panic!("{} of {} answered:\n{}", got.len(), n + 1, d.describe()),
        }
    }
    // Late duplicates, if any, within a few seconds.
    while let Some(r) = responses.next(Duration::from_secs(5)) {
        got.push(r);
    }
    let t = Tally::of(&got, &d);
    // Every pod's whole log (the one running still writes), the parts counted by name.
    let whole = logs.whole(&d);
    let count = |message: &str| {
        let mut by_part = std::collections::BTreeMap::<String, usize>::new();
        for (_, log) in &whole {
            for f in logged(log, message) {
                *by_part.entry(f["part"].to_string()).or_default() += 1;
            }
        }
        by_part
    };
    let (taken, skipped) = (count("part taken"), count("already landed"));
    let parts = taken.len();
    let begun: usize = taken.values().sum::<usize>() - skipped.values().sum::<usize>();
    let redone = begun - parts;
    eprintln!(
        "k8s scenario=rolling pods={} requests={} answers={} distinct={} duplicates={} \
         failed={} evictions={} video_parts={parts} parts_begun={begun} redone={redone} \
         ({:.1} %) in {:.0} s",
        whole.len(),
        n + 1,
        got.len(),
        t.distinct,
        t.duplicates,
        t.failed.len(),
        t.evictions,
        100.0 * redone as f64 / parts as f64,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(
        whole.len(),
        3,
        "pods: {:?}",
        whole.iter().map(|w| &w.0).collect::<Vec<_>>()
    );
    assert_eq!((t.distinct, t.duplicates), (n + 1, 0));
    assert!(t.failed.is_empty(), "{:?}", t.failed);
    // The video's 12 units and its audio, at least; each begun again at most once in 7.
    assert!(parts >= 13, "{taken:?}");
    assert!(
        redone * 100 <= parts * 15,
        "redone {redone} of {parts}: {taken:?}, skipped {skipped:?}"
    );
}

/// Photos at one width, and videos as one 720p rendition: the work of the scaling scenario.
const SCALE_PROFILE: &str = "[profiles.work]\nanalysis = false\nwidths = [640]\n\
     formats = [{ format = \"webp\", quality = 80 }]\nrenditions = [{ height = 720, crf = 26 }]\n\
     poster = false\n";

/// KEDA (its operator and metrics adapter, `scripts/k8s.sh keda`) scales the shipped
/// ScaledObject's Deployment through the HPA it makes: out on the request group's lag (150
/// photos sent at once, 20 per replica wanted: up to `maxReplicaCount`), and in again once
/// the lag is gone, while each pod encodes a video: the pods removed drain on SIGTERM and every
/// request is answered once, completed, nothing evicted.
///
/// What the test changes, and why: `maxReplicaCount` 3 (three partitions, one node's 2 cores),
/// KEDA polling every 5 s, and the scale-in policy's window 30 s and one pod every 20 s (5
/// minutes and a minute as shipped: scripts/validate-k8s.py checks those); the Prometheus
/// trigger left out (no prometheus-operator here: one trigger that cannot be read stops the
/// HPA from ever scaling in). Several workers on one node of the host's network cannot share
/// ports, so these pods listen on a port of their own choosing (HTTP_ADDR port 0), with no
/// probes, and without the ClamAV sidecars (clamd's port); everything else is the base's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_scales_out_on_lag_and_in_without_dropping_a_job() {
    let n = 150;
    let videos = 6;
    let cluster = Cluster::shared();
    let stack = Stack::start(3).await;
    let units = stack.own("media.optimize.units");
    stack.broker.create_topic(&units, 3);
    let group = "k8s-scale";
    let bootstrap = stack.broker.bootstrap();
    let trigger = |i: usize, group: &str, topic: &str| {
        format!(
            "- op: replace\n  path: /spec/triggers/{i}/metadata/bootstrapServers\n  value: \"{bootstrap}\"\n\
             - op: replace\n  path: /spec/triggers/{i}/metadata/consumerGroup\n  value: \"{group}\"\n\
             - op: replace\n  path: /spec/triggers/{i}/metadata/topic\n  value: \"{topic}\"\n"
        )
    };
    let scaling = [
        "- op: remove\n  path: /spec/triggers/2\n".to_owned(),
        trigger(0, &stack.own(group), &stack.request_topic),
        trigger(1, &format!("{}.units", stack.own(group)), &units),
        "- op: replace\n  path: /spec/maxReplicaCount\n  value: 3\n\
         - op: replace\n  path: /spec/pollingInterval\n  value: 5\n\
         - op: replace\n  path: /spec/advanced/horizontalPodAutoscalerConfig/behavior/scaleDown\n  \
           value: { stabilizationWindowSeconds: 30, policies: [{ type: Pods, value: 1, periodSeconds: 20 }] }\n"
            .into(),
    ]
    .concat();
    let d = Deployment::apply(
        &cluster,
        &stack,
        group,
        &Options {
            config: SCALE_PROFILE.into(),
            env: vec![("HTTP_ADDR".into(), "127.0.0.1:0".into())],
            patch: "- op: remove\n  path: /spec/template/spec/containers/0/ports\n\
                    - op: remove\n  path: /spec/template/spec/containers/0/readinessProbe\n\
                    - op: remove\n  path: /spec/template/spec/containers/0/livenessProbe\n\
                    - op: remove\n  path: /spec/template/spec/initContainers\n"
                .into(),
            scaling,
        },
    );
    let logs = PodLogs::follow(&d);
    d.wait_ready(1, 4 * MINUTE);
    let keda = d.keda();
    wait_for("the HPA KEDA makes", 2 * MINUTE, || {
        d.cluster
            .kubectl(&["-n", &d.ns, "get", "hpa", "keda-hpa-media-worker"])
            .status
            .success()
            .then_some(())
    });
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic::camera_like_video(dir.path(), 120, 1280, 720);
    stack.upload_file("clip.mp4", &video).await;
    stack.upload_corpus("imageio_coffee.png").await;
    let responses = stack.responses();
    let started = Instant::now();
    let replicas = || -> u64 {
        d.get(&["deployment", "media-worker"])["spec"]["replicas"]
            .as_u64()
            .unwrap_or(0)
    };
    // (seconds since the start, the replicas the Deployment wants) at each change.
    let mut history: Vec<(f64, u64)> = vec![(0.0, replicas())];
    let watch = |history: &mut Vec<(f64, u64)>| {
        let r = replicas();
        if history.last().map(|h| h.1) != Some(r) {
            history.push((started.elapsed().as_secs_f64(), r));
        }
    };
    let reqs: Vec<_> = (0..n)
        .map(|i| request(&format!("p{i}"), "imageio_coffee.png").with_profile("work"))
        .collect();
    stack.send_all(&reqs).await;
    let mut got: Vec<Received> = Vec::new();
    let deadline = Instant::now() + 8 * MINUTE;
    while got.len() < n {
        if let Some(r) = responses.next(Duration::from_secs(1)) {
            got.push(r);
        }
        watch(&mut history);
        assert!(
            Instant::now() < deadline,
            "{} of {n} photos answered; replicas {history:?}:\n{}",
            got.len(),
            d.describe()
        );
    }
    let peak = history.iter().map(|h| h.1).max().unwrap();
    let photos_done = started.elapsed().as_secs_f64();
    assert!(
        peak >= 2,
        "never scaled out: {history:?}\n{}",
        keda.operator_log()
    );
    // The lag gone: the videos go to the pods there, and the scale-in comes while they encode.
    let reqs: Vec<_> = (0..videos)
        .map(|i| request(&format!("v{i}"), "clip.mp4").with_profile("work"))
        .collect();
    stack.send_all(&reqs).await;
    let mut videos_left = videos;
    let mut shrunk_mid_video = 0;
    let deadline = Instant::now() + 10 * MINUTE;
    while videos_left > 0 || replicas() > 1 {
        if let Some(r) = responses.next(Duration::from_secs(1)) {
            if r.body
                .media_id
                .as_deref()
                .is_some_and(|id| id.starts_with('v'))
            {
                videos_left -= 1;
            }
            got.push(r);
        }
        let before = history.last().unwrap().1;
        watch(&mut history);
        if history.last().unwrap().1 < before && videos_left > 0 {
            shrunk_mid_video += 1;
        }
        assert!(
            Instant::now() < deadline,
            "{videos_left} videos unanswered, replicas {history:?}:\n{}",
            d.describe()
        );
    }
    while let Some(r) = responses.next(Duration::from_secs(5)) {
        got.push(r);
    }
    let t = Tally::of(&got, &d);
    let whole = logs.whole(&d);
    let by_worker: std::collections::BTreeMap<String, usize> =
        got.iter().fold(Default::default(), |mut m, r| {
            *m.entry(r.body.worker.id.clone()).or_default() += 1;
            m
        });
    let drained_busy = whole
        .iter()
        .filter(|(_, log)| {
            logged(log, "draining")
                .iter()
                .any(|l| l["in_flight"].as_u64().unwrap_or(0) > 0)
        })
        .count();
    eprintln!(
        "k8s scenario=scale requests={} answers={} distinct={} duplicates={} failed={} \
         evictions={} replicas={history:?} (photos answered at {photos_done:.0} s) pods={} \
         answers_by_pod={by_worker:?} scale_ins_mid_video={shrunk_mid_video} \
         pods_drained_with_jobs={drained_busy} in {:.0} s",
        n + videos,
        got.len(),
        t.distinct,
        t.duplicates,
        t.failed.len(),
        t.evictions,
        whole.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!((t.distinct, t.duplicates), (n + videos, 0));
    assert!(t.failed.is_empty(), "{:?}", t.failed);
    assert_eq!(t.evictions, 0);
    assert!(
        by_worker.len() >= 2,
        "one pod did all the work: {by_worker:?}"
    );
    assert!(
        shrunk_mid_video >= 1 && drained_busy >= 1,
        "no scale-in while a video was in flight: {history:?}, {drained_busy} pods drained busy"
    );
    assert_eq!(replicas(), 1, "{history:?}");
}

/// What a scenario's answers come to: the requests answered, the answers beyond one per
/// request, those not completed (id and error), and the namespace's `Evicted` events.
struct Tally {
    distinct: usize,
    duplicates: usize,
    failed: Vec<String>,
    evictions: usize,
}

impl Tally {
    fn of(got: &[Received], d: &Deployment) -> Tally {
        let distinct: std::collections::HashSet<_> =
            got.iter().map(|r| r.body.media_id.clone()).collect();
        Tally {
            distinct: distinct.len(),
            duplicates: got.len() - distinct.len(),
            failed: got
                .iter()
                .filter(|r| r.body.status != Status::Completed)
                .map(|r| format!("{:?}: {:?}", r.body.media_id, r.body.error))
                .collect(),
            evictions: d.events().iter().filter(|e| e.0 == "Evicted").count(),
        }
    }
}

/// The rollout of one node: the old pod goes before the new one starts.
const ONE_AT_A_TIME: &str = "- op: replace\n  path: /spec/strategy/rollingUpdate\n  \
     value: { maxSurge: 0, maxUnavailable: 1 }\n";

fn pod_name(p: &serde_json::Value) -> String {
    p["metadata"]["name"].as_str().unwrap().to_owned()
}

/// `kubectl drain` with deploy/k8s's PodDisruptionBudget in force, twice, with requests
/// flowing. First with S3 stopped mid-stream: the worker turns unready (readiness follows the
/// output bucket), as would every replica of a fleet, and the drain must proceed, since an
/// unready pod serves nothing a budget could protect. A budget of one unavailable pod blocks
/// nothing while one pod is all there is, so a stand-in (the worker's labels, the pause image,
/// a readiness probe that never passes) stands for the fleet's other replicas: two workers
/// cannot share one node's ports. Then S3 back, the node back, the worker ready again and
/// drained again with requests flowing: evicted, replaced once the node is back. Every
/// request answered once, completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_proceed_under_the_disruption_budget() {
    let cluster = Cluster::shared();
    let mut stack = Stack::start(1).await;
    let d = Deployment::apply(
        &cluster,
        &stack,
        "k8s-drain",
        &Options {
            config: THUMB_PROFILE.into(),
            ..Options::default()
        },
    );
    d.wait_ready(1, 4 * MINUTE);
    let n = 60;
    let responses = stack.responses();
    stack.upload_corpus("imageio_coffee.png").await;
    let drain = |timeout: &str| {
        let out = cluster.kubectl(&[
            "drain",
            "local",
            "--pod-selector=app.kubernetes.io/name=media-worker",
            "--delete-emptydir-data",
            &format!("--timeout={timeout}"),
        ]);
        cluster.kubectl_ok(&["uncordon", "local"]);
        out
    };

    // S3 stopped mid-stream: the worker unready, beside an unready stand-in.
    let reqs: Vec<_> = (0..n)
        .map(|i| request(&format!("s{i}"), "imageio_coffee.png").with_profile("thumb"))
        .collect();
    stack.send_all(&reqs).await;
    let mut got = responses.take(n / 4, 2 * MINUTE);
    stack.s3.stop();
    wait_for("the worker unready without S3", 2 * MINUTE, || {
        d.pods()
            .iter()
            .all(|p| !common::cluster::ready(p))
            .then_some(())
    });
    let stand_in = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: unready\n  namespace: {ns}\n\
         spec:\n  replicas: 1\n  selector:\n    matchLabels: {{ app.kubernetes.io/name: media-worker, role: stand-in }}\n\
         \x20 template:\n    metadata:\n      labels: {{ app.kubernetes.io/name: media-worker, role: stand-in }}\n\
         \x20   spec:\n      hostNetwork: true\n      containers:\n        - name: pause\n          image: {PAUSE}\n\
         \x20         imagePullPolicy: Never\n          readinessProbe:\n            tcpSocket: {{ host: 127.0.0.1, port: 9 }}\n\
         \x20           periodSeconds: 2\n",
        ns = d.ns
    );
    let file = d.kustomization_dir().join("stand-in.yaml");
    std::fs::write(&file, stand_in).unwrap();
    d.kubectl_ok(&["apply", "-f", file.to_str().unwrap()]);
    wait_for("the stand-in running, unready", 2 * MINUTE, || {
        let pods = d.pods();
        (pods.len() == 2
            && pods
                .iter()
                .all(|p| p["status"]["phase"] == "Running" && !common::cluster::ready(p)))
        .then_some(())
    });
    // Longer than the grace period: the jobs held for S3 are given up at the drain's deadline.
    let drained = drain("150s");
    assert!(
        drained.status.success(),
        "the drain did not proceed past unready pods: {}",
        String::from_utf8_lossy(&drained.stderr)
    );
    d.kubectl_ok(&["delete", "deployment", "unready", "--wait=true"]);
    stack.s3.restart();
    d.wait_ready(1, 4 * MINUTE);
    got.extend(responses.take(n - got.len(), 3 * MINUTE));

    // Ready, drained with requests flowing.
    let reqs: Vec<_> = (0..n)
        .map(|i| request(&format!("d{i}"), "imageio_coffee.png").with_profile("thumb"))
        .collect();
    stack.send_all(&reqs).await;
    got.extend(responses.take(n / 4, 2 * MINUTE));
    let drained = drain("150s");
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    got.extend(responses.take(2 * n - got.len(), 3 * MINUTE));
    while let Some(r) = responses.next(Duration::from_secs(5)) {
        got.push(r);
    }
    let t = Tally::of(&got, &d);
    eprintln!(
        "k8s scenario=drain requests={} answers={} duplicates={} failed={} evictions={}",
        2 * n,
        got.len(),
        t.duplicates,
        t.failed.len(),
        t.evictions
    );
    assert_eq!((t.distinct, got.len()), (2 * n, 2 * n));
    assert!(t.failed.is_empty(), "{:?}", t.failed);
}

/// The dashboard's CPU and memory panels as a Prometheus that scrapes the kubelet's cAdvisor
/// metrics (and the worker, as the ServiceMonitor would) evaluates them, while the pod
/// encodes a video: the pod's CPU counts the job processes and ffmpeg, where the worker
/// process's own counter (what the panels showed before) sees a small part of it; the pod's
/// working set is more than the worker's RSS; the throttling share evaluates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboards_cpu_and_memory_panels_count_every_process_of_the_pod() {
    let cluster = Cluster::shared();
    let stack = Stack::start(1).await;
    let d = Deployment::apply(&cluster, &stack, "k8s-panels", &Options::default());
    d.wait_ready(1, 4 * MINUTE);
    let scrape = format!(
        "  - job_name: kubelet-cadvisor\n    scheme: https\n    metrics_path: /metrics/cadvisor\n    \
         tls_config: {{insecure_skip_verify: true}}\n    static_configs:\n      \
         - targets: ['127.0.0.1:{}']\n{}",
        cluster.kubelet_port(),
        worker_scrape(([127, 0, 0, 1], d.http_port).into(), &d.ns)
    );
    let prom = Prometheus::start(&scrape, None);
    let panel = |metric: &str| {
        let e = panel_exprs()
            .into_iter()
            .find(|e| e.starts_with(metric))
            .unwrap_or_else(|| panic!("no panel expression starts with {metric}"));
        e.replace("$namespace", &d.ns)
            .replace("$job", "media-worker")
            // Grafana's rate interval, at least four scrapes: the kubelet's cAdvisor
            // measures every 10 s.
            .replace("$__rate_interval", "40s")
    };
    let (cpu, throttled, process_cpu) = (
        panel("sum(rate(container_cpu_usage_seconds_total"),
        panel("sum(rate(container_cpu_cfs_throttled_periods_total"),
        panel("sum(rate(process_cpu_seconds_total"),
    );
    let (memory, rss) = (
        panel("max(container_memory_working_set_bytes"),
        panel("max(process_resident_memory_bytes"),
    );
    // Both scraped (a rate has its two samples) before the job starts.
    wait_for("the pod and the worker scraped", MINUTE, || {
        prom.value(&cpu)
            .and(prom.value(&process_cpu))
            .and(prom.value(&memory))
    });
    let responses = stack.responses();
    let dir = tempfile::tempdir().unwrap();
    let video = synthetic::camera_like_video(dir.path(), 60, 1280, 720);
    stack.upload_file("busy.mp4", &video).await;
    let sent = Instant::now();
    stack.send(&request("busy", "busy.mp4")).await;
    let r = responses.next(4 * MINUTE).expect("the video answered");
    assert_eq!(r.body.status, Status::Completed, "{:?}", r.body.error);
    let job = sent.elapsed();
    // cAdvisor measures every 10-15 s and stamps its samples: wait for one taken after the
    // answer, so that the whole job is in the series.
    let answered = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let stamped = format!(
        "max(timestamp(container_cpu_usage_seconds_total{{namespace=\"{}\", container=\"media-worker\"}}))",
        d.ns
    );
    wait_for("a cAdvisor sample after the answer", MINUTE, || {
        (prom.value(&stamped)? > answered).then_some(())
    });
    // Over the job and since: each panel's series at every second, as Grafana draws them,
    // then their mean and peak.
    let window = sent.elapsed().as_secs() + 1;
    let over = |f: &str, e: &str| prom.value(&format!("{f}(({e})[{window}s:1s])"));
    let (pod, worker) = (
        over("avg_over_time", &cpu).unwrap(),
        over("avg_over_time", &process_cpu).unwrap(),
    );
    let peak = over("max_over_time", &cpu).unwrap();
    let (working_set, worker_rss) = (
        over("max_over_time", &memory).unwrap(),
        over("max_over_time", &rss).unwrap(),
    );
    let throttling = over("max_over_time", &throttled);
    eprintln!(
        "k8s scenario=panels job={:.0}s window={window}s pod_cores_mean={pod:.2} \
         pod_cores_peak={peak:.2} worker_process_cores_mean={worker:.3} \
         working_set_peak={working_set:.0} worker_rss_peak={worker_rss:.0} \
         throttled_peak={throttling:?}",
        job.as_secs_f64()
    );
    assert!(peak > 0.5, "the pod's CPU never passed half a core: {peak}");
    assert!(
        pod > 4.0 * worker,
        "pod {pod} cores, the worker process {worker}"
    );
    assert!(working_set > worker_rss, "{working_set} <= {worker_rss}");
    assert!(
        throttling.is_some_and(|t| (0.0..=1.0).contains(&t)),
        "{throttling:?}"
    );
}

/// The pod sandbox's image scripts/k8s.sh loads (the release's own pause).
const PAUSE: &str = "docker.io/media-worker-k8s/pause:v1.34.4";
