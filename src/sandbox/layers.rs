//! The layers a job process puts between a compromised decoder and everything else, applied to
//! itself after the fork server forked it and before it reads a byte of the input:
//!
//! - **unprivileged**: a worker running as root (tests, CI, a careless deployment) has its job
//!   processes drop to an unprivileged uid/gid with no capability left, so file permissions and
//!   ptrace checks hold as they do in a `runAsNonRoot` pod;
//! - **Landlock** (`landlock_fs`, `landlock_net`, `landlock_scope`): read-only access to what
//!   decoding needs (libraries, cascades, locale and time zone data), execute for ffmpeg and
//!   ffprobe only, read-write to the job's own output and temporary directories; no TCP bind or
//!   connect (ABI 4); no signal to, and no abstract socket of, a process outside the job (ABI 6);
//! - **seccomp** (`seccomp`): a deny-list of the calls a decoder never needs and an attacker
//!   wants: sockets of any family (socketpairs stay), ptrace and cross-process memory, leaving
//!   the session, namespaces, mounts, kernel modules, keyrings, BPF, io_uring.
//!
//! None of these needs a privilege: they work in a pod with `runAsNonRoot`, every capability
//! dropped and the RuntimeDefault seccomp profile. What this kernel supports is found once, at
//! start-up ([`Layers::available`]), logged, exported (`media_worker_sandbox_layers{layer}`)
//! and, with `MEDIA_SANDBOX_REQUIRE`, required.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use serde::{Deserialize, Serialize};

/// Which layers are active (or, from [`Layers::available`], can be).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layers {
    pub unprivileged: bool,
    pub landlock_fs: bool,
    pub landlock_net: bool,
    pub landlock_scope: bool,
    pub seccomp: bool,
}

impl Layers {
    /// What this kernel and this process allow; `disabled` names layers an operator turned off
    /// (`MEDIA_SANDBOX_DISABLE`, for a kernel whose Landlock misbehaves).
    pub fn available(disabled: &[String]) -> Layers {
        let abi = landlock_abi();
        let off = |name: &str| disabled.iter().any(|d| d == name || d == "all");
        let landlock = !off("landlock");
        Layers {
            // Root drops to `SANDBOX_UID`; any other uid has no capability to begin with.
            unprivileged: !off("unprivileged"),
            landlock_fs: landlock && abi >= 1,
            landlock_net: landlock && abi >= 4,
            landlock_scope: landlock && abi >= 6,
            seccomp: !off("seccomp") && seccomp_available(),
        }
    }

    /// Name and state of each layer, for logs and the metric.
    pub fn list(&self) -> BTreeMap<&'static str, bool> {
        BTreeMap::from([
            ("unprivileged", self.unprivileged),
            ("landlock_fs", self.landlock_fs),
            ("landlock_net", self.landlock_net),
            ("landlock_scope", self.landlock_scope),
            ("seccomp", self.seccomp),
        ])
    }

    /// The layers that are off, by name.
    pub fn missing(&self) -> Vec<&'static str> {
        self.list()
            .into_iter()
            .filter_map(|(k, on)| (!on).then_some(k))
            .collect()
    }
}

/// The Landlock ABI version of this kernel (0 without Landlock).
pub fn landlock_abi() -> i64 {
    // SAFETY: landlock_create_ruleset's documented version query (no attr, size 0, flag 1).
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    v.max(0)
}

fn seccomp_available() -> bool {
    let action: u32 = libc::SECCOMP_RET_ERRNO;
    // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32.
    unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        ) == 0
    }
}

/// The uid and gid a job process of a root worker runs as (`nobody`).
pub const SANDBOX_ID: u32 = 65534;

/// Paths every job reads (libraries, locale and time zone data, the CPU count), and the
/// programs it may run. Resolved once by the fork server; missing ones are skipped.
#[derive(Debug, Clone)]
pub struct Allowed {
    read: Vec<PathBuf>,
    exec: Vec<PathBuf>,
}

