//! How a worker stops: one [`Shutdown`] shared by everything that must stop with it.
//!
//! The sequence, executed by [`Shutdown::stop`] on what the worker runs ([`Stoppable`]):
//! 1. **Drain** ([`Shutdown::drain`], on SIGTERM or by the caller). No new messages: the pod
//!    reports not ready and stops fetching; jobs in flight run on, publish their responses and
//!    have their offsets committed.
//! 2. **Abandon** ([`Shutdown::abandon`], at the drain deadline: `SHUTDOWN_TIMEOUT_SECS` less a
//!    reserve for step 3). Jobs still running are given up without a response or a commit, so
//!    they are redelivered; every job attempt's token ([`Shutdown::job`]) is cancelled, which
//!    stops its native work (ffmpeg is killed).
//! 3. **Finish** ([`Shutdown::finish`], once the consumer has made its final commit and left the
//!    group and the producer is flushed, or the time for them is up: each of those steps is
//!    bounded by what is left of `SHUTDOWN_TIMEOUT_SECS`, since with the group coordinator or
//!    the brokers gone none of them would end). The HTTP server and the background probes stop.
//!
//! Abandoning implies draining. Tokens only ever go from running to stopped.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the stop sequence stops: the worker's intake, jobs and clients.
pub trait Stoppable {
    /// Step 1: take no new work (not ready, no more fetching, no new tasks).
    fn drain(&self);
    /// Returns when every job in flight has finished.
    fn jobs_finished(&self) -> impl Future<Output = ()> + Send;
    /// Step 2: kill the native work of the jobs still running; returns how many jobs there
    /// were.
    fn abandon(&self) -> usize;
    /// Before step 3: close the media processes, make the final commit, leave the group and
    /// flush the producer; each bounded by what is left of `left`, so that the whole returns
    /// within it.
    fn close(self, left: Duration) -> impl Future<Output = ()> + Send;
}

/// How the jobs in flight ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Every one finished (and was committed).
    Drained,
    /// This many were given up at the deadline (they will be redelivered).
    Abandoned(usize),
}

/// Of the stop's time, kept for the final commit, leaving the group and flushing.
fn reserve(timeout: Duration) -> Duration {
    (timeout / 5).min(Duration::from_secs(3))
}

