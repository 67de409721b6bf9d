//! Making an endpoint's segment under its name, whole. The file is made
//! under a private name of ours (`name::TMP_PREFIX`), locked through the
//! descriptor that made it, sized, mapped and given its header there;
//! only then is it hard-linked to its real name — which fails, at once
//! and for everyone alike, if the name is taken — and the private name
//! removed. A file under a real name therefore always has a valid header
//! and, while its creator runs, its creator's lock: no wall-clock rule is
//! needed to tell a file being made from one left behind. See
//! `docs/design.md`, "The shm provider".

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{flock, FlockOperation};
use weft_core::{Error, Result};

use crate::layout::Geometry;
use crate::live::{self, Removal};
use crate::name::{self, SHM_DIR, TMP_PREFIX};
use crate::segment::Segment;

/// A segment under its real name, and the file through which we hold its
/// shared lock (`live::held_by`) for as long as it stays open.
#[derive(Debug)]
pub struct Made {
    pub seg: Segment,
    pub held: File,
}

/// A private name of ours, removed when dropped, whatever happened: the
/// file was linked under its real name (the private name is then a
/// second name of it), given up, or already removed by a sweep. The
/// name carries our pid, a counter and 64 random bits (`name::unique`):
/// nobody else makes a file under it, so whatever is there is ours.
#[derive(Debug)]
struct Private(PathBuf);

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A segment file being made: locked, sized and mapped under a private
/// name.
#[derive(Debug)]
struct Draft {
    path: Private,
    file: File,
    seg: Segment,
}

/// The path of a new private file for `name`'s segment:
/// `/dev/shm/weft-shmtmp.<name>.<unique>`.
fn private_path(name: &str) -> PathBuf {
    Path::new(SHM_DIR).join(format!("{TMP_PREFIX}{name}.{}", name::unique()))
}

/// A new file of `len` bytes under a private name, with our shared lock
/// on it, mapped. `Ok(None)` when a sweep ([`reclaim_drafts`]) took it in
/// the one instant it is not locked — between its creation and our lock
/// — and removes it or has: the caller starts again under another name.
fn draft(name: &str, len: usize) -> Result<Option<Draft>> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = private_path(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let path = Private(path);
    if !lock_new(&file, &path.0)? {
        return Ok(None);
    }
    // Before the file has a header, let alone the real name: without
    // working claim locks no sender could ever claim a channel here.
    crate::claim_lock::probe(std::os::fd::AsFd::as_fd(&file))?;
    file.set_len(len as u64)?;
    let seg = Segment::map_file(&file, len)?;
    Ok(Some(Draft { path, file, seg }))
}

