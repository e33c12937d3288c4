//! Bearer tokens for the job API: `API_TOKENS_FILE`, one token per line (blank lines and `#`
//! comments skipped), re-read when the file changes (checked on each request: a rotated
//! Kubernetes Secret takes effect without a restart). Compared in constant time; no token is
//! ever logged. A file that cannot be read refuses every request until it can.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

/// The accepted tokens, as last read.
pub struct Tokens {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

#[derive(Default)]
struct Loaded {
    /// The file's modification time and size when read.
    stamp: Option<(SystemTime, u64)>,
    tokens: Vec<Vec<u8>>,
}

impl Tokens {
    /// Reads `path` (an unreadable file at start-up is an error).
    pub fn load(path: &Path) -> std::io::Result<Tokens> {
        let t = Tokens {
            path: path.to_owned(),
            loaded: Mutex::default(),
        };
        std::fs::metadata(path)?;
        t.refresh();
        Ok(t)
    }

    /// Whether `presented` is one of the tokens (after re-reading a changed file).
    pub fn accepts(&self, presented: &[u8]) -> bool {
        self.refresh();
        let loaded = self.loaded.lock().unwrap();
        // Every token is compared, so the time taken does not say which one matched.
        let mut hit = subtle::Choice::from(0);
        for t in &loaded.tokens {
            hit |= t.as_slice().ct_eq(presented);
        }
        bool::from(hit)
    }

    fn refresh(&self) {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        let mut loaded = self.loaded.lock().unwrap();
        if stamp.is_some() && stamp == loaded.stamp {
            return;
        }
        let tokens = match std::fs::read_to_string(&self.path) {
            Ok(text) => parse(&text),
            Err(e) => {
                tracing::warn!(file = %self.path.display(), error = %e,
                    "API tokens file unreadable: every request is refused");
                Vec::new()
            }
        };
        tracing::info!(file = %self.path.display(), tokens = tokens.len(), "API tokens loaded");
        *loaded = Loaded { stamp, tokens };
    }
}

fn parse(text: &str) -> Vec<Vec<u8>> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.as_bytes().to_vec())
        .collect()
}

/// Refuses a request without an accepted `Authorization: Bearer <token>` (401), when tokens
/// are configured.
pub async fn require_token(
    State(tokens): State<Option<Arc<Tokens>>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(tokens) = tokens else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if presented.is_some_and(|p| tokens.accepts(p)) {
        return next.run(request).await;
    }
    let message = if presented.is_some() {
        "the bearer token is not accepted"
    } else {
        "an Authorization: Bearer token is required"
    };
    let body = axum::Json(crate::contract::ApiError {
        error: crate::contract::ApiErrorBody {
            code: "unauthorized".into(),
            message: message.into(),
        },
    });
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_lines_and_a_changed_file_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(&path, "# ops\n alpha \n\nbeta\n").unwrap();
        let t = Tokens::load(&path).unwrap();
        assert!(t.accepts(b"alpha") && t.accepts(b"beta"));
        assert!(!t.accepts(b"# ops") && !t.accepts(b"") && !t.accepts(b"alph"));
        // Rotated (a different size, so the change is seen whatever the clock's resolution).
        std::fs::write(&path, "gamma-rotated\n").unwrap();
        assert!(t.accepts(b"gamma-rotated"));
        assert!(!t.accepts(b"alpha"), "an old token stops working");
        // Unreadable: nothing is accepted.
        std::fs::remove_file(&path).unwrap();
        assert!(!t.accepts(b"gamma-rotated"));
        assert!(Tokens::load(&dir.path().join("missing")).is_err());
    }
}
