//! The consumer: an rdkafka poll loop on its own thread, talking to async code through typed
//! messages.
//!
//! # Protocol
//! - The poll thread owns the `BaseConsumer` and the [`OffsetTracker`]. Each message it polls is
//!   recorded as dispatched and sent to the worker as a [`Delivery`] (an owned copy: no rdkafka
//!   type crosses the channel).
//! - When a job's response is published, the worker sends the delivery's token back through an
//!   [`Acker`]; the thread marks it finished. Every `commit_interval` it commits, per partition,
//!   the lowest unfinished offset (async). Nothing is stored or committed on receipt. A position
//!   is committed when the commit's result (the commit callback, served by this thread's polls)
//!   says so: a rejected one is sent again on the next turn ([`OffsetTracker`]).
//! - Flow control: each assigned partition's messages come through its own queue (split from
//!   the consumer's), and the thread takes from those queues only while fewer than
//!   `max_in_flight` messages are unfinished. The consumer's own queue (rebalances, commit
//!   results, errors, statistics) is served on every turn, so the member stays in the group
//!   and `max.poll.interval.ms` never expires, however long the jobs take. librdkafka keeps
//!   prefetching into the partition queues up to `queued.min.messages` /
//!   `queued.max.messages.kbytes` each. If the bound holds for
//!   [`PAUSE_AFTER`](super::flow::PAUSE_AFTER) (the pool is busy with long jobs) the partitions
//!   are paused as well, which drops that prefetch and stops fetching; they resume once half
//!   the bound is free ([`Flow`] decides); a partition assigned meanwhile gets the same state
//!   (librdkafka keeps a partition's pause flag while it is away). Pausing is not the first
//!   reaction because librdkafka discards the prefetch on pause and takes about half a second
//!   to fetch again after resume, which would cap short jobs at `max_in_flight` per cycle.
//! - Each lane holds up to its depth of each partition's messages, taken from those queues in
//!   order ([`LookAhead`]), and gives the first urgent one held to a job first, else the
//!   partitions' next in turn (`kafka::ahead`): the unit lane's urgent tasks are those that
//!   make a video playable or answer it, which would otherwise wait behind every unit other
//!   videos sent first. A held message is unfinished for the offsets, never committed past.
//! - The loop sleeps on its command channel: acks, shutdown commands and librdkafka's
//!   "queue no longer empty" callbacks all wake it (`safety_poll_ms` bounds the sleep, a net
//!   for a missed wake). A partition's queue is taken from librdkafka once per assignment
//!   change, and librdkafka never forwards it back to the consumer's queue while the
//!   application holds it; the handles of the previous assignment are dropped before the new
//!   ones are taken, because dropping a handle clears the wake callback of the queue it names,
//!   which for a kept partition is the same queue the new handle just registered.
//! - Revoke is a barrier: inside the rebalance callback (on this thread) it waits up to
//!   `revoke_drain` for the revoked partitions' jobs, applying their acks as they come, commits
//!   synchronously what finished, then lets the partitions go. Jobs that finish later carry a
//!   stale generation and never commit for a partition we no longer own.
//! - Shutdown: `stop_fetching` pauses everything and drops any message still polled (never
//!   dispatched, so never committed: it will be redelivered). `close` commits what finished and
//!   closes the consumer (the final revoke, the outstanding commit, leaving the group) within
//!   the time it is given: with the group coordinator down neither can complete, and the pod
//!   must still exit before its grace period ends. What is not committed by then is
//!   redelivered.
//!
//! # Two groups
//! A worker with a unit topic runs two of these consumers, each a [`Lane`]: the request topic
//! in the worker's group, the unit topic in a group of its own (`kafka.unit_group_id`). One
//! group over both topics left the split to the assignor: KIP-848's default (`uniform`)
//! balances partitions per member, not per topic, and gave one of two members all four
//! request partitions and the other all four unit partitions, so one member encoded every unit
//! of a video (two workers measured 1.00x one). In a group of one topic, every member gets its
//! share of that topic whatever the assignor and protocol. Each lane counts the other's
//! messages against its bound ([`Bound`], as `flow::Places` says: `MAX_IN_FLIGHT` bounds
//! both lanes' together); each lane commits, pauses and drains on revoke by itself.

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientContext, Offset, Statistics, TopicPartitionList};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::ahead::{Ahead, Held};
use super::flow::{Flow, Intake};
pub use super::lanes::{Bound, Lane};
use super::offsets::{OffsetToken, OffsetTracker, Tp};
use super::settings::{GroupProtocol, KafkaSettings};
use crate::health::Health;
use crate::telemetry::Metrics;

