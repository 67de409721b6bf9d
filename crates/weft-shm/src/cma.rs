//! Cross-memory attach (`process_vm_readv(2)`): a large message moves in
//! one copy, from the sender's buffers straight into the receive's,
//! instead of two through the ring (`docs/design.md`, "The shm provider",
//! and `docs/wire.md`, "CMA records").
//!
//! Whether the kernel lets one process read another's memory depends on
//! Yama's `ptrace_scope`, seccomp (containers) and capabilities, so it is
//! found out, not assumed: [`mode`] once per process (a read of our own
//! memory, and `ptrace_scope`), and per sender when the receiver first
//! sees its channel (a read of a word the sender announced, which must
//! hold [`PROBE_MAGIC`]). Only a channel whose probe succeeded carries
//! CMA records; every other one uses the copy path.
//!
//! The peer's announcement is checked before use ([`Announce::parse`]):
//! a bounded number of ranges whose lengths add up exactly to the
//! message's declared total. The local side of every read is our own
//! receive buffers as slices, so whatever a peer announces, nothing is
//! written outside them (the `nix` wrapper is safe for that reason).

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;

use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

/// Messages of `CMA_MIN..=CMA_MAX` bytes go by CMA where it is
/// permitted and [`pays`] (a side sleeps; while both spin, the ring —
/// unless the sender can write the receiver's memory and the message is
/// `split::spin_min()` or more, when the two sides share the copy:
/// `crate::split`).
/// Below, the two copies through the ring cost less than the system call
/// and the page walks; above, the receiver's one core doing
/// the whole copy loses to the ring's two copies on two cores while
/// messages stream (both measured with `integration/bench-shm-cma`,
/// `docs/benchmarks.md`) — but not in a ping-pong, so larger messages go
/// by CMA when their channel is idle ([`idle_large`]).
pub const CMA_MIN: usize = 32 << 10;
/// See [`CMA_MIN`]; [`max_len`] is what applies.
pub const CMA_MAX: usize = 256 << 10;

/// The largest message sent by CMA whatever the channel does, unless
/// its copy is split between both sides (`split`), which has no bound:
/// `WEFT_SHM_CMA_MAX` (bytes) if set to a number, else [`CMA_MAX`] (the
/// benchmark sets it to compare both paths at every size).
pub fn max_len() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| env_num("WEFT_SHM_CMA_MAX", CMA_MAX as u64) as usize)
}

/// The number in environment variable `var`, else `default`: the knobs
/// benchmarks turn, read once each by their callers.
pub(crate) fn env_num(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Whether messages above [`max_len`] go by CMA when their channel is
/// idle (`tx::Peer::cma_ok`): on unless `WEFT_SHM_CMA_IDLE=0` (the
/// benchmark turns it off to compare).
pub fn idle_large() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !std::env::var("WEFT_SHM_CMA_IDLE").is_ok_and(|v| v.trim() == "0"))
}

/// Whether large transfers go by CMA although the sending endpoint spins
/// (inline or busy-poll progress) and the receiver is awake: off unless
/// `WEFT_SHM_CMA_SPIN=1` (the benchmarks turn it on to compare). While
/// both sides spin, the ring's two copies on two cores, pipelined record
/// by record through cache, beat the kernel's page walks and one core's
/// copy at every size (2.9x at 1 MiB in a ping-pong, 3x at 64-256 KiB
/// streaming; `integration/bench-shm-cma`, `docs/benchmarks.md`, "Large
/// messages while both sides spin"); CMA pays where a side sleeps, since
/// it costs one wake-up a message where the ring costs one a ring's
/// worth. [`pays`] applies it; [`set_when_spinning`] overrides it.
/// (Messages split between both sides' copies go by CMA while both spin
/// whatever this says, from `split::spin_min()` up: `crate::split`.)
pub fn when_spinning() -> bool {
    match SPIN_CMA.load(Ordering::Relaxed) {
        SPIN_UNREAD => {
            let on = std::env::var("WEFT_SHM_CMA_SPIN").is_ok_and(|v| v.trim() == "1");
            let v = if on { SPIN_ON } else { SPIN_OFF };
            // A value set meanwhile stands.
            let _ = SPIN_CMA.compare_exchange(SPIN_UNREAD, v, Ordering::Relaxed, Ordering::Relaxed);
            SPIN_CMA.load(Ordering::Relaxed) == SPIN_ON
        }
        v => v == SPIN_ON,
    }
}

