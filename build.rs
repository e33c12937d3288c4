// Links our small FFI layers (src/media/vips.rs, webpmux.rs) against the system libvips and
// libwebpmux via pkg-config, and records the source revision and build profile for
// `media_worker_build_info`.
fn main() {
    // MEDIA_WORKER_REVISION at build time (an image build without .git), else git's HEAD.
    println!("cargo:rerun-if-env-changed=MEDIA_WORKER_REVISION");
    // HEAD and the branches where git keeps them: in a worktree `.git` is a file naming its own
    // directory (a path that does not exist would rerun this script, and rebuild the crate,
    // on every build).
    let git = |arg: &str| {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "--path-format=absolute", arg])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    if let (Some(dir), Some(common)) = (git("--git-dir"), git("--git-common-dir")) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={common}/refs/heads");
        if std::path::Path::new(&format!("{common}/packed-refs")).exists() {
            println!("cargo:rerun-if-changed={common}/packed-refs");
        }
    }
    let revision = std::env::var("MEDIA_WORKER_REVISION").ok().or_else(|| {
        let out = std::process::Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    });
    println!(
        "cargo:rustc-env=MEDIA_WORKER_REVISION={}",
        revision.unwrap_or_else(|| "unknown".to_owned())
    );
    // "release" (benches too: their profile inherits it) or "debug" (tests).
    println!(
        "cargo:rustc-env=MEDIA_WORKER_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_owned())
    );
    pkg_config::Config::new()
        .atleast_version("8.12")
        .probe("vips")
        .expect("libvips >= 8.12 not found (apt-get install libvips-dev)");
    // Metadata removal after webpsave (src/media/webpmux.rs); libvips itself links it.
    pkg_config::Config::new()
        .atleast_version("1.2")
        .probe("libwebpmux")
        .expect("libwebpmux >= 1.2 not found (apt-get install libwebp-dev)");
}
