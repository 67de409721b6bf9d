//! A large CMA message copied by both sides at once (`docs/design.md`,
//! "Split copies"; `docs/wire.md`, "Offer blocks").
//!
//! A CMA message is one copy, made by the receiver with
//! `process_vm_readv` while the sender waits. When the sender can also
//! write the receiver's memory (it read the owner's probe word:
//! `F_SPLIT` on its record) and waits awake, the receiver offers it the
//! message's back part — where in the message it begins and the ranges
//! of the receive's buffers it goes to — in the channel's offer block,
//! then reads the front part itself. The sender takes the offer (a
//! compare-and-swap), writes its part with `process_vm_writev`, and
//! says it is done; the receiver, its part read, revokes an offer not
//! taken (and copies that part too) or waits for one taken. Two cores
//! each copy half: a 1 MiB message in about half the time of one copy.
//!
//! What each side trusts of the other: the receiver reads back only the
//! state word, and keeps what it offered to itself; a sender that writes
//! garbage there breaks the channel's rules. The sender checks every
//! offer against its own message (the part within the bytes it sent, the
//! ranges' lengths adding up to the part) before writing; its local side
//! is its own send buffers, so an offer cannot make it read anything
//! else, and the kernel writes only where the owner named in the owner's
//! own memory. A receive's buffers stay held until the sender's part is
//! done or revoked, or the sender is gone: an honest sender never writes
//! after that (a dishonest one could write the receiver's memory anyway:
//! it passed a probe that needs the same rights).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use bytes::BytesMut;
use smallvec::SmallVec;
use weft_core::sync::lock;

use crate::layout::*;
use crate::pool::POOL_REF_LEN;
use crate::segment::Segment;

/// Messages of at least this many bytes are split when their sender
/// offers (`F_SPLIT`): every CMA message (`cma::CMA_MIN`). Split, a
/// 32 KiB ping-pong in interrupt mode took 0.83-0.85x the time of one
/// copy by the receiver, 64 KiB to 1 MiB 0.5-0.75x (`docs/benchmarks.md`,
/// "Split copies").
pub const SPLIT_MIN: usize = crate::cma::CMA_MIN;

/// The smallest message split: `WEFT_SHM_SPLIT_MIN` (bytes) if set to a
/// number (the benchmark sets it past every size to compare), else
/// [`SPLIT_MIN`].
pub fn split_min() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| crate::cma::env_num("WEFT_SHM_SPLIT_MIN", SPLIT_MIN as u64) as usize)
}

/// Messages of at least this many bytes go by CMA, to be split, even
/// while both sides spin, where the ring's two copies on two cores,
/// pipelined, beat one copy by the receiver (`cma::pays`). Split, the
/// copy is shared too, and beats the ring from 64 KiB (0.8-0.85x the
/// time of a ping-pong through the ring; 1 MiB 0.4-0.8x); at 32 KiB the
/// ring is still ahead (1.04-1.15x) (`docs/benchmarks.md`, "Split
/// copies").
pub const SPIN_MIN: usize = 64 << 10;

/// The smallest message sent by CMA to be split while both sides spin:
/// what [`set_spin_min`] set, else `WEFT_SHM_SPLIT_SPIN_MIN` (bytes) if
/// set to a number, else [`SPIN_MIN`].
pub fn spin_min() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    match SPIN_SET.load(Ordering::Relaxed) {
        0 => *MIN.get_or_init(|| {
            crate::cma::env_num("WEFT_SHM_SPLIT_SPIN_MIN", SPIN_MIN as u64) as usize
        }),
        n => n,
    }
}

/// Sets [`spin_min`] for this process, whatever the environment says:
/// for tests of the ring path while both sides spin, whose process other
/// tests share (`usize::MAX`: the ring at every size).
pub fn set_spin_min(n: usize) {
    SPIN_SET.store(n.max(1), Ordering::Relaxed);
}

/// [`set_spin_min`]'s value; 0 when not set.
static SPIN_SET: AtomicUsize = AtomicUsize::new(0);