#[derive(Clone, Debug)]
pub struct Shutdown {
    abandon: CancellationToken,
    /// A child of `abandon`: abandoning also drains.
    drain: CancellationToken,
    finish: CancellationToken,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        let abandon = CancellationToken::new();
        Shutdown {
            drain: abandon.child_token(),
            abandon,
            finish: CancellationToken::new(),
        }
    }

    /// Step 1: stop taking work, let what runs finish.
    pub fn drain(&self) {
        self.drain.cancel();
    }

    /// Step 2: give up the jobs still running.
    pub fn abandon(&self) {
        self.abandon.cancel();
    }

    /// Step 3: stop the servers that outlive the jobs (HTTP, probes).
    pub fn finish(&self) {
        self.finish.cancel();
    }

    pub async fn draining(&self) {
        self.drain.cancelled().await
    }

    pub async fn abandoned(&self) {
        self.abandon.cancelled().await
    }

    /// Cancelled at step 1, for servers that stop taking requests there (the job API).
    pub fn drained(&self) -> CancellationToken {
        self.drain.clone()
    }

    pub fn is_abandoned(&self) -> bool {
        self.abandon.is_cancelled()
    }

    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// The token of one job attempt: cancelled when jobs are abandoned, or by the job itself
    /// (its time limit) without touching the others.
    pub fn job(&self) -> CancellationToken {
        self.abandon.child_token()
    }

    /// Cancelled at step 3, for servers that take a token.
    pub fn finished(&self) -> CancellationToken {
        self.finish.clone()
    }

    /// The whole sequence on `parts`, within `timeout` (`SHUTDOWN_TIMEOUT_SECS`): drain, wait
    /// for the jobs until the deadline less a reserve, abandon those left, close, finish.
    pub async fn stop(&self, parts: impl Stoppable, timeout: Duration) -> Stopped {
        self.drain();
        let deadline = Instant::now() + timeout;
        parts.drain();
        let until = deadline - reserve(timeout);
        let stopped = match tokio::time::timeout_at(until, parts.jobs_finished()).await {
            Ok(()) => Stopped::Drained,
            Err(_) => {
                self.abandon();
                Stopped::Abandoned(parts.abandon())
            }
        };
        let left = deadline.saturating_duration_since(Instant::now());
        parts.close(left.max(Duration::from_millis(100))).await;
        self.finish();
        stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Records the calls the sequence makes; its jobs finish after `jobs_take` (never: `None`).
    #[derive(Clone)]
    struct Parts {
        calls: Arc<Mutex<Vec<String>>>,
        /// What `close` was given.
        left: Arc<Mutex<Option<Duration>>>,
        jobs_take: Option<Duration>,
        shutdown: Shutdown,
    }

    impl Stoppable for Parts {
        fn drain(&self) {
            let drained = self.shutdown.is_draining();
            self.calls
                .lock()
                .unwrap()
                .push(format!("drain (draining: {drained})"));
        }
        async fn jobs_finished(&self) {
            // The jobs' own time: nothing to await but its passing.
            match self.jobs_take {
                Some(take) => tokio::time::sleep(take).await,
                None => std::future::pending::<()>().await,
            }
        }
        fn abandon(&self) -> usize {
            let abandoned = self.shutdown.is_abandoned();
            self.calls
                .lock()
                .unwrap()
                .push(format!("abandon (abandoned: {abandoned})"));
            2
        }
        async fn close(self, left: Duration) {
            let finished = self.shutdown.finished().is_cancelled();
            self.calls
                .lock()
                .unwrap()
                .push(format!("close (finished: {finished})"));
            *self.left.lock().unwrap() = Some(left);
        }
    }

    /// In real time (a paused clock needs tokio's `test-util`, which the release build lacks and
    /// the tests share its build), with a timeout of 4 s (a reserve of 800 ms): jobs that finish
    /// at once, jobs that finish mid-wait (after 1 s: close gets the rest, 3 s at most, not
    /// only the reserve nor the whole timeout), and jobs that never do, whose wait ends at the
    /// deadline less the reserve (close gets the reserve).
    #[tokio::test]
    async fn the_stop_waits_for_jobs_until_the_deadline_less_the_reserve() {
        let timeout = Duration::from_secs(4);
        let reserve = reserve(timeout);
        let drained = vec!["drain (draining: true)", "close (finished: false)"];
        for (jobs_take, expected, calls) in [
            (Some(Duration::ZERO), Stopped::Drained, drained.clone()),
            (Some(Duration::from_secs(1)), Stopped::Drained, drained),
            (
                None,
                Stopped::Abandoned(2),
                vec![
                    "drain (draining: true)",
                    "abandon (abandoned: true)",
                    "close (finished: false)",
                ],
            ),
        ] {
            let shutdown = Shutdown::new();
            let parts = Parts {
                calls: Arc::default(),
                left: Arc::default(),
                jobs_take,
                shutdown: shutdown.clone(),
            };
            let started = Instant::now();
            let stopped = shutdown.stop(parts.clone(), timeout).await;
            let took = started.elapsed();
            assert_eq!(stopped, expected, "{jobs_take:?}");
            assert_eq!(*parts.calls.lock().unwrap(), calls, "{jobs_take:?}");
            assert!(shutdown.finished().is_cancelled(), "step 3 comes last");
            let left = parts.left.lock().unwrap().expect("closed");
            match jobs_take {
                // Close gets the rest of the timeout: what the jobs did not take (the
                // deadline was set before they began), more than the reserve.
                Some(take) => {
                    assert!(took >= take, "{take:?}: returned after {took:?}");
                    assert!(
                        left <= timeout - take,
                        "{take:?}: close got {left:?}, more than was left"
                    );
                    assert!(
                        left > reserve,
                        "{take:?}: close got {left:?}, no more than the reserve"
                    );
                }
                None => {
                    assert!(
                        took >= timeout - reserve,
                        "waited until the reserve: {took:?}"
                    );
                    assert!(left <= reserve, "close gets the reserve: {left:?}");
                }
            }
        }
    }

    #[test]
    fn each_step_stops_what_it_names_and_no_more() {
        let s = Shutdown::new();
        let (job, finished) = (s.job(), s.finished());
        s.drain();
        assert!(s.is_draining());
        assert!(!job.is_cancelled(), "draining lets jobs finish");
        assert!(!finished.is_cancelled());
        s.abandon();
        assert!(job.is_cancelled());
        assert!(!finished.is_cancelled(), "servers outlive the jobs");
        s.finish();
        assert!(finished.is_cancelled());

        let s = Shutdown::new();
        let job = s.job();
        job.cancel();
        assert!(
            !s.job().is_cancelled(),
            "one job's limit stops only that job"
        );
        s.abandon();
        assert!(s.is_draining(), "abandoning implies draining");
    }
}