/// Read-only, for what dynamic linking, glibc, GLib and the codecs open.
const READ: &[&str] = &[
    "/usr",
    "/lib",
    "/lib64",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/fonts",
    "/dev/urandom",
    "/dev/random",
    "/sys/devices/system/cpu",
];

/// The dynamic loaders the kernel opens to start ffmpeg (execute, like the program itself).
const LOADERS: &[&str] = &["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"];

impl Allowed {
    /// `programs` by name, found on `PATH` (ffmpeg, ffprobe).
    pub fn resolve(programs: &[&str]) -> Allowed {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let found = programs.iter().filter_map(|p| {
            std::env::split_paths(&path)
                .map(|d| d.join(p))
                .find(|f| f.is_file())
        });
        let exec = found
            .chain(LOADERS.iter().map(PathBuf::from))
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        Allowed {
            read: READ
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.exists())
                .collect(),
            exec,
        }
    }
}

/// One job's own paths.
pub struct JobPaths<'a> {
    pub input: &'a Path,
    /// Read-write: outputs and temporary files.
    pub writable: &'a [&'a Path],
    /// Further read-only files (the job's cascades).
    pub read: Vec<&'a Path>,
}

/// Confines the calling process (and everything it starts) to `job`'s files, with the layers in
/// `want`. Returns the layers really in force.
pub fn landlock(want: Layers, allowed: &Allowed, job: &JobPaths) -> io::Result<Layers> {
    let mut got = want;
    if !want.landlock_fs {
        got.landlock_net = false;
        got.landlock_scope = false;
        return Ok(got);
    }
    let abi = ABI::V6;
    let err = |e: landlock::RulesetError| io::Error::other(format!("landlock: {e}"));
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let write = AccessFs::from_all(abi) & !AccessFs::Execute;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?;
    if want.landlock_net {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(abi))
            .map_err(err)?;
    }
    if want.landlock_scope {
        ruleset = ruleset.scope(Scope::from_all(abi)).map_err(err)?;
    }
    // Its own /proc entry (its limits and memory figures), no other process's.
    let own: &[&Path] = &[Path::new("/proc/self"), job.input];
    let created = ruleset
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(&allowed.read, read))
        .and_then(|r| r.add_rules(path_beneath_rules(&allowed.exec, read | AccessFs::Execute)))
        .and_then(|r| r.add_rules(path_beneath_rules(own.iter().chain(&job.read), read)))
        .and_then(|r| {
            let null = read | AccessFs::WriteFile | AccessFs::IoctlDev;
            r.add_rules(path_beneath_rules(["/dev/null"], null))
        })
        .and_then(|r| r.add_rules(path_beneath_rules(job.writable, write)))
        .map_err(err)?;
    let status = created.restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        got.landlock_fs = false;
        got.landlock_net = false;
        got.landlock_scope = false;
    }
    Ok(got)
}

/// The syscall filter: every call allowed but those listed, which fail with `EPERM`
/// (`clone3` with `ENOSYS`, so that glibc falls back to `clone`, whose flags can be checked).
pub fn seccomp_filters() -> io::Result<[BpfProgram; 2]> {
    let err = |e: seccompiler::BackendError| io::Error::other(format!("seccomp: {e}"));
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| err(e))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = DENIED.iter().map(|s| (*s, vec![])).collect();
    // Threads and processes, but no new namespace.
    let namespaces = [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWCGROUP,
    ];
    let clone = namespaces
        .iter()
        .map(|f| {
            let f = *f as u64;
            let cond =
                SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(f), f)
                    .map_err(err)?;
            SeccompRule::new(vec![cond]).map_err(err)
        })
        .collect::<io::Result<Vec<_>>>()?;
    rules.insert(libc::SYS_clone, clone);
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(err)?;
    let clone3 = SeccompFilter::new(
        BTreeMap::from([(libc::SYS_clone3, vec![])]),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(err)?;
    let compile = |f: SeccompFilter| BpfProgram::try_from(f).map_err(err);
    Ok([compile(deny)?, compile(clone3)?])
}

