//! Tests of `live`: liveness, lock tests, removals and the sweep.

use super::*;
use crate::test_fifo::{without_waiting_on, Fifo};
use crate::test_files::Leftovers;
use std::time::{Duration, Instant};

/// A child process killed and reaped when dropped, whatever the test's
/// outcome: a failed assertion would otherwise leave it running.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let mut child = Child(
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let start = start_time(pid).unwrap();
    assert!(alive(pid, start));
    // SIGKILL, not reaped (`wait` below does).
    child.0.kill().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while stat(pid).map(|s| s.0) != Some(b'Z') {
        assert!(Instant::now() < until, "no zombie");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(start_time(pid), Some(start), "its pid and start remain");
    assert!(!alive(pid, start));
    child.0.wait().unwrap();
    assert!(!alive(pid, start));
}

/// A process whose command name (the file name it ran) holds bytes that
/// are not UTF-8, a ')' and a space is still known to `/proc`: told
/// from a reused pid by its start time, and dead once a zombie — not
/// judged by its pid alone.
#[test]
fn a_process_whose_name_is_not_utf8_is_known() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let dir = std::env::temp_dir().join(format!("weft-live-test-{}", crate::name::unique()));
    std::fs::create_dir(&dir).unwrap();
    let exe = dir.join(std::ffi::OsStr::from_bytes(b"sl\xffep) x"));
    // `sleep` as `a_zombie_is_not_alive` runs it: from the `PATH`.
    let sleep = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join("sleep"))
        .find(|p| p.is_file())
        .unwrap();
    std::os::unix::fs::symlink(sleep, &exe).unwrap();
    // The command name is the file name run; `argv[0]` stays `sleep`,
    // for a multi-call binary that dispatches on it.
    let mut child = Child(
        std::process::Command::new(&exe)
            .arg0("sleep")
            .arg("30")
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let raw = std::fs::read(format!("/proc/{pid}/stat")).unwrap();
    assert!(std::str::from_utf8(&raw).is_err(), "the name as run");
    let start = start_time(pid).unwrap();
    assert!(alive(pid, start));
    assert!(!alive(pid, start + 1), "a reused pid is another process");
    child.0.kill().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while stat(pid).map(|s| s.0) != Some(b'Z') {
        assert!(Instant::now() < until, "no zombie");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(!alive(pid, start), "a zombie");
    child.0.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
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

/// A file outside `/dev/shm`'s segment prefix, so that no shm domain
/// opening meanwhile (another test binary's `reclaim_stale`) takes
/// it for a dead owner's segment and removes it.
fn temp_file(bytes: &[u8]) -> (std::path::PathBuf, std::fs::File) {
    // `/dev/shm`, not `temp_dir()`: a `TMPDIR` on a file system
    // without `flock` (some container storage) would fail the locks.
    let path =
        std::path::Path::new(SHM_DIR).join(format!("weft-live-test-{}", crate::name::unique()));
    std::fs::write(&path, bytes).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    (path, f)
}

/// A segment file under a fresh name whose header names a new
/// instance of this process (so no other test binary's
/// `reclaim_stale` removes it): the name, its path, the instance.
fn own_segment() -> (String, std::path::PathBuf, Instance) {
    let name = format!("live-test-{}", crate::name::unique());
    let path = seg_path(&name);
    let (pid, start) = me();
    let inst = (pid, start, serial());
    std::fs::write(&path, header(inst)).unwrap();
    (name, path, inst)
}

/// Takes `f`'s exclusive lock, as a remover between its test and its
/// unlink holds it.
fn lock_out(f: &std::fs::File) {
    rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
}

fn hold_file(path: &std::path::Path) -> std::fs::File {
    let f = std::fs::File::open(path).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockShared).unwrap();
    f
}

/// `remove_if(name, stale)` on a file nobody holds, tried again for up
/// to 5 s while it meets another process's lock: another test binary's
/// sweep may be removing the same file (`Busy`, between its lock and
/// its unlink), or have taken its shared test lock for an instant after
/// its exclusive one was refused (`Held`). What it last said.
fn remove_meeting_sweeps(name: &str, stale: impl Fn(Option<Instance>) -> bool) -> Removal {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let r = remove_if(name, &stale).unwrap();
        if !matches!(r, Removal::Busy | Removal::Held) || Instant::now() >= until {
            return r;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The paths among `paths` still there after up to 5 s of waiting for
/// them all to go: another test binary's sweep, between its lock and
/// its unlink when ours met it, removes them in a moment.
fn left_after_sweeps(paths: &[std::path::PathBuf]) -> Vec<&std::path::PathBuf> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = paths
            .iter()
            .filter(|p| {
                !matches!(std::fs::symlink_metadata(p),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound)
            })
            .collect();
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The lock says whether the owner runs where its pid cannot: here
/// the header names a pid that is not running, as a process in
/// another pid namespace would look.
#[test]
fn a_held_segment_runs_whatever_its_pid_says() {
    let inst = (u32::MAX, 0, 5);
    let (path, f) = temp_file(&header(inst));
    assert!(!alive(inst.0, inst.1));
    assert_eq!(held_by_file(&f, inst), Held::No);
    assert_eq!(read_instance(&f).unwrap(), Some(inst));
    let h = hold_file(&path);
    assert_eq!(held_by_file(&f, inst), Held::Yes);
    // Another holder of a shared lock does not make it look free.
    let h2 = hold_file(&path);
    drop(h);
    assert_eq!(held_by_file(&f, inst), Held::Yes);
    drop(h2);
    assert_eq!(
        held_by_file(&f, inst),
        Held::No,
        "the kernel lets go with the file"
    );
    // A lasting failure to look (here the header cannot be read
    // through a write-only file) is an answer: else a dead peer's
    // record would stay for ever.
    let unreadable = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    assert_eq!(held_by_file(&unreadable, inst), Held::No);
    // A missing file is not held either.
    assert_eq!(held_by("live-test-no-such-segment", inst), Held::No);
    assert!(!owner_runs("live-test-no-such-segment", inst));
    std::fs::remove_file(&path).unwrap();
}

/// A crashed instance's name taken by a new endpoint (its own segment
/// file under the name, held): the lock is the new one's, and says
/// nothing of the old instance — nor of another serial of the same
/// pid — which is dead to us; the new one runs.
#[test]
fn a_name_held_by_another_instance_does_not_keep_the_old_one_running() {
    let old = (u32::MAX, 7, 1);
    let new = (u32::MAX - 1, 8, 1);
    let (old_path, old_f) = temp_file(&header(old));
    let h = hold_file(&old_path);
    assert_eq!(held_by_file(&old_f, old), Held::Yes);
    drop(h);
    // The old one died; the new one made its own file, and holds it.
    let (path, f) = temp_file(&header(new));
    let h = hold_file(&path);
    assert_eq!(lock_test(&f), Held::Yes, "the file alone looks held");
    assert_eq!(held_by_file(&f, old), Held::No, "the old instance is dead");
    assert_eq!(held_by_file(&f, new), Held::Yes);
    assert_eq!(
        held_by_file(&f, (new.0, new.1, 2)),
        Held::No,
        "another endpoint of the same process, on the lock path"
    );
    // A file with no valid header yet (its creator is still writing
    // it) names nobody.
    std::fs::write(&path, [0u8; 64]).unwrap();
    assert_eq!(held_by_file(&f, new), Held::No);
    assert_eq!(read_instance(&f).unwrap(), None);
    drop(h);
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&old_path).unwrap();
}

/// The pid path does not look at the serial: another endpoint of a
/// running process runs by it, whether or not any segment file names
/// it (a closed instance of a running process is told by its header's
/// pid, cleared at close, and its file gone — not here).
#[test]
fn the_pid_path_ignores_the_serial() {
    let (pid, start) = me();
    let none = "live-test-no-such-segment";
    assert_eq!(held_by(none, (pid, start, u64::MAX)), Held::No);
    assert!(owner_runs(none, (pid, start, u64::MAX)));
    assert!(!owner_runs(none, (pid, start + 1, 1)), "another process");
}

/// A header-less segment file (64 zero bytes) under a fresh real name,
/// with a doorbell beside it, held (shared lock) before it takes the
/// name: a take-over by another test, or the sweep of a build before
/// the sweep left such files, would remove it at once otherwise. No
/// sweep of this build removes a header-less file, so the returned
/// guard removes both whatever the test's outcome.
fn plant_held_headerless() -> (String, std::path::PathBuf, Leftovers, std::fs::File) {
    let name = format!("live-test-{}", crate::name::unique());
    let mut leftovers = Leftovers::default();
    let path = leftovers.add(seg_path(&name));
    leftovers.add(bell_path(&name));
    let (made, _) = temp_file(&[0u8; 64]);
    leftovers.add(&made);
    let h = hold_file(&made);
    std::fs::rename(&made, &path).unwrap();
    std::fs::write(bell_path(&name), b"").unwrap();
    (name, path, leftovers, h)
}

/// A file under a real name without a valid header is no creator's
/// in the making (they link theirs whole): abandoned to a take-over
/// under the name at once, whatever its age, and removed unless
/// somebody holds it — an older version's creator, which locked its
/// file before writing its header.
#[test]
fn a_headerless_segment_goes_at_once_unless_held() {
    assert!(abandoned(None));
    let (pid, start) = me();
    assert!(!abandoned(Some((pid, start, 1))));
    assert!(abandoned(Some((u32::MAX, 0, 1))));
    let (name, path, _leftovers, h) = plant_held_headerless();
    assert_eq!(remove_if(&name, abandoned).unwrap(), Removal::Held);
    assert!(path.exists(), "held: its creator runs");
    drop(h);
    // Another test binary's sweep (an older build's) may get there
    // first, or be removing it.
    let r = remove_meeting_sweeps(&name, abandoned);
    assert!(matches!(r, Removal::Removed | Removal::Gone), "{r:?}");
    assert!(!path.exists());
    assert!(!std::path::Path::new(&bell_path(&name)).exists());
}

/// The sweep removes only a file whose header names a dead owner: one
/// without a valid header — perhaps an older version's creator's, made
/// in place, in the instant between its create and its lock — is not
/// even lock-tested (`NotStale`), where a take-over under the name
/// judges it stale and finds it held (`Held`). Held here so that the
/// sweep of an older build of these tests, which removes such a file
/// when nobody holds it, does not take it meanwhile.
#[test]
fn the_sweep_leaves_a_headerless_segment_to_a_take_over() {
    let (pid, start) = me();
    assert!(!owner_dead(None), "no header: not the sweep's");
    assert!(!owner_dead(Some((pid, start, 1))));
    assert!(owner_dead(Some((u32::MAX, 0, 1))));
    let (name, path, _leftovers, h) = plant_held_headerless();
    assert_eq!(remove_if(&name, owner_dead).unwrap(), Removal::NotStale);
    assert_eq!(remove_if(&name, abandoned).unwrap(), Removal::Held);
    reclaim_stale();
    assert!(path.exists());
    assert!(
        std::path::Path::new(&bell_path(&name)).exists(),
        "its segment is there"
    );
    // The same file with a header naming a dead owner is the sweep's,
    // once nobody holds it.
    std::fs::write(&path, header((u32::MAX, 0, 1))).unwrap();
    assert_eq!(remove_if(&name, owner_dead).unwrap(), Removal::Held);
    drop(h);
    // Now every sweep's: another test binary's may get there first, or
    // be between its lock and its unlink (`Busy`) when we look.
    let r = remove_meeting_sweeps(&name, owner_dead);
    assert!(matches!(r, Removal::Removed | Removal::Gone), "{r:?}");
    assert!(!path.exists());
    assert!(!std::path::Path::new(&bell_path(&name)).exists());
}

/// The sweep itself removes a dead owner's files when nobody holds
/// them, with their doorbells: one killed during its close (its
/// header's pid already cleared to 0, `endpoint.rs`) and one whose pid
/// runs nowhere (as one in another pid namespace would look, dead and
/// unlocked). Another test binary's sweep may remove them first, or be
/// removing one when ours looks (ours then leaves it, `Busy`): all gone
/// in a moment, whoever removed them.
#[test]
fn the_sweep_removes_a_dead_owners_files() {
    let (_, start) = me();
    let mut leftovers = Leftovers::default();
    let mut paths = Vec::new();
    for inst in [(0, start, serial()), (u32::MAX, 0, 1)] {
        assert!(owner_dead(Some(inst)), "{inst:?}");
        let name = format!("live-test-{}", crate::name::unique());
        let path = leftovers.add(seg_path(&name));
        let bell = leftovers.add(bell_path(&name));
        // Whole before it takes the name, as a creator's is; the
        // doorbell after it, as an endpoint makes its own.
        let (made, _) = temp_file(&header(inst));
        leftovers.add(&made);
        std::fs::rename(&made, &path).unwrap();
        std::fs::write(&bell, b"").unwrap();
        paths.extend([path, bell]);
    }
    reclaim_stale();
    let left = left_after_sweeps(&paths);
    assert!(left.is_empty(), "left: {left:?}");
}

/// A file under a real name is ready to be sent to only once its
/// version is stored, after its doorbell is made.
#[test]
fn a_segment_is_ready_once_its_version_is_stored() {
    let (name, path, inst) = own_segment();
    assert_eq!(instance_of_name(&name), Some(inst));
    assert_eq!(ready_instance_of_name(&name), None);
    let mut h = header(inst);
    h[H_VERSION..H_VERSION + 4].copy_from_slice(&crate::layout::VERSION.to_ne_bytes());
    std::fs::write(&path, h).unwrap();
    assert_eq!(ready_instance_of_name(&name), Some(inst));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(ready_instance_of_name(&name), None);
}

/// Only failures that may pass say nothing; lasting ones answer.
#[test]
fn only_passing_failures_are_unknown() {
    use rustix::io::Errno;
    for e in TRANSIENT {
        assert!(transient(&e.into()), "{e:?}");
        assert_eq!(failed(&e.into()), Held::Unknown);
    }
    for e in [
        Errno::ACCESS,
        Errno::PERM,
        Errno::BADF,
        Errno::NOTDIR,
        Errno::OPNOTSUPP,
    ] {
        assert!(!transient(&e.into()), "{e:?}");
        assert_eq!(failed(&e.into()), Held::No);
    }
    assert!(!transient(&std::io::Error::other("no errno")));
}

/// A remover's exclusive lock on a dead instance's file (held from
/// its test to its unlink) is not an owner's: the instance is dead
/// to a concurrent look, not alive.
#[test]
fn a_removers_lock_is_not_an_owner() {
    let inst = (u32::MAX, 0, 9);
    let (path, f) = temp_file(&header(inst));
    let remover = std::fs::File::open(&path).unwrap();
    lock_out(&remover);
    assert_eq!(held_by_file(&f, inst), Held::No);
    drop(remover);
    let h = hold_file(&path);
    assert_eq!(held_by_file(&f, inst), Held::Yes, "an owner's shared lock");
    drop(h);
    std::fs::remove_file(&path).unwrap();
}

/// `remove_if` meeting another remover between its lock and its
/// unlink says `Busy` (the creator retries), and leaves a held file
/// alone. The header names this process, so no other test binary's
/// `reclaim_stale` removes the file meanwhile.
#[test]
fn remove_if_tells_busy_from_held() {
    let (name, path, _) = own_segment();
    let always = |_: Option<Instance>| true;
    let remover = std::fs::File::open(&path).unwrap();
    lock_out(&remover);
    assert_eq!(remove_if(&name, always).unwrap(), Removal::Busy);
    drop(remover);
    let h = hold_file(&path);
    assert_eq!(remove_if(&name, always).unwrap(), Removal::Held);
    assert_eq!(remove_if(&name, abandoned).unwrap(), Removal::NotStale);
    drop(h);
    assert_eq!(remove_if(&name, always).unwrap(), Removal::Removed);
    assert!(!path.exists());
    assert_eq!(remove_if(&name, always).unwrap(), Removal::Gone);
}

/// A remover unlinks the file and lets go between a prober's refused
/// exclusive lock and its shared one: the shared one is then taken on
/// an unlinked file — here while another shared holder keeps the
/// exclusive test refused — which is nobody's segment: not held.
#[test]
fn an_unlinked_file_is_not_held() {
    let inst = (u32::MAX, 0, 11);
    let (path, f) = temp_file(&header(inst));
    let h = hold_file(&path);
    assert_eq!(held_by_file(&f, inst), Held::Yes);
    assert!(is_under(&f, &path));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(held_by_file(&f, inst), Held::No, "unlinked while held");
    assert!(!is_under(&f, &path));
    // Another file under the name now: still not the one we hold.
    std::fs::write(&path, header(inst)).unwrap();
    assert!(!is_under(&f, &path));
    assert_eq!(held_by_file(&f, inst), Held::No);
    drop(h);
    std::fs::remove_file(&path).unwrap();
}

/// `remove_if_owned` leaves a file its owner holds, and removes it
/// once let go; the doorbell goes with it.
#[test]
fn remove_if_owned_removes_only_an_unheld_owned_file() {
    let (name, path, inst) = own_segment();
    let (pid, start, _) = inst;
    std::fs::write(bell_path(&name), b"").unwrap();
    let h = hold_file(&path);
    remove_if_owned(&name, (pid, start, inst.2 + 1));
    remove_if_owned(&name, inst);
    assert!(path.exists(), "held by its owner");
    drop(h);
    remove_if_owned(&name, (pid, start, inst.2 + 1));
    assert!(path.exists(), "another instance's");
    remove_if_owned(&name, inst);
    assert!(!path.exists());
    assert!(!std::path::Path::new(&bell_path(&name)).exists());
}

/// A FIFO under a segment's name or a private name is none of ours:
/// looked at without waiting on it (a plain open for reading blocks
/// until a writer comes), by the sweep too, and left there. A symbolic
/// link under a segment's name is not followed: the file it points at,
/// a dead instance's, is neither judged nor removed.
#[test]
fn what_is_not_a_regular_file_is_left_without_waiting() {
    let name = format!("live-test-{}", crate::name::unique());
    let path = seg_path(&name);
    let private = std::path::Path::new(SHM_DIR).join(format!(
        "{}{name}.{}",
        crate::name::TMP_PREFIX,
        crate::name::unique()
    ));
    let fifo = Fifo::make(&path);
    let private_fifo = Fifo::make(&private);
    without_waiting_on(&[&fifo, &private_fifo], || {
        assert!(open_regular(&path).unwrap().is_none());
        assert_eq!(held_by(&name, (u32::MAX, 0, 1)), Held::No);
        assert_eq!(instance_of_name(&name), None);
        assert_eq!(ready_instance_of_name(&name), None);
        assert_eq!(remove_if(&name, |_| true).unwrap(), Removal::NotStale);
        reclaim_stale();
    });
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&path)
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(std::fs::symlink_metadata(&private).is_ok());
    drop(fifo);
    drop(private_fifo);
    assert!(std::fs::symlink_metadata(&path).is_err());
    assert!(std::fs::symlink_metadata(&private).is_err());

    let dead = (u32::MAX, 0, 13);
    let (target, _f) = temp_file(&header(dead));
    std::os::unix::fs::symlink(&target, &path).unwrap();
    assert!(open_regular(&path).unwrap().is_none());
    assert_eq!(instance_of_name(&name), None, "not followed");
    assert_eq!(remove_if(&name, abandoned).unwrap(), Removal::NotStale);
    assert!(target.exists());
    std::fs::remove_file(&path).unwrap();
    std::fs::remove_file(&target).unwrap();
}