/// Sets [`when_spinning`] for this process, whatever the environment
/// says: for tests of the CMA path in every wait mode, whose process
/// other tests share (the environment is read once, and is no place to
/// write while threads run).
pub fn set_when_spinning(on: bool) {
    SPIN_CMA.store(if on { SPIN_ON } else { SPIN_OFF }, Ordering::Relaxed);
}

/// [`when_spinning`]'s value: not read yet, off, on.
static SPIN_CMA: AtomicU8 = AtomicU8::new(SPIN_UNREAD);
const SPIN_UNREAD: u8 = 0;
const SPIN_OFF: u8 = 1;
const SPIN_ON: u8 = 2;

/// Whether a large transfer (a CMA send or a direct RMA request) may go
/// by CMA, from the sender's side: yes if the sending endpoint sleeps
/// between progress (`!spins`, interrupt mode) or the receiver said it
/// sleeps now (`peer_sleeps`); no while both spin, unless
/// [`when_spinning`] says otherwise. The size windows apply besides.
pub fn pays(spins: bool, peer_sleeps: bool) -> bool {
    !spins || peer_sleeps || when_spinning()
}

/// RMA reads and writes of at least this many bytes go direct where CMA
/// is permitted: the target moves the bytes between its region and the
/// initiator's buffers (`rma::direct`). Below, the ring's two copies on
/// two cores, pipelined record by record, beat one core's single copy
/// plus the page walks (128 and 192 KiB: ring ahead; 256 KiB up: direct
/// ahead, 1.2-2x; `integration/bench-shm-rma`, `docs/benchmarks.md`).
pub const RMA_CMA_MIN: usize = 256 << 10;

/// The smallest RMA transfer sent direct: `WEFT_SHM_RMA_CMA_MIN` (bytes)
/// if set to a number (the benchmark sets it past every size to measure
/// the ring), else [`RMA_CMA_MIN`].
pub fn rma_min() -> usize {
    static MIN: OnceLock<usize> = OnceLock::new();
    *MIN.get_or_init(|| env_num("WEFT_SHM_RMA_CMA_MIN", RMA_CMA_MIN as u64) as usize)
}

/// Ranges one announcement may list (the provider's `IOV_LIMIT`).
pub const MAX_RANGES: usize = crate::IOV_LIMIT;
/// Payload bytes of an announcement of `n` ranges.
pub const fn announce_len(n: usize) -> usize {
    8 + 16 * n
}
/// Most payload bytes of an announcement: [`MAX_RANGES`] ranges and a
/// pool reference.
pub const ANNOUNCE_MAX: usize = announce_len(MAX_RANGES) + crate::pool::POOL_REF_LEN;

/// What a probing receiver must read at the address a sender announces.
pub const PROBE_MAGIC: u64 = u64::from_le_bytes(*b"WEFTCMA1");
/// The word probed (its address goes into the channel's control block).
static PROBE: AtomicU64 = AtomicU64::new(PROBE_MAGIC);

/// The address of this process's probe word.
pub fn probe_addr() -> u64 {
    PROBE.as_ptr() as usize as u64
}

/// What this process may do, as found at the first domain open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Any process of this user may be read (`ptrace_scope` 0 or no Yama).
    Permitted,
    /// Yama restricts reads to descendants (`ptrace_scope` 1): each
    /// sender's probe decides; most pairs use the copy path.
    Restricted,
    /// Not at all (`ptrace_scope` 2 or 3, seccomp, no such call): the
    /// copy path only.
    Denied,
}

