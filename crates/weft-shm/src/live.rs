//! Whether a process is alive: its pid and its start time (field 22 of
//! `/proc/<pid>/stat`, clock ticks since boot), so a pid reused by a new
//! process is not mistaken for the old one. Segment headers and channel
//! claims record both; see `docs/design.md`, "The shm provider".
//!
//! Also the clean-up of segments that crashed runs left behind.

use rustix::process::Pid;

use crate::layout::{H_MAGIC, H_PID, H_SERIAL, H_START, H_VERSION, MAGIC, VERSION};
use crate::name::{bell_path, seg_name, BELL_PREFIX, SEG_PREFIX, SHM_DIR, TMP_PREFIX};
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
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces, parentheses and bytes
    // that are not UTF-8 (it is the file name the process ran, or what
    // it set): the fields after the last ')' are fixed, and ASCII. Read
    // as a string whole, such a name made the process unknown to
    // `/proc`, judged by its pid alone (a reused pid ran, a zombie ran).
    let after = s.get(s.iter().rposition(|&b| b == b')')? + 1..)?;
    let mut rest = std::str::from_utf8(after).ok()?.split_ascii_whitespace();
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

/// What a test of a segment file's lock found ([`held_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Some live process holds it.
    Yes,
    /// Nobody does, or the file is not the instance's asked about (gone,
    /// no valid header, another instance's).
    No,
    /// The test failed for a passing reason ([`transient`]: `EMFILE`,
    /// `ENFILE`, `ENOMEM`, `ENOLCK`, `EINTR`, `EAGAIN`, `EIO`): nothing
    /// learnt. A caller deciding whether a peer died keeps it this
    /// round. A lasting failure (`EACCES`, say) is [`Held::No`]: kept as
    /// `Unknown`, a dead peer's record, operations and channel would
    /// stay for ever.
    Unknown,
}

/// The failures that may go away by themselves ([`transient`]).
const TRANSIENT: [rustix::io::Errno; 7] = {
    use rustix::io::Errno;
    [
        Errno::MFILE,
        Errno::NFILE,
        Errno::NOMEM,
        Errno::NOLCK,
        Errno::INTR,
        Errno::AGAIN,
        Errno::IO,
    ]
};

/// Whether `e` may go away by itself (a want of resources, an
/// interrupted call, an I/O error), so that a test failing with it says
/// nothing ([`Held::Unknown`]); any other failure lasts and is taken as
/// an answer.
pub fn transient(e: &std::io::Error) -> bool {
    let Some(raw) = e.raw_os_error() else {
        return false;
    };
    TRANSIENT.iter().any(|x| x.raw_os_error() == raw)
}

/// [`Held`] of a failed test.
fn failed(e: &std::io::Error) -> Held {
    if transient(e) {
        Held::Unknown
    } else {
        Held::No
    }
}

/// A non-blocking exclusive test lock on `f`, let go at once when taken.
/// Taken on a file under a real name only: its creator took its shared
/// lock on it under a private name, before linking it under the real
/// one (`create::create_segment`), so the test never makes that fail.
///
/// An exclusive lock refused is not yet an owner: another process may
/// hold its own exclusive test lock — a prober here for an instant, or
/// a remover inside [`remove_if`] until it unlinks the file. A shared
/// test lock tells an owner from those ([`shared_test`]).
fn lock_test(f: &std::fs::File) -> Held {
    use rustix::fs::{flock, FlockOperation};
    match flock(f, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {
            let _ = flock(f, FlockOperation::Unlock);
            Held::No
        }
        Err(rustix::io::Errno::WOULDBLOCK) => shared_test(f),
        Err(e) => failed(&e.into()),
    }
}

