//! `media-worker process FILE|DIR… --out DIR`: the job runner on local files, one JSON response
//! per line on stdout.

use std::path::PathBuf;
use std::sync::Arc;

use futures_util::{StreamExt, stream};
use indicatif::{ProgressBar, ProgressStyle};

use crate::config::Settings;
use crate::contract::OptimizeRequest;
use crate::job::{self, JobRunner};
use crate::shutdown::Shutdown;
use crate::storage::LocalStorage;

const SOURCE_BUCKET: &str = "local";

/// Returns true when every file succeeded.
pub async fn run(
    mut settings: Settings,
    inputs: Vec<PathBuf>,
    out: PathBuf,
    profile: String,
) -> anyhow::Result<bool> {
    if settings.profile(&profile).is_none() {
        anyhow::bail!("unknown profile `{profile}`");
    }
    let files = super::expand_inputs(&inputs)?;
    // Outputs are keyed by media id, which is the file name: two files of one name would
    // overwrite each other's outputs.
    let mut ids = std::collections::HashMap::new();
    for file in &files {
        if let Some(other) = ids.insert(super::media_id_for(file), file) {
            anyhow::bail!(
                "`{}` and `{}` would write the same outputs (media id `{}`): process them into \
                 different --out directories",
                other.display(),
                file.display(),
                super::media_id_for(file)
            );
        }
    }
    std::fs::create_dir_all(&out)?;
    let out = out.canonicalize()?;
    settings.worker.tmp_dir = out.join(".scratch");
    // No pod here to be unwell: a local fault is answered, never held (see `job::runner`).
    settings.worker.min_scratch_free_bytes = 0;
    let storage = LocalStorage::new(&out)
        .with_bucket(SOURCE_BUCKET, "/")
        .with_bucket(&settings.storage.output_bucket, &out);
    let pool = settings.pool_size();
    let svc = job::services(Arc::new(settings), Arc::new(storage))?;
    let runner = JobRunner::new(svc.clone(), Shutdown::new());

    let bar = if files.len() > 1 {
        let b = ProgressBar::new(files.len() as u64);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} ETA {eta} {msg}")
                .expect("valid template"),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let mut all_ok = true;
    let mut results = stream::iter(files)
        .map(|file| {
            let runner = runner.clone();
            let profile = profile.clone();
            async move {
                let abs = file.canonicalize().unwrap_or(file.clone());
                let media_id = super::media_id_for(&file);
                let key = abs.to_string_lossy().trim_start_matches('/').to_owned();
                let req = OptimizeRequest::new(
                    format!("local-{media_id}"),
                    media_id,
                    "local",
                    SOURCE_BUCKET,
                    key,
                )
                .with_profile(&profile);
                (file, runner.run_registered(&req).await)
            }
        })
        .buffer_unordered(pool);
    while let Some((file, response)) = results.next().await {
        all_ok &= response.success;
        bar.set_message(
            file.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
        );
        bar.suspend(|| println!("{}", serde_json::to_string(&response).expect("serialises")));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(all_ok)
}
