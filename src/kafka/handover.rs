//! Where the unit group starts: the unit topic handed over from the request group.
//!
//! Before the unit topic had a group of its own (`kafka.unit_group_id`), the workers took it in
//! the request group (one group over both topics), and what they took is committed there. A
//! unit group that has committed nothing (new to the fleet: the first pod of the release that
//! brought it) would start at `earliest` and take again every task the topic retains (seven
//! days, as the docs advise). So before a worker's unit lane subscribes, [`seed`] commits for
//! the unit group, partition by partition, the request group's offsets on the unit topic: the
//! tasks the earlier pods took are not taken again, those waiting are taken. It changes
//! nothing when the unit group has committed anything (it started before: its own offsets
//! stand), or when the request group has no offset on the unit topic (a fleet that never took
//! it in one group: `earliest` takes nothing twice); a commit the broker refuses (another
//! pod's unit lane joined the group meanwhile, from these offsets or its own) is reported.
//! The earlier release's pods must have stopped taking the unit topic before this release's
//! take it: they never claim an answer (`crate::units`, "One answer"), so one of them and a
//! pod of this release stitching one plan would both answer (docs/operations.md, "Upgrading").

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::{Offset, TopicPartitionList};

use super::settings::KafkaSettings;

/// How long each question to the broker may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What [`seed`] found, and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seeded {
    /// The unit group has committed offsets (or the unit topic is missing): nothing done.
    Started,
    /// Neither group has taken the unit topic: the unit group starts at `earliest`.
    Fresh,
    /// The request group's offsets on the unit topic (partition, offset), now the unit
    /// group's.
    From(Vec<(i32, i64)>),
}

/// Commits for the unit group the request group's offsets on the unit topic, when the unit
/// group has none (see the module doc). Blocking: a few round trips to the broker.
pub fn seed(settings: &KafkaSettings) -> KafkaResult<Seeded> {
    let Some(topic) = settings.unit_topic() else {
        return Ok(Seeded::Started);
    };
    let units = offsets_of(settings, &settings.unit_group())?;
    let metadata = units.fetch_metadata(Some(topic), TIMEOUT)?;
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map_or(0, |t| t.partitions().len() as i32);
    if partitions == 0 {
        return Ok(Seeded::Started);
    }
    let mut all = TopicPartitionList::new();
    for p in 0..partitions {
        all.add_partition(topic, p);
    }
    if !committed(&units, &all)?.is_empty() {
        return Ok(Seeded::Started);
    }
    let requests = offsets_of(settings, &settings.group_id)?;
    let earlier = committed(&requests, &all)?;
    if earlier.is_empty() {
        return Ok(Seeded::Fresh);
    }
    let mut tpl = TopicPartitionList::new();
    for &(p, offset) in &earlier {
        tpl.add_partition_offset(topic, p, Offset::Offset(offset))?;
    }
    units.commit(&tpl, CommitMode::Sync)?;
    Ok(Seeded::From(earlier))
}

/// A client of `group`'s offsets that never joins it.
fn offsets_of(settings: &KafkaSettings, group: &str) -> KafkaResult<BaseConsumer> {
    super::client::offsets_config(settings, group).create()
}

/// The partitions of `tpl` with an offset committed by `consumer`'s group.
fn committed(consumer: &BaseConsumer, tpl: &TopicPartitionList) -> KafkaResult<Vec<(i32, i64)>> {
    let got = consumer.committed_offsets(tpl.clone(), TIMEOUT)?;
    Ok(got
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect())
}