/// After an exclusive test lock on `f` was refused: refused too,
/// somebody holds it exclusively — a prober's or a remover's test lock —
/// which they got only once nobody held it shared: the owner let go,
/// [`Held::No`]. An owner never takes its lock again once it let go (the
/// kernel dropped it with the process, or the endpoint closed). Taken,
/// only shared holders remain — the owner's lock, taken when it made the
/// file (`create::Made::held`) — so [`Held::Yes`],
/// unless the file was unlinked meanwhile: the exclusive holder may have
/// been a remover that unlinked it and let go between our two locks, and
/// an unlinked file is nobody's segment (an owner unlinks its own only
/// at close).
fn shared_test(f: &std::fs::File) -> Held {
    use rustix::fs::{flock, FlockOperation};
    use std::os::unix::fs::MetadataExt;
    match flock(f, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = flock(f, FlockOperation::Unlock);
            match f.metadata() {
                Ok(m) if m.nlink() == 0 => Held::No,
                Ok(_) => Held::Yes,
                Err(e) => failed(&e),
            }
        }
        Err(rustix::io::Errno::WOULDBLOCK) => Held::No,
        Err(e) => failed(&e.into()),
    }
}

/// Whether the endpoint instance `inst` (pid, start time, serial), which
/// had or has the name `name`, may still run: its pid and start time say
/// so in this pid namespace, or its lock on its own segment does (it may
/// live in another pid namespace, where the pid names nobody or somebody
/// else), or the lock could not be tested ([`Held::Unknown`]: a live
/// peer is not declared dead for want of a file descriptor).
///
/// The pid path does not look at the serial: another endpoint of a
/// running process runs by it, closed or not. What tells a closed
/// instance of a running process is elsewhere: its header's pid cleared
/// at close (`Peer::alive`, `alive_now` read the mapping) and its file
/// unlinked (`Peers::gone_from_name`). The serial counts on the lock
/// path only: the lock counts only while the segment file under `name`
/// is still `inst`'s — once a new endpoint holds the name (a process
/// restarted after a crash), the lock is that one's and says nothing of
/// `inst` (`docs/design.md`, "The shm provider").
pub fn owner_runs(name: &str, inst: Instance) -> bool {
    alive(inst.0, inst.1) || held_by(name, inst) != Held::No
}

/// Whether `name`'s segment file is `inst`'s own — its header names that
/// instance — and some live process holds it (its owner's shared lock,
/// taken when it made the file: `create::Made::held`). A missing
/// file, something not a regular file ([`open_regular`]), a header
/// naming another instance (or none), or a lasting
/// failure to look (`EACCES`) is [`Held::No`]; a passing one
/// ([`transient`]) is [`Held::Unknown`].
pub fn held_by(name: &str, inst: Instance) -> Held {
    match open_regular(&seg_path(name)) {
        Ok(Some(f)) => held_by_file(&f, inst),
        Ok(None) => Held::No,
        Err(e) => failed(&e),
    }
}

/// Opens the file at `path` for reading, if it is a regular file:
/// `Ok(None)` when something else is there — a FIFO, a socket, a
/// directory, a symbolic link, put there by hand or by another process
/// of the user — which is none of ours and is left as it is. The open
/// neither waits (`O_NONBLOCK`: a FIFO without a writer would block a
/// plain open for reading until one came, hanging a sweep or a domain's
/// open) nor follows a link (`O_NOFOLLOW`: our lock tests and removals
/// are of the file under the name, not of whatever it points at).
/// Every open of a segment or private file by its path goes through
/// here.
pub fn open_regular(path: &std::path::Path) -> std::io::Result<Option<std::fs::File>> {
    use rustix::fs::OFlags;
    use std::os::unix::fs::OpenOptionsExt;
    let flags = (OFlags::NONBLOCK | OFlags::NOFOLLOW).bits() as i32;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if rustix::io::Errno::from_io_error(&e).is_some_and(crate::segment::not_a_file) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    Ok(f.metadata()?.file_type().is_file().then_some(f))
}

/// [`held_by`] of an open segment file: the header and the lock are read
/// through it, so both are of the same segment even if the name changes
/// hands meanwhile.
pub fn held_by_file(f: &std::fs::File, inst: Instance) -> Held {
    match read_instance(f) {
        Ok(Some(i)) if i == inst => lock_test(f),
        Ok(_) => Held::No,
        Err(e) => failed(&e),
    }
}

/// The end of the last header word [`read_instance`] reads, wherever
/// the layout puts them: a word past the bytes read would make every
/// header look invalid.
const INSTANCE_END: usize = {
    let ends = [H_MAGIC + 8, H_PID + 4, H_START + 8, H_SERIAL + 8];
    let mut end = 0;
    let mut i = 0;
    while i < ends.len() {
        if ends[i] > end {
            end = ends[i];
        }
        i += 1;
    }
    end
};

