//! A channel's claim lock (layout version 10): an open-file-description
//! write lock (`fcntl` `F_OFD_SETLK`) on the one byte of the owner's
//! segment file at the channel's control block. A claimer holds it from
//! before its claim's swap to after its claim's last swap, so the owner,
//! judging a claim that outlasted a sweep interval, can tell a live
//! claimer from a dead one (`F_OFD_GETLK`) whatever pid namespace the
//! claimer runs in. `docs/design.md`, "The state word".
//!
//! A lock lives as long as its open file description, which every
//! descriptor and every mapping of it keeps — and a `fork` child
//! inherits both (`O_CLOEXEC` acts only at `exec`). So the lock is taken
//! through a description opened for that one claim (`Peer::claim`: the
//! segment opened again by name, checked to be the file mapped), never
//! mapped and closed right after the claim: a child forked at any other
//! time holds no reference to it, and one forked during the claim itself
//! shares the description only until the parent lets the lock go
//! (`F_UNLCK` acts on the description, whoever else holds it). Had the
//! lock been taken through the descriptor the segment is mapped with, a
//! child forked any time later would keep it alive after a parent that
//! died mid-claim, and the owner would keep that claim until the child
//! exited.
//!
//! Open-file-description locks, not the classic `F_SETLK` ones: classic
//! locks belong to a process, so two endpoints of one process claiming
//! one channel would never refuse each other, an owner looking in the
//! same process as a claimer would not see its lock, and closing any
//! descriptor of the file would drop them all.
//!
//! Not `flock`: the owner's whole-file `flock` (`create`, `live`) and
//! these `fcntl` byte locks live apart on Linux — neither ever refuses
//! the other (`flock_and_byte_locks_do_not_interact` checks it here) —
//! so the owner's shared lock and a prober's exclusive test lock leave
//! every claim lock as it is, and the reverse. rustix has only whole-file
//! `fcntl` locks; this module calls `fcntl` through `libc`.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use weft_core::{Error, Result};

/// One byte at `at`, for `F_OFD_*` with lock type `kind`.
fn one_byte(kind: libc::c_int, at: u64) -> Result<libc::flock> {
    let l_type = libc::c_short::try_from(kind).map_err(|_| Error::Inval)?;
    let l_whence = libc::c_short::try_from(libc::SEEK_SET).map_err(|_| Error::Inval)?;
    let l_start = libc::off_t::try_from(at).map_err(|_| Error::Inval)?;
    // SAFETY: `flock` is a plain C struct of integers, for which all
    // zeroes is a valid value; `l_pid` must be 0 for the `F_OFD_*`
    // commands (the zeroing sees to it), and the kernel ignores any
    // padding a target has.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type;
    fl.l_whence = l_whence;
    fl.l_start = l_start;
    fl.l_len = 1;
    Ok(fl)
}

