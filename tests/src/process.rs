//! Processes of the harness: the servers' OS user, commands run as it, their logs, and the
//! process table (`/proc`) that kills, crash tests and cleanups find descendants in — one
//! module for the nodes ([`crate::node`]), Patroni and etcd ([`crate::patroni`]), PgBouncer
//! ([`crate::pooler`]) and postgres_exporter ([`crate::exporter`]).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::HarnessError;
use crate::node::pg_bin_dir;
use crate::Result;

// ================================================================================ the OS user

/// uid and gid of the OS user that runs the servers (`TSORACLE_PG_USER`, default `postgres`).
pub(crate) fn os_user() -> Result<(u32, u32)> {
    crate::node::pg_user()
}

pub(crate) fn chown(path: &Path) -> Result<()> {
    let (uid, gid) = os_user()?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| HarnessError::io(format!("chown {}", path.display()), e))
}

/// A directory owned by the servers' OS user, mode 0700 (as PostgreSQL wants its own).
pub(crate) fn make_dir(path: &Path) -> Result<()> {
    fs::create_dir_all(path)
        .map_err(|e| HarnessError::io(format!("create {}", path.display()), e))?;
    chown(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700))
        .map_err(|e| HarnessError::io(format!("chmod {}", path.display()), e))
}

/// A command run as the server OS user, with a clean environment, in `dir`; it gets SIGKILL
/// when the thread that spawned it ends (`PR_SET_PDEATHSIG`).
pub(crate) fn server_command(program: &str, dir: &Path, die_with_parent: bool) -> Result<Command> {
    Ok(command_as(program, dir, die_with_parent, os_user()?))
}

/// [`server_command`] as the OS user of uid and gid `ids`.
pub(crate) fn command_as(
    program: &str,
    dir: &Path,
    die_with_parent: bool,
    ids: (u32, u32),
) -> Command {
    let (uid, gid) = ids;
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", pg_bin_dir().display()))
        .env("HOME", dir)
        .env("LANG", "C.UTF-8")
        .env("LC_ALL", "C.UTF-8")
        .env("PYTHONUNBUFFERED", "1")
        .current_dir(dir)
        .uid(uid)
        .gid(gid)
        .stdin(Stdio::null());
    if die_with_parent {
        // SAFETY: prctl(2) is async-signal-safe; this runs in the child after fork (and after
        // its setuid, which would otherwise clear the setting).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                Ok(())
            });
        }
    }
    cmd
}

pub(crate) fn open_log(path: &Path) -> Result<(Stdio, Stdio)> {
    let f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| HarnessError::io(format!("open {}", path.display()), e))?;
    chown(path)?;
    let f2 = f.try_clone().map_err(|e| HarnessError::io("dup log fd", e))?;
    Ok((Stdio::from(f), Stdio::from(f2)))
}

/// The command line of a process, its arguments separated by spaces.
pub(crate) fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// `roots` and all their descendants (live, non-zombie), roots first.
pub(crate) fn with_descendants(roots: &[i32]) -> Vec<i32> {
    let table = table();
    let mut by_parent: HashMap<i32, Vec<i32>> = HashMap::new();
    for &(p, pp, state) in &table {
        if state != 'Z' && state != 'X' {
            by_parent.entry(pp).or_default().push(p);
        }
    }
    let mut out: Vec<i32> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<i32> = roots.to_vec();
    while let Some(p) = stack.pop() {
        if p <= 1 || !seen.insert(p) {
            continue;
        }
        out.push(p);
        if let Some(kids) = by_parent.get(&p) {
            stack.extend(kids);
        }
    }
    out
}

/// Send `sig` to every pid in `pids` above 1.
pub(crate) fn signal(pids: &[i32], sig: i32) {
    for &p in pids {
        if p > 1 {
            // SAFETY: kill(2) on processes this harness started (checked by the callers).
            unsafe {
                libc::kill(p, sig);
            }
        }
    }
}

pub(crate) fn read_tail(path: &Path, lines: usize) -> String {
    let text = fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    crate::node::last_lines(&text, lines)
}

// ================================================================================ the process table

/// (pid, ppid, state) of every process, from /proc/*/stat.
pub(crate) fn table() -> Vec<(i32, i32, char)> {
    let mut v = Vec::new();
    let Ok(dir) = fs::read_dir("/proc") else { return v };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Some((state, ppid)) = stat(pid) {
            v.push((pid, ppid, state));
        }
    }
    v
}

/// (state, ppid) of a process from /proc/<pid>/stat.
pub(crate) fn stat(pid: i32) -> Option<(char, i32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid ..." where comm may contain spaces and parentheses.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let ppid = it.next()?.parse().ok()?;
    Some((state, ppid))
}

/// All descendants of `pid` (children, grandchildren...), zombies included (a zombie's pid is
/// still ours to wait for); [`with_descendants`] is the live ones, roots included.
pub(crate) fn descendants(pid: i32) -> Vec<i32> {
    let mut by_parent: HashMap<i32, Vec<i32>> = HashMap::new();
    for (p, pp, _) in table() {
        by_parent.entry(pp).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if let Some(kids) = by_parent.get(&p) {
            for &k in kids {
                out.push(k);
                stack.push(k);
            }
        }
    }
    out
}

/// SIGSTOP `pid` (so it cannot fork), collect its descendants, SIGKILL it and them.
/// Returns the descendants' pids.
pub(crate) fn kill_tree(pid: i32) -> Vec<i32> {
    // SAFETY: kill(2) only takes integers and reads or writes none of our memory; `pid` is
    // our own child (a zombie until we reap it, so its pid cannot be reused meanwhile).
    unsafe {
        libc::kill(pid, libc::SIGSTOP);
    }
    let kids = descendants(pid);
    // SAFETY: as above, kill(2) touches none of our memory. The descendants were read from
    // /proc just now; one that has exited since only makes kill fail with ESRCH.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        for &k in &kids {
            libc::kill(k, libc::SIGKILL);
        }
    }
    kids
}

pub(crate) fn is_gone(pid: i32) -> bool {
    match stat(pid) {
        None => true,
        Some((state, _)) => state == 'Z' || state == 'X',
    }
}

pub(crate) fn wait_gone(pids: &[i32], timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let alive: Vec<i32> = pids.iter().copied().filter(|&p| !is_gone(p)).collect();
        if alive.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(HarnessError::Timeout(format!(
                "processes still alive after SIGKILL: {alive:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
