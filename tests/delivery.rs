//! The delivery path under the faults a review of it found, each performed against Apache Kafka
//! and s3s-fs: a response the broker refuses for lack of authorisation, a redelivered request
//! whose source was deleted, a progress topic that takes nothing, a rebalance that keeps a
//! partition, a shutdown with the group coordinator down. Each ends with every request answered
//! exactly once, nothing lost and nothing held past its bound.

mod common;

use std::time::{Duration, Instant};

use common::*;
use media_worker::contract::Status;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// The readiness document's `field` (the worker answers 503 with the document when not ready).
fn readiness(worker: &Worker, field: &str) -> Option<serde_json::Value> {
    let (_, body) = worker.http_get("/health/ready")?;
    let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
    Some(doc[field].clone())
}

/// How many records `topic` (one partition) holds: its high watermark.
fn record_count(stack: &Stack, topic: &str) -> i64 {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", stack.broker.bootstrap())
        .create()
        .unwrap();
    c.fetch_watermarks(topic, 0, Duration::from_secs(10))
        .map_or(0, |(_, high)| high)
}

/// Item 1: the worker's principal loses its WRITE ACL on the response and dead-letter topics
/// (a late ACL, a rotated principal). The response is the pod's to hold, not the request's to
/// lose: the pod reports `publishing: false` and takes nothing new, nothing is dead-lettered,
/// dropped or committed; once the ACL is granted again the response itself goes out and the
/// offset is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_refused_for_lack_of_authorisation_is_held_until_it_is_granted() {
    let stack = Stack::on(Broker::with_authorizer(), 1).await;
    let group = stack.own("g-acl");
    let dlq = stack.own("media.optimize.dlq");
    stack.broker.create_topic(&dlq, 1);
    let grant = |op: &str, what: &[&str]| {
        let mut args = vec![
            "--add",
            "--allow-principal",
            "User:worker",
            "--operation",
            op,
        ];
        args.extend_from_slice(what);
        stack.broker.acl(&args);
    };
    let (response_topic, request_topic) =
        (stack.response_topic.clone(), stack.request_topic.clone());
    grant("Read", &["--topic", &request_topic]);
    grant("Read", &["--group", &group]);
    let writes = [
        ["--topic", response_topic.as_str()],
        ["--topic", dlq.as_str()],
    ];
    for w in &writes {
        grant("Write", w);
    }
    let mut env = stack.worker_env("g-acl");
    env.extend(
        stack
            .broker
            .sasl_client_env()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v)),
    );
    env.insert("KAFKA_PUBLISH_ATTEMPTS".into(), "2".into());
    let worker = Worker::start(&env);
    worker.ready().await;
    stack.upload_corpus("pillow_flower.jpg").await;
    let responses = stack.responses();
    stack.send(&request("granted", "pillow_flower.jpg")).await;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    wait_until("the first offset committed", MINUTE, || {
        (stack.committed("g-acl", 1) == vec![1]).then_some(())
    })
    .await;

    for w in &writes {
        let mut args = vec![
            "--remove",
            "--force",
            "--allow-principal",
            "User:worker",
            "--operation",
            "Write",
        ];
        args.extend_from_slice(w);
        stack.broker.acl(&args);
    }
    stack.send(&request("refused", "pillow_flower.jpg")).await;
    wait_until("not ready: publishing", 2 * MINUTE, || {
        (readiness(&worker, "publishing")? == false).then_some(())
    })
    .await;
    wait_until("intake paused", MINUTE, || {
        (worker.metric("media_worker_kafka_paused") == Some(1.0)).then_some(())
    })
    .await;
    assert!(
        responses.next(Duration::ZERO).is_none(),
        "answered without the right to write"
    );
    assert_eq!(stack.committed("g-acl", 1), vec![1], "committed unanswered");
    assert_eq!(record_count(&stack, &dlq), 0, "dead-lettered");
    assert_eq!(
        worker.metric("media_worker_responses_dropped_total"),
        Some(0.0)
    );

    for w in &writes {
        grant("Write", w);
    }
    let got = responses.take(1, 2 * MINUTE);
    assert_eq!(
        (got[0].body.media_id.as_deref(), got[0].body.status),
        (Some("refused"), Status::Completed),
        "{:?}",
        got[0].body.error
    );
    wait_until("the held offset committed", MINUTE, || {
        (stack.committed("g-acl", 1) == vec![2]).then_some(())
    })
    .await;
    wait_until("ready again", MINUTE, || {
        (readiness(&worker, "ready")? == true).then_some(())
    })
    .await;
    assert_eq!(record_count(&stack, &dlq), 0, "dead-lettered");
    assert_eq!(
        stack.response_count(),
        2,
        "one response per request, no minimal one"
    );
}