/// How long the receiver spins for a taken part before it parks the
/// channel (and looks again at its next passes): a part takes tens of
/// microseconds, and a sender stopped mid-write must not hold the other
/// channels.
pub const SPIN: std::time::Duration = std::time::Duration::from_micros(500);

const _: () = assert!(O_MAX == crate::cma::MAX_RANGES);

/// Sets how long a receiver waits for its offer to be taken before it
/// reads its own part, for this process (zero, the default: it does
/// not wait). For tests that must see a sender write its part: on a
/// loaded machine the sender's thread may be off its core for the whole
/// of the receiver's half, in round after round, and the receiver then
/// revokes every offer. The wait ends as soon as the offer is taken, or
/// settled otherwise; an offer not taken by then is copied by the
/// receiver as always.
pub fn set_take_grace(d: std::time::Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    TAKE_GRACE_NS.store(ns, Ordering::Relaxed);
}

/// [`set_take_grace`]'s value in nanoseconds; 0 when not set.
static TAKE_GRACE_NS: AtomicU64 = AtomicU64::new(0);

/// Owner: waits out [`set_take_grace`]'s time while the offer about the
/// record ending at `end` is neither taken nor settled. Not on any path
/// unless a test set it.
pub fn await_take(seg: &Segment, g: Geometry, i: usize, end: u64) {
    let ns = TAKE_GRACE_NS.load(Ordering::Relaxed);
    if ns == 0 {
        return;
    }
    let until = std::time::Instant::now() + std::time::Duration::from_nanos(ns);
    while outcome(state(seg, g, i), end) == Outcome::Offered && std::time::Instant::now() < until {
        // The sender may need this core.
        std::thread::yield_now();
    }
}

/// The part of a message offered to its sender: where in the message it
/// begins, and the ranges (address, length) of the receiver's memory it
/// goes to, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    pub at: u64,
    pub ranges: SmallVec<[(u64, u64); O_MAX]>,
    /// The receiver's shared pool holding every range, if one does.
    pub pool: Option<crate::pool::PoolRef>,
}

impl Offer {
    /// The part of a receive's buffers `bufs` from byte `at` to byte
    /// `end` of their concatenation, if it lies in at most [`O_MAX`]
    /// ranges.
    pub fn of(bufs: &[BytesMut], at: usize, end: usize) -> Option<Offer> {
        let lens: SmallVec<[usize; O_MAX]> = bufs.iter().map(|b| b.len()).collect();
        if lens.len() > O_MAX || at >= end {
            return None;
        }
        let ranges = crate::cma::pieces(&lens, at, end - at)
            .into_iter()
            .map(|(i, off, k)| ((bufs[i].as_ptr() as usize + off) as u64, k as u64))
            .collect::<SmallVec<[(u64, u64); O_MAX]>>();
        let len: u64 = ranges.iter().map(|r| r.1).sum();
        let pool = crate::pool::lookup(&ranges);
        (len == (end - at) as u64).then_some(Offer {
            at: at as u64,
            ranges,
            pool,
        })
    }

    /// Bytes of the part.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }
}

/// The owner of an offer as this process knows it: its endpoint's
/// serial and which file its segment is (a forged segment naming our
/// pid and a real endpoint's serial is another file).
pub type Owner = (u64, crate::segment::FileId);

/// An offer standing from an owner in this process: whose, for which
/// channel and record, what, and whether a sender of ours is writing it
/// now.
struct Standing {
    owner: Owner,
    chan: usize,
    end: u64,
    offer: Offer,
    /// Senders of ours inside their write of it (`Writing` guards).
    writing: u32,
}

/// The offers standing from owners in this process. A sender whose
/// owner shares our memory (`shares_memory`) writes only an offer found
/// here, and marks it while it writes: any process of the user can
/// write an offer block, and a forged one would otherwise have us write
/// our own memory where it chose — which the kernel lets a process do
/// to itself whatever ptrace allows others; and a state word a third
/// process sets to done would otherwise end the receive while we still
/// write into it (`unvouch` waits for the mark).
static LOCAL: Mutex<Vec<Standing>> = Mutex::new(Vec::new());