/// Takes our shared lock on the new file `f` at `path`; `false` when a
/// sweep got there first: its exclusive lock refused ours (it keeps it
/// until it unlinks the file), or it unlinked the file and let go before
/// our lock — a file under no name cannot be linked under the real one.
fn lock_new(f: &File, path: &Path) -> Result<bool> {
    match flock(f, FlockOperation::NonBlockingLockShared) {
        Ok(()) => Ok(live::is_under(f, path)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}

/// Makes `name`'s segment: a file of `g.bytes()` bytes, locked, whose
/// header `header` writes (called once per file made, before the file
/// takes the name), then linked under the name. The name taken, its
/// file is judged (`live::remove_if` with `live::abandoned`): one whose
/// owner is dead, or with no valid header — which no creator of this
/// version leaves under a real name: an older version's, or a damaged
/// one — is removed if nobody holds its lock, and the link tried again;
/// a live owner's is `AddrInUse`, and so is anything under the name that
/// is not a regular file (a FIFO: left, not waited on). Another process removing the file
/// just then (`Removal::Busy`: it holds its lock until it unlinks)
/// frees the name in a moment: tried again, a bounded number of times. A
/// dead owner's file whose lock a peer's probe held for an instant
/// (`Removal::Held`: our exclusive lock refused, a shared one then
/// taken) looks like a live owner's in another pid namespace: tried
/// again too, a few times — an owner's lock lasts, a probe's does not —
/// before `AddrInUse`. An error looking at the file (`EMFILE`) is
/// returned as it is, not as `AddrInUse`; so is a failure to link other
/// than the name being taken (a directory without hard links: `EPERM`;
/// no fallback, logged). The private name is gone when this returns,
/// whatever it returns.
pub fn create_segment(name: &str, g: Geometry, mut header: impl FnMut(&Segment)) -> Result<Made> {
    const TRIES: u32 = 10;
    const HELD_TRIES: u32 = 3;
    let real = live::seg_path(name);
    let mut held = 0;
    let mut kept: Option<Draft> = None;
    for _ in 0..TRIES {
        let d = match kept.take() {
            Some(d) => d,
            None => match draft(name, g.bytes())? {
                Some(d) => {
                    header(&d.seg);
                    d
                }
                None => continue,
            },
        };
        match std::fs::hard_link(&d.path.0, &real) {
            // `d.path` goes as `d` is dropped: the file keeps one name.
            Ok(()) => {
                return Ok(Made {
                    seg: d.seg,
                    held: d.file,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            // Our private file removed by hand (a sweep never removes a
            // locked one): start again under another name.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(
                    name,
                    error = %e,
                    "shm: cannot link a new segment under its name: {SHM_DIR} must support hard links"
                );
                return Err(e.into());
            }
        }
        kept = Some(d);
        match live::remove_if(name, live::abandoned)? {
            Removal::NotStale => return Err(Error::AddrInUse),
            Removal::Held if held == HELD_TRIES => return Err(Error::AddrInUse),
            // Rare (a probe's instant, or a live owner elsewhere), and
            // before the endpoint exists: short blocking waits, 1, 2 and
            // 4 ms.
            Removal::Held => {
                std::thread::sleep(Duration::from_millis(1 << held));
                held += 1;
            }
            Removal::Removed | Removal::Gone => {}
            // Rare (two processes taking one dead name at once), and
            // before the endpoint exists: a short blocking wait.
            Removal::Busy => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    Err(Error::AddrInUse)
}

/// Removes the private files that creators left behind when they died
/// (between their create and their link, or between their link and the
/// private name's removal); returns how many. A creator holds its file's
/// lock from just after creating it until the private name is gone, and
/// only the kernel lets go of it for a creator that did not finish, with
/// the process: a file whose exclusive lock we get is no running
/// creator's. Save one created an instant ago and not yet locked: its
/// creator then finds its lock refused or its file gone, and starts
/// again under another name (`draft`). So no age rule. The exclusive
/// lock is kept until the unlink, and the name checked to still be the
/// file locked. Only the private name goes: a file also linked under its
/// real name stays there, judged by its header like any other segment.
///
/// `names`: the sweep's one listing of `/dev/shm` (`live::reclaim_stale`),
/// of which the private names are looked at.
pub fn reclaim_drafts(names: &[String]) -> usize {
    names
        .iter()
        .filter(|f| f.starts_with(TMP_PREFIX))
        .filter(|f| remove_draft(&Path::new(SHM_DIR).join(f)))
        .count()
}

/// Removes the private file at `path` if nobody holds its lock (see
/// [`reclaim_drafts`]). Anything but a regular file under a private
/// name (a FIFO, a link) is not ours: left, not waited on
/// (`live::open_regular`).
fn remove_draft(path: &Path) -> bool {
    let Ok(Some(f)) = live::open_regular(path) else {
        return false;
    };
    if flock(&f, FlockOperation::NonBlockingLockExclusive).is_err() {
        return false;
    }
    live::is_under(&f, path) && std::fs::remove_file(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> Geometry {
        Geometry::check(1, crate::layout::RING_MIN as u32).unwrap()
    }

    /// Writes a header naming a new instance of this process (no other
    /// test binary's sweep removes its file).
    fn header(seg: &Segment) {
        use crate::layout::{H_MAGIC, H_PID, H_SERIAL, H_START, MAGIC};
        use std::sync::atomic::Ordering::Release;
        let (pid, start) = live::me();
        seg.store32(H_PID, pid, Release);
        seg.store64(H_START, start, Release);
        seg.store64(H_SERIAL, live::serial(), Release);
        seg.store64(H_MAGIC, MAGIC, Release);
    }

    fn fresh() -> String {
        format!("create-test-{}", name::unique())
    }

    /// A path outside every prefix the sweep looks at, for a file only
    /// this test removes (another test binary's sweep may run at any
    /// time).
    fn own_path() -> PathBuf {
        Path::new(SHM_DIR).join(format!("weft-create-test-{}", name::unique()))
    }

    /// A file of `n` bytes at `path`, made elsewhere and locked before it
    /// takes the name, as a creator's is from its making: no sweep finds
    /// it unlocked. The file holding the lock.
    fn locked_at(path: &Path, n: usize) -> File {
        let made = own_path();
        std::fs::write(&made, vec![0u8; n]).unwrap();
        let f = File::open(&made).unwrap();
        flock(&f, FlockOperation::NonBlockingLockShared).unwrap();
        std::fs::rename(&made, path).unwrap();
        f
    }

    /// The private files of `name` in the directory.
    fn privates(name: &str) -> Vec<PathBuf> {
        let prefix = format!("{TMP_PREFIX}{name}.");
        std::fs::read_dir(SHM_DIR)
            .unwrap()
            .flatten()
            // Not `to_str().unwrap()`: anyone may put a name that is not
            // UTF-8 there, and it is none of ours.
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|f| f.starts_with(&prefix))
            .map(|f| Path::new(SHM_DIR).join(f))
            .collect()
    }

    /// The made segment is under its name, whole, locked by us through
    /// the file returned, and no private name is left.
    #[test]
    fn a_made_segment_is_whole_under_its_name() {
        let name = fresh();
        let made = create_segment(&name, g(), header).unwrap();
        let path = live::seg_path(&name);
        assert!(live::is_under(&made.held, &path));
        let inst = live::instance_of_name(&name).unwrap();
        assert_eq!((inst.0, inst.1), live::me());
        assert_eq!(live::held_by(&name, inst), live::Held::Yes);
        assert!(privates(&name).is_empty());
        assert_eq!(
            create_segment(&name, g(), header).unwrap_err(),
            Error::AddrInUse,
            "a live owner's name"
        );
        assert!(privates(&name).is_empty(), "the loser's private file went");
        assert!(live::is_under(&made.held, &path), "the owner's file stays");
        drop(made);
        live::unlink_files(&name);
    }

    /// A private file left by a creator that died (made by hand here,
    /// unlocked) is removed by the sweep at once; one whose lock is held
    /// (a creator still making it) stays.
    #[test]
    fn only_unlocked_private_files_are_reclaimed() {
        let name = fresh();
        let dead = private_path(&name);
        std::fs::write(&dead, [0u8; 64]).unwrap();
        let live_one = private_path(&name);
        let f = locked_at(&live_one, 64);
        // Another test binary's sweep may have got there first.
        reclaim_drafts(&live::shm_names());
        assert!(!dead.exists(), "nobody holds it");
        assert!(!remove_draft(&live_one), "its creator holds it");
        assert!(live_one.exists());
        drop(f);
        // Only the private names in the listing are looked at: a segment
        // and a doorbell listed beside them, unlocked, are no drafts, and
        // stay. The segment's header names this process, so no sweep of
        // another test binary (of this build or an older one) removes it,
        // nor the doorbell beside it; both go at the end, whatever the
        // outcome.
        let mut leftovers = crate::test_files::Leftovers::default();
        let other = fresh();
        let seg = leftovers.add(live::seg_path(&other));
        let bell = leftovers.add(name::bell_path(&other));
        // Whole before it takes the name, as a creator's is.
        let made = leftovers.add(own_path());
        std::fs::write(&made, live_header()).unwrap();
        std::fs::rename(&made, &seg).unwrap();
        std::fs::write(&bell, b"").unwrap();
        let file = |p: &Path| p.file_name().unwrap().to_str().unwrap().to_owned();
        // At most one: another test binary's sweep may take `live_one`.
        let listed = [file(&seg), file(&bell), file(&live_one)];
        assert!(reclaim_drafts(&listed) <= 1);
        assert!(privates(&name).is_empty());
        assert!(seg.exists(), "a segment's name is no private name");
        assert!(bell.exists(), "a doorbell's name is no private name");
    }

    /// A segment file's first bytes, with a header naming a new instance
    /// of this process.
    fn live_header() -> Vec<u8> {
        use crate::layout::{H_MAGIC, H_PID, H_SERIAL, H_START, MAGIC};
        let (pid, start) = live::me();
        let mut h = vec![0u8; 64];
        h[H_MAGIC..H_MAGIC + 8].copy_from_slice(&MAGIC.to_ne_bytes());
        h[H_PID..H_PID + 4].copy_from_slice(&pid.to_ne_bytes());
        h[H_START..H_START + 8].copy_from_slice(&start.to_ne_bytes());
        h[H_SERIAL..H_SERIAL + 8].copy_from_slice(&live::serial().to_ne_bytes());
        h
    }

    /// A private file whose creator died after linking it holds the real
    /// name too: the sweep removes the private name only.
    #[test]
    fn a_linked_private_file_loses_only_its_private_name() {
        let name = fresh();
        let made = create_segment(&name, g(), header).unwrap();
        let private = own_path();
        std::fs::hard_link(live::seg_path(&name), &private).unwrap();
        assert!(!remove_draft(&private), "locked while its owner runs");
        drop(made);
        assert!(remove_draft(&private));
        assert!(live::seg_path(&name).exists());
        live::unlink_files(&name);
    }

    /// A draft is locked as soon as made, and its private name goes
    /// with it. A sweep that took the new file before its creator's lock
    /// — its exclusive lock still held, or the file already unlinked —
    /// makes the creator give it up (and start again).
    #[test]
    fn a_draft_taken_by_a_sweep_is_given_up() {
        let name = fresh();
        // `None`: another test binary's sweep took it before our lock.
        let d = loop {
            if let Some(d) = draft(&name, g().bytes()).unwrap() {
                break d;
            }
        };
        assert!(!remove_draft(&d.path.0), "locked from its making");
        drop(d);
        assert!(privates(&name).is_empty(), "a dropped draft goes");

        let path = own_path();
        std::fs::write(&path, [0u8; 64]).unwrap();
        let creator = File::open(&path).unwrap();
        let sweep = File::open(&path).unwrap();
        flock(&sweep, FlockOperation::NonBlockingLockExclusive).unwrap();
        assert!(!lock_new(&creator, &path).unwrap(), "the sweep's lock");
        std::fs::remove_file(&path).unwrap();
        drop(sweep);
        assert!(!lock_new(&creator, &path).unwrap(), "unlinked meanwhile");
        let path = own_path();
        std::fs::write(&path, [0u8; 64]).unwrap();
        let creator = File::open(&path).unwrap();
        assert!(lock_new(&creator, &path).unwrap());
        assert!(!remove_draft(&path));
        drop(creator);
        assert!(remove_draft(&path));
    }

    /// Two opens under one name at once: exactly one gets it, the other
    /// `AddrInUse`, and no private file is left.
    #[test]
    fn of_two_concurrent_creators_one_wins() {
        for _ in 0..20 {
            let name = fresh();
            let barrier = std::sync::Barrier::new(2);
            let (a, b) = std::thread::scope(|s| {
                let one = || {
                    barrier.wait();
                    create_segment(&name, g(), header)
                };
                let a = s.spawn(one);
                let b = s.spawn(one);
                (a.join().unwrap(), b.join().unwrap())
            });
            let (won, lost) = match (a, b) {
                (Ok(m), Err(e)) | (Err(e), Ok(m)) => (m, e),
                other => panic!("not one winner: {other:?}"),
            };
            assert_eq!(lost, Error::AddrInUse);
            assert!(live::is_under(&won.held, &live::seg_path(&name)));
            assert!(privates(&name).is_empty());
            drop(won);
            live::unlink_files(&name);
        }
    }
}
