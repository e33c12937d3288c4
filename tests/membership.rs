//! Static membership (`KAFKA_GROUP_INSTANCE_ID`, the pod name in the StatefulSet overlay) on
//! Apache Kafka, under both group protocols: a member restarted within the session timeout gets
//! its partitions back, and the other members see no rebalance (neither in their own
//! rebalance counters nor in the group coordinator's log).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;

const PARTITIONS: u32 = 6;

/// The partitions a worker holds now, from its `partition assigned` / `partition revoked` lines.
fn held(w: &Worker) -> BTreeSet<i64> {
    let mut held = BTreeSet::new();
    for line in w.log().lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let f = &v["fields"];
        let Some(p) = f["partition"].as_i64() else {
            continue;
        };
        match f["message"].as_str() {
            Some("partition assigned") => {
                held.insert(p);
            }
            Some("partition revoked") => {
                held.remove(&p);
            }
            _ => {}
        }
    }
    held
}

/// (assign, revoke) rebalance events the worker has seen.
fn rebalances(w: &Worker) -> (f64, f64) {
    let kind = |k: &str| {
        w.metric(&format!(
            "media_worker_kafka_rebalances_total{{kind=\"{k}\"}}"
        ))
        .unwrap_or(0.0)
    };
    (kind("assign"), kind("revoke"))
}

async fn a_restarted_static_member_gets_its_partitions_back(protocol: &str) {
    let mut stack = Stack::start(PARTITIONS).await;
    stack.group_protocol = protocol.to_owned();
    stack.upload_corpus("imageio_chelsea.png").await;
    let base = stack.worker_env("g-static");
    let member = |i: usize| {
        let mut env = base.clone();
        env.insert(
            "KAFKA_GROUP_INSTANCE_ID".into(),
            format!("media-worker-{i}"),
        );
        env.insert("WORKER_POOL_SIZE".into(), "1".into());
        env
    };
    let mut workers: Vec<Worker> = (0..3).map(|i| Worker::start(&member(i))).collect();
    // Settled: every partition held by exactly one member, two each (both protocols' assignors
    // balance; an unbalanced moment is a reconciliation still under way).
    let settled = |ws: &[Worker]| {
        let sets: Vec<BTreeSet<i64>> = ws.iter().map(held).collect();
        let union: BTreeSet<i64> = sets.iter().flatten().copied().collect();
        (union.len() == PARTITIONS as usize && sets.iter().all(|s| s.len() == 2)).then_some(sets)
    };
    let before = wait_for("the group settled", 2 * MINUTE, || settled(&workers));
    let others_before = [rebalances(&workers[0]), rebalances(&workers[2])];
    let group = stack.own("g-static");
    let generations = stack.broker.group_rebalances(&group);
    assert!(
        generations >= 1,
        "the broker's log names the group's rebalances"
    );

    // Member 1 restarts: it drains and exits, and its successor joins under the same id well
    // inside the session timeout (6 s here).
    let mut old = workers.remove(1);
    let stopped = std::time::Instant::now();
    old.sigterm();
    assert!(old.wait_exit(Duration::from_secs(30)).success());
    workers.insert(1, Worker::start(&member(1)));
    let back = wait_for("member 1 holding partitions again", MINUTE, || {
        let h = held(&workers[1]);
        (h.len() == before[1].len()).then_some(h)
    });
    println!(
        "static member protocol={protocol} restarted_within={:.1}s partitions={back:?}",
        stopped.elapsed().as_secs_f64()
    );
    assert_eq!(back, before[1], "the same partitions came back to it");

    // The group still works, and the others never rebalanced.
    let responses = stack.responses();
    let reqs: Vec<_> = (0..12)
        .map(|i| request(&format!("static-{i}"), "imageio_chelsea.png"))
        .collect();
    stack.send_all(&reqs).await;
    for r in responses.take(reqs.len(), 3 * MINUTE) {
        assert!(r.body.success, "{}: {:?}", r.key, r.body.error);
    }
    assert_eq!(
        stack.broker.group_rebalances(&group),
        generations,
        "the coordinator did not rebalance the group"
    );
    assert_eq!(
        [rebalances(&workers[0]), rebalances(&workers[2])],
        others_before,
        "the other members saw no rebalance"
    );
    assert_eq!(held(&workers[0]), before[0]);
    assert_eq!(held(&workers[2]), before[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_a_restarted_static_member_gets_its_partitions_back() {
    a_restarted_static_member_gets_its_partitions_back("classic").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_a_restarted_static_member_gets_its_partitions_back() {
    a_restarted_static_member_gets_its_partitions_back("consumer").await
}
