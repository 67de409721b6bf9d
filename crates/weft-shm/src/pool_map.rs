//! Peers' shared pools, mapped here (`pool`): a message whose sender
//! announced it lies in one of its pools is read with plain copies from
//! our mapping of that pool, and a split part whose owner offered a
//! receive in one of its pools is written so — no system call per
//! message once the pool is mapped. Anything that does not map (the
//! right to attach refused, a file that is not the one named, not sealed,
//! of another size) falls back to cross-memory attach, which the caller
//! had the right to use anyway.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::process::{Pid, PidfdFlags};

use crate::cma::PullError;
use crate::pool::PoolRef;
use crate::segment::Segment;

/// Mappings kept at once (least recently used dropped past it): each
/// holds a peer's pool memory alive while kept.
const KEEP: usize = 32;

/// A failure to map is remembered this long (no system calls per
/// message for a pool that does not map), then tried again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// A peer's pool as named (its pid and reference), and what came of
/// mapping it.
struct Entry {
    pid: u32,
    r: PoolRef,
    state: State,
    used: u64,
}

enum State {
    /// Mapped; the peer's pidfd, to see it gone (`sweep`).
    Mapped(Arc<Segment>, OwnedFd),
    /// Could not be mapped, at that instant.
    Failed(std::time::Instant),
}

impl Entry {
    fn seg(&self) -> Option<Arc<Segment>> {
        match &self.state {
            State::Mapped(seg, _) => Some(seg.clone()),
            State::Failed(_) => None,
        }
    }

    /// A failure remembered past [`RETRY`], to be tried again.
    fn stale(&self) -> bool {
        matches!(self.state, State::Failed(t) if t.elapsed() >= RETRY)
    }
}

struct Cache {
    entries: Vec<Entry>,
    clock: u64,
    /// Bumped by every [`forget`]: a mapping made meanwhile (outside the
    /// lock) may be of the pool forgotten, and is not kept.
    generation: u64,
}

/// Copies made through a mapped pool (`pool::mapped_copies`).
pub(crate) static COPIES: AtomicU64 = AtomicU64::new(0);

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    entries: Vec::new(),
    clock: 0,
    generation: 0,
});

fn cache() -> std::sync::MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Our mapping of pool `r` of process `pid`, made now if not kept (and
/// not failed within [`RETRY`]). The mapping is made outside the cache's
/// lock: it opens a file of the peer's, which other copies need not wait
/// for. Live mappings and failures are kept apart, [`KEEP`] of each, so
/// failures (a peer naming files that do not map) never push out a
/// mapping.
fn mapping(pid: u32, r: &PoolRef) -> Option<Arc<Segment>> {
    let generation = {
        let mut c = cache();
        c.clock += 1;
        let now = c.clock;
        if let Some(e) = c.entries.iter_mut().find(|e| e.pid == pid && e.r == *r) {
            if !e.stale() {
                e.used = now;
                return e.seg();
            }
        }
        c.generation
    };
    let state = match map(pid, r) {
        Ok((seg, pidfd)) => State::Mapped(Arc::new(seg), pidfd),
        Err(()) => State::Failed(std::time::Instant::now()),
    };
    let mut c = cache();
    let ok = matches!(state, State::Mapped(..));
    let entry = Entry {
        pid,
        r: *r,
        state,
        used: c.clock,
    };
    if c.generation != generation {
        // A pool was forgotten meanwhile: perhaps this one.
        return entry.seg();
    }
    sweep(&mut c.entries);
    // Another thread mapped it meanwhile: its mapping stands.
    let mut same = c.entries.iter().filter(|e| e.pid == pid && e.r == *r);
    if let Some(live) = same.find_map(|e| e.seg()) {
        return Some(live);
    }
    c.entries.retain(|e| !(e.pid == pid && e.r == *r));
    let kind = |e: &Entry| matches!(e.state, State::Mapped(..)) == ok;
    if c.entries.iter().filter(|e| kind(e)).count() >= KEEP {
        let oldest = c
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| kind(e))
            .min_by_key(|(_, e)| e.used)
            .map(|(i, _)| i);
        if let Some(i) = oldest {
            c.entries.swap_remove(i);
        }
    }
    let seg = entry.seg();
    c.entries.push(entry);
    seg
}

/// Drops our mappings of pool `r` (one of ours that goes: the file is
/// not held on here).
pub(crate) fn forget(r: &PoolRef) {
    let mut c = cache();
    c.generation += 1;
    c.entries.retain(|e| e.r != *r);
}