/// Item 2: a request that completed is delivered again after its source was deleted (the
/// common "delete the original once its variants exist", then a crash before the commit). It is
/// answered from the manifest, saying the source is gone; a request for a profile the manifest
/// does not record still fails `source_not_found`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_request_whose_source_was_deleted_is_answered_from_its_manifest() {
    let stack = Stack::start(1).await;
    let worker = Worker::start(&stack.worker_env("g-deleted"));
    worker.ready().await;
    stack.upload_corpus("pillow_flower.jpg").await;
    let responses = stack.responses();
    let req = request("deleted", "pillow_flower.jpg");
    stack.send(&req).await;
    let first = responses.take(1, MINUTE).remove(0).body;
    assert_eq!(first.status, Status::Completed, "{:?}", first.error);

    stack
        .s3c
        .delete_object()
        .bucket(SOURCE_BUCKET)
        .key("pillow_flower.jpg")
        .send()
        .await
        .unwrap();
    stack.send(&req).await;
    let again = responses.take(1, MINUTE).remove(0).body;
    assert_eq!(again.status, Status::Completed, "{:?}", again.error);
    assert!(again.replayed && again.source_missing, "{again:?}");
    let keys = |r: &media_worker::contract::OptimizeResponse| {
        r.outputs.iter().map(|o| o.key.clone()).collect::<Vec<_>>()
    };
    assert_eq!(keys(&again), keys(&first));
    for o in &again.outputs {
        let (bytes, _, _) = stack.get(OUTPUT_BUCKET, &o.key).await;
        assert_eq!(bytes.len() as u64, o.size_bytes, "{}", o.key);
    }

    // Another profile, or another (missing) source object for the same media: not what the
    // manifest records, so nothing to replay.
    let mut other_profile = req.clone();
    other_profile.request_id = "req-other-profile".into();
    other_profile.profile = Some("variants".into());
    let mut other_source = req.clone();
    other_source.request_id = "req-other-source".into();
    other_source.source.key = "not-uploaded-yet.jpg".into();
    for r in [&other_profile, &other_source] {
        stack.send(r).await;
        let failed = responses.take(1, MINUTE).remove(0).body;
        assert_eq!(failed.status, Status::Failed, "{}", r.request_id);
        assert_eq!(
            failed.error.as_ref().map(|e| e.code.as_str()),
            Some("source_not_found"),
            "{}",
            r.request_id
        );
    }
}

/// Item 4: progress events go to a topic that does not exist on a broker that creates none.
/// Progress is best effort: the response is not held for them (the job itself takes about a
/// second; an event's delivery was bounded only by librdkafka's 30 s wait for the topic's
/// metadata, and by `message.timeout.ms`, 5 min, for a topic without a leader).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_topic_that_takes_nothing_never_holds_a_response() {
    let broker = Broker::cluster_with(1, "auto.create.topics.enable=false");
    let stack = Stack::on(broker, 1).await;
    let mut env = stack.worker_env("g-progress");
    env.insert("KAFKA_PROGRESS_TOPIC".into(), stack.own("no.such.topic"));
    env.insert("MEDIA_WORKER_KAFKA__PROGRESS_DELAY_SECS".into(), "0".into());
    let worker = Worker::start(&env);
    worker.ready().await;
    stack.upload_corpus("pillow_flower.jpg").await;
    let responses = stack.responses();
    let sent = Instant::now();
    stack.send(&request("progress", "pillow_flower.jpg")).await;
    let got = responses.take(1, MINUTE).remove(0).body;
    let took = sent.elapsed();
    assert_eq!(got.status, Status::Completed);
    eprintln!("answered in {took:?} (the job {} ms)", got.duration_ms);
    // Each event is bounded (5 s), and the follower waits for at most the one in flight.
    assert!(
        took < Duration::from_secs(20),
        "the response waited {took:?} for progress events"
    );
    wait_until("a progress event counted as failed", MINUTE, || {
        (worker.metric("media_worker_progress_events_total{result=\"failed\"}")? >= 1.0)
            .then_some(())
    })
    .await;
}

