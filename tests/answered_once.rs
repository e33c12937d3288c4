//! A long video's request answered exactly once, whatever becomes of the unit topic and
//! whichever pods take its tasks (`crate::units`, "Stitch" and "One answer"): the answer's
//! claim is a write only the first writer makes (`Storage::create`, on s3s-fs and on local
//! files); a plan whose unit topic is gone when its last part lands is stitched where it
//! landed; a stitch task taken in two groups answers once; and the upgrade from one group over
//! both topics (docs/operations.md, "Upgrading") answers each request once and replays
//! nothing. Real Kafka (scripts/kafka.sh) and s3s-fs throughout.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use common::{MINUTE, OUTPUT_BUCKET, Stack, logged_containing};
use media_worker::contract::Status;
use media_worker::storage::{Created, LocalStorage, ObjectMeta, S3Storage, Storage};

const JSON: ObjectMeta<'static> = ObjectMeta {
    content_type: "application/json",
    cache_control: "no-cache",
};

/// Writers of one key at once, and rounds of them.
const WRITERS: usize = 16;
const ROUNDS: usize = 20;

/// `Storage::create` on s3s-fs (the real `s3s-fs` binary, through the S3 client the worker
/// uses) and on local files: the first write of a key makes it, the second finds it there and
/// leaves it (read back with the SDK's GetObject and `std::fs`), the key deleted is made again.
/// Of writers of one key at once, on local files one makes it and its body is what is there.
/// s3s-fs 0.14.1 checks that the key is free and then writes (`put_object`: `exists()`, then a
/// temporary file renamed), so writers at once can each be told they made it: its figures
/// are printed, not asserted (S3 decides a conditional write atomically).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_where_nothing_is_is_made_once() {
    let s3 = common::S3::start();
    let client = s3.client().await;
    client
        .create_bucket()
        .bucket("claims")
        .send()
        .await
        .unwrap();
    let on_s3s = S3Storage::with_client(client.clone(), 16 << 20);
    let dir = tempfile::tempdir().unwrap();
    let local = LocalStorage::new(dir.path());
    let read_back = |name: &'static str, key: String| {
        let (client, root) = (client.clone(), dir.path().join("claims"));
        async move {
            if name == "local" {
                return std::fs::read(root.join(key)).unwrap();
            }
            let got = client.get_object().bucket("claims").key(key);
            let got = got.send().await.unwrap();
            got.body.collect().await.unwrap().into_bytes().to_vec()
        }
    };
    let stores: [(&'static str, &dyn Storage); 2] = [("s3s-fs", &on_s3s), ("local", &local)];
    for (name, store) in stores {
        let key = "plan/records/answered";
        let first = store.create("claims", key, b"first", &JSON).await.unwrap();
        assert_eq!(first, Created::New, "{name}");
        let second = store.create("claims", key, b"second", &JSON).await.unwrap();
        assert_eq!(second, Created::Exists, "{name}");
        assert_eq!(read_back(name, key.into()).await, b"first", "{name}");
        store.delete("claims", key).await.unwrap();
        let again = store.create("claims", key, b"again", &JSON).await.unwrap();
        assert_eq!(again, Created::New, "{name}: made again once deleted");

        let mut made = Vec::new();
        for round in 0..ROUNDS {
            let key = format!("race/{round}/answered");
            let writes = (0..WRITERS).map(|i| {
                let key = key.clone();
                async move {
                    let body = format!("writer {i}");
                    let created = store.create("claims", &key, body.as_bytes(), &JSON).await;
                    (created.unwrap(), body)
                }
            });
            let results = futures_util::future::join_all(writes).await;
            let winners: Vec<&String> = results
                .iter()
                .filter(|(c, _)| *c == Created::New)
                .map(|(_, b)| b)
                .collect();
            made.push(winners.len());
            if let [winner] = winners[..] {
                assert_eq!(read_back(name, key).await, winner.as_bytes(), "{name}");
            }
        }
        eprintln!("{name}: {WRITERS} writers at once, {ROUNDS} rounds: made by {made:?}");
        if name == "local" {
            assert!(made.iter().all(|&n| n == 1), "{name}: made by {made:?}");
        }
    }
}

/// A stack with a unit topic of `partitions`, a `secs`-long 640x360 camera-like video
/// uploaded as `long.mp4`, and the environment of workers in group `group`: a pool of one,
/// videos past 20 s planned as units, ffmpeg's fastest preset (what is tested is who answers).
async fn long_video(
    group: &str,
    secs: u32,
    partitions: u32,
) -> (Stack, tempfile::TempDir, HashMap<String, String>) {
    let stack = Stack::start(2).await;
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, partitions);
    let dir = tempfile::tempdir().unwrap();
    let source = common::synthetic::camera_like_video(dir.path(), secs, 640, 360);
    stack.upload_file("long.mp4", &source).await;
    let mut env = stack.worker_env(group);
    env.insert("KAFKA_UNIT_TOPIC".into(), unit_topic);
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    env.insert("FFMPEG_PRESET".into(), "ultrafast".into());
    env.insert(
        "MEDIA_WORKER_PROFILES__STREAMING__UNITS_AFTER_SECS".into(),
        "20".into(),
    );
    (stack, dir, env)
}