/// The instance a segment file's header names (`H_PID`, `H_START`,
/// `H_SERIAL`); `Ok(None)` when the header is not (yet) valid (too short
/// a file, or no magic). Read at offset 0 whatever the file's position.
pub(crate) fn read_instance(f: impl std::os::fd::AsFd) -> std::io::Result<Option<Instance>> {
    let mut h = [0u8; INSTANCE_END];
    let mut got = 0;
    while got < h.len() {
        let at = u64::try_from(got).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        match rustix::io::pread(&f, &mut h[got..], at) {
            Ok(0) => return Ok(None),
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let u64_at = |o: usize| h.get(o..o + 8)?.try_into().ok().map(u64::from_ne_bytes);
    let u32_at = |o: usize| h.get(o..o + 4)?.try_into().ok().map(u32::from_ne_bytes);
    Ok((u64_at(H_MAGIC) == Some(MAGIC))
        .then(|| Some((u32_at(H_PID)?, u64_at(H_START)?, u64_at(H_SERIAL)?)))
        .flatten())
}

/// The instance the segment file under `name` names now: the endpoint
/// that holds the name, or held it last. `None` also when the file
/// cannot be read.
pub fn instance_of_name(name: &str) -> Option<Instance> {
    read_instance(&open_regular(&seg_path(name)).ok()??).ok()?
}

/// [`instance_of_name`], once the endpoint is ready to be sent to: its
/// doorbell made and its version (`H_VERSION`) stored, the last word of
/// its header, after the file took its name (`EpShared::open`). Our
/// version only: another version's segment is never ready to us
/// (`ring::header_geometry` refuses it), whatever it stored.
pub fn ready_instance_of_name(name: &str) -> Option<Instance> {
    use std::os::unix::fs::FileExt;
    let f = open_regular(&seg_path(name)).ok()??;
    let inst = read_instance(&f).ok()??;
    let mut v = [0u8; 4];
    f.read_exact_at(&mut v, H_VERSION as u64).ok()?;
    (u32::from_ne_bytes(v) == VERSION).then_some(inst)
}

/// The owner a mapped segment's header names.
pub fn owner_of(seg: &Segment) -> Option<(u32, u64)> {
    use std::sync::atomic::Ordering::Acquire;
    (seg.load64(H_MAGIC, Acquire)? == MAGIC)
        .then(|| Some((seg.load32(H_PID, Acquire)?, seg.load64(H_START, Acquire)?)))
        .flatten()
}

/// Removes `name`'s segment and doorbell if `stale` says so of the
/// segment file now under the name (given the instance its header names,
/// if valid) and nobody holds that file: every removal of a segment not
/// our own goes through here. The header is looked at first, so the
/// test lock is only taken on a file that looks left behind. The test
/// lock is then kept until the
/// file is unlinked, and the name checked to still be that file: two
/// processes removing one name at once (say, two endpoints restarting
/// under it) cannot both remove — the second would unlink the first's
/// new segment — since whoever takes the lock second finds it held, or
/// finds the name moved on. Something under the name that is not a
/// regular file (a FIFO, a link: [`open_regular`]) is no segment of
/// ours and is left, `NotStale`, without waiting on it. What it did
/// ([`Removal`]); an error opening the file other than its absence is
/// returned as it is.
///
/// Only the real name goes: a creator that died between its link and
/// the removal of its private name (`create::create_segment`) leaves
/// the file under that private name too, which the next sweep removes
/// (`create::reclaim_drafts`: nobody holds it).
pub fn remove_if(name: &str, stale: impl Fn(Option<Instance>) -> bool) -> std::io::Result<Removal> {
    let path = seg_path(name);
    let f = match open_regular(&path) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(Removal::NotStale),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Removal::Gone),
        Err(e) => return Err(e),
    };
    let judge = || {
        let Ok(inst) = read_instance(&f) else {
            return false;
        };
        stale(inst)
    };
    if !judge() {
        return Ok(Removal::NotStale);
    }
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        // Refused: another process's exclusive test lock (a remover's,
        // or a prober's for an instant), or a shared one (its owner,
        // alive in another pid namespace — or, an instant, a prober's
        // shared test after its exclusive one was refused).
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let held = shared_test(&f);
            // Unlinked or replaced meanwhile (a remover finished):
            // the name is free, or another file's.
            if !is_under(&f, &path) {
                return Ok(Removal::Gone);
            }
            return Ok(match held {
                Held::No => Removal::Busy,
                Held::Yes => Removal::Held,
                Held::Unknown => Removal::NotStale,
            });
        }
        Err(_) => return Ok(Removal::NotStale),
    }
    // Under the lock: still the file under the name, and still stale
    // (judged again, as the file was: cheap, and a file written in place
    // by an older version's creator may have got its header meanwhile).
    if !is_under(&f, &path) {
        return Ok(Removal::Gone);
    }
    if !judge() {
        return Ok(Removal::NotStale);
    }
    // While the segment is still there, no new endpoint can take the
    // name (its create fails, and its take-over finds our lock), so the
    // doorbell removed first is not a new one's.
    unlink_files(name);
    Ok(Removal::Removed)
}