/// Owner: `o` stands for the record ending at `end` on channel `chan` of
/// `owner` (before it is published).
pub fn vouch(owner: Owner, chan: usize, end: u64, o: &Offer) {
    lock(&LOCAL).push(Standing {
        owner,
        chan,
        end,
        offer: o.clone(),
        writing: 0,
    });
}

/// Owner: the offer for that record is settled (before the receive
/// ends): it stands no more — once a sender of ours writing it is done.
pub fn unvouch(owner: Owner, chan: usize, end: u64) {
    loop {
        {
            let mut l = lock(&LOCAL);
            let at = l
                .iter()
                .position(|e| (e.owner, e.chan, e.end) == (owner, chan, end));
            match at {
                None => return,
                Some(i) if l[i].writing == 0 => {
                    l.swap_remove(i);
                    return;
                }
                Some(_) => {}
            }
        }
        // A sender of this process is inside its write (tens of
        // microseconds): the receive must not end before it.
        std::thread::yield_now();
    }
}

/// Sender: whether an owner of this process stands for offer `o` for the
/// record ending at `end` on channel `chan` of `owner`; if so it is
/// marked as being written until the returned guard drops (so that
/// neither an early return nor a panic in the write leaves [`unvouch`]
/// waiting).
pub fn begin_write(owner: Owner, chan: usize, end: u64, o: &Offer) -> Option<Writing> {
    let mut l = lock(&LOCAL);
    let e = l
        .iter_mut()
        .find(|e| (e.owner, e.chan, e.end) == (owner, chan, end) && e.offer == *o)?;
    e.writing += 1;
    Some(Writing { owner, chan, end })
}

/// A sender's mark on a vouched offer while it writes it
/// ([`begin_write`]); dropping it ends the mark.
#[derive(Debug)]
#[must_use = "the mark ends when the guard drops"]
pub struct Writing {
    owner: Owner,
    chan: usize,
    end: u64,
}

impl Drop for Writing {
    fn drop(&mut self) {
        let mut l = lock(&LOCAL);
        let key = (self.owner, self.chan, self.end);
        if let Some(e) = l.iter_mut().find(|e| (e.owner, e.chan, e.end) == key) {
            e.writing = e.writing.saturating_sub(1);
        }
    }
}

/// A word at its own address, random per process: a process from which
/// we read it back there shares our memory (is us, by any of our thread
/// ids, or a child forked from us, which is treated alike).
static TOKEN: OnceLock<u64> = OnceLock::new();

/// Our `TOKEN`, drawn now if not yet. Drawn before a shared pool is made
/// (`pool::alloc`), so that a child forked after it, which shares the
/// pool's pages, holds the token too and is taken for us (its offers
/// must then be vouched for here, which they are not).
pub fn token() -> &'static u64 {
    // Without a random source, a constant: another process of this
    // program holding it at the same address is then taken for us, which
    // only makes its offers need vouching (they fail, the owner copies).
    TOKEN.get_or_init(|| {
        let n = weft_core::wire::claim::fresh_nonce().unwrap_or([0x5a; 16]);
        let mut w = [0u8; 8];
        w.copy_from_slice(&n[..8]);
        u64::from_ne_bytes(w) | 1
    })
}

