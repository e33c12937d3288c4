//! Where a job's native media work runs ([`Executor`]): in a confined job process (the
//! default: a crash, a runaway decode or a compromised decoder costs that job only and reaches
//! nothing else) or inline on a blocking thread of the worker (the `process` CLI, benchmarks).
//!
//! - `pool`: the worker's side. Fork servers started ahead, one job at a time each; the worker
//!   trusts nothing they relay (bounded lines, clamped limits, deadlines on every wait) and
//!   checks the outputs itself (`outputs`).
//! - `server`: the fork server (`media-worker sandbox`), libraries loaded, idle between jobs;
//!   it forks one job process per job and kills whatever that process left.
//! - `child`: the job process, which confines itself (`layers`, `confine`) before it reads
//!   the input.
//! - `work`: one job's work as both sides see it; `protocol`: what they say; `lines`,
//!   `stderr_tail`: reading it bounded.

#[cfg(feature = "attack-probe")]
pub mod attack;
pub mod child;
pub mod confine;
pub mod layers;
mod lines;
mod outputs;
mod pool;
pub mod protocol;
pub mod server;
mod stderr_tail;
mod work;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::contract::{Failure, Stage};
use crate::media::{self, Control, Event, MediaError, MediaFailure, MediaOutput};

pub use confine::Limits;
pub use layers::Layers;
pub use pool::{Pool, PoolConfig};
pub use work::Work;

/// Runs media work inline or in sandbox children.
#[derive(Clone)]
pub enum Executor {
    Inline,
    Sandbox(Pool),
}

impl Executor {
    /// Runs `work` until it ends, its time limit passes or `cancel` fires. `on_event` hears the
    /// work's events; `hold` (a pool permit, a busy gauge) is kept until the native work has
    /// really stopped: a killed and reaped child, or an inline thread that returned (libvips
    /// calls cannot be interrupted, so a timed-out inline decode keeps its permit to the end).
    pub async fn run(
        &self,
        work: Work,
        cancel: CancellationToken,
        mut on_event: Box<dyn FnMut(Event) + Send>,
        hold: impl Send + 'static,
    ) -> Result<MediaOutput, MediaFailure> {
        match self {
            Executor::Sandbox(pool) => {
                let r = pool.run(&work, &cancel, &mut *on_event).await;
                drop(hold);
                r
            }
            Executor::Inline => inline(work, cancel, on_event, hold).await,
        }
    }

    /// Whether media work could start now (see [`Pool::check`]).
    pub async fn check(&self) -> Result<(), String> {
        match self {
            Executor::Sandbox(pool) => pool.check().await,
            Executor::Inline => Ok(()),
        }
    }

    /// Stops the idle sandbox children (at exit).
    pub async fn close(&self) {
        if let Executor::Sandbox(pool) = self {
            pool.close().await;
        }
    }

    /// Kills all native work now (shutdown past its deadline); returns how many processes.
    pub fn kill_all(&self) -> usize {
        let children = match self {
            Executor::Sandbox(pool) => pool.kill_all(),
            Executor::Inline => 0,
        };
        children + media::video::kill_all()
    }
}

async fn inline(
    work: Work,
    cancel: CancellationToken,
    mut on_event: Box<dyn FnMut(Event) + Send>,
    hold: impl Send + 'static,
) -> Result<MediaOutput, MediaFailure> {
    let limit = Arc::new(AtomicU64::new(work.limit.as_millis() as u64));
    let stage = Arc::new(std::sync::Mutex::new(Stage::Probe));
    let (announced, token, current) = (limit.clone(), cancel.clone(), stage.clone());
    let started = Instant::now();
    // The media code's spans (image.analyze, ...) belong under the caller's span.
    let parent = tracing::Span::current();
    let native = tokio::task::spawn_blocking(move || {
        let _span = parent.enter();
        let _hold = hold;
        let mut events = |e: Event| {
            match e {
                Event::Stage(s) => *current.lock().unwrap() = s,
                Event::TimeLimit(d) => {
                    let d = d.min(work.max_limit);
                    announced.store(d.as_millis() as u64, Ordering::Relaxed)
                }
                _ => {}
            }
            on_event(e)
        };
        let mut ctl = Control {
            cancel: token,
            on_event: &mut events,
        };
        media::process(&work.job, &work.input, &work.out_dir, &mut ctl)
    });
    let stage_now = || *stage.lock().unwrap();
    match until_limit(native, started, &limit).await {
        Ok(Ok(r)) => r,
        Ok(Err(join)) => Err(Failure {
            stage: stage_now(),
            error: MediaError::Crashed(format!("media task failed: {join}")),
        }),
        Err(limit) => {
            cancel.cancel();
            Err(Failure {
                stage: stage_now(),
                error: MediaError::Timeout(limit),
            })
        }
    }
}

/// Awaits `task` until `limit_ms` (which the task may raise meanwhile) has passed since
/// `started`; `Err(limit)` when it has.
async fn until_limit<T>(
    mut task: tokio::task::JoinHandle<T>,
    started: Instant,
    limit_ms: &AtomicU64,
) -> Result<Result<T, tokio::task::JoinError>, Duration> {
    loop {
        let limit = Duration::from_millis(limit_ms.load(Ordering::Relaxed));
        tokio::select! {
            r = &mut task => return Ok(r),
            _ = tokio::time::sleep_until((started + limit).into()) => {
                if limit_ms.load(Ordering::Relaxed) <= limit.as_millis() as u64 {
                    return Err(limit);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_limit_raised_while_running_is_honoured() {
        let limit = Arc::new(AtomicU64::new(100));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let task = tokio::task::spawn_blocking(move || rx.recv().map(|_| 7));
        // As a video job does once probed: raise the limit, then outlast the old one.
        let raise = limit.clone();
        let job = tokio::spawn(async move {
            raise.store(60_000, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(300)).await;
            tx.send(()).unwrap();
        });
        let r = until_limit(task, Instant::now(), &limit).await;
        assert_eq!(r.unwrap().unwrap(), Ok(7));
        job.await.unwrap();

        let (_tx, rx) = std::sync::mpsc::channel::<()>();
        let stuck = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5)));
        let r = until_limit(stuck, Instant::now(), &AtomicU64::new(100)).await;
        assert_eq!(r.unwrap_err(), Duration::from_millis(100));
    }
}
