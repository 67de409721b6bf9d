//! Whether a process is alive: its pid and its start time (field 22 of
//! `/proc/<pid>/stat`, clock ticks since boot), so a pid reused by a new
//! process is not mistaken for the old one. Segment headers and channel
//! claims record both; see `docs/design.md`, "The shm provider".
//!
//! Also the clean-up of segments that crashed runs left behind.

use std::io::Read;
use std::time::{Duration, SystemTime};

use rustix::process::Pid;

use crate::layout::{H_MAGIC, H_PID, H_SERIAL, H_START, MAGIC};
use crate::name::{bell_path, seg_name, BELL_PREFIX, SEG_PREFIX, SHM_DIR};
use crate::segment::Segment;

/// This process's pid and start time.
pub fn me() -> (u32, u64) {
    let pid = std::process::id();
    (pid, start_time(pid).unwrap_or(0))
}

/// One endpoint instance: its process's pid and start time, and its
/// serial in that process (`serial`).
pub type Instance = (u32, u64, u64);

/// A new endpoint serial, unique in this process (never 0): with the
/// process's pid and start time (`me`), it names one endpoint instance
/// on this host, even when the process closes an endpoint and opens
/// another under the same name (`layout::H_SERIAL`).
pub fn serial() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The start time of process `pid`, if it exists and `/proc` says.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, t)| t)
}

/// Process `pid`'s state letter and start time (fields 3 and 22 of
/// `/proc/<pid>/stat`), if it exists and `/proc` says.
fn stat(pid: u32) -> Option<(u8, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after the last ')' are fixed.
    let mut rest = s[s.rfind(')')? + 1..].split_ascii_whitespace();
    let state = *rest.next()?.as_bytes().first()?;
    Some((state, rest.nth(18)?.parse().ok()?))
}

/// Whether the process `pid` that started at `start` still runs. A start
/// time of 0 (not known when recorded) checks the pid only. A zombie
/// (`Z`, or `X` on its way out) runs no more: it holds no locks, writes
/// nothing, and its parent may take long to reap it — meanwhile a new
/// endpoint may take its name, and our records of it must go. (A
/// process whose main thread alone exited shows a zombie leader too; its
/// lock, which `owner_runs` also asks, still says it runs.)
pub fn alive(pid: u32, start: u64) -> bool {
    if pid == 0 {
        return false;
    }
    match stat(pid) {
        Some((state, t)) => !matches!(state, b'Z' | b'X') && (start == 0 || t == start),
        None => {
            let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
                return false;
            };
            // No /proc entry: alive only if the kernel knows the pid.
            !matches!(
                rustix::process::test_kill_process(p),
                Err(rustix::io::Errno::SRCH)
            )
        }
    }
}

/// The path of `name`'s segment file.
pub fn seg_path(name: &str) -> std::path::PathBuf {
    std::path::Path::new(SHM_DIR).join(format!("{SEG_PREFIX}{name}"))
}

/// Holds a shared lock on `name`'s segment file for as long as the
/// returned file stays open: the kernel drops it when the process ends,
/// however it ends. Unlike a pid, the lock means the same thing in every
/// pid namespace that sees the file (containers that share `/dev/shm` but
/// not their pids).
pub fn hold(name: &str) -> weft_core::Result<std::fs::File> {
    let f = std::fs::File::open(seg_path(name))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared)
        .map_err(std::io::Error::from)?;
    Ok(f)
}

/// Whether some live process holds `name`'s segment (see [`hold`]);
/// `None` when the file cannot be opened. A test lock is taken and let go
/// at once when nobody does.
pub fn held(name: &str) -> Option<bool> {
    let f = std::fs::File::open(seg_path(name)).ok()?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            let _ = rustix::fs::flock(&f, rustix::fs::FlockOperation::Unlock);
            Some(false)
        }
        Err(rustix::io::Errno::WOULDBLOCK) => Some(true),
        Err(_) => None,
    }
}

/// Whether the endpoint instance `inst` (pid, start time, serial), which
/// had or has the name `name`, still runs: its pid says so in this pid
/// namespace, or its lock on its own segment does (it may live in
/// another pid namespace, where the pid names nobody or somebody else).
///
/// The lock counts only while the segment file under `name` is still
/// `inst`'s: once a new endpoint holds the name (a process restarted
/// after a crash), the lock is that one's and says nothing of `inst`,
/// which is then dead to us (`docs/design.md`, "The shm provider").
pub fn owner_runs(name: &str, inst: Instance) -> bool {
    alive(inst.0, inst.1) || held_by(name, inst)
}