/// `fcntl(fd, cmd, fl)` for a lock command, again when interrupted.
fn lock_cmd(fd: BorrowedFd<'_>, cmd: libc::c_int, fl: &mut libc::flock) -> std::io::Result<()> {
    loop {
        // SAFETY: `fd` is open for the borrow's lifetime; `fl` is a valid
        // `flock` we hold exclusively, which the kernel reads (and for
        // `F_OFD_GETLK` writes) during the call only; the lock commands
        // take a pointer to a `flock` as their third argument.
        let r = unsafe { libc::fcntl(fd.as_raw_fd(), cmd, std::ptr::from_mut(fl)) };
        if r != -1 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A channel's claim lock held through the open file description of the
/// descriptor `F` (the guard's own, for a claim), let go when dropped.
#[derive(Debug)]
pub struct ClaimLock<F: AsFd> {
    fd: F,
    at: u64,
}

impl<F: AsFd> ClaimLock<F> {
    /// Takes the lock on the byte at `at` of `fd`'s file (a channel's
    /// control block offset), without waiting: `None` when another open
    /// file description holds it — a claimer of that channel, here or in
    /// another process — or the kernel is out of lock records (`ENOLCK`,
    /// which passes: the channel is passed over as a taken one, and tried
    /// again at the next send). The lock of `fd`'s own description is
    /// taken again (it never refuses itself). Errors: the kernel has no
    /// `F_OFD_*` locks (before Linux 3.15: `Inval`), a filter forbids the
    /// call, `fd` is not open for writing (`BadF`).
    pub fn try_take(fd: F, at: u64) -> Result<Option<ClaimLock<F>>> {
        let mut fl = one_byte(libc::F_WRLCK, at)?;
        match lock_cmd(fd.as_fd(), libc::F_OFD_SETLK, &mut fl) {
            Ok(()) => Ok(Some(ClaimLock { fd, at })),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EACCES | libc::ENOLCK)
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }
}

impl<F: AsFd> Drop for ClaimLock<F> {
    fn drop(&mut self) {
        let done = one_byte(libc::F_UNLCK, self.at).and_then(|mut fl| {
            lock_cmd(self.fd.as_fd(), libc::F_OFD_SETLK, &mut fl).map_err(Error::from)
        });
        if let Err(e) = done {
            // Not seen on a valid descriptor. The lock then stays until
            // its description closes — for a claim's, which the guard
            // owns, right after this — and meanwhile claims of that
            // channel by others are refused and the owner voids none: a
            // channel held longer, nothing lost.
            tracing::warn!(error = ?e, at = self.at, "shm: a claim lock not let go");
        }
    }
}

/// Whether another open file description than `fd`'s holds a lock on the
/// byte at `at` of `fd`'s file (`F_OFD_GETLK`): the owner's look whether
/// a claimer of that channel still runs. The owner takes no claim lock
/// itself, so through its own descriptor every holder is another's.
pub fn held(fd: BorrowedFd<'_>, at: u64) -> Result<bool> {
    let mut fl = one_byte(libc::F_WRLCK, at)?;
    lock_cmd(fd, libc::F_OFD_GETLK, &mut fl)?;
    Ok(libc::c_int::from(fl.l_type) != libc::F_UNLCK)
}

/// Whether claim locks work through `fd` (a segment file open for
/// reading and writing that nobody else locks: a new one, before it
/// takes its name): looked at, taken and let go on byte 0, in the header,
/// which no channel's lock covers. An shm endpoint cannot work without
/// them — a sender could claim no channel, and its sends would wait
/// forever — so one is made only after this passes. Only the calls
/// working passes: the look, the take and the release succeeding, or
/// the look showing another holder (the take's refusal is then that
/// holder's). A refusal with no holder shown is a filter's answer, and
/// would refuse every claim alike (each channel passed over as taken:
/// sends waiting forever), so it fails as every other error does:
/// `NoSys`, the cause logged (`EINVAL`: a kernel before Linux 3.15;
/// `EPERM`/`ENOSYS`/`EACCES`: a filter; `EBADF`: `fd` cannot take a
/// write lock). `ENOLCK` (the kernel out of lock records just now) is
/// `Again`: try later; not kept by [`usable`].
pub fn probe(fd: BorrowedFd<'_>) -> Result<()> {
    let (mut look, mut take, mut free) = (
        one_byte(libc::F_WRLCK, 0)?,
        one_byte(libc::F_WRLCK, 0)?,
        one_byte(libc::F_UNLCK, 0)?,
    );
    let calls = lock_cmd(fd, libc::F_OFD_GETLK, &mut look).and_then(|()| {
        if libc::c_int::from(look.l_type) != libc::F_UNLCK {
            // Another description holds byte 0: the calls work.
            return Ok(());
        }
        lock_cmd(fd, libc::F_OFD_SETLK, &mut take)
            .and_then(|()| lock_cmd(fd, libc::F_OFD_SETLK, &mut free))
    });
    match calls {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENOLCK) => {
            tracing::debug!(error = %e, "shm: lock probe: the kernel is out of lock records");
            Err(Error::Again)
        }
        Err(e) => {
            tracing::warn!(
                error = %e,
                "shm: open-file-description locks (fcntl F_OFD_SETLK, Linux 3.15 or later) do not work here; the shm provider needs them"
            );
            Err(Error::NoSys)
        }
    }
}

/// Whether claim locks work in this process, probed on an anonymous file
/// ([`probe`]): what the provider offers hangs on it. A probe that cannot
/// be made (no anonymous file) or meets a passing shortage (`Again`)
/// says yes for now — endpoint creation probes again on its own segment,
/// and fails there; only a definite answer is kept for the process.
pub fn usable() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    // 0: not known yet; 1: they work; 2: they do not.
    static USABLE: AtomicU8 = AtomicU8::new(0);
    match USABLE.load(Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    use rustix::fs::{memfd_create, MemfdFlags};
    let Ok(fd) = memfd_create("weft-shm-lock-probe", MemfdFlags::CLOEXEC) else {
        return true;
    };
    match probe(fd.as_fd()) {
        Ok(()) => {
            USABLE.store(1, Relaxed);
            true
        }
        Err(Error::Again) => true,
        Err(_) => {
            USABLE.store(2, Relaxed);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::fs::File;
    use std::os::fd::AsFd;

    use rustix::fs::{flock, FlockOperation};

    use super::*;

    /// A file of 4 KiB under `/dev/shm`, opened twice (two open file
    /// descriptions, as a claimer's and the owner's), its name removed.
    fn two_opens() -> (File, File) {
        let path = std::path::Path::new(crate::name::SHM_DIR)
            .join(format!("weft-claimlock-test-{}", crate::name::unique()));
        let mut gone = crate::test_files::Leftovers::default();
        let path = gone.add(path);
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let open = || File::options().read(true).write(true).open(&path).unwrap();
        (open(), open())
    }

    /// A byte locked through one description is held for the other, and
    /// refused to it; only that byte; free again once let go — or once
    /// the holder's descriptor closes without letting go.
    #[test]
    fn a_claim_lock_is_seen_and_refused_by_another_description() {
        let (a, b) = two_opens();
        let l = ClaimLock::try_take(a.as_fd(), 512).unwrap().unwrap();
        assert!(held(b.as_fd(), 512).unwrap());
        assert!(!held(a.as_fd(), 512).unwrap(), "its own never conflicts");
        assert!(!held(b.as_fd(), 511).unwrap());
        assert!(!held(b.as_fd(), 513).unwrap());
        assert!(ClaimLock::try_take(b.as_fd(), 512).unwrap().is_none());
        let other = ClaimLock::try_take(b.as_fd(), 768).unwrap().unwrap();
        drop(l);
        assert!(!held(b.as_fd(), 512).unwrap());
        drop(other);
        let l = ClaimLock::try_take(a.as_fd(), 512).unwrap().unwrap();
        std::mem::forget(l);
        assert!(held(b.as_fd(), 512).unwrap());
        drop(a);
        assert!(!held(b.as_fd(), 512).unwrap(), "gone with its descriptor");
        assert!(ClaimLock::try_take(b.as_fd(), 512).unwrap().is_some());
    }

    /// A descriptor that cannot take a write lock (open only for
    /// reading: `EBADF`) is an error, not a refusal; the probe an
    /// endpoint's creation makes says `NoSys` for it, and passes where
    /// the locks work.
    #[test]
    fn a_lock_that_cannot_be_taken_is_an_error() {
        let (a, b) = two_opens();
        // The file's name is gone: opened again through `/proc`, as a
        // new description.
        let ro = File::open(format!("/proc/self/fd/{}", a.as_raw_fd())).unwrap();
        assert_eq!(
            ClaimLock::try_take(ro.as_fd(), 512).unwrap_err(),
            Error::BadF
        );
        assert_eq!(probe(ro.as_fd()), Err(Error::NoSys));
        assert_eq!(probe(a.as_fd()), Ok(()));
        // Through the other description: a description's own lock
        // never shows to its own look.
        assert!(!held(b.as_fd(), 0).unwrap(), "the probe let go");
        assert!(usable());
    }

    /// A lock the probe is refused (another description holds byte 0)
    /// shows the calls work: the probe passes, as for any passing error
    /// (`ENOLCK`), and only an error saying the calls cannot work
    /// (`EBADF` above) makes it `NoSys`.
    #[test]
    fn a_probe_that_sees_another_holder_passes() {
        let (a, b) = two_opens();
        let l = ClaimLock::try_take(a.as_fd(), 0).unwrap().unwrap();
        assert_eq!(probe(b.as_fd()), Ok(()));
        assert!(held(b.as_fd(), 0).unwrap(), "the holder's lock stays");
        drop(l);
    }

    /// The owner's whole-file `flock` (shared while it runs, a prober's
    /// exclusive test lock for an instant) and a claim lock neither
    /// refuse nor show each other, in either order.
    #[test]
    fn flock_and_byte_locks_do_not_interact() {
        let (a, b) = two_opens();
        flock(&a, FlockOperation::NonBlockingLockExclusive).unwrap();
        let l = ClaimLock::try_take(b.as_fd(), 256).unwrap().unwrap();
        assert!(held(a.as_fd(), 256).unwrap());
        flock(&a, FlockOperation::Unlock).unwrap();
        flock(&a, FlockOperation::NonBlockingLockShared).unwrap();
        flock(&a, FlockOperation::NonBlockingLockExclusive).unwrap();
        // `b`'s whole-file lock is refused by `a`'s exclusive one alone;
        // once that goes, `b` takes it, its byte lock held all along.
        assert!(flock(&b, FlockOperation::NonBlockingLockShared).is_err());
        flock(&a, FlockOperation::Unlock).unwrap();
        flock(&b, FlockOperation::NonBlockingLockExclusive).unwrap();
        drop(l);
        let l = ClaimLock::try_take(a.as_fd(), 256).unwrap().unwrap();
        assert!(held(b.as_fd(), 256).unwrap());
        drop(l);
    }
}