/// How often the revoke barrier looks at the clock while it waits for jobs.
const REVOKE_CHECK: Duration = Duration::from_millis(100);
/// How long closing may take when the worker gave no deadline (it went away).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Consumer-queue polls per turn of the loop (an empty poll costs about 0.1 µs).
const EVENTS_PER_TURN: usize = 32;

/// A message, owned, as the worker sees it.
#[derive(Debug)]
pub struct Delivery {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Option<Vec<u8>>,
    pub traceparent: Option<String>,
    pub token: OffsetToken,
    /// The lane it came through.
    pub lane: Lane,
    acker: Acker,
}

impl Delivery {
    /// The message's work is done (its response published, or nothing to answer): its offset
    /// may be committed, by the consumer it came from.
    pub fn finished(&self) {
        self.acker.finished(self.token.clone());
    }
}

enum Command {
    Finished(OffsetToken),
    /// A librdkafka queue went from empty to non-empty.
    Wake,
    StopFetching,
    /// Commit, leave the group and end by this deadline.
    Close(Instant),
}

/// Reports finished messages to the poll thread.
#[derive(Clone, Debug)]
pub struct Acker(Sender<Command>);

impl Acker {
    /// The message's response is published: its offset may be committed.
    pub fn finished(&self, token: OffsetToken) {
        let _ = self.0.send(Command::Finished(token));
    }
}

struct LoopState {
    tracker: OffsetTracker,
    commands: Receiver<Command>,
    stopping: bool,
    closing: bool,
    /// When closing must be done.
    close_by: Option<Instant>,
    paused: bool,
    /// The assignment changed: the partition queues must be split again.
    reassigned: bool,
}

struct SourceContext {
    lane: Lane,
    state: Mutex<LoopState>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    revoke_drain: Duration,
}

impl ClientContext for SourceContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error, KafkaError::Global(RDKafkaErrorCode::AllBrokersDown)) {
            self.health.set_broker_up(false);
        }
        tracing::warn!(error = %error, reason, "kafka client error");
    }

    /// librdkafka's statistics (every `statistics.interval.ms`): consumer lag per partition.
    fn stats(&self, stats: Statistics) {
        let up = stats.brokers.values().any(|b| b.state == "UP");
        self.health.set_broker_up(up);
        let lag = match self.lane {
            Lane::Requests => &self.metrics.consumer_lag,
            Lane::Units => &self.metrics.unit_lag,
        };
        // Only what is assigned now: revoked partitions disappear from the gauge.
        lag.reset();
        let mut total = 0;
        for topic in stats.topics.values() {
            for p in topic.partitions.values() {
                if p.partition < 0 || !p.desired {
                    continue;
                }
                // librdkafka's lag needs a committed offset; before the group's first commit
                // the backlog is everything from the start of the log.
                let behind = if p.consumer_lag >= 0 {
                    p.consumer_lag
                } else if p.hi_offset >= 0 {
                    p.hi_offset - p.lo_offset.max(0)
                } else {
                    continue;
                };
                lag.with_label_values(&[&p.partition.to_string()])
                    .set(behind);
                total += behind;
            }
        }
        // The backlog estimate weighs requests by the mean job; units are its own work.
        if self.lane == Lane::Requests {
            self.metrics.set_lag_total(total);
        }
    }
}