/// `env` with `pairs` set, one worker's.
fn with(env: &HashMap<String, String>, pairs: &[(&str, &str)]) -> HashMap<String, String> {
    let mut env = env.clone();
    for (k, v) in pairs {
        env.insert((*k).into(), (*v).into());
    }
    env
}

/// The long video's request under `streaming`, as `media_id`.
fn long_request(media_id: &str) -> media_worker::contract::OptimizeRequest {
    let mut req = common::request(media_id, "long.mp4");
    req.profile = Some("streaming".into());
    req
}

/// The keys under `prefix` in the output bucket.
async fn keys(stack: &Stack, prefix: &str) -> BTreeSet<String> {
    let listed = stack
        .s3c
        .list_objects_v2()
        .bucket(OUTPUT_BUCKET)
        .prefix(prefix)
        .send()
        .await
        .unwrap();
    listed
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_owned))
        .collect()
}

/// The prefix of `media_id`'s plan and its number of units, once the plan is stored.
async fn plan_of(stack: &Stack, media_id: &str) -> (String, usize) {
    let deadline = Instant::now() + 5 * MINUTE;
    let at = format!("user-1/videos/{media_id}/units/");
    let key = loop {
        if let Some(k) = keys(stack, &at)
            .await
            .into_iter()
            .find(|k| k.ends_with("/plan.json"))
        {
            break k;
        }
        assert!(Instant::now() < deadline, "no plan for {media_id}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (bytes, _, _) = stack.get(OUTPUT_BUCKET, &key).await;
    let plan: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let units = plan["units"].as_array().unwrap().len();
    (key.strip_suffix("plan.json").unwrap().to_owned(), units)
}

/// The unit topic deleted while a plan's last part is in hand (every other part recorded, the
/// worker at work on it): the part lands, the topic cannot take the stitch task, and the
/// worker stitches and answers itself, once, completed. The deletion is checked to be done
/// before the part's record is written.
#[tokio::test(flavor = "multi_thread")]
async fn a_plan_whose_unit_topic_is_gone_when_its_last_part_lands_is_answered() {
    let (stack, _dir, env) = long_video("gone", 30, 2).await;
    let worker = common::Worker::start(&env);
    worker.ready().await;
    let responses = stack.responses();
    stack.send(&long_request("gone")).await;
    let (prefix, units) = plan_of(&stack, "gone").await;
    let plan_id = prefix.trim_end_matches('/').rsplit('/').next().unwrap();
    // (its record, its task's key on `/jobs`) for every part that completes the plan.
    let parts: Vec<(String, String)> = (0..units)
        .map(|i| {
            let record = format!("{prefix}records/unit-{i:05}.json");
            (record, format!("{plan_id}/{i}"))
        })
        .chain([(
            format!("{prefix}records/audio.json"),
            format!("{plan_id}/audio"),
        )])
        .collect();
    let deadline = Instant::now() + 5 * MINUTE;
    let (last, _) = loop {
        let records = keys(&stack, &format!("{prefix}records/")).await;
        let missing: Vec<_> = parts.iter().filter(|(r, _)| !records.contains(r)).collect();
        assert!(!missing.is_empty(), "every part landed unseen: {records:?}");
        if let [(record, task)] = missing[..]
            && worker
                .jobs()
                .iter()
                .any(|j| j["request_id"] == task.as_str())
        {
            break (record.clone(), task.clone());
        }
        assert!(Instant::now() < deadline, "missing {missing:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let unit_topic = &env["KAFKA_UNIT_TOPIC"];
    stack.broker.delete_topic(unit_topic);
    assert!(
        !keys(&stack, &last).await.contains(&last),
        "the last part landed before its unit topic was gone: the moment this test sets up \
         was missed"
    );
    let r = responses.next(4 * MINUTE).expect("a response");
    assert_eq!(r.key, "gone");
    assert_eq!(r.body.status, Status::Completed, "{:?}", r.body.error);
    assert!(
        responses.next(Duration::from_secs(10)).is_none(),
        "a second response"
    );
    let log = worker.log();
    assert_eq!(logged_containing(&log, "stitched here").len(), 1, "{log}");
}

/// Two pods whose unit groups differ: each takes every task of the unit topic (as old and new
/// pods do while an upgrade overlaps them, or a new unit group replaying the topic beside the
/// old), so each encodes every part, and each the stitch task (or two). The request is
/// answered once: every stitch of the plan claims the answer and one publishes; the others
/// say so. Both groups have taken every task before the responses are counted.
#[tokio::test(flavor = "multi_thread")]
async fn a_stitch_taken_in_two_groups_is_answered_once() {
    let (stack, _dir, env) = long_video("two", 30, 2).await;
    let groups = ["two.units", "two.units-beside"];
    let workers: Vec<common::Worker> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let group = stack.own(g);
            let id = format!("worker-{i}");
            common::Worker::start(&with(
                &env,
                &[("KAFKA_UNIT_GROUP_ID", &group), ("WORKER_ID", &id)],
            ))
        })
        .collect();
    for w in &workers {
        w.ready().await;
    }
    let responses = stack.responses();
    stack.send(&long_request("two")).await;
    let r = responses.next(5 * MINUTE).expect("a response");
    assert_eq!(r.body.status, Status::Completed, "{:?}", r.body.error);
    let unit_topic = &env["KAFKA_UNIT_TOPIC"];
    common::wait_until("both groups' tasks done", 5 * MINUTE, || {
        groups
            .iter()
            .all(|g| stack.uncommitted(unit_topic, g, 2) == 0)
            .then_some(())
    })
    .await;
    let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
    let stitches: Vec<usize> = logs
        .iter()
        .map(|l| logged_containing(l, "job finished").len())
        .collect();
    assert_eq!(
        stack.response_count(),
        1,
        "stitches by worker: {stitches:?}"
    );
    // More than one stitch ran (else this test would prove nothing): a stitch that found the
    // answer claimed, or the plan answered when it was taken (a stitch's task key is the plan
    // id alone).
    let declined: usize = logs
        .iter()
        .map(|l| {
            let found_answered = logged_containing(l, "already answered")
                .iter()
                .filter(|f| f["task"].as_str().is_some_and(|t| !t.contains('/')))
                .count();
            logged_containing(l, "the answer is another task's").len() + found_answered
        })
        .sum();
    assert!(declined > 0, "only one stitch ran");
}

/// What the release before left on the unit topic, written as it wrote it: stitch tasks
/// (of plans that are not there: whoever takes one logs it dropped), `done` of them taken and
/// committed in the request group, then `waiting` not taken.
async fn left_by_one_group(
    stack: &Stack,
    unit_topic: &str,
    group: &str,
    done: &[&str],
    waiting: &str,
) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    use rdkafka::producer::FutureRecord;
    use rdkafka::{ClientConfig, Offset, TopicPartitionList};
    let producer = stack.producer();
    for media in done.iter().chain([&waiting]) {
        let task = serde_json::json!({
            "plan": { "bucket": OUTPUT_BUCKET, "prefix": format!("user-1/videos/{media}/units/{media}/") },
            "unit": null,
        })
        .to_string();
        let record = FutureRecord::to(unit_topic)
            .key(*media)
            .partition(0)
            .payload(&task);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .unwrap();
        if *media == *done.last().unwrap() {
            // What a consumer of the request group commits once it took them.
            let c: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", stack.broker.bootstrap())
                .set("group.id", stack.own(group))
                .create()
                .unwrap();
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(unit_topic, 0, Offset::Offset(done.len() as i64))
                .unwrap();
            tpl.add_partition_offset(unit_topic, 1, Offset::Offset(0))
                .unwrap();
            c.commit(&tpl, CommitMode::Sync).unwrap();
        }
    }
}

/// The upgrade path of docs/operations.md, "Upgrading", on one Kafka cluster. The unit topic
/// holds what the release before left: three tasks it took (committed in the request group,
/// as one group over both topics did) and one waiting. A pod as after step 1 (the request
/// group, no unit topic: it encodes long videos where it takes them) and a pod of this release
/// (the unit topic in its own group) run side by side; two long videos and two photos are
/// sent. Each request is answered once, completed; the new pod's unit group starts where the
/// request group left the unit topic: the waiting task is taken, the three taken before are
/// not taken again.
#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_from_one_group_over_both_topics_answers_once_and_replays_nothing() {
    let (stack, _dir, env) = long_video("upgrade", 30, 2).await;
    let unit_topic = env["KAFKA_UNIT_TOPIC"].clone();
    let done = ["done-0", "done-1", "done-2"];
    left_by_one_group(&stack, &unit_topic, "upgrade", &done, "waiting").await;
    let old = common::Worker::start(&with(
        &env,
        &[("KAFKA_UNIT_TOPIC", ""), ("WORKER_ID", "old")],
    ));
    old.ready().await;
    let new = common::Worker::start(&with(&env, &[("WORKER_ID", "new")]));
    new.ready().await;
    // Each holds one of the request topic's two partitions before anything is sent.
    for w in [&old, &new] {
        common::wait_until("a request partition each", 2 * MINUTE, || {
            let held = |m: &str| {
                logged_containing(&w.log(), m)
                    .iter()
                    .filter(|f| f["lane"] == "requests")
                    .count()
            };
            (held("partition assigned") - held("partition revoked") == 1).then_some(())
        })
        .await;
    }
    let responses = stack.responses();
    stack.upload_corpus("pillow_flower.jpg").await;
    let requests = [
        long_request("video-0"),
        long_request("video-1"),
        common::request("photo-0", "pillow_flower.jpg"),
        common::request("photo-1", "pillow_flower.jpg"),
    ];
    // A video and a photo on each partition, so on each pod.
    let producer = stack.producer();
    for (i, r) in requests.iter().enumerate() {
        let payload = serde_json::to_vec(r).unwrap();
        let record = rdkafka::producer::FutureRecord::to(&stack.request_topic)
            .key(&r.media_id)
            .partition(i as i32 % 2)
            .payload(&payload);
        producer
            .send(record, Duration::from_secs(10))
            .await
            .unwrap();
    }
    let mut answered = BTreeSet::new();
    while answered.len() < requests.len() {
        let r = responses.next(10 * MINUTE).expect("a response");
        assert_eq!(
            r.body.status,
            Status::Completed,
            "{}: {:?}",
            r.key,
            r.body.error
        );
        assert!(answered.insert(r.key.clone()), "{} answered twice", r.key);
    }
    common::wait_until("the unit topic's tasks done", 5 * MINUTE, || {
        (stack.uncommitted_units(&unit_topic, "upgrade", 2) == 0).then_some(())
    })
    .await;
    assert_eq!(stack.response_count(), requests.len() as i64);
    let log = new.log();
    let dropped: Vec<String> = logged_containing(&log, "a unit task whose plan is gone")
        .iter()
        .map(|f| f["plan"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(dropped, ["waiting"], "taken by the new unit group");
    let seeded = logged_containing(&log, "the unit group starts where the request group left");
    assert_eq!(seeded.len(), 1, "{log}");
    // Both pods took requests (the request topic's two partitions, one each), so both
    // releases answered.
    let finished = |w: &common::Worker| logged_containing(&w.log(), "job finished").len();
    assert!(
        finished(&old) > 0 && finished(&new) > 0,
        "one pod answered every request"
    );
}