/// Removes `name`'s doorbell, then its segment: in that order, so that
/// no new endpoint can have taken the name (and made its own doorbell)
/// before the doorbell goes. For a caller that knows both are its to
/// remove.
pub fn unlink_files(name: &str) {
    let _ = std::fs::remove_file(bell_path(name));
    Segment::unlink(&seg_name(name));
}

/// Whether `f` is the file now at `path` (same device and inode): not
/// unlinked, nor replaced by another. `false` when either cannot be
/// looked at.
pub fn is_under(f: &std::fs::File, path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// What [`remove_if`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// It removed the segment file under the name (and its doorbell).
    Removed,
    /// The file under the name is not stale (or its lock could not be
    /// tested, [`Held::Unknown`]): left alone.
    NotStale,
    /// The file under the name was judged stale, but its
    /// exclusive lock was refused and a shared one then taken: its owner
    /// holds it (alive in another pid namespace) — or, for an instant,
    /// a prober did (`lock_test`) and let go between our two locks. An
    /// owner's lock lasts, a probe's does not: a caller that must have
    /// the name tries again a few times before giving up on it.
    Held,
    /// Another process holds the file's exclusive lock: a remover,
    /// between its lock and its unlink (the name is free in a moment),
    /// or, for an instant, a prober (`lock_test`; the file stays).
    /// Either way, trying again soon tells more.
    Busy,
    /// No file under the name, or no longer the one it looked at.
    Gone,
}

/// Whether an endpoint opening under a name may take over the segment
/// file there (`create::create_segment`): its owner is dead, or it has
/// no valid header (`remove_if` then checks that nobody holds it). A
/// creator gives its file its whole header before the file takes the
/// name (`create::create_segment`), so a file under a name without one
/// is none of ours in the making: an older version's — made in place,
/// which took its lock before writing its header, so held if its
/// creator runs, save in the instant between its create and its lock —
/// or a damaged one. No age rule. The sweep does not remove the second
/// kind ([`owner_dead`]).
pub fn abandoned(inst: Option<Instance>) -> bool {
    inst.is_none_or(|(pid, start, _)| !alive(pid, start))
}

/// Whether the sweep ([`reclaim_stale`]) may remove a segment file: its
/// header names an owner that is dead (`remove_if` then checks that
/// nobody holds it). A file without a valid header is left to an open
/// under its name, which takes it over ([`abandoned`]): it may be an
/// older version's creator's (layout 6 and before), made in place under
/// the name, in the instant between its create and its lock, in which
/// nothing in the file or its lock tells it from one whose creator
/// died. A sweep runs in every process that opens a domain, for every
/// name, so it would break that creator's open — which then fails, or
/// in the narrowest case succeeds with a segment under no name, which
/// no peer can reach — though the two builds never meant to meet; an
/// open under the same name meets only a creator of that very name,
/// one of the two bound to lose it (`docs/design.md`, "Making a
/// segment").
pub fn owner_dead(inst: Option<Instance>) -> bool {
    inst.is_some_and(|(pid, start, _)| !alive(pid, start))
}