impl ConsumerContext for SourceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => self.on_revoke(consumer, tpl),
            Rebalance::Error(e) => {
                self.metrics.rebalances.with_label_values(&["error"]).inc();
                tracing::error!(error = %e, "rebalance error");
            }
            Rebalance::Assign(_) => {}
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.on_assign(consumer, tpl);
        }
    }

    /// The result of an async commit (served by this thread's polls, never under the state
    /// lock): per partition, committed or to be sent again.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let mut st = self.state.lock().unwrap();
        let mut failed = Vec::new();
        for e in offsets.elements() {
            let Offset::Offset(position) = e.offset() else {
                continue;
            };
            // A partition's own error, or the request's.
            let error = e.error().err().or_else(|| result.clone().err());
            let tp = (e.topic().to_owned(), e.partition());
            st.tracker.commit_result(&tp, position, error.is_none());
            if let Some(error) = error {
                failed.push((tp, position, error.to_string()));
            }
        }
        self.health
            .set_commit_failures(self.lane.index(), st.tracker.commit_failures());
        if !failed.is_empty() || result.is_err() {
            self.metrics.commit_failures.inc();
            tracing::warn!(result = ?result, ?failed, "offset commit failed; sent again at the next commit");
        }
    }
}

fn partitions(tpl: &TopicPartitionList) -> Vec<Tp> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

impl SourceContext {
    fn apply(st: &mut LoopState, cmd: Command) {
        match cmd {
            Command::Finished(t) => {
                st.tracker.finished(&t);
            }
            Command::Wake => {}
            Command::StopFetching => st.stopping = true,
            Command::Close(by) => {
                st.stopping = true;
                st.closing = true;
                st.close_by = Some(by);
            }
        }
    }

    fn drain_commands(st: &mut LoopState) {
        loop {
            match st.commands.try_recv() {
                Ok(cmd) => Self::apply(st, cmd),
                Err(TryRecvError::Empty) => break,
                // The worker is gone: nothing will be finished any more.
                Err(TryRecvError::Disconnected) => {
                    st.stopping = true;
                    st.closing = true;
                    break;
                }
            }
        }
    }

