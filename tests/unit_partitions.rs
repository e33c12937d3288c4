//! A unit topic with fewer partitions than its group has members, against Apache Kafka: the
//! worker left without one says so in its log at start, and its gauge reads 0 (it encodes no
//! unit of any long video while the others do).

mod common;

use common::*;

/// Two workers, a unit topic of one partition: the one that holds none warns, once, within two
/// of its checks of the topic (30 s apart); the one that holds it does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_left_without_a_unit_partition_says_so_at_start() {
    let stack = Stack::start(2).await;
    let unit_topic = stack.own("media.optimize.units");
    stack.broker.create_topic(&unit_topic, 1);
    let mut env = stack.worker_env("few-units");
    env.insert("KAFKA_UNIT_TOPIC".into(), unit_topic);
    env.insert("WORKER_POOL_SIZE".into(), "1".into());
    let workers: Vec<Worker> = (0..2)
        .map(|i| {
            let mut env = env.clone();
            env.insert("WORKER_ID".into(), format!("worker-{i}"));
            Worker::start(&env)
        })
        .collect();
    for w in &workers {
        w.ready().await;
    }
    const SAID: &str = "this worker holds no partition of the unit topic";
    let idle = wait_until(
        "a worker says it holds no unit partition",
        2 * MINUTE,
        || workers.iter().position(|w| w.log().contains(SAID)),
    )
    .await;
    let holder = &workers[1 - idle];
    let gauge = "media_worker_kafka_unit_partitions ";
    assert_eq!(workers[idle].metric(gauge), Some(0.0));
    assert_eq!(holder.metric(gauge), Some(1.0));
    assert!(!holder.log().contains(SAID), "{}", holder.log());
    assert_eq!(workers[idle].log().matches(SAID).count(), 1);
}
