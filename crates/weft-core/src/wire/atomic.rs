//! The fixed prefix of an `AtomicReq` payload (`docs/wire.md` section
//! 9.5): the target, the operation, the element type, the form and the
//! element count; the operand and compare arrays follow it.
//!
//! The decoder checks the encoding only (known numbers, zero reserved
//! bytes, a length that matches the count); whether the target supports
//! the combination, and whether the region allows it, is the target's
//! business.

use std::fmt;

use crate::atomic::{AtomicKind, AtomicOp, Datatype};
use crate::wire::rma::Target;

/// Bytes of [`AtomicHdr`] at the front of an `AtomicReq` payload.
pub const ATOMIC_HDR_LEN: usize = 32;
/// Most bytes one atomic touches at the target (`count` × element
/// size), whatever the endpoint's `max_msg_size`: bounds the operand and
/// compare arrays a target holds for a request and the old values it
/// answers with.
pub const ATOMIC_MAX: usize = 64 * 1024;
/// Largest `AtomicReq` payload: the prefix, an operand array and a
/// compare array.
pub const ATOMIC_REQ_MAX: usize = ATOMIC_HDR_LEN + 2 * ATOMIC_MAX;

/// An atomic request's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicHdr {
    /// Where: the region's key and the first element's address.
    pub target: Target,
    /// What.
    pub op: AtomicOp,
    /// On which element type.
    pub datatype: Datatype,
    /// `fi_atomic`, `fi_fetch_atomic` or `fi_compare_atomic`.
    pub kind: AtomicKind,
    /// Elements.
    pub count: u64,
}

/// An `AtomicReq` the decoder refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadAtomic {
    /// Fewer than [`ATOMIC_HDR_LEN`] bytes.
    Short(usize),
    /// An operation, datatype or form number libfabric does not have.
    Unknown,
    /// Reserved bytes not zero.
    Reserved,
    /// A payload length other than the prefix and the arrays its count
    /// and form call for, or arrays over [`ATOMIC_MAX`].
    Length,
}

impl fmt::Display for BadAtomic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadAtomic::Short(n) => write!(f, "atomic prefix of {n} bytes"),
            BadAtomic::Unknown => f.write_str("unknown atomic operation, datatype or form"),
            BadAtomic::Reserved => f.write_str("atomic prefix reserved bytes not zero"),
            BadAtomic::Length => f.write_str("atomic payload length does not match its count"),
        }
    }
}

impl std::error::Error for BadAtomic {}

impl AtomicHdr {
    /// Bytes of the target's memory it touches, if at most
    /// [`ATOMIC_MAX`].
    pub fn bytes(&self) -> Option<usize> {
        let n = self.count.checked_mul(self.datatype.size() as u64)?;
        usize::try_from(n).ok().filter(|&n| n <= ATOMIC_MAX)
    }

    /// The payload length this request has: the prefix, the operand
    /// array (none for `FI_ATOMIC_READ`), and the compare array for the
    /// compare form.
    pub fn payload_len(&self) -> Option<usize> {
        let n = self.bytes()?;
        let operand = if self.op == AtomicOp::Read { 0 } else { n };
        let compare = if self.kind == AtomicKind::Compare {
            n
        } else {
            0
        };
        Some(ATOMIC_HDR_LEN + operand + compare)
    }

    /// Bytes of the answer's payload when it succeeds: the old values
    /// for the fetching forms.
    pub fn answer_len(&self) -> usize {
        if self.kind.fetches() {
            self.bytes().unwrap_or(0)
        } else {
            0
        }
    }

    /// Little-endian `addr`, `key`, then `op`, `datatype`, `kind` bytes,
    /// five reserved zero bytes, and `count`.
    pub fn encode(&self) -> [u8; ATOMIC_HDR_LEN] {
        let mut b = [0u8; ATOMIC_HDR_LEN];
        b[..16].copy_from_slice(&self.target.encode());
        b[16] = self.op as u8;
        b[17] = self.datatype as u8;
        b[18] = self.kind as u8;
        b[24..32].copy_from_slice(&self.count.to_le_bytes());
        b
    }