    /// Commits positions (only of `only`, when given). Sync commits send every known position;
    /// an async one's result comes to [`ConsumerContext::commit_callback`].
    fn commit(
        &self,
        consumer: &BaseConsumer<Self>,
        st: &mut LoopState,
        only: Option<&[Tp]>,
        mode: CommitMode,
    ) {
        let positions: Vec<(Tp, i64)> = st
            .tracker
            .committable(matches!(mode, CommitMode::Sync))
            .into_iter()
            .filter(|(tp, _)| only.is_none_or(|o| o.contains(tp)))
            .collect();
        if positions.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), pos) in &positions {
            let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*pos));
        }
        self.metrics.commits.inc();
        for (tp, pos) in &positions {
            st.tracker.commit_sent(tp, *pos);
        }
        let result = match mode {
            CommitMode::Sync => consumer.commit(&tpl, mode),
            CommitMode::Async => commit_async(consumer, &tpl),
        };
        // An async commit that was queued is answered later, in the callback.
        if result.is_err() || matches!(mode, CommitMode::Sync) {
            for (tp, pos) in &positions {
                st.tracker.commit_result(tp, *pos, result.is_ok());
            }
            self.health
                .set_commit_failures(self.lane.index(), st.tracker.commit_failures());
        }
        if let Err(e) = result {
            self.metrics.commit_failures.inc();
            tracing::warn!(error = %e, ?positions, "offset commit failed; sent again at the next commit");
        }
    }

    /// Pauses (or resumes) every assigned partition.
    fn pause(&self, consumer: &BaseConsumer<Self>, st: &mut LoopState, pause: bool) {
        if let Ok(assignment) = consumer.assignment() {
            let r = if pause {
                consumer.pause(&assignment)
            } else {
                consumer.resume(&assignment)
            };
            if let Err(e) = r {
                tracing::warn!(error = %e, pause, "pause/resume failed");
            }
        }
        st.paused = pause;
        if self.lane == Lane::Requests {
            self.metrics.paused.set(pause as i64);
        }
    }

    fn on_revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        self.metrics.rebalances.with_label_values(&["revoke"]).inc();
        let revoked = partitions(tpl);
        let mut st = self.state.lock().unwrap();
        let deadline = Instant::now() + self.revoke_drain;
        Self::drain_commands(&mut st);
        while !st.closing && revoked.iter().any(|tp| st.tracker.in_flight_on(tp) > 0) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match st.commands.recv_timeout(left.min(REVOKE_CHECK)) {
                Ok(cmd) => Self::apply(&mut st, cmd),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        // Closing, the commit is awaited with the close, within its deadline: a synchronous one
        // waits for a coordinator without bound.
        let mode = if st.closing {
            CommitMode::Async
        } else {
            CommitMode::Sync
        };
        self.commit(consumer, &mut st, Some(&revoked), mode);
        let abandoned: usize = revoked.iter().map(|tp| st.tracker.in_flight_on(tp)).sum();
        for tp in &revoked {
            st.tracker.revoke(tp);
        }
        // A partition whose commits failed may be gone with them.
        self.health
            .set_commit_failures(self.lane.index(), st.tracker.commit_failures());
        st.reassigned = true;
        // One line per partition, with typed fields (the fleet tests read ownership from them).
        for (topic, partition) in &revoked {
            tracing::info!(
                topic,
                partition,
                lane = self.lane.name(),
                still_running = abandoned,
                "partition revoked"
            );
        }
    }

    fn on_assign(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        self.metrics.rebalances.with_label_values(&["assign"]).inc();
        let assigned = partitions(tpl);
        let mut st = self.state.lock().unwrap();
        for tp in &assigned {
            st.tracker.assign(tp.clone());
        }
        st.reassigned = true;
        // A partition keeps librdkafka's pause flag when it is taken away and given back: one
        // revoked (or lost) while we were paused missed the resume, which covers only what is
        // assigned, and would never be fetched again. Each new partition gets our state.
        let r = if st.paused {
            consumer.pause(tpl)
        } else {
            consumer.resume(tpl)
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, paused = st.paused, "pause state of new partitions");
        }
        if let Ok(a) = consumer.assignment() {
            match self.lane {
                Lane::Requests => self.metrics.assigned_partitions.set(a.count() as i64),
                Lane::Units => self.metrics.unit_partitions.set(a.count() as i64),
            }
        }
        for (topic, partition) in &assigned {
            tracing::info!(
                topic,
                partition,
                lane = self.lane.name(),
                "partition assigned"
            );
        }
    }
}

/// An async commit whose result comes back as an event on the consumer's queue, served by its
/// polls into [`ConsumerContext::commit_callback`]. rust-rdkafka's `commit(Async)` loses the
/// result: librdkafka posts a manual commit's result only to a reply queue or to an
/// `offset_commit_cb`, and rust-rdkafka 0.39 sets neither (it takes events instead), so a
/// rejected commit went unseen (`COMMITFAIL` in librdkafka's log, nothing else).
fn commit_async(
    consumer: &BaseConsumer<SourceContext>,
    tpl: &TopicPartitionList,
) -> KafkaResult<()> {
    use rdkafka::bindings as rd;
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is a live consumer; the queue handle is ours and destroyed here (the commit
    // keeps its own reference to the queue); `tpl` is copied by librdkafka.
    let err = unsafe {
        let queue = rd::rd_kafka_queue_get_consumer(rk);
        if queue.is_null() {
            return Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::UnknownGroup));
        }
        let err = rd::rd_kafka_commit_queue(rk, tpl.ptr(), queue, None, std::ptr::null_mut());
        rd::rd_kafka_queue_destroy(queue);
        err
    };
    match RDKafkaErrorCode::from(err) {
        RDKafkaErrorCode::NoError => Ok(()),
        code => Err(KafkaError::ConsumerCommit(code)),
    }
}

