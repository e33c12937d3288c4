//! Malware scanning with ClamAV's clamd, over its INSTREAM protocol: the bytes go to clamd in
//! chunks as they are read (a file, or an HTTP body as it arrives), never whole in memory.
//!
//! [`Scanner`] is used by the job runner's scan stage (profiles with `scan = true`) and by
//! `POST /scan`. The protocol is `clamav-client`'s; what clamd's answer means ([`Reply`]) and
//! how failures are classified ([`ScanError`]) are ours: the crate's `clean()` would take any
//! reply without `FOUND`, an `ERROR` included, for a clean file.

mod settings;

pub use settings::{ClamdAddr, ScanSettings};

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::contract::ScanVerdict;
use crate::telemetry::Metrics;

/// What clamd answered to INSTREAM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Clean,
    Infected(String),
    /// clamd could not scan (`INSTREAM size limit exceeded. ERROR`, a broken database).
    Error(String),
}

impl Reply {
    /// `stream: OK`, `stream: <signature> FOUND`, `<message> ERROR` (NUL-terminated).
    pub fn parse(raw: &[u8]) -> Reply {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim_end_matches(['\0', '\n', '\r', ' ']);
        let body = text.strip_prefix("stream: ").unwrap_or(text);
        if body == "OK" {
            Reply::Clean
        } else if let Some(sig) = body.strip_suffix(" FOUND") {
            Reply::Infected(sig.trim().to_owned())
        } else if body.is_empty() {
            Reply::Error("empty reply".into())
        } else {
            Reply::Error(body.trim_end_matches(" ERROR").to_owned())
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// clamd cannot be reached or stopped answering: a dependency's fault, worth retrying.
    #[error("clamd unavailable: {0}")]
    Unavailable(String),
    /// clamd answered that it could not scan this input.
    #[error("clamd could not scan the input: {0}")]
    Refused(String),
    /// The input is over `MAX_INPUT_BYTES`.
    #[error("the input is larger than the {limit}-byte limit")]
    TooLarge { limit: u64 },
    /// Reading the input failed (a client that stopped sending, a scratch file error).
    #[error("reading the input: {0}")]
    Input(String),
    #[error("no clamd is configured (CLAMD_ADDR)")]
    NotConfigured,
}

/// A chunked input: a file or a request body.
pub type Input = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

/// Talks to one clamd.
pub struct Scanner {
    addr: ClamdAddr,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// clamd's `VERSION` and when it was read (it changes with signature updates).
    engine: std::sync::Mutex<Option<(Instant, String)>>,
}

/// How long clamd's `VERSION` is reused.
const ENGINE_TTL: Duration = Duration::from_secs(300);

/// The input's own failure, told apart from clamd's connection failing.
enum Fault {
    TooLarge,
    Read(String),
}

impl Scanner {
    pub fn new(addr: ClamdAddr, timeout: Duration, metrics: Arc<Metrics>) -> Scanner {
        Scanner {
            addr,
            timeout,
            metrics,
            engine: Default::default(),
        }
    }

    /// Scans a file.
    pub async fn scan_file(&self, path: &Path) -> Result<ScanVerdict, ScanError> {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| ScanError::Input(e.to_string()))?;
        let input = tokio_util::io::ReaderStream::with_capacity(file, CHUNK);
        self.scan(Box::pin(input), u64::MAX).await
    }

    /// Scans `input` as it arrives; more than `max_bytes` fails [`ScanError::TooLarge`].
    pub async fn scan(&self, input: Input, max_bytes: u64) -> Result<ScanVerdict, ScanError> {
        let started = Instant::now();
        let r = self.scan_timed(input, max_bytes, started).await;
        let m = &self.metrics;
        m.scan_duration.observe(started.elapsed().as_secs_f64());
        let verdict = match &r {
            Ok(v) if v.clean => "clean",
            Ok(_) => "infected",
            Err(ScanError::Unavailable(_)) => {
                m.clamd_errors.inc();
                self.set_up(false);
                "error"
            }
            Err(_) => "error",
        };
        m.scans.with_label_values(&[verdict]).inc();
        r
    }

    async fn scan_timed(
        &self,
        input: Input,
        max_bytes: u64,
        started: Instant,
    ) -> Result<ScanVerdict, ScanError> {
        let scanned = Arc::new(AtomicU64::new(0));
        let fault: Arc<std::sync::Mutex<Option<Fault>>> = Arc::default();
        let (count, seen) = (scanned.clone(), fault.clone());
        let input = input.map(move |chunk| {
            let chunk =
                chunk.inspect_err(|e| *seen.lock().unwrap() = Some(Fault::Read(e.to_string())))?;
            let total = count.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
            if total > max_bytes {
                *seen.lock().unwrap() = Some(Fault::TooLarge);
                return Err(std::io::Error::other("over the size limit"));
            }
            Ok(chunk)
        });
        let sent = tokio::time::timeout(self.timeout, self.instream(input)).await;
        if let Some(f) = fault.lock().unwrap().take() {
            return Err(match f {
                Fault::TooLarge => ScanError::TooLarge { limit: max_bytes },
                Fault::Read(e) => ScanError::Input(e),
            });
        }
        let raw = match sent {
            Ok(Ok(raw)) => raw,
            Ok(Err(e)) => return Err(ScanError::Unavailable(format!("{}: {e}", self.addr_text()))),
            Err(_) => {
                return Err(ScanError::Unavailable(format!(
                    "{}: no answer within {:?}",
                    self.addr_text(),
                    self.timeout
                )));
            }
        };
        self.set_up(true);
        let signature = match Reply::parse(&raw) {
            Reply::Clean => None,
            Reply::Infected(sig) => Some(sig),
            Reply::Error(e) => return Err(ScanError::Refused(e)),
        };
        Ok(ScanVerdict {
            clean: signature.is_none(),
            signature,
            engine: self.engine().await,
            scanned_bytes: scanned.load(Ordering::Relaxed),
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }

    async fn instream(
        &self,
        input: impl Stream<Item = std::io::Result<Bytes>>,
    ) -> std::io::Result<Vec<u8>> {
        clamav_client::tokio::scan_stream(input, &self.addr, Some(CHUNK)).await
    }

    /// clamd's `VERSION` (`ClamAV 1.4.6/27440/Tue Nov 17 ...`), cached for [`ENGINE_TTL`];
    /// `ClamAV` alone when it cannot be read.
    async fn engine(&self) -> String {
        if let Some((at, v)) = &*self.engine.lock().unwrap()
            && at.elapsed() < ENGINE_TTL
        {
            return v.clone();
        }
        let raw = clamav_client::tokio::get_version(&self.addr);
        match tokio::time::timeout(COMMAND_TIMEOUT, raw).await {
            Ok(Ok(raw)) => {
                let v = String::from_utf8_lossy(&raw)
                    .trim_end_matches(['\0', '\n'])
                    .to_owned();
                *self.engine.lock().unwrap() = Some((Instant::now(), v.clone()));
                v
            }
            _ => "ClamAV".to_owned(),
        }
    }

    /// Whether clamd answers `PING` (sets `media_worker_clamd_up`).
    pub async fn ping(&self) -> bool {
        let pong = clamav_client::tokio::ping(&self.addr);
        let r = tokio::time::timeout(COMMAND_TIMEOUT, pong).await;
        let up = matches!(r, Ok(Ok(ref pong)) if pong.starts_with(b"PONG"));
        self.set_up(up);
        up
    }

    fn set_up(&self, up: bool) {
        self.metrics
            .clamd_up
            .with_label_values(&[&self.addr_text()])
            .set(up as i64);
    }

    fn addr_text(&self) -> String {
        match &self.addr {
            ClamdAddr::Tcp(a) => format!("tcp://{a}"),
            ClamdAddr::Unix(p) => format!("unix://{}", p.display()),
        }
    }
}

/// INSTREAM chunk size.
const CHUNK: usize = 64 << 10;
/// Limit for `PING` and `VERSION`.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// `clamav-client` connects through this: one address type for both transports.
impl clamav_client::tokio::TransportProtocol for &ClamdAddr {
    type Stream = Either<tokio::net::TcpStream, tokio::net::UnixStream>;

    async fn connect(&self) -> std::io::Result<Self::Stream> {
        Ok(match self {
            ClamdAddr::Tcp(a) => Either::Left(tokio::net::TcpStream::connect(a.as_str()).await?),
            ClamdAddr::Unix(p) => Either::Right(tokio::net::UnixStream::connect(p).await?),
        })
    }
}

/// Pings clamd every `period` until `stop`, for `media_worker_clamd_up`; logs changes.
pub async fn watch(scanner: Arc<Scanner>, period: Duration, stop: CancellationToken) {
    let mut was_up = true;
    let mut every = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let up = scanner.ping().await;
        if std::mem::replace(&mut was_up, up) != up {
            if up {
                tracing::info!(clamd = %scanner.addr_text(), "clamd answers again");
            } else {
                tracing::warn!(clamd = %scanner.addr_text(), "clamd does not answer");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_strictly() {
        assert_eq!(Reply::parse(b"stream: OK\0"), Reply::Clean);
        assert_eq!(
            Reply::parse(b"stream: Test.EICAR.UNOFFICIAL FOUND\0"),
            Reply::Infected("Test.EICAR.UNOFFICIAL".into())
        );
        assert_eq!(
            Reply::parse(b"INSTREAM size limit exceeded. ERROR\0"),
            Reply::Error("INSTREAM size limit exceeded.".into())
        );
        assert!(matches!(Reply::parse(b""), Reply::Error(_)));
        // An error reply that mentions OK somewhere is still an error.
        assert!(matches!(
            Reply::parse(b"stream: OK? ERROR\0"),
            Reply::Error(_)
        ));
    }

    #[test]
    fn addresses_name_their_transport() {
        assert_eq!(
            "tcp://127.0.0.1:3310".parse(),
            Ok(ClamdAddr::Tcp("127.0.0.1:3310".into()))
        );
        assert_eq!(
            "tcp://clamd:3310".parse(),
            Ok(ClamdAddr::Tcp("clamd:3310".into()))
        );
        assert_eq!(
            "unix:///run/clamav/clamd.ctl".parse(),
            Ok(ClamdAddr::Unix("/run/clamav/clamd.ctl".into()))
        );
        for bad in [
            "127.0.0.1:3310",
            "tcp://host",
            "tcp://:3310",
            "unix://relative",
            "",
        ] {
            assert!(bad.parse::<ClamdAddr>().is_err(), "{bad}");
        }
    }
}