/// Drops the mappings of processes that are gone (their pidfd readable)
/// and expired failures: made at each new mapping, so a dead peer's pool
/// is let go by the next one, not only when pushed out.
fn sweep(entries: &mut Vec<Entry>) {
    use rustix::event::{PollFd, PollFlags};
    let gone: Vec<bool> = {
        let mut fds: Vec<PollFd<'_>> = entries
            .iter()
            .filter_map(|e| match &e.state {
                State::Mapped(_, pidfd) => Some(PollFd::new(pidfd, PollFlags::IN)),
                State::Failed(_) => None,
            })
            .collect();
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if rustix::event::poll(&mut fds, Some(&zero)).is_err() {
            return;
        }
        fds.iter().map(|f| !f.revents().is_empty()).collect()
    };
    let mut gone = gone.into_iter();
    entries.retain(|e| match e.state {
        State::Mapped(..) => !gone.next().unwrap_or(false),
        State::Failed(_) => !e.stale(),
    });
}

/// Opens the file behind descriptor `r.fd` of `pid` and maps it if it is
/// the pool named. The peer chooses the number, so the file is first
/// reached without being opened: `/proc/<pid>/fd/<n>` with `O_PATH`
/// (no file system's open is called, and closing it neither flushes
/// nor drops any lock of ours). Only if that file is a `memfd` — on the
/// kernel's internal tmpfs mount, the device our own `memfd`s are on,
/// so no file of a mounted file system — of the inode named is it
/// opened for reading and writing (through `/proc/self/fd`) and mapped
/// (`Segment::map_sealed`: sealed against shrinking, its exact size).
/// Needs the right to look at the peer's descriptors (`ptrace` read),
/// which the CMA right this path is taken under includes. Returns the
/// peer's pidfd with the mapping, to see it gone.
fn map(pid: u32, r: &PoolRef) -> Result<(Segment, OwnedFd), ()> {
    use rustix::fs::{Mode, OFlags};
    let raw_pid = i32::try_from(pid).map_err(|_| ())?;
    let n = i32::try_from(r.fd).map_err(|_| ())?;
    let dev = memfd_dev().ok_or(())?;
    let at = rustix::fs::open(
        format!("/proc/{raw_pid}/fd/{n}"),
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|_| ())?;
    let st = rustix::fs::fstat(&at).map_err(|_| ())?;
    if st.st_dev != dev || st.st_ino != r.ino {
        return Err(());
    }
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&at)),
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|_| ())?;
    let len = usize::try_from(r.len).map_err(|_| ())?;
    let seg = Segment::map_sealed(&fd, r.ino, len).map_err(|_| ())?;
    let pid = Pid::from_raw(raw_pid).ok_or(())?;
    let pidfd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).map_err(|_| ())?;
    Ok((seg, pidfd))
}

/// The device of the kernel's internal mount that every `memfd` lives
/// on (learned once from a `memfd` of our own).
fn memfd_dev() -> Option<u64> {
    static DEV: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *DEV.get_or_init(|| {
        let fd = rustix::fs::memfd_create("weft-probe", rustix::fs::MemfdFlags::CLOEXEC).ok()?;
        Some(rustix::fs::fstat(&fd).ok()?.st_dev)
    })
}

/// Our mapping of `pool` of `pid` and its base, if it holds every range
/// of `remote` and maps (counted as a copy made through it).
fn mapped(pid: u32, pool: Option<&PoolRef>, remote: &[(u64, u64)]) -> Option<(Arc<Segment>, u64)> {
    let m = pool
        .filter(|r| r.holds(remote))
        .and_then(|r| mapping(pid, r).map(|s| (s, r.base)))?;
    COPIES.fetch_add(1, Ordering::Relaxed);
    Some(m)
}

/// Reads the ranges `remote` of process `pid` into `local`, as
/// `cma::pull` does: from our mapping of its pool `pool` when the ranges
/// lie in it and it maps, else by cross-memory attach.
pub fn pull(
    pid: u32,
    pool: Option<&PoolRef>,
    remote: &[(u64, u64)],
    local: &mut [&mut [u8]],
) -> Result<usize, PullError> {
    if let Some((seg, base)) = mapped(pid, pool, remote) {
        let lens: smallvec::SmallVec<[usize; 4]> = local.iter().map(|b| b.len()).collect();
        return Ok(copy(remote, base, &lens, |off, k, at, n| {
            seg.read(off, &mut local[k][at..at + n])
        }));
    }
    crate::cma::pull(pid, remote, local)
}

/// Writes `local` into the ranges `remote` of process `pid`, as
/// `cma::push` does: into our mapping of its pool `pool` when the ranges
/// lie in it and it maps, else by cross-memory attach.
pub fn push(
    pid: u32,
    pool: Option<&PoolRef>,
    remote: &[(u64, u64)],
    local: &[&[u8]],
) -> Result<usize, PullError> {
    if let Some((seg, base)) = mapped(pid, pool, remote) {
        let lens: smallvec::SmallVec<[usize; 4]> = local.iter().map(|b| b.len()).collect();
        return Ok(copy(remote, base, &lens, |off, k, at, n| {
            seg.write(off, &local[k][at..at + n])
        }));
    }
    crate::cma::push(pid, remote, local)
}