/// Whether process (or thread) `pid` shares our memory: it holds our
/// `TOKEN` at its address. Any id of one of our threads names us to
/// the kernel, so comparing `pid` with our own would not do.
///
/// `Some(false)` only when the answer is certain: the address is not
/// mapped there (`EFAULT`, a short read) or holds another word. Any
/// other failure (the process gone, its pid perhaps taken by another,
/// the call refused) is `None`: the caller must then not write by CMA
/// at all, since a wrong "not us" would let a forged offer aim our own
/// writes at our own memory.
pub fn shares_memory(pid: u32) -> Option<bool> {
    let token = token();
    let mut w = [0u8; 8];
    let addr = token as *const u64 as usize as u64;
    match crate::cma::pull(pid, &[(addr, 8)], &mut [&mut w[..]]) {
        Ok(8) => Some(u64::from_ne_bytes(w) == *token),
        Ok(_) | Err(crate::cma::PullError::Short) => Some(false),
        Err(crate::cma::PullError::Sys(nix::errno::Errno::EFAULT)) => Some(false),
        Err(_) => None,
    }
}

/// Where a split's message is cut: about half, at a page boundary (the
/// sender's part starts on a fresh page of the receive where the buffer
/// is page-aligned).
pub fn cut(placed: usize) -> usize {
    (placed / 2) & !4095
}

/// The offer block of channel `i` of a segment of geometry `g`.
fn at(g: Geometry, i: usize, field: usize) -> usize {
    g.offer(i) + field
}

/// Owner: publishes `o` for the CMA record of channel `i` that ends at
/// ring position `end`. The fields first, the state word last (release),
/// so a sender that sees the offer sees them.
pub fn publish(seg: &Segment, g: Geometry, i: usize, end: u64, o: &Offer) {
    let mut b = [0u8; O_POOL + POOL_REF_LEN];
    b[O_AT..O_AT + 8].copy_from_slice(&o.at.to_ne_bytes());
    if let Some(p) = &o.pool {
        b[O_POOL..].copy_from_slice(&p.encode());
    }
    b[O_N..O_N + 8].copy_from_slice(&(o.ranges.len() as u64).to_ne_bytes());
    for (k, (a, l)) in o.ranges.iter().enumerate() {
        let p = O_RANGES + 16 * k;
        b[p..p + 8].copy_from_slice(&a.to_ne_bytes());
        b[p + 8..p + 16].copy_from_slice(&l.to_ne_bytes());
    }
    seg.write(at(g, i, O_AT), &b[O_AT..]);
    seg.store64(
        at(g, i, O_STATE),
        split_word(end, O_OFFERED),
        Ordering::Release,
    );
}

/// The offer block's state word of channel `i` (acquire: a sender's
/// `O_DONE` orders its writes before it).
pub fn state(seg: &Segment, g: Geometry, i: usize) -> Option<u64> {
    seg.load64(at(g, i, O_STATE), Ordering::Acquire)
}

/// Owner: takes back the offer about the record ending at `end` if the
/// sender has not taken it. Returns the state word found otherwise.
pub fn revoke(seg: &Segment, g: Geometry, i: usize, end: u64) -> Result<(), Option<u64>> {
    let off = at(g, i, O_STATE);
    if seg.cas64(off, split_word(end, O_OFFERED), split_word(end, O_REVOKED)) {
        Ok(())
    } else {
        Err(seg.load64(off, Ordering::Acquire))
    }
}

/// Owner: no offer on channel `i` (the channel is freed: the next
/// claim's positions start again at 0, and must not meet an old word).
pub fn clear(seg: &Segment, g: Geometry, i: usize) {
    seg.store64(at(g, i, O_STATE), 0, Ordering::Release);
}

/// What became of an offer, as its state word says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Offered and not taken yet (the receiver revokes it).
    Offered,
    /// Taken: the sender writes now.
    Taken,
    /// The sender wrote its part.
    Done,
    /// The sender could not write it, or the receiver took it back: the
    /// receiver copies it.
    Own,
    /// A word no side of this offer writes: the sender broke the rules.
    Broken,
}

/// The outcome the state word `w` gives for the offer about the record
/// ending at `end`.
pub fn outcome(w: Option<u64>, end: u64) -> Outcome {
    let Some(w) = w else {
        return Outcome::Broken;
    };
    if w >> 3 != end & (u64::MAX >> 3) {
        return Outcome::Broken;
    }
    match w & 7 {
        O_OFFERED => Outcome::Offered,
        O_TAKEN => Outcome::Taken,
        O_DONE => Outcome::Done,
        O_FAILED | O_REVOKED => Outcome::Own,
        _ => Outcome::Broken,
    }
}