/// Whether `name`'s segment file is `inst`'s own — its header names that
/// instance — and some live process holds it (see [`hold`]). The header
/// and the lock are read through one open file, so both are of the same
/// segment even if the name changes hands meanwhile.
pub fn held_by(name: &str, inst: Instance) -> bool {
    let Ok(mut f) = std::fs::File::open(seg_path(name)) else {
        return false;
    };
    if instance_in(&mut f) != Some(inst) {
        return false;
    }
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            let _ = rustix::fs::flock(&f, rustix::fs::FlockOperation::Unlock);
            false
        }
        Err(e) => e == rustix::io::Errno::WOULDBLOCK,
    }
}

/// The instance a segment file's header names (`H_PID`, `H_START`,
/// `H_SERIAL`); `None` when the header is not (yet) valid.
fn instance_in(f: &mut std::fs::File) -> Option<Instance> {
    let mut h = [0u8; H_SERIAL + 8];
    f.read_exact(&mut h).ok()?;
    let u64_at = |o: usize| h.get(o..o + 8)?.try_into().ok().map(u64::from_ne_bytes);
    let u32_at = |o: usize| h.get(o..o + 4)?.try_into().ok().map(u32::from_ne_bytes);
    (u64_at(H_MAGIC)? == MAGIC).then_some((u32_at(H_PID)?, u64_at(H_START)?, u64_at(H_SERIAL)?))
}

/// The instance the segment file under `name` names now: the endpoint
/// that holds the name, or held it last.
pub fn instance_of_name(name: &str) -> Option<Instance> {
    instance_in(&mut std::fs::File::open(seg_path(name)).ok()?)
}

/// The owner (pid, start time) a segment file's header names, read with
/// plain file I/O; `None` when the header is not (yet) valid.
pub fn owner_of_file(path: &std::path::Path) -> Option<(u32, u64)> {
    let (pid, start, _) = instance_in(&mut std::fs::File::open(path).ok()?)?;
    Some((pid, start))
}

/// The owner a mapped segment's header names.
pub fn owner_of(seg: &Segment) -> Option<(u32, u64)> {
    use std::sync::atomic::Ordering::Acquire;
    (seg.load64(H_MAGIC, Acquire)? == MAGIC)
        .then(|| Some((seg.load32(H_PID, Acquire)?, seg.load64(H_START, Acquire)?)))
        .flatten()
}

/// Removes `name`'s segment and doorbell if the files still belong to
/// the dead owner `pid` (a new process may have taken the name since).
pub fn remove_if_owned(name: &str, pid: u32, start: u64) {
    let path = seg_path(name);
    if owner_of_file(&path) == Some((pid, start)) && held(name) != Some(true) {
        Segment::unlink(&seg_name(name));
        let _ = std::fs::remove_file(bell_path(name));
        tracing::debug!(name, pid, "shm: removed a dead peer's segment");
    }
}

/// How old a segment without a valid header must be to count as left
/// behind by a creator that died while making it.
const HALF_MADE: Duration = Duration::from_secs(60);