/// Walks `remote` (addresses from `base` in a mapping) against local
/// buffers of lengths `lens`, in order, until either ends, calling
/// `step(offset in the mapping, local buffer, offset in it, bytes)` for
/// each piece; returns the bytes the steps moved (stopping at the first
/// that fails).
fn copy(
    remote: &[(u64, u64)],
    base: u64,
    lens: &[usize],
    mut step: impl FnMut(usize, usize, usize, usize) -> bool,
) -> usize {
    let (mut k, mut at) = (0usize, 0usize);
    let mut done = 0usize;
    for &(a, l) in remote {
        let (mut off, mut left) = ((a - base) as usize, l as usize);
        while left > 0 {
            while k < lens.len() && at == lens[k] {
                k += 1;
                at = 0;
            }
            let Some(&room) = lens.get(k) else {
                return done;
            };
            let n = left.min(room - at);
            if !step(off, k, at, n) {
                return done;
            }
            (off, left, at, done) = (off + n, left - n, at + n, done + n);
        }
    }
    done
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn pieces_follow_both_sides() {
        let mut seen = Vec::new();
        let n = copy(&[(100, 10), (200, 5)], 100, &[4, 0, 20], |o, k, a, n| {
            seen.push((o, k, a, n));
            true
        });
        assert_eq!(n, 15);
        assert_eq!(seen, vec![(0, 0, 0, 4), (4, 2, 0, 6), (100, 2, 6, 5)]);
        // Local side shorter: stops where it ends.
        let n = copy(&[(0, 10)], 0, &[3], |_, _, _, _| true);
        assert_eq!(n, 3);
    }

    #[test]
    fn only_a_sealed_memfd_of_its_size_is_mapped() {
        if !crate::pool::enabled() {
            eprintln!("skipped: cross-memory attach is not permitted here");
            return;
        }
        use std::os::fd::AsRawFd;
        let me = std::process::id();
        let of = |fd: &OwnedFd, len: u64| PoolRef {
            fd: fd.as_raw_fd() as u32,
            ino: rustix::fs::fstat(fd).expect("fstat").st_ino,
            base: 0x10_0000,
            len,
        };
        // A memfd without seals: its owner could shrink it under us.
        let open =
            rustix::fs::memfd_create("weft-test", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&open, 8192).expect("size");
        assert!(mapping(me, &of(&open, 8192)).is_none(), "unsealed");
        // Sealed, but named with another size.
        let sealed = rustix::fs::memfd_create(
            "weft-test",
            rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
        )
        .expect("memfd");
        rustix::fs::ftruncate(&sealed, 8192).expect("size");
        rustix::fs::fcntl_add_seals(&sealed, rustix::fs::SealFlags::SHRINK).expect("seal");
        assert!(mapping(me, &of(&sealed, 4096)).is_none(), "another size");
        assert!(mapping(me, &of(&sealed, 8192)).is_some(), "the real one");
        // Not a memfd at all (a file in /dev/shm): never taken.
        let path = format!("/dev/shm/weft-pool-map-test-{me}");
        let f = std::fs::File::create(&path).expect("file");
        let _ = std::fs::remove_file(&path);
        let f = OwnedFd::from(f);
        assert!(mapping(me, &of(&f, 4096)).is_none(), "not a memfd");
        cache().entries.retain(|e| e.pid != me);
    }

    #[test]
    fn our_own_pool_maps_and_copies_without_the_kernel() {
        if !crate::pool::enabled() {
            eprintln!("skipped: cross-memory attach is not permitted here");
            return;
        }
        let mem = crate::pool::alloc(2, 8192).expect("pool");
        let mut bufs = mem.bufs;
        bufs[1][..5].copy_from_slice(b"hello");
        let a = bufs[1].as_ptr() as u64;
        let r = crate::pool::lookup(&[(a, 8192)]).expect("ours");
        let me = std::process::id();
        let mut out = [0u8; 5];
        assert_eq!(pull(me, Some(&r), &[(a, 5)], &mut [&mut out[..]]), Ok(5));
        assert_eq!(&out, b"hello");
        assert_eq!(push(me, Some(&r), &[(a + 8, 3)], &[b"abc"]), Ok(3));
        assert_eq!(&bufs[1][8..11], b"abc");
        // Another inode under the number: not mapped, the kernel copies.
        let lie = PoolRef {
            ino: r.ino ^ 1,
            ..r
        };
        assert!(mapping(me, &lie).is_none());
        assert_eq!(pull(me, Some(&lie), &[(a, 5)], &mut [&mut out[..]]), Ok(5));
        drop(bufs);
        drop(mem.keep);
    }
}