/// Calls that fail with `EPERM` in a job process.
const DENIED: &[i64] = &[
    // Pipes and socketpairs only: no socket of any family. Not even `AF_UNIX`: Landlock does
    // not govern connecting to a pathname UNIX socket, so any one the job's uid may write
    // (a daemon's, a sidecar's) would be reachable; nothing a decoder does needs one (glibc's
    // nscd look-up falls back to the files when `socket` fails).
    libc::SYS_socket,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_setsid,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_personality,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_fanotify_init,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_vhangup,
];

/// Installs the filters in the calling thread (and what it starts). Needs no privilege once
/// `PR_SET_NO_NEW_PRIVS` is set.
pub fn seccomp(filters: &[BpfProgram; 2]) -> io::Result<()> {
    for f in filters {
        seccompiler::apply_filter(f).map_err(|e| io::Error::other(format!("seccomp: {e}")))?;
    }
    Ok(())
}

/// As root: no supplementary groups, `SANDBOX_ID` for every uid and gid, and no capability
/// left in any set (bounding and ambient included), so nothing this process or a program it
/// runs does can gain one back. A no-op for any other uid (it has none to drop).
pub fn drop_privileges() -> io::Result<bool> {
    // SAFETY: plain credential calls on the calling process.
    unsafe {
        if libc::geteuid() != 0 {
            return Ok(false);
        }
        let check = |r: libc::c_int| {
            if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID))?;
        for cap in 0..=63 {
            // EINVAL past the kernel's last capability: the loop has dropped them all.
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                break;
            }
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        // Leaving uid 0 for good clears the permitted and effective sets.
        check(libc::setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID))?;
    }
    Ok(true)
}

/// Gives the job's scratch to the job process, when it will run as [`SANDBOX_ID`] (a root
/// worker): its output and temporary directories are its own (0700), the input readable
/// through its group, the job directory (where the worker keeps its own records) only
/// traversable. Every job process shares the uid: Landlock keeps each to its own job.
pub fn grant(input: &Path, writable: &[&Path]) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let own = |p: &Path, uid: u32, mode: u32| -> io::Result<()> {
        std::os::unix::fs::chown(p, Some(uid), Some(SANDBOX_ID))?;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
    };
    if let Some(job_dir) = input.parent() {
        own(job_dir, 0, 0o710)?;
    }
    own(input, 0, 0o640)?;
    for dir in writable {
        std::fs::create_dir_all(dir)?;
        // What the worker put there for the job (a long video's pieces, for its stitch) is
        // the job's to read and replace: given first, children before their folder, each
        // through a descriptor opened without following a link, while every folder above is
        // still root's (no job process can swap an entry on the way).
        give_contents(dir)?;
        own(dir, SANDBOX_ID, 0o700)?;
    }
    Ok(())
}

/// Hands every file and folder beneath `dir` (not `dir` itself) to [`SANDBOX_ID`].
fn give_contents(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p);
        // A symlink (ELOOP) or anything else unopenable is left as it is.
        let Ok(f) = f else { continue };
        let meta = f.metadata()?;
        let mode = if meta.is_dir() {
            give_contents(&p)?;
            0o700
        } else if meta.is_file() {
            0o600
        } else {
            continue;
        };
        std::os::unix::fs::fchown(&f, Some(SANDBOX_ID), Some(SANDBOX_ID))?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Whether [`SANDBOX_ID`] can reach `dir` (each directory above it searchable by others), as
/// job processes of a root worker must; the first that is not, when one is not.
pub fn unreachable_by_sandbox(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let dir = std::fs::canonicalize(dir).ok()?;
    dir.ancestors()
        .skip(1)
        .find(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
        .map(Path::to_owned)
}
