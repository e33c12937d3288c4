//! A fork server's stderr (its job processes'): each line relayed as a field of a worker log
//! record (never raw, so a child cannot forge the worker's log lines), the end kept to explain
//! a death (`memory allocation of ... failed`, a C++ `bad_alloc`). A line longer than
//! [`MAX_LINE`] is a violation: the running job is stopped ([`Tail::overflowed`]).
//!
//! After each job the server writes [`JOB_END`] on its stderr, behind everything the job wrote:
//! [`Tail::caught_up`] waits for it, so a dead job's last words are read before they explain it.

use std::sync::{Arc, Mutex};

use tokio::io::BufReader;
use tokio::process::ChildStderr;
use tokio::sync::{Notify, watch};

use super::lines::{BoundedLines, Line};

/// The longest stderr line relayed.
pub const MAX_LINE: usize = 64 << 10;
/// The server's line after each job's end.
pub const JOB_END: &str = "\u{1}media-worker: job ended";
/// Bytes of stderr kept.
const KEPT: usize = 2048;

#[derive(Clone)]
pub struct Tail {
    kept: Arc<Mutex<String>>,
    overflow: Arc<Notify>,
    /// How many [`JOB_END`] lines were read.
    ends: watch::Receiver<u64>,
}

impl Tail {
    /// Follows the stderr of server `pid` until it closes.
    pub fn follow(pid: i32, stderr: ChildStderr) -> Tail {
        let (ends_tx, ends) = watch::channel(0);
        let tail = Tail {
            kept: Arc::default(),
            overflow: Arc::default(),
            ends,
        };
        let t = tail.clone();
        tokio::spawn(async move {
            let mut lines = BoundedLines::new(BufReader::new(stderr), MAX_LINE);
            loop {
                match lines.next().await {
                    Ok(Line::Text(line)) if line == JOB_END => ends_tx.send_modify(|n| *n += 1),
                    Ok(Line::Text(line)) if line.is_empty() => {}
                    Ok(Line::Text(line)) => {
                        tracing::info!(sandbox = pid, stderr = %line, "sandbox stderr");
                        t.push(&line);
                    }
                    Ok(Line::TooLong) => {
                        tracing::warn!(
                            sandbox = pid,
                            "sandbox stderr: a line longer than {MAX_LINE} bytes"
                        );
                        t.overflow.notify_one();
                    }
                    Ok(Line::Eof) | Err(_) => break,
                }
            }
        });
        tail
    }

    fn push(&self, line: &str) {
        let mut s = self.kept.lock().unwrap();
        s.push_str(line);
        s.push('\n');
        if s.len() > KEPT {
            let mut cut = s.len() - KEPT;
            while !s.is_char_boundary(cut) {
                cut += 1;
            }
            s.drain(..cut);
        }
    }

    /// Before a job: forgets the last one's words and overflow.
    pub fn clear(&self) {
        self.kept.lock().unwrap().clear();
        // A permit left by an overflow after the last job's end is not this job's.
        let stale = self.overflow.notified();
        tokio::pin!(stale);
        let _ = stale.as_mut().enable();
    }

    /// Resolves when a line too long was written.
    pub async fn overflowed(&self) {
        self.overflow.notified().await
    }

    /// Waits (up to `within`) until `jobs` job ends were read: everything those jobs wrote is.
    pub async fn caught_up(&self, jobs: u64, within: std::time::Duration) {
        let mut ends = self.ends.clone();
        let _ = tokio::time::timeout(within, ends.wait_for(|n| *n >= jobs)).await;
    }

    pub fn text(&self) -> String {
        self.kept.lock().unwrap().clone()
    }
}