/// Removes `name`'s segment and doorbell if the files still belong to
/// the gone instance `inst` — serial included: the same process may
/// have opened a new endpoint under the name since, or a new process
/// taken it.
///
/// Tried a second time if the first met another process's lock
/// (`Busy`, `Held`): a probe's lasts an instant, and the segment would
/// otherwise stay until some process's next [`reclaim_stale`]. No
/// wait: this runs on the sweep, and a remover's lock ends with its
/// unlink, which is the outcome wanted anyway.
pub fn remove_if_owned(name: &str, inst: Instance) {
    let owned = |i: Option<Instance>| i == Some(inst);
    let mut r = remove_if(name, owned);
    if let Ok(Removal::Busy | Removal::Held) = r {
        std::thread::yield_now();
        r = remove_if(name, owned);
    }
    if let Ok(Removal::Removed) = r {
        tracing::debug!(name, pid = inst.0, "shm: removed a dead peer's segment");
    }
}

/// Removes the segments (and doorbells) in `/dev/shm` whose headers name
/// a dead owner, if nobody holds them ([`owner_dead`]: a file without a
/// valid header is left to an open under its name); the private
/// files of segments being made whose creators died
/// (`create::reclaim_drafts`); and doorbells whose segment is gone. Run
/// once per process, when its first shm domain opens. Returns how many
/// segments it removed (private files not counted).
///
/// The directory is listed once, and the three passes work from that
/// listing: what appears after it waits for the next sweep. Each
/// segment and private file is looked at anew when its turn comes —
/// opened, locked and compared by device and inode with what is under
/// the name then, a segment also judged by its header — so one that
/// changed hands or went since the listing is judged as it is then, or
/// skipped. A doorbell is not opened, locked nor compared: it is
/// unlinked by its name if nothing is under its segment's name when
/// its turn comes (`reclaim_bells`, which says what window that
/// leaves).
pub fn reclaim_stale() -> usize {
    let names = shm_names();
    let drafts = crate::create::reclaim_drafts(&names);
    let mut removed = 0;
    for name in names.iter().filter_map(|f| f.strip_prefix(SEG_PREFIX)) {
        // Noted only to say why such a file stays; `stale` runs once
        // for it (`remove_if` judges again only what it found stale).
        let headerless = std::cell::Cell::new(false);
        let stale = |inst: Option<Instance>| {
            headerless.set(inst.is_none());
            owner_dead(inst)
        };
        match remove_if(name, stale) {
            Ok(Removal::Removed) => removed += 1,
            _ if headerless.get() => tracing::debug!(
                name,
                "shm: a segment file without a valid header left to an open under its name"
            ),
            _ => {}
        }
    }
    reclaim_bells(&names);
    if removed > 0 || drafts > 0 {
        tracing::info!(removed, drafts, "shm: reclaimed segments of dead processes");
    }
    removed
}

/// The names in `/dev/shm` that start with one of our prefixes
/// (segments, private files, doorbells all start `weft-shm`); none when
/// it cannot be listed. A name that is not UTF-8 is none of ours.
pub(crate) fn shm_names() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    let ours = [SEG_PREFIX, TMP_PREFIX, BELL_PREFIX];
    dir.flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|f| ours.iter().any(|p| f.starts_with(p)))
        .collect()
}

/// Removes the doorbells among `names` whose segment is gone. A running
/// endpoint's segment is under its name from before its doorbell is
/// made (the segment takes the name, then the doorbell is made) until
/// after it is removed (closing removes the doorbell first): a doorbell
/// seen with no segment is no running endpoint's, whatever its age. A
/// window of a few system calls remains — a whole endpoint creation
/// (segment, doorbell) between our look at the segment and our unlink —
/// in which we would remove the new endpoint's doorbell
/// (`docs/design.md`, "Stale segments").
fn reclaim_bells(names: &[String]) {
    for name in names.iter().filter_map(|f| f.strip_prefix(BELL_PREFIX)) {
        // Not `exists`, which follows a symbolic link: what is under
        // the segment's name is looked at as everywhere else here.
        let gone = matches!(
            std::fs::symlink_metadata(seg_path(name)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound
        );
        if gone {
            let _ = std::fs::remove_file(bell_path(name));
        }
    }
}

#[cfg(test)]
mod tests;
