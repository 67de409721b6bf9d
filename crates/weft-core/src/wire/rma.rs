//! The fixed prefixes of the RMA frames' payloads (`docs/wire.md`
//! section 9.4): where in the target's memory an operation lands.
//!
//! They name a region by key and a byte in it by address; whether that
//! region exists, covers the range and allows the access is the target's
//! business, checked on every request (the decoders only check the
//! encoding).

use std::fmt;

/// Bytes of [`Target`] at the front of an `RmaWrite` payload.
pub const TARGET_LEN: usize = 16;
/// Bytes of a [`ReadReq`], the whole payload of an `RmaReadReq`.
pub const READ_REQ_LEN: usize = 24;
/// Largest payload of one `RmaReadResp`: a target answers a read in
/// pieces of at most this size, so what it holds for one answer at a
/// time is bounded whatever length was asked for.
pub const READ_CHUNK: usize = 256 * 1024;

/// The remote side of an RMA operation: a region's key and an address
/// in it (an offset from the region's start on the tcp provider, whose
/// `mr_mode` has no `FI_MR_VIRT_ADDR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Target {
    /// Address of the first byte.
    pub addr: u64,
    /// The region's key.
    pub key: u64,
}

/// A read request: `len` bytes at `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadReq {
    /// Where to read.
    pub target: Target,
    /// How many bytes.
    pub len: u64,
}

/// A prefix of the wrong size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadPrefix {
    /// Bytes given.
    pub got: usize,
    /// Bytes the prefix has.
    pub want: usize,
}

impl fmt::Display for BadPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RMA prefix of {} bytes, want {}", self.got, self.want)
    }
}

impl std::error::Error for BadPrefix {}

fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl Target {
    /// Little-endian `addr`, then `key`.
    pub fn encode(&self) -> [u8; TARGET_LEN] {
        let mut b = [0u8; TARGET_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Decodes the first [`TARGET_LEN`] bytes of `b` (an `RmaWrite`
    /// payload's front); fewer is `BadPrefix`.
    pub fn decode(b: &[u8]) -> Result<Target, BadPrefix> {
        if b.len() < TARGET_LEN {
            return Err(BadPrefix {
                got: b.len(),
                want: TARGET_LEN,
            });
        }
        Ok(Target {
            addr: u64_at(b, 0),
            key: u64_at(b, 8),
        })
    }
}

impl ReadReq {
    /// Little-endian `addr`, `key`, `len`.
    pub fn encode(&self) -> [u8; READ_REQ_LEN] {
        let mut b = [0u8; READ_REQ_LEN];
        b[..TARGET_LEN].copy_from_slice(&self.target.encode());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a whole `RmaReadReq` payload: exactly [`READ_REQ_LEN`]
    /// bytes, or `BadPrefix`.
    pub fn decode(b: &[u8]) -> Result<ReadReq, BadPrefix> {
        if b.len() != READ_REQ_LEN {
            return Err(BadPrefix {
                got: b.len(),
                want: READ_REQ_LEN,
            });
        }
        Ok(ReadReq {
            target: Target::decode(b)?,
            len: u64_at(b, 16),
        })
    }
}

/// Where `len` bytes at `addr` fall in a region of `region_len` bytes
/// addressed from `base`: the offset of the first byte, or `None` when
/// any byte lies outside (before `base`, past the end, or a sum that
/// overflows). A zero-length range inside or at the end is valid.
pub fn range_in(base: u64, region_len: usize, addr: u64, len: u64) -> Option<usize> {
    let off = addr.checked_sub(base)?;
    let end = off.checked_add(len)?;
    if end > region_len as u64 {
        return None;
    }
    usize::try_from(off).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_round_trip() {
        let t = Target {
            addr: 0x0102_0304_0506_0708,
            key: u64::MAX - 1,
        };
        assert_eq!(Target::decode(&t.encode()), Ok(t));
        let r = ReadReq { target: t, len: 77 };
        assert_eq!(ReadReq::decode(&r.encode()), Ok(r));
        // A write's payload continues after the target.
        let mut w = t.encode().to_vec();
        w.extend_from_slice(b"data");
        assert_eq!(Target::decode(&w), Ok(t));
    }

    #[test]
    fn wrong_sizes_are_refused() {
        let r = ReadReq::default().encode();
        for n in 0..READ_REQ_LEN {
            assert_eq!(
                ReadReq::decode(&r[..n]),
                Err(BadPrefix {
                    got: n,
                    want: READ_REQ_LEN
                })
            );
        }
        let mut long = r.to_vec();
        long.push(0);
        assert!(ReadReq::decode(&long).is_err());
        assert!(Target::decode(&r[..TARGET_LEN - 1]).is_err());
    }

    #[test]
    fn ranges_stay_inside_the_region() {
        assert_eq!(range_in(0, 100, 0, 100), Some(0));
        assert_eq!(range_in(0, 100, 100, 0), Some(100));
        assert_eq!(range_in(0, 100, 99, 2), None);
        assert_eq!(range_in(0, 100, 101, 0), None);
        assert_eq!(range_in(1000, 100, 999, 1), None, "before the start");
        assert_eq!(range_in(1000, 100, 1050, 50), Some(50));
        assert_eq!(range_in(0, 100, u64::MAX, 2), None, "overflow");
        assert_eq!(range_in(0, 100, 1, u64::MAX), None, "overflow");
    }
}