impl Mode {
    /// As the offer's fabric name shows it.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Permitted => "cma",
            Mode::Restricted => "cma-restricted",
            Mode::Denied => "copy",
        }
    }
}

/// The process's CMA mode, found once: `WEFT_SHM_CMA=0` turns CMA off.
pub fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| {
        let off = std::env::var("WEFT_SHM_CMA").is_ok_and(|v| v.trim() == "0");
        let m = if off || !self_probe() {
            Mode::Denied
        } else {
            match ptrace_scope() {
                None | Some(0) => Mode::Permitted,
                Some(1) => Mode::Restricted,
                Some(_) => Mode::Denied,
            }
        };
        tracing::debug!(mode = m.label(), "shm: cross-memory attach");
        m
    })
}

/// Yama's `ptrace_scope`, if Yama is there.
fn ptrace_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether the call works at all here (seccomp may refuse it).
fn self_probe() -> bool {
    probe(std::process::id(), probe_addr())
}

/// Whether process `pid` can be read, and holds [`PROBE_MAGIC`] at
/// `addr`.
pub fn probe(pid: u32, addr: u64) -> bool {
    let mut w = [0u8; 8];
    let r = pull(pid, &[(addr, 8)], &mut [&mut w[..]]);
    r == Ok(8) && u64::from_ne_bytes(w) == PROBE_MAGIC
}

/// Why a pull failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullError {
    /// The kernel refused (`EPERM`, `ESRCH`, `EFAULT`, ...).
    Sys(nix::errno::Errno),
    /// A pid or range that cannot be one.
    Bad,
    /// The transfer stopped short (a range was unmapped part way).
    Short,
}

