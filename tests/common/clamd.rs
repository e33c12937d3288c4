//! A real clamd (Debian's clamav-daemon) on a free loopback port, with a signature database the
//! harness writes itself: one `.hdb` line for the EICAR test file (no signature download here).

use std::process::{Child, Command};

use super::*;

/// The standard 68-byte EICAR antivirus test file.
pub const EICAR: &[u8] = br"X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*";
/// What clamd reports for it with the database below.
pub const EICAR_SIGNATURE: &str = "Test.EICAR.UNOFFICIAL";

pub struct Clamd {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Clamd {
    pub fn start() -> Clamd {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db");
        std::fs::create_dir_all(&db).unwrap();
        std::fs::write(
            db.join("test.hdb"),
            "44d88612fea8a8f36de82e1278abb02f:68:Test.EICAR\n",
        )
        .unwrap();
        let port = free_port();
        let p = |name: &str| dir.path().join(name).display().to_string();
        let conf = format!(
            "TCPSocket {port}\nTCPAddr 127.0.0.1\nLocalSocket {}\nForeground yes\n\
             DatabaseDirectory {}\nLogFile {}\nPidFile {}\nUser root\nStreamMaxLength 600M\n",
            p("clamd.sock"),
            db.display(),
            p("clamd.log"),
            p("clamd.pid"),
        );
        std::fs::write(dir.path().join("clamd.conf"), conf).unwrap();
        let mut c = Clamd {
            port,
            dir,
            child: None,
        };
        c.restart();
        c
    }

    /// `CLAMD_ADDR` for the worker.
    pub fn addr(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    /// The same clamd's unix socket, as `CLAMD_ADDR`.
    pub fn unix_addr(&self) -> String {
        format!("unix://{}", self.dir.path().join("clamd.sock").display())
    }

    /// (Re)starts clamd on the same port and waits until it listens.
    pub fn restart(&mut self) {
        self.stop();
        let mut cmd = Command::new("/usr/sbin/clamd");
        cmd.arg("-c").arg(self.dir.path().join("clamd.conf"));
        let log = self.dir.path().join("clamd.out");
        self.child = Some(start_server(&mut cmd, &log, self.port, "clamd"));
    }

    pub fn stop(&mut self) {
        stop_child(&mut self.child);
    }
}

impl Drop for Clamd {
    fn drop(&mut self) {
        report_if_panicking("clamd", &self.dir.path().join("clamd.log"));
        self.stop();
    }
}
