//! The `[scan]` section: where clamd listens and how long a scan may take.

use std::path::PathBuf;

use serde::Deserialize;

use crate::section::{Invalid, Section, ensure};

/// Malware scanning with clamd (see `scan`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScanSettings {
    /// `tcp://host:port` or `unix:///path`; unset: no scanning (a profile with `scan = true`
    /// is then a configuration error).
    #[serde(default)]
    pub clamd_addr: Option<String>,
    /// Limit for one scan, streaming included.
    pub timeout_secs: u64,
    /// How often clamd is pinged for `media_worker_clamd_up`.
    pub probe_interval_secs: u64,
}

impl Section for ScanSettings {
    fn validate(&self) -> Result<(), Invalid> {
        if let Some(addr) = &self.clamd_addr
            && let Err(e) = addr.parse::<ClamdAddr>()
        {
            return Err(Invalid::new("clamd_addr", e));
        }
        ensure(
            self.timeout_secs > 0 && self.probe_interval_secs > 0,
            "",
            "timeout_secs and probe_interval_secs must be positive",
        )
    }
}

/// Where clamd listens: `tcp://host:port` or `unix:///path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClamdAddr {
    Tcp(String),
    Unix(PathBuf),
}

impl std::str::FromStr for ClamdAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(hostport) = s.strip_prefix("tcp://") {
            let port = hostport
                .rsplit_once(':')
                .and_then(|(h, p)| (!h.is_empty()).then(|| p.parse::<u16>().ok()).flatten());
            return match port {
                Some(_) => Ok(ClamdAddr::Tcp(hostport.to_owned())),
                None => Err(format!("`{s}`: expected tcp://host:port")),
            };
        }
        match s.strip_prefix("unix://") {
            Some(path) if path.starts_with('/') => Ok(ClamdAddr::Unix(path.into())),
            _ => Err(format!("`{s}`: expected tcp://host:port or unix:///path")),
        }
    }
}
