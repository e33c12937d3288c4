//! The S3 side: s3s-fs serving a directory.

use std::process::{Child, Command};
use std::time::Duration;

use aws_sdk_s3::Client as S3Client;

use super::*;

/// s3s-fs serving a directory.
pub struct S3 {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl S3 {
    pub fn start() -> S3 {
        let mut s = S3 {
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
        };
        std::fs::create_dir_all(s.dir.path().join("data")).unwrap();
        s.restart();
        s
    }

    /// Where s3s-fs keeps the objects: `{dir}/{bucket}/{key}`.
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn restart(&mut self) {
        self.stop();
        let mut cmd = Command::new("s3s-fs");
        cmd.args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.dir.path().join("data"));
        let log = self.dir.path().join("s3s.log");
        let mut child = spawn(&mut cmd, &log);
        wait_port(self.port, &mut child, "s3s-fs", &log);
        self.child = Some(child);
    }

    pub fn stop(&mut self) {
        stop_child(&mut self.child);
    }

    pub async fn client(&self) -> S3Client {
        let creds =
            aws_sdk_s3::config::Credentials::new(ACCESS_KEY, SECRET_KEY, None, None, "test");
        let conf = aws_sdk_s3::config::Builder::new()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .http_client(media_worker::storage::s3_http_client())
            .region(aws_sdk_s3::config::Region::new("us-east-1"))
            .endpoint_url(self.endpoint())
            .credentials_provider(creds)
            .force_path_style(true)
            // A test fails rather than hangs on a server that stops answering.
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(60))
                    .build(),
            )
            .build();
        S3Client::from_conf(conf)
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        self.stop();
        report_if_panicking("s3s-fs", &self.dir.path().join("s3s.log"));
    }
}
