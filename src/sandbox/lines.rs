//! Lines from a process the worker does not trust, never longer than a bound: a child that
//! writes an endless line costs it its job, not the worker its memory.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What the next line was.
#[derive(Debug, PartialEq)]
pub enum Line {
    Text(String),
    /// Longer than the bound: what came of it is dropped up to its newline.
    TooLong,
    Eof,
}

/// Reads lines of at most `max` bytes (the newline excluded). Cancel-safe: a read cut short
/// keeps what it had for the next call.
pub struct BoundedLines<R> {
    reader: R,
    buf: Vec<u8>,
    max: usize,
    /// Inside a line that was too long: skipping to its end.
    skipping: bool,
}

impl<R: AsyncBufRead + Unpin> BoundedLines<R> {
    pub fn new(reader: R, max: usize) -> Self {
        BoundedLines {
            reader,
            buf: Vec::new(),
            max,
            skipping: false,
        }
    }

    pub async fn next(&mut self) -> std::io::Result<Line> {
        loop {
            let chunk = self.reader.fill_buf().await?;
            if chunk.is_empty() {
                if self.buf.is_empty() || self.skipping {
                    return Ok(Line::Eof);
                }
                return Ok(Line::Text(self.take()));
            }
            let (used, newline) = match chunk.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, Some(i)),
                None => (chunk.len(), None),
            };
            let part = &chunk[..newline.unwrap_or(used)];
            if !self.skipping {
                if self.buf.len() + part.len() > self.max {
                    self.buf.clear();
                    self.skipping = newline.is_none();
                    self.reader.consume(used);
                    return Ok(Line::TooLong);
                }
                self.buf.extend_from_slice(part);
            }
            self.reader.consume(used);
            if newline.is_some() {
                if std::mem::take(&mut self.skipping) {
                    continue;
                }
                return Ok(Line::Text(self.take()));
            }
        }
    }

    fn take(&mut self) -> String {
        let line = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_refused_and_skipped_to_their_end() {
        let mut input = b"short\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend(b"\nnext\nlast");
        let reader = tokio::io::BufReader::with_capacity(64, &input[..]);
        let mut lines = BoundedLines::new(reader, 1000);
        assert_eq!(lines.next().await.unwrap(), Line::Text("short".into()));
        assert_eq!(lines.next().await.unwrap(), Line::TooLong);
        assert_eq!(lines.next().await.unwrap(), Line::Text("next".into()));
        assert_eq!(lines.next().await.unwrap(), Line::Text("last".into()));
        assert_eq!(lines.next().await.unwrap(), Line::Eof);
    }
}
