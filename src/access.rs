//! Who may use the job API, and for which tenants: `API_TOKENS_FILE`, one token per line
//! (blank lines and `#` comments skipped), re-read when the file changes (checked on each
//! request: a rotated Kubernetes Secret takes effect without a restart). Compared in constant
//! time; no token is ever logged. A file that cannot be read refuses every request until it
//! can.
//!
//! A line may bind its token to a tenant: `token user_id_pattern allowed_buckets`, the pattern
//! `*`, `prefix*` or an exact `user_id`, the buckets a comma-separated list or `*`. A bound
//! token cannot name another tenant's `user_id` or a source bucket it was not given
//! ([`Grant`]). A token alone on its line may act for any tenant.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

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
    tokens: Vec<(Vec<u8>, Grant)>,
}

/// What a token may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// `*`, `prefix*` or an exact `user_id`.
    users: String,
    /// `None`: any bucket.
    buckets: Option<Vec<String>>,
}

impl Grant {
    /// A grant for every tenant (an unbound token).
    pub fn any() -> Grant {
        Grant {
            users: "*".into(),
            buckets: None,
        }
    }

    /// Whether it may act for `user_id`.
    pub fn allows_user(&self, user_id: &str) -> bool {
        match self.users.strip_suffix('*') {
            Some(prefix) => user_id.starts_with(prefix),
            None => self.users == user_id,
        }
    }

    /// Whether it may name `bucket` as a source.
    pub fn allows_bucket(&self, bucket: &str) -> bool {
        self.buckets
            .as_ref()
            .is_none_or(|b| b.iter().any(|b| b == bucket))
    }
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

    /// What `presented` may act for, when it is one of the tokens (after re-reading a changed
    /// file).
    pub fn grant(&self, presented: &[u8]) -> Option<Grant> {
        self.refresh();
        let loaded = self.loaded.lock().unwrap();
        // Every token is compared, so the time taken does not say which one matched.
        let mut hit = None;
        for (t, grant) in &loaded.tokens {
            if bool::from(t.as_slice().ct_eq(presented)) {
                hit = Some(grant.clone());
            }
        }
        hit
    }

    /// Whether `presented` is one of the tokens.
    pub fn accepts(&self, presented: &[u8]) -> bool {
        self.grant(presented).is_some()
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

/// `token [users [buckets]]` lines. A line with more fields, or an empty pattern, is skipped
/// (and said so): a typo never widens a grant.
fn parse(text: &str) -> Vec<(Vec<u8>, Grant)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let grant = match fields[1..] {
                [] => Grant::any(),
                [users] => Grant {
                    users: users.into(),
                    buckets: None,
                },
                [users, "*"] => Grant {
                    users: users.into(),
                    buckets: None,
                },
                [users, buckets] => Grant {
                    users: users.into(),
                    buckets: Some(buckets.split(',').map(str::to_owned).collect()),
                },
                _ => {
                    tracing::warn!(
                        "API tokens file: a line with more than three fields is ignored"
                    );
                    return None;
                }
            };
            Some((fields[0].as_bytes().to_vec(), grant))
        })
        .collect()
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
        assert_eq!(t.grant(b"alpha"), Some(Grant::any()));
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

    #[test]
    fn a_bound_token_acts_for_its_tenant_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens");
        std::fs::write(
            &path,
            "acme acme-* uploads-acme\nglobex globex *\nbad a b c\n",
        )
        .unwrap();
        let t = Tokens::load(&path).unwrap();
        let acme = t.grant(b"acme").unwrap();
        assert!(acme.allows_user("acme-42") && !acme.allows_user("globex"));
        assert!(acme.allows_bucket("uploads-acme") && !acme.allows_bucket("uploads-globex"));
        let globex = t.grant(b"globex").unwrap();
        assert!(globex.allows_user("globex") && !globex.allows_user("globex-2"));
        assert!(globex.allows_bucket("anything"));
        assert_eq!(t.grant(b"bad"), None);
    }
}