/// Item 7: after a rebalance that keeps a partition, a message produced to it wakes the poll
/// loop at once. The safety poll is made an hour and librdkafka's statistics (which also wake
/// the loop) are off, so the message is taken by the partition's owner only if the kept
/// partition's queue still wakes the loop. (Unwoken, the loop stopped polling until
/// `max.poll.interval.ms` expired: the member was put out of the group, the kept partition
/// revoked and assigned again, and only then was the message taken.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_partition_wakes_the_consumer_after_a_rebalance() {
    use rdkafka::producer::FutureRecord;
    let stack = Stack::start(2).await;
    let mut env = stack.worker_env("g-kept");
    env.insert("WORKER_ID".into(), "keeper".into());
    env.insert(
        "MEDIA_WORKER_KAFKA__SAFETY_POLL_MS".into(),
        "3600000".into(),
    );
    env.insert("KAFKA_PROPERTY_STATISTICS_INTERVAL_MS".into(), "0".into());
    let keeper = Worker::start(&env);
    wait_until("both partitions assigned", MINUTE, || {
        (keeper.metric("media_worker_kafka_assigned_partitions ")? == 2.0).then_some(())
    })
    .await;
    let mut other_env = stack.worker_env("g-kept");
    other_env.insert("WORKER_ID".into(), "joiner".into());
    let joiner = Worker::start(&other_env);
    joiner.ready().await;
    let revoked = wait_until("one partition moved", MINUTE, || {
        let p = keeper.log().lines().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["fields"]["message"] == "partition revoked")
                .then(|| v["fields"]["partition"].as_i64())?
        })?;
        (keeper.metric("media_worker_kafka_assigned_partitions ")? == 1.0).then_some(p as i32)
    })
    .await;
    let kept = 1 - revoked;
    stack.upload_corpus("pillow_flower.jpg").await;
    let responses = stack.responses();
    let req = request("kept", "pillow_flower.jpg");
    let payload = serde_json::to_vec(&req).unwrap();
    stack
        .producer()
        .send(
            FutureRecord::to(&stack.request_topic)
                .partition(kept)
                .key("kept")
                .payload(&payload),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let produced = Instant::now();
    let got = responses.take(1, MINUTE).remove(0).body;
    eprintln!(
        "answered {:?} after it was produced (the job {} ms)",
        produced.elapsed(),
        got.duration_ms
    );
    assert_eq!(got.status, Status::Completed);
    assert_eq!(got.worker.id, "keeper", "taken by the partition's owner");
    let kept_revoked = keeper.log().lines().any(|l| {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
        v["fields"]["message"] == "partition revoked"
            && v["fields"]["partition"].as_i64() == Some(i64::from(kept))
    });
    assert!(
        !kept_revoked,
        "the kept partition was taken only after the member left the group"
    );
}

/// Item 8: SIGTERM with the group coordinator gone (the one broker killed) and finished work
/// not yet committed: the final commit and leaving the group cannot complete, and the worker
/// still exits within `SHUTDOWN_TIMEOUT_SECS` rather than be SIGKILLed by its pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_the_coordinator_down_ends_within_its_budget() {
    let stack = Stack::on(Broker::cluster(1), 1).await;
    let mut env = stack.worker_env("g-coordinator");
    env.insert("SHUTDOWN_TIMEOUT_SECS".into(), "6".into());
    // The finished offset stays uncommitted until the final commit.
    env.insert("KAFKA_COMMIT_INTERVAL_MS".into(), "600000".into());
    let mut worker = Worker::start(&env);
    worker.ready().await;
    stack.upload_corpus("pillow_flower.jpg").await;
    let responses = stack.responses();
    stack.send(&request("before", "pillow_flower.jpg")).await;
    assert_eq!(responses.take(1, MINUTE)[0].body.status, Status::Completed);
    drop(responses);
    stack.broker.kill_node(1);
    let stopping = Instant::now();
    worker.sigterm();
    // The budget, and a second for the process to go.
    let status = worker.exited(Duration::from_secs(7)).await;
    eprintln!("exited {status} after {:?}", stopping.elapsed());
    assert!(status.success(), "{status}");
}
