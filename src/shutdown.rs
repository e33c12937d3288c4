//! How a worker stops: one [`Shutdown`] shared by everything that must stop with it.
//!
//! The sequence, driven by `worker::run`:
//! 1. **Drain** ([`Shutdown::drain`], on SIGTERM or by the caller). No new messages: the pod
//!    reports not ready and stops fetching; jobs in flight run on, publish their responses and
//!    have their offsets committed.
//! 2. **Abandon** ([`Shutdown::abandon`], at the drain deadline: `SHUTDOWN_TIMEOUT_SECS` less a
//!    reserve for step 3). Jobs still running are given up without a response or a commit, so
//!    they are redelivered; every job attempt's token ([`Shutdown::job`]) is cancelled, which
//!    stops its native work (ffmpeg is killed).
//! 3. **Finish** ([`Shutdown::finish`], once the consumer has made its final commit and left the
//!    group and the producer is flushed). The HTTP server and the background probes stop.
//!
//! Abandoning implies draining. Tokens only ever go from running to stopped.

use tokio_util::sync::CancellationToken;

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
}

#[cfg(test)]
mod tests {
    use super::*;

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