/// Sender: the offer waiting on channel `i`, if any: the end of the
/// record it is about. Relaxed: only a look (a taker's swap acquires).
pub fn offered(seg: &Segment, g: Geometry, i: usize) -> Option<u64> {
    let w = seg.load64(at(g, i, O_STATE), Ordering::Relaxed)?;
    (w & 7 == O_OFFERED).then_some(w >> 3)
}

/// Sender: takes the offer about the record ending at `end` (whose
/// message is `len` bytes), and reads it: `None` if the owner revoked it
/// meanwhile. An offer that does not check out (more ranges than
/// [`O_MAX`], a part past the message, lengths that do not add up) is
/// taken and answered `O_FAILED` at once: the owner copies the part.
pub fn take(seg: &Segment, g: Geometry, i: usize, end: u64, len: usize) -> Option<Option<Offer>> {
    if !seg.cas64(
        at(g, i, O_STATE),
        split_word(end, O_OFFERED),
        split_word(end, O_TAKEN),
    ) {
        return None;
    }
    let mut b = [0u8; O_POOL + POOL_REF_LEN];
    if !seg.read(at(g, i, O_AT), &mut b[O_AT..]) {
        return Some(None);
    }
    let word = |p: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[p..p + 8]);
        u64::from_ne_bytes(w)
    };
    let (off, n) = (word(O_AT), word(O_N));
    let Some(n) = usize::try_from(n).ok().filter(|n| (1..=O_MAX).contains(n)) else {
        return Some(None);
    };
    let ranges: SmallVec<[(u64, u64); O_MAX]> = (0..n)
        .map(|k| (word(O_RANGES + 16 * k), word(O_RANGES + 16 * k + 8)))
        .collect();
    let sum = ranges
        .iter()
        .try_fold(0u64, |s, r| s.checked_add(r.1))
        .filter(|&s| s > 0);
    let fits = sum
        .and_then(|s| s.checked_add(off))
        .is_some_and(|e| e <= len as u64);
    // A pool reference, if any (a length of 0: none), must keep its rules
    // and hold every range, or the offer is refused.
    let pool = match word(O_POOL + 24) {
        0 => None,
        _ => match crate::pool::PoolRef::parse(&b[O_POOL..]).filter(|p| p.holds(&ranges)) {
            Some(p) => Some(p),
            None => return Some(None),
        },
    };
    Some(fits.then_some(Offer {
        at: off,
        ranges,
        pool,
    }))
}