/// Reads the ranges `remote` (address, length) of process `pid` into
/// `local`, in order, until either side ends: one system call, more only
/// if the kernel stops part way. Returns the bytes read (the smaller of
/// the two sides' totals).
pub fn pull(pid: u32, remote: &[(u64, u64)], local: &mut [&mut [u8]]) -> Result<usize, PullError> {
    let lens: smallvec::SmallVec<[usize; MAX_RANGES]> = local.iter().map(|b| b.len()).collect();
    transfer(pid, remote, &lens, |pid, done, want, rs| {
        let mut lv: smallvec::SmallVec<[IoSliceMut<'_>; MAX_RANGES]> = smallvec::SmallVec::new();
        // Pieces come in buffer order, each buffer at most once.
        let mut ps = pieces(&lens, done, want - done).into_iter().peekable();
        for (i, b) in local.iter_mut().enumerate() {
            if let Some((_, at, k)) = ps.next_if(|p| p.0 == i) {
                lv.push(IoSliceMut::new(&mut b[at..at + k]));
            }
        }
        process_vm_readv(pid, &mut lv, rs)
    })
}

/// Writes `local`, in order, into the ranges `remote` (address, length)
/// of process `pid` until either side ends (`process_vm_writev(2)`): the
/// other direction of [`pull`], with the same checks. Returns the bytes
/// written.
pub fn push(pid: u32, remote: &[(u64, u64)], local: &[&[u8]]) -> Result<usize, PullError> {
    let lens: smallvec::SmallVec<[usize; MAX_RANGES]> = local.iter().map(|b| b.len()).collect();
    transfer(pid, remote, &lens, |pid, done, want, rs| {
        let mut lv: smallvec::SmallVec<[IoSlice<'_>; MAX_RANGES]> = smallvec::SmallVec::new();
        for (i, at, k) in pieces(&lens, done, want - done) {
            lv.push(IoSlice::new(&local[i][at..at + k]));
        }
        process_vm_writev(pid, &lv, rs)
    })
}

/// The parts of buffers of lengths `lens` that cover bytes
/// `skip..skip + left` of their concatenation: (buffer, start, length).
pub(crate) fn pieces(
    lens: &[usize],
    mut skip: usize,
    mut left: usize,
) -> smallvec::SmallVec<[(usize, usize, usize); MAX_RANGES]> {
    let mut out = smallvec::SmallVec::new();
    for (i, &l) in lens.iter().enumerate() {
        if left == 0 {
            break;
        }
        if skip >= l {
            skip -= l;
            continue;
        }
        let k = (l - skip).min(left);
        out.push((i, skip, k));
        left -= k;
        skip = 0;
    }
    out
}

/// Moves bytes between local buffers of lengths `lens` and the ranges
/// `remote` of process `pid`, `call`ing the kernel (with the bytes done,
/// the bytes wanted and the remote ranges still to go) until the smaller
/// side is done. Every remote range is checked (no wrap, totals that
/// fit) before the first call.
fn transfer(
    pid: u32,
    remote: &[(u64, u64)],
    lens: &[usize],
    mut call: impl FnMut(Pid, usize, usize, &[RemoteIoVec]) -> nix::Result<usize>,
) -> Result<usize, PullError> {
    let pid = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(PullError::Bad)?;
    let mut rv: smallvec::SmallVec<[RemoteIoVec; MAX_RANGES]> = smallvec::SmallVec::new();
    let mut rtotal = 0usize;
    for &(a, l) in remote {
        let base = usize::try_from(a).map_err(|_| PullError::Bad)?;
        let len = usize::try_from(l).map_err(|_| PullError::Bad)?;
        base.checked_add(len).ok_or(PullError::Bad)?;
        rtotal = rtotal.checked_add(len).ok_or(PullError::Bad)?;
        rv.push(RemoteIoVec { base, len });
    }
    let rlens: smallvec::SmallVec<[usize; MAX_RANGES]> = rv.iter().map(|r| r.len).collect();
    let want = rtotal.min(lens.iter().sum());
    let mut done = 0usize;
    while done < want {
        let rs: smallvec::SmallVec<[RemoteIoVec; MAX_RANGES]> = pieces(&rlens, done, want - done)
            .into_iter()
            .map(|(i, at, k)| RemoteIoVec {
                base: rv[i].base + at,
                len: k,
            })
            .collect();
        match call(Pid::from_raw(pid), done, want, &rs) {
            Ok(0) => return Err(PullError::Short),
            Ok(n) => done += n.min(want - done),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(PullError::Sys(e)),
        }
    }
    Ok(want)
}

/// The payload of a direct RMA request (`docs/wire.md`, "RMA records"):
/// the offset in the target's region, then where the initiator's buffers
/// lie (an [`Announce`]: the bytes to write, or the buffers a read
/// fills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectReq {
    pub off: u64,
    pub ann: Announce,
}

/// Most payload bytes of a direct request.
pub const DIRECT_MAX: usize = 8 + announce_len(MAX_RANGES);

impl DirectReq {
    /// The offset (u64, host byte order), then the announcement.
    pub fn encode(&self) -> smallvec::SmallVec<[u8; DIRECT_MAX]> {
        let mut b = smallvec::SmallVec::new();
        b.extend_from_slice(&self.off.to_ne_bytes());
        b.extend_from_slice(&self.ann.encode());
        b
    }

    /// Reads a direct request moving `total` bytes, if its announcement
    /// keeps [`Announce::parse`]'s rules.
    pub fn parse(b: &[u8], total: usize) -> Option<DirectReq> {
        let off = u64::from_ne_bytes(b.get(..8)?.try_into().ok()?);
        // A direct request's buffers are read by cross-memory attach
        // only: an announcement naming a pool is not one.
        let ann = Announce::parse(b.get(8..)?, total).filter(|a| a.pool.is_none())?;
        Some(DirectReq { off, ann })
    }
}

/// A CMA record's payload: where the message lies in the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Announce {
    /// (address, length) in the sender, in message order.
    pub ranges: smallvec::SmallVec<[(u64, u64); MAX_RANGES]>,
    /// The sender's shared pool holding every range, if one does
    /// (`pool`): the receiver may map it and copy without the kernel.
    pub pool: Option<crate::pool::PoolRef>,
}

