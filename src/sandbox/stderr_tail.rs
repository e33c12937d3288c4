//! A child's stderr: copied line by line to the worker's (its logs), the end kept to explain
//! a death (`memory allocation of ... failed`, a C++ `bad_alloc`).

use std::io::Write;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::ChildStderr;

/// Bytes of stderr kept.
const KEPT: usize = 2048;

#[derive(Clone, Default)]
pub struct Tail(Arc<Mutex<String>>);

impl Tail {
    /// Follows `stderr` until it closes (when the returned task ends).
    pub fn follow(stderr: ChildStderr) -> (Tail, tokio::task::JoinHandle<()>) {
        let tail = Tail::default();
        let kept = tail.clone();
        let task = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = writeln!(std::io::stderr().lock(), "{line}");
                kept.push(&line);
            }
        });
        (tail, task)
    }

    fn push(&self, line: &str) {
        let mut s = self.0.lock().unwrap();
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

    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }

    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }
}