/// Sender: says the part of the offer about the record ending at `end`
/// is written (`ok`) or could not be (the owner copies it). Release: the
/// owner that reads it reads our writes too.
pub fn finish(seg: &Segment, g: Geometry, i: usize, end: u64, ok: bool) {
    let state = if ok { O_DONE } else { O_FAILED };
    seg.store64(at(g, i, O_STATE), split_word(end, state), Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg() -> (Segment, Geometry) {
        let g = Geometry::OURS;
        let seg = Segment::anonymous(&vec![0u8; g.rings()]).expect("segment");
        (seg, g)
    }

    #[test]
    fn an_offer_covers_the_part_across_buffers() {
        let bufs = vec![BytesMut::zeroed(100), BytesMut::zeroed(50)];
        let o = Offer::of(&bufs, 80, 130).expect("two ranges");
        let a0 = bufs[0].as_ptr() as u64;
        let a1 = bufs[1].as_ptr() as u64;
        assert_eq!(o.ranges.as_slice(), &[(a0 + 80, 20), (a1, 30)]);
        assert_eq!((o.at, o.bytes()), (80, 50));
        assert_eq!(Offer::of(&bufs, 130, 130), None, "an empty part");
        assert_eq!(Offer::of(&bufs, 100, 200), None, "past the buffers");
    }

    #[test]
    fn an_offer_is_vouched_for_only_while_it_stands() {
        let o = Offer {
            at: 8,
            ranges: [(0x1000, 8)].into_iter().collect(),
            pool: None,
        };
        let other = Offer {
            at: 8,
            ranges: [(0x2000, 8)].into_iter().collect(),
            pool: None,
        };
        let me = test_file();
        let owner = (u64::MAX, me);
        vouch(owner, 2, 64, &o);
        assert!(begin_write(owner, 2, 64, &other).is_none(), "other ranges");
        assert!(begin_write(owner, 3, 64, &o).is_none(), "another channel");
        assert!(begin_write(owner, 2, 72, &o).is_none(), "another record");
        let stranger = (u64::MAX - 1, me);
        assert!(begin_write(stranger, 2, 64, &o).is_none(), "another owner");
        let mark = begin_write(owner, 2, 64, &o).expect("stands");
        // Settling waits for the write to end.
        let t = std::thread::spawn(move || unvouch(owner, 2, 64));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!t.is_finished(), "settled while a sender writes");
        drop(mark);
        t.join().expect("unvouch");
        assert!(begin_write(owner, 2, 64, &o).is_none(), "stands no more");
    }

    #[test]
    fn a_panicking_write_still_ends_its_mark() {
        let o = Offer {
            at: 0,
            ranges: [(0x3000, 8)].into_iter().collect(),
            pool: None,
        };
        let owner = (u64::MAX - 2, test_file());
        vouch(owner, 1, 8, &o);
        let w = std::thread::spawn(move || {
            let _mark = begin_write(owner, 1, 8, &o).expect("stands");
            panic!("a write that panics");
        });
        assert!(w.join().is_err(), "the write panicked");
        let t = std::thread::spawn(move || unvouch(owner, 1, 8));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(t.is_finished(), "unvouch waits on a mark nobody holds");
        t.join().expect("unvouch");
    }

    /// A file identity for the registry's tests (this test binary's).
    fn test_file() -> crate::segment::FileId {
        let f = std::fs::File::open("/proc/self/exe").expect("exe");
        crate::segment::FileId::of_fd(&f).expect("fstat")
    }

    #[test]
    fn we_share_our_memory_and_a_child_process_does_not() {
        if crate::cma::mode() != crate::cma::Mode::Permitted {
            // Yama 1-3 or seccomp: reading another process (even our
            // child) may be refused, and then nothing here is "certain".
            eprintln!("skipped: cross-memory attach is not permitted here");
            return;
        }
        assert_eq!(shares_memory(std::process::id()), Some(true));
        // Any of our threads' ids names us to the kernel.
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = tx.send(nix::unistd::gettid().as_raw() as u32);
            let _ = stop_rx.recv();
        });
        let live = rx.recv().expect("tid");
        assert_eq!(
            shares_memory(live),
            Some(true),
            "a live thread of ours: {live}"
        );
        let _ = stop_tx.send(());
        t.join().expect("thread");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let shares = shares_memory(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(shares, Some(false), "an exec'd child has its own memory");
        // A pid that names no process: not certain, so no CMA writes.
        let gone = child.id();
        assert_eq!(shares_memory(gone), None, "a reaped child's pid");
    }

    #[test]
    fn the_cut_is_half_at_a_page() {
        assert_eq!(cut(1 << 20), 512 << 10);
        assert_eq!(cut((1 << 20) + 12288), 516 << 10);
        assert_eq!(cut((1 << 20) + 8191), 512 << 10);
        assert_eq!(cut(4095), 0);
    }

    #[test]
    fn a_taken_offer_reads_as_published_and_ends_done() {
        let (seg, g) = seg();
        let o = Offer {
            at: 4096,
            ranges: [(0x1000, 2048), (0x9000, 2048)].into_iter().collect(),
            pool: None,
        };
        publish(&seg, g, 3, 777, &o);
        assert_eq!(offered(&seg, g, 3), Some(777));
        assert_eq!(offered(&seg, g, 2), None, "another channel's block");
        assert_eq!(outcome(state(&seg, g, 3), 777), Outcome::Offered);
        assert_eq!(take(&seg, g, 3, 776, 8192), None, "another record's");
        assert_eq!(take(&seg, g, 3, 777, 8192), Some(Some(o)));
        assert_eq!(revoke(&seg, g, 3, 777), Err(Some(split_word(777, O_TAKEN))));
        assert_eq!(outcome(state(&seg, g, 3), 777), Outcome::Taken);
        finish(&seg, g, 3, 777, true);
        assert_eq!(outcome(state(&seg, g, 3), 777), Outcome::Done);
        assert_eq!(outcome(state(&seg, g, 3), 778), Outcome::Broken);
        clear(&seg, g, 3);
        assert_eq!(outcome(state(&seg, g, 3), 777), Outcome::Broken);
    }

    #[test]
    fn a_revoked_offer_cannot_be_taken() {
        let (seg, g) = seg();
        let o = Offer {
            at: 0,
            ranges: [(0x1000, 10)].into_iter().collect(),
            pool: None,
        };
        publish(&seg, g, 0, 40, &o);
        assert_eq!(revoke(&seg, g, 0, 40), Ok(()));
        assert_eq!(take(&seg, g, 0, 40, 10), None);
        assert_eq!(outcome(state(&seg, g, 0), 40), Outcome::Own);
    }

    #[test]
    fn an_offer_names_its_pool_and_a_pool_not_holding_it_is_refused() {
        let (seg, g) = seg();
        let r = crate::pool::PoolRef {
            fd: 3,
            ino: 77,
            base: 0x10000,
            len: 0x10000,
        };
        let o = Offer {
            at: 8,
            ranges: [(0x10100, 10)].into_iter().collect(),
            pool: Some(r),
        };
        publish(&seg, g, 1, 40, &o);
        assert_eq!(take(&seg, g, 1, 40, 18), Some(Some(o.clone())));
        // The same ranges with a pool that does not hold them.
        let far = Offer {
            pool: Some(crate::pool::PoolRef { base: 0x40000, ..r }),
            ..o.clone()
        };
        publish(&seg, g, 1, 48, &far);
        assert_eq!(take(&seg, g, 1, 48, 18), Some(None));
        // A reference that breaks its own rules (unaligned).
        let odd = Offer {
            pool: Some(crate::pool::PoolRef { base: 0x10001, ..r }),
            ..o
        };
        publish(&seg, g, 1, 56, &odd);
        assert_eq!(take(&seg, g, 1, 56, 18), Some(None));
    }

    #[test]
    fn an_offer_past_the_message_is_taken_and_refused() {
        let (seg, g) = seg();
        let part = |at: u64, ranges: &[(u64, u64)]| Offer {
            at,
            ranges: ranges.iter().copied().collect(),
            pool: None,
        };
        for (o, len) in [
            (part(8, &[(0x1000, 10)]), 17),
            (part(u64::MAX, &[(0x1000, 1)]), 100),
            (part(0, &[(0x1000, u64::MAX), (0x2000, 2)]), 100),
            (part(0, &[(0x1000, 0)]), 100),
        ] {
            publish(&seg, g, 1, 8, &o);
            assert_eq!(take(&seg, g, 1, 8, len), Some(None), "{o:?}");
        }
        // Too many ranges: the count is read, never the ranges past O_MAX.
        let o = part(0, &[(0x1000, 1)]);
        publish(&seg, g, 1, 16, &o);
        seg.write(g.offer(1) + O_N, &((O_MAX as u64 + 1).to_ne_bytes()));
        assert_eq!(take(&seg, g, 1, 16, 100), Some(None));
        publish(&seg, g, 1, 24, &o);
        assert_eq!(
            take(&seg, g, 1, 24, 1),
            Some(Some(o)),
            "the part exactly the message"
        );
    }
}