    /// Decodes the prefix at the front of `b` and checks it against the
    /// whole payload's length `payload_len` (from the frame header).
    pub fn decode(b: &[u8], payload_len: u64) -> Result<AtomicHdr, BadAtomic> {
        if b.len() < ATOMIC_HDR_LEN {
            return Err(BadAtomic::Short(b.len()));
        }
        let target = Target::decode(b).map_err(|_| BadAtomic::Short(b.len()))?;
        let op = AtomicOp::from_u8(b[16]).ok_or(BadAtomic::Unknown)?;
        let datatype = Datatype::from_u8(b[17]).ok_or(BadAtomic::Unknown)?;
        let kind = AtomicKind::from_u8(b[18]).ok_or(BadAtomic::Unknown)?;
        if b[19..24].iter().any(|&x| x != 0) {
            return Err(BadAtomic::Reserved);
        }
        let mut c = [0u8; 8];
        c.copy_from_slice(&b[24..32]);
        let h = AtomicHdr {
            target,
            op,
            datatype,
            kind,
            count: u64::from_le_bytes(c),
        };
        match h.payload_len() {
            Some(n) if n as u64 == payload_len => Ok(h),
            _ => Err(BadAtomic::Length),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AtomicHdr {
        AtomicHdr {
            target: Target { addr: 24, key: 7 },
            op: AtomicOp::CswapGe,
            datatype: Datatype::I16,
            kind: AtomicKind::Compare,
            count: 3,
        }
    }

    #[test]
    fn prefix_round_trips_with_its_lengths() {
        let h = sample();
        assert_eq!(h.payload_len(), Some(ATOMIC_HDR_LEN + 12));
        assert_eq!(h.answer_len(), 6);
        assert_eq!(AtomicHdr::decode(&h.encode(), 44), Ok(h));
        let r = AtomicHdr {
            op: AtomicOp::Read,
            kind: AtomicKind::Fetch,
            ..h
        };
        assert_eq!(r.payload_len(), Some(ATOMIC_HDR_LEN), "no operand");
        let w = AtomicHdr {
            op: AtomicOp::Sum,
            kind: AtomicKind::Plain,
            ..h
        };
        assert_eq!((w.payload_len(), w.answer_len()), (Some(38), 0));
    }

    #[test]
    fn bad_prefixes_are_refused() {
        let b = sample().encode();
        assert_eq!(AtomicHdr::decode(&b[..31], 44), Err(BadAtomic::Short(31)));
        assert_eq!(AtomicHdr::decode(&b, 43), Err(BadAtomic::Length));
        for (at, v) in [(16, 19), (17, 14), (18, 3)] {
            let mut x = b;
            x[at] = v;
            assert_eq!(AtomicHdr::decode(&x, 44), Err(BadAtomic::Unknown));
        }
        let mut x = b;
        x[21] = 1;
        assert_eq!(AtomicHdr::decode(&x, 44), Err(BadAtomic::Reserved));
        // A count whose bytes overflow, or exceed the bound.
        for count in [u64::MAX, (ATOMIC_MAX / 2 + 1) as u64] {
            let h = AtomicHdr { count, ..sample() };
            assert_eq!(h.payload_len(), None);
            assert_eq!(AtomicHdr::decode(&h.encode(), 44), Err(BadAtomic::Length));
        }
        let most = AtomicHdr {
            count: (ATOMIC_MAX / 2) as u64,
            ..sample()
        };
        assert_eq!(most.payload_len(), Some(ATOMIC_REQ_MAX));
    }

    #[test]
    fn arbitrary_requests_decode_and_apply_without_panic() {
        // A deterministic xorshift sweep over plausible prefixes and
        // arbitrary elements; the fuzz target does the rest.
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut applied = 0;
        for _ in 0..20_000 {
            let mut b = [0u8; ATOMIC_HDR_LEN];
            b[..16].copy_from_slice(&[next().to_le_bytes(), next().to_le_bytes()].concat());
            b[16] = (next() % 20) as u8;
            b[17] = (next() % 15) as u8;
            b[18] = (next() % 4) as u8;
            b[24..].copy_from_slice(&(next() % 5).to_le_bytes());
            // Mostly the length the prefix calls for, sometimes not.
            let right = match (
                AtomicOp::from_u8(b[16]),
                Datatype::from_u8(b[17]),
                AtomicKind::from_u8(b[18]),
            ) {
                (Some(op), Some(datatype), Some(kind)) => AtomicHdr {
                    target: Target::default(),
                    op,
                    datatype,
                    kind,
                    count: u64::from(b[24]),
                }
                .payload_len(),
                _ => None,
            };
            let claimed = match right {
                Some(n) if next() % 4 != 0 => n as u64,
                _ => next() % 200,
            };
            let Ok(h) = AtomicHdr::decode(&b, claimed) else {
                continue;
            };
            let n = h.bytes().unwrap_or(0);
            let data: Vec<u8> = (0..3 * n).map(|_| next() as u8).collect();
            let mut target = data[..n].to_vec();
            let operand = if h.op == AtomicOp::Read {
                &[][..]
            } else {
                &data[n..2 * n]
            };
            let compare = if h.kind == AtomicKind::Compare {
                &data[2 * n..]
            } else {
                &[][..]
            };
            match crate::atomic::apply(h.op, h.datatype, &mut target, operand, compare) {
                Ok(old) => {
                    assert_eq!(old, data[..n]);
                    applied += 1;
                }
                Err(_) => assert_eq!(target, data[..n], "{h:?}"),
            }
        }
        assert!(
            applied > 100,
            "the sweep reached the arithmetic {applied} times"
        );
    }
}
