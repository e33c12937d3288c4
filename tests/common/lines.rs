//! Piping JSON lines through a reference script (Pillow, jsonschema, sharp): the lines go in
//! on a thread of their own while the answer is read, so neither side can fill a pipe and wait
//! on the other.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs `cmd` with `lines` on its stdin, one per line, then closed; its stdout captured.
/// Panics, naming `what`, when it cannot start.
pub fn pipe<L: Display + Send + 'static>(
    cmd: &mut Command,
    lines: impl IntoIterator<Item = L>,
    what: &str,
) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut stdin = child.stdin.take().expect("piped");
    let lines: Vec<L> = lines.into_iter().collect();
    let writer = std::thread::spawn(move || {
        for l in lines {
            writeln!(stdin, "{l}").expect("the script reads its input");
        }
    });
    let out = child.wait_with_output().expect("the script's output");
    writer.join().expect("writer");
    out
}

/// The JSON value of each line of `out`'s stdout.
pub fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}