/// Removes the segments (and doorbells) in `/dev/shm` whose owners are
/// dead, and those that never got a valid header and are old. Run once
/// per process, when its first shm domain opens. Returns how many
/// segments it removed.
pub fn reclaim_stale() -> usize {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return 0;
    };
    let mut removed = 0;
    for e in dir.flatten() {
        let file = e.file_name();
        let Some(f) = file.to_str() else { continue };
        let Some(name) = f.strip_prefix(SEG_PREFIX) else {
            continue;
        };
        let path = e.path();
        let stale = held(name) == Some(false)
            && match owner_of_file(&path) {
                Some((pid, start)) => !alive(pid, start),
                None => e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .is_some_and(|age| age > HALF_MADE),
            };
        if stale {
            Segment::unlink(&seg_name(name));
            let _ = std::fs::remove_file(bell_path(name));
            removed += 1;
        }
    }
    // Doorbells whose segment is gone.
    if let Ok(dir) = std::fs::read_dir(SHM_DIR) {
        for e in dir.flatten() {
            let file = e.file_name();
            let Some(name) = file.to_str().and_then(|f| f.strip_prefix(BELL_PREFIX)) else {
                continue;
            };
            let seg = seg_path(name);
            if !seg.exists() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    if removed > 0 {
        tracing::info!(removed, "shm: reclaimed segments of dead processes");
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_pid_zero_is_not() {
        let (pid, start) = me();
        assert!(start > 0);
        assert!(alive(pid, start));
        assert!(!alive(pid, start + 1), "a reused pid is another process");
        assert!(!alive(0, 0));
        assert!(!alive(u32::MAX, 0));
    }

    /// A child killed and not yet reaped is a zombie: dead to us,
    /// though its pid and start time are still there.
    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = start_time(pid).unwrap();
        assert!(alive(pid, start));
        // SIGKILL, not reaped (`wait` below does).
        child.kill().unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while stat(pid).map(|s| s.0) != Some(b'Z') {
            assert!(std::time::Instant::now() < until, "no zombie");
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(start_time(pid), Some(start), "its pid and start remain");
        assert!(!alive(pid, start));
        child.wait().unwrap();
        assert!(!alive(pid, start));
    }

    /// A segment file header naming the instance `i`.
    fn header(i: Instance) -> Vec<u8> {
        let mut h = vec![0u8; 64];
        h[H_MAGIC..H_MAGIC + 8].copy_from_slice(&MAGIC.to_ne_bytes());
        h[H_PID..H_PID + 4].copy_from_slice(&i.0.to_ne_bytes());
        h[H_START..H_START + 8].copy_from_slice(&i.1.to_ne_bytes());
        h[H_SERIAL..H_SERIAL + 8].copy_from_slice(&i.2.to_ne_bytes());
        h
    }

    /// The lock says whether the owner runs where its pid cannot: here
    /// the header names a pid that is not running, as a process in
    /// another pid namespace would look.
    #[test]
    fn a_held_segment_runs_whatever_its_pid_says() {
        let name = format!("live-test-{}", crate::name::unique());
        let path = seg_path(&name);
        let inst = (u32::MAX, 0, 5);
        std::fs::write(&path, header(inst)).unwrap();
        assert_eq!(held(&name), Some(false));
        assert!(!owner_runs(&name, inst));
        assert_eq!(instance_of_name(&name), Some(inst));
        assert_eq!(owner_of_file(&path), Some((inst.0, inst.1)));
        let h = hold(&name).unwrap();
        assert_eq!(held(&name), Some(true));
        assert!(owner_runs(&name, inst));
        // Another holder of a shared lock does not make it look free.
        let h2 = hold(&name).unwrap();
        drop(h);
        assert_eq!(held(&name), Some(true));
        assert!(owner_runs(&name, inst));
        drop(h2);
        assert_eq!(held(&name), Some(false), "the kernel lets go with the file");
        assert!(!owner_runs(&name, inst));
        assert_eq!(held("live-test-no-such-segment"), None);
        assert!(!held_by("live-test-no-such-segment", inst));
        std::fs::remove_file(&path).unwrap();
    }

    /// A crashed instance's name taken by a new endpoint (its own segment
    /// file under the name, held): the lock is the new one's, and says
    /// nothing of the old instance — nor of another serial of the same
    /// pid — which is dead to us; the new one runs.
    #[test]
    fn a_name_held_by_another_instance_does_not_keep_the_old_one_running() {
        let name = format!("live-test-{}", crate::name::unique());
        let path = seg_path(&name);
        let old = (u32::MAX, 7, 1);
        let new = (u32::MAX - 1, 8, 1);
        std::fs::write(&path, header(old)).unwrap();
        let h = hold(&name).unwrap();
        assert!(owner_runs(&name, old));
        drop(h);
        // The old one died; the new one replaced its file and holds it.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, header(new)).unwrap();
        let h = hold(&name).unwrap();
        assert_eq!(held(&name), Some(true), "the name alone looks held");
        assert!(!owner_runs(&name, old), "the old instance is dead");
        assert!(owner_runs(&name, new));
        assert!(
            !owner_runs(&name, (new.0, new.1, 2)),
            "another endpoint of the same process"
        );
        // A file with no valid header yet (its creator is still writing
        // it) names nobody.
        std::fs::write(&path, [0u8; 64]).unwrap();
        assert!(!owner_runs(&name, new));
        assert_eq!(instance_of_name(&name), None);
        drop(h);
        std::fs::remove_file(&path).unwrap();
    }
}