/// The running consumer thread.
pub struct KafkaSource {
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

struct LoopConfig {
    lane: Lane,
    bound: Bound,
    /// The longest sleep without a wake.
    safety_poll: Duration,
    group_protocol: GroupProtocol,
    commit_interval: Duration,
    /// Scratch space is one of the checks that gate intake (`Health::intake_blocker`).
    scratch_dir: std::path::PathBuf,
    look: LookAhead,
}

/// How a lane chooses among the messages it has fetched (`kafka::ahead`): how many of each
/// partition it holds, and which go first.
#[derive(Debug, Clone, Copy)]
pub struct LookAhead {
    /// Messages held per partition (at least 1).
    pub depth: usize,
    /// Whether a message (by its key) goes before the others held.
    pub urgent: fn(Option<&[u8]>) -> bool,
}

impl LookAhead {
    /// One message of each partition at a time, in turn: the request lane's.
    pub const IN_TURN: LookAhead = LookAhead {
        depth: 1,
        urgent: |_| false,
    };
}

impl KafkaSource {
    /// Subscribes `lane`'s topic in its group and starts polling, with at most `bound`
    /// messages dispatched and unfinished. Deliveries arrive on the receiver, each with what
    /// acknowledges it. `None` for the unit lane of a worker without a unit topic.
    pub fn start(
        settings: &KafkaSettings,
        lane: Lane,
        bound: Bound,
        scratch_dir: std::path::PathBuf,
        look: LookAhead,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
    ) -> KafkaResult<Option<(KafkaSource, UnboundedReceiver<Delivery>)>> {
        let Some((topic, group)) = lane.subscription(settings) else {
            return Ok(None);
        };
        let (cmd_tx, cmd_rx) = std::sync::mpsc::channel();
        let (ev_tx, ev_rx) = tokio::sync::mpsc::unbounded_channel();
        let context = SourceContext {
            lane,
            state: Mutex::new(LoopState {
                tracker: OffsetTracker::default(),
                commands: cmd_rx,
                stopping: false,
                closing: false,
                close_by: None,
                paused: false,
                reassigned: false,
            }),
            metrics,
            health,
            revoke_drain: Duration::from_secs(settings.revoke_drain_secs),
        };
        let mut consumer: BaseConsumer<SourceContext> =
            super::client::consumer_config(settings, &group).create_with_context(context)?;
        consumer.set_nonempty_callback(waker(&cmd_tx));
        consumer.subscribe(&[&topic])?;
        let cmd_wake = cmd_tx.clone();
        let cfg = LoopConfig {
            lane,
            bound,
            safety_poll: Duration::from_millis(settings.safety_poll_ms),
            group_protocol: settings.group_protocol,
            commit_interval: Duration::from_millis(settings.commit_interval_ms),
            scratch_dir,
            look,
        };
        let out = Dispatcher {
            events: ev_tx,
            acker: Acker(cmd_tx.clone()),
            lane,
        };
        let thread = std::thread::Builder::new()
            .name(format!("kafka-{}", lane.name()))
            .spawn(move || poll_loop(Arc::new(consumer), out, cfg, cmd_wake))
            .expect("spawn poll thread");
        Ok(Some((
            KafkaSource {
                commands: cmd_tx,
                thread: Some(thread),
            },
            ev_rx,
        )))
    }

    /// Stops taking new messages; in-flight ones can still finish and commit.
    pub fn stop_fetching(&self) {
        let _ = self.commands.send(Command::StopFetching);
    }

