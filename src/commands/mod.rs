//! The `demo` and `process` commands: the same job runner, without a real Kafka or S3.

pub mod demo;
pub mod eval_faces;
pub mod gallery;
pub mod process;

use std::path::{Path, PathBuf};

/// A file name made into a valid media id (`[A-Za-z0-9_-]`, at most 128 characters).
pub fn media_id_for(path: &Path) -> String {
    let stem = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let id: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(128)
        .collect();
    if id.is_empty() {
        "media".to_owned()
    } else {
        id
    }
}

/// Regular files given directly, or found in the given directories (not recursive), sorted,
/// each once however often it was named (`a.jpg dir/` with `dir/a.jpg` is one job, not two
/// racing for the same outputs).
pub fn expand_inputs(inputs: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in inputs {
        if p.is_dir() {
            for e in std::fs::read_dir(p)? {
                let path = e?.path();
                if path.is_file() {
                    files.push(path);
                }
            }
        } else {
            files.push(p.clone());
        }
    }
    files.sort();
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(f.canonicalize().unwrap_or_else(|_| f.clone())));
    Ok(files)
}