impl Announce {
    /// The payload as written: range count (u32), whether a pool
    /// reference follows (u32: 0 or 1), each range's address and length
    /// (u64 each), then the pool reference if any; host byte order.
    pub fn encode(&self) -> smallvec::SmallVec<[u8; ANNOUNCE_MAX]> {
        let mut b = smallvec::SmallVec::new();
        b.extend_from_slice(&(self.ranges.len() as u32).to_ne_bytes());
        b.extend_from_slice(&u32::from(self.pool.is_some()).to_ne_bytes());
        for (a, l) in &self.ranges {
            b.extend_from_slice(&a.to_ne_bytes());
            b.extend_from_slice(&l.to_ne_bytes());
        }
        if let Some(p) = &self.pool {
            b.extend_from_slice(&p.encode());
        }
        b
    }

    /// Reads an announcement for a message of `total` bytes, if it keeps
    /// the rules: its length exactly that of its count of ranges (and
    /// pool reference), 1 to [`MAX_RANGES`] of them, the pool word 0 or 1,
    /// no range wrapping the address space, the lengths adding up to
    /// `total`, and a pool reference that keeps `PoolRef::parse`'s rules
    /// and holds every range.
    pub fn parse(b: &[u8], total: usize) -> Option<Announce> {
        let w4 = |o: usize| -> Option<u32> {
            Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?))
        };
        let w8 = |o: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?))
        };
        let n = w4(0)? as usize;
        let pooled = match w4(4)? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let len = announce_len(n) + if pooled { crate::pool::POOL_REF_LEN } else { 0 };
        if !(1..=MAX_RANGES).contains(&n) || b.len() != len {
            return None;
        }
        let mut ranges = smallvec::SmallVec::new();
        let mut sum = 0u64;
        for i in 0..n {
            let (a, l) = (w8(8 + 16 * i)?, w8(16 + 16 * i)?);
            a.checked_add(l)?;
            sum = sum.checked_add(l)?;
            ranges.push((a, l));
        }
        let pool = match pooled {
            true => Some(
                crate::pool::PoolRef::parse(b.get(announce_len(n)..)?)
                    .filter(|p| p.holds(&ranges))?,
            ),
            false => None,
        };
        (usize::try_from(sum).ok()? == total).then_some(Announce { ranges, pool })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn announcements_round_trip_and_lies_are_refused() {
        let a = Announce {
            ranges: [(0x1000u64, 10u64), (0x9000, 6)].into_iter().collect(),
            pool: None,
        };
        let b = a.encode();
        assert_eq!(b.len(), announce_len(2));
        assert_eq!(Announce::parse(&b, 16), Some(a.clone()));
        // Lengths that do not add up to the total.
        assert_eq!(Announce::parse(&b, 15), None);
        // A count that does not match the length, or none at all.
        assert_eq!(Announce::parse(&b[..b.len() - 8], 16), None);
        let mut z = b.clone();
        z[0..4].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(Announce::parse(&z, 0), None);
        // A range wrapping the address space.
        let w = Announce {
            ranges: [(u64::MAX - 2, 16u64)].into_iter().collect(),
            pool: None,
        };
        assert_eq!(Announce::parse(&w.encode(), 16), None);
        // Overflowing lengths.
        let o = Announce {
            ranges: [(0u64, u64::MAX), (0, 2)].into_iter().collect(),
            pool: None,
        };
        assert_eq!(Announce::parse(&o.encode(), 1), None);
        // A pool reference: round trips, and must hold every range.
        let r = crate::pool::PoolRef {
            fd: 5,
            ino: 9,
            base: 0x1000,
            len: 0x9000,
        };
        let p = Announce {
            pool: Some(r),
            ..a.clone()
        };
        let b = p.encode();
        assert_eq!(b.len(), announce_len(2) + crate::pool::POOL_REF_LEN);
        assert_eq!(Announce::parse(&b, 16), Some(p.clone()));
        let short = Announce {
            pool: Some(crate::pool::PoolRef { len: 0x8000, ..r }),
            ..a.clone()
        };
        assert_eq!(
            Announce::parse(&short.encode(), 16),
            None,
            "a range outside"
        );
        let mut two = b.clone();
        two[4..8].copy_from_slice(&2u32.to_ne_bytes());
        assert_eq!(Announce::parse(&two, 16), None, "pool word 2");
        assert_eq!(Announce::parse(&b[..b.len() - 8], 16), None, "cut short");
        // A direct request never names a pool.
        let d = DirectReq { off: 0, ann: p };
        assert_eq!(DirectReq::parse(&d.encode(), 16), None);
    }

    #[test]
    fn pulls_stay_in_the_local_buffers() {
        if mode() == Mode::Denied {
            return;
        }
        let src: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let a = src.as_ptr() as usize as u64;
        let me = std::process::id();
        // Local smaller than remote: truncated to the local buffers.
        let mut x = vec![0u8; 100];
        let mut y = vec![0u8; 50];
        let n = pull(me, &[(a, 5000), (a + 5000, 5000)], &mut [&mut x, &mut y]).unwrap();
        assert_eq!(n, 150);
        assert_eq!(&x[..], &src[..100]);
        assert_eq!(&y[..], &src[100..150]);
        // Remote split across ranges, local in one buffer.
        let mut z = vec![0u8; 10_000];
        let n = pull(me, &[(a, 3), (a + 3, 9997)], &mut [&mut z]).unwrap();
        assert_eq!((n, &z[..]), (10_000, &src[..]));
        // An unmapped address fails; a bad pid is refused.
        let mut w = vec![0u8; 8];
        assert!(pull(me, &[(8, 8)], &mut [&mut w]).is_err());
        assert_eq!(pull(0, &[(a, 8)], &mut [&mut w]), Err(PullError::Bad));
        assert!(probe(me, probe_addr()));
        assert!(!probe(me, a));
    }

    #[test]
    fn pushes_fill_the_remote_ranges_in_order() {
        if mode() == Mode::Denied {
            return;
        }
        let me = std::process::id();
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; 1200];
        let d = dst.as_mut_ptr() as usize as u64;
        // Two local pieces into two remote ranges with a gap between.
        let n = push(me, &[(d, 300), (d + 400, 700)], &[&src[..600], &src[600..]]).unwrap();
        assert_eq!(n, 1000);
        assert_eq!(&dst[..300], &src[..300]);
        assert!(dst[300..400].iter().all(|&b| b == 0), "the gap untouched");
        assert_eq!(&dst[400..1100], &src[300..]);
        assert!(dst[1100..].iter().all(|&b| b == 0));
        // Remote shorter than local: only the remote ranges are written.
        let n = push(me, &[(d, 10)], &[&src[..]]).unwrap();
        assert_eq!(n, 10);
        // Unmapped remote memory fails; a parse round-trips.
        assert!(push(me, &[(8, 8)], &[&src[..8]]).is_err());
        let r = DirectReq {
            off: 5,
            ann: Announce {
                ranges: [(d, 10u64)].into_iter().collect(),
                pool: None,
            },
        };
        assert_eq!(DirectReq::parse(&r.encode(), 10), Some(r.clone()));
        assert_eq!(DirectReq::parse(&r.encode(), 11), None);
        assert_eq!(DirectReq::parse(&r.encode()[..7], 10), None);
    }
}