    /// Commits what finished, leaves the group and joins the thread (blocking), within
    /// `within`: what is not done by then is left (uncommitted work is redelivered).
    pub fn close(mut self, within: Duration) {
        let by = Instant::now() + within;
        let _ = self.commands.send(Command::Close(by));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn traceparent(m: &impl Message) -> Option<String> {
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case("traceparent"))
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// A librdkafka "queue no longer empty" callback that wakes the loop.
fn waker(commands: &Sender<Command>) -> impl Fn() + Send + Sync + 'static {
    let commands = commands.clone();
    move || {
        let _ = commands.send(Command::Wake);
    }
}

type Consumer = Arc<BaseConsumer<SourceContext>>;
type Queues = Vec<(Tp, PartitionQueue<SourceContext>)>;

/// A polled message, owned: what a job gets of it, held until it goes (`kafka::ahead`).
struct Fetched {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    traceparent: Option<String>,
}

impl Fetched {
    fn of(m: &BorrowedMessage<'_>) -> Fetched {
        Fetched {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().map(<[u8]>::to_vec),
            traceparent: traceparent(m),
        }
    }
}

/// What the loop does with each message it takes.
struct Dispatcher {
    events: UnboundedSender<Delivery>,
    acker: Acker,
    lane: Lane,
}

impl Dispatcher {
    /// Records `m` as in flight and hands it to the worker (unless stopping or revoked).
    fn dispatch(&self, ctx: &SourceContext, m: Fetched) {
        let token = {
            let mut st = ctx.state.lock().unwrap();
            if st.stopping {
                return; // not dispatched, not committed: redelivered later
            }
            st.tracker.dispatched(&m.topic, m.partition, m.offset)
        };
        let Some(token) = token else { return };
        ctx.metrics.requests_received.inc();
        let d = Delivery {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            key: m.key,
            payload: m.payload,
            traceparent: m.traceparent,
            token,
            lane: self.lane,
            acker: self.acker.clone(),
        };
        if self.events.send(d).is_err() {
            ctx.state.lock().unwrap().stopping = true;
        }
    }
}

/// One handle per assigned partition, taken again after every assignment change. The previous
/// handles must be dropped first (see the module doc): their drop clears the wake callback.
fn split_queues(consumer: &Consumer, assigned: Vec<Tp>, wake: &Sender<Command>) -> Queues {
    assigned
        .into_iter()
        .filter_map(|tp| {
            let mut q = consumer.split_partition_queue(&tp.0, tp.1)?;
            q.set_nonempty_callback(waker(wake));
            Some((tp, q))
        })
        .collect()
}

fn poll_loop(consumer: Consumer, out: Dispatcher, cfg: LoopConfig, wake: Sender<Command>) {
    let ctx = consumer.context().clone();
    let mut queues: Queues = Vec::new();
    let mut flow = Flow::new(cfg.bound.max(cfg.lane), cfg.commit_interval, Instant::now());
    let mut ahead = Ahead::new(cfg.look.depth);
    let mut intake_blocker = None;
    loop {
        // Serve the consumer's queue: rebalances run their callbacks in here. A message can
        // arrive here only if it was fetched before its partition's queue was split. `None`
        // does not mean empty: rdkafka also returns it for an event it served itself (a log
        // line, statistics, a rebalance, a commit result), so stopping at the first `None` let
        // a burst of log lines (a broker down) hold a rebalance back at one event per turn.
        for _ in 0..EVENTS_PER_TURN {
            match consumer.poll(Duration::ZERO) {
                Some(Ok(m)) => out.dispatch(&ctx, Fetched::of(&m)),
                Some(Err(e)) => tracing::warn!(error = %e, "consumer error"),
                None => {}
            }
        }
        // A fatal error (e.g. a broker without the consumer group protocol) leaves the consumer
        // unable to do anything more: stop, so that the worker exits and says why, rather than
        // stay up and consume nothing.
        if let Some((code, reason)) = consumer.client().fatal_error() {
            tracing::error!(
                %code,
                reason,
                lane = cfg.lane.name(),
                group_protocol = ?cfg.group_protocol,
                "consumer fatal error; the consumer group protocol needs Apache Kafka 4.0 or \
                 later (KAFKA_GROUP_PROTOCOL=classic works with every broker)"
            );
            break;
        }
        let turn = {
            let mut st = ctx.state.lock().unwrap();
            SourceContext::drain_commands(&mut st);
            if st.closing {
                break;
            }
            if std::mem::take(&mut st.reassigned) {
                drop(std::mem::take(&mut queues));
                let assigned = st.tracker.partitions().cloned().collect();
                queues = split_queues(&consumer, assigned, &wake);
                ahead.retain(|tp, generation| st.tracker.generation(tp) == Some(generation));
            }
            let in_flight = cfg.bound.set(cfg.lane, st.tracker.in_flight());
            let blocker = ctx.health.intake_blocker(&cfg.scratch_dir);
            if blocker != intake_blocker {
                let lane = cfg.lane.name();
                match blocker {
                    Some(reason) => tracing::warn!(reason, lane, "not ready: intake paused"),
                    None => tracing::info!(lane, "ready again: intake resumed"),
                }
                intake_blocker = blocker;
            }
            let state = Intake {
                stopping: st.stopping,
                sick: blocker.is_some(),
                paused: st.paused,
            };
            let turn = flow.turn(Instant::now(), in_flight, state);
            if let Some(pause) = turn.pause {
                ctx.pause(&consumer, &mut st, pause);
            }
            if turn.commit {
                ctx.commit(&consumer, &mut st, None, CommitMode::Async);
            }
            turn
        };
        // Read ahead: each partition's messages held, in order, up to the lane's depth.
        let mut fetched = Vec::new();
        for (tp, queue) in &queues {
            for _ in 0..ahead.room(tp) {
                match queue.poll(Duration::ZERO) {
                    Some(Ok(m)) => fetched.push((tp.clone(), Fetched::of(&m))),
                    Some(Err(e)) => tracing::warn!(error = %e, "consumer error"),
                    None => break,
                }
            }
        }
        if !fetched.is_empty() {
            let mut st = ctx.state.lock().unwrap();
            for (tp, m) in fetched {
                let Some(generation) = st.tracker.held(&tp.0, tp.1, m.offset) else {
                    continue; // finished work, or a partition gone meanwhile
                };
                let urgent = (cfg.look.urgent)(m.key.as_deref());
                let offset = m.offset;
                let held = Held {
                    offset,
                    generation,
                    urgent,
                    message: m,
                };
                ahead.hold(tp, held);
            }
        }
        // Take the held messages, urgent ones first (`kafka::ahead`), up to the bound, each
        // counted as it is taken: the other lane takes beside this one.
        let mut room = turn.room;
        while room > 0 && !ahead.is_empty() && cfg.bound.take(cfg.lane) {
            match ahead.pick() {
                Some((_, held)) => {
                    out.dispatch(&ctx, held.message);
                    room -= 1;
                }
                None => {
                    cfg.bound.give_back(cfg.lane);
                    break;
                }
            }
        }
        // Sleep until an ack, a command or a librdkafka queue wakes us.
        let mut st = ctx.state.lock().unwrap();
        cfg.bound.set(cfg.lane, st.tracker.in_flight());
        match st.commands.recv_timeout(cfg.safety_poll) {
            Ok(cmd) => SourceContext::apply(&mut st, cmd),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => st.closing = true,
        }
    }
    let by = {
        let mut st = ctx.state.lock().unwrap();
        ctx.commit(&consumer, &mut st, None, CommitMode::Async);
        st.close_by
            .unwrap_or_else(|| Instant::now() + CLOSE_TIMEOUT)
    };
    // The queues hold the consumer: release them first.
    drop(queues);
    close_by(consumer, by);
}

/// Closes the consumer: a final (skipped-drain) revoke, the outstanding commits, leaving the
/// group, each served by polls here until librdkafka says it is closed or `by` passes. Past
/// it, the consumer is left as it is (its drop would wait without bound, rust-rdkafka #509)
/// for the process's exit: what it had not committed is redelivered.
fn close_by(consumer: Consumer, by: Instant) {
    if let Err(e) = consumer.close_queue() {
        tracing::warn!(error = %e, "closing the consumer failed");
    }
    while !consumer.closed() {
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::warn!(
                "consumer not closed by the shutdown deadline (group coordinator unreachable?): left as it is"
            );
            std::mem::forget(consumer);
            return;
        }
        let _ = consumer.poll(left.min(REVOKE_CHECK));
    }
    drop(consumer);
    tracing::info!("consumer closed");
}
