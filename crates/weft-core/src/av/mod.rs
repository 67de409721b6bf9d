//! Address vectors (`fi_av(3)`): the table that maps peer addresses to
//! `fi_addr_t` handles, and the pure rules around it.
//!
//! [`AvTable`] owns the entries. Inserting is split into
//! [`reserve`](AvTable::reserve) / [`fill`](AvTable::fill) /
//! [`release`](AvTable::release) because an asynchronous (`FI_EVENT`) insert
//! must hand out its handles in call order at once, while the addresses
//! themselves may resolve later and in any order;
//! [`insert`](AvTable::insert) is the synchronous shortcut.
//!
//! The free functions cover what does not need a table: receive-context
//! addressing ([`rx_addr`]), the buffer conventions of `fi_av_lookup` and
//! `fi_av_straddr`, insert flag checks, the EQ events of an `FI_EVENT` insert
//! and the expansion of `fi_av_insertsym`.

pub mod auth_keys;
mod index;
mod key_lease;
pub mod shared;
mod sym;
mod table;
#[cfg(test)]
mod tests;
mod version;

pub use auth_keys::{AuthKeyTable, MAX_AV_AUTH_KEYS};
pub use key_lease::KeyLease;
pub use sym::expand_insertsym;
pub use table::AvTable;
pub use version::{version_now, AvVersion};

use crate::{addr::FiAddr, addr::FI_ADDR_NOTAVAIL, attr::AvType, flags::AvFlags, Error, Result};

/// Attributes of an address vector (`struct fi_av_attr`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AvAttr {
    /// Requested type; `Unspec` lets the table choose (it chooses `Table`).
    pub av_type: AvType,
    /// Expected number of addresses: a sizing hint, never a limit.
    pub count: usize,
    /// High bits of every handle reserved for a receive-context index.
    pub rx_ctx_bits: u32,
    /// Open flags (`FI_EVENT`, `FI_SYMMETRIC`, `FI_AV_USER_ID`, `FI_READ`).
    pub flags: AvFlags,
    /// Name of a shared AV: opened with
    /// [`AvTable::open_shared`] (see [`shared`]); [`AvTable::open`]
    /// refuses it.
    pub name: Option<String>,
    /// Named MAP AVs: the `map_addr` processes agree on (0: take the
    /// segment's, see [`AvTable::map_addr`]). Ignored otherwise.
    pub map_addr: u64,
}

/// The most receive-context bits an AV accepts: `fi_rx_addr` takes an `int`
/// index, so more bits could never be addressed.
pub const MAX_RX_CTX_BITS: u32 = 32;

/// Mask of the low `bits` bits.
const fn low_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// `fi_rx_addr`: puts a receive-context index into the top `rx_ctx_bits`
/// bits of a handle.
///
/// Unlike libfabric's plain OR, any receive-context bits already in `fi_addr`
/// are replaced, so re-targeting an rx-addressed handle works. `rx_index` is
/// truncated to `rx_ctx_bits` bits; `rx_ctx_bits` above [`MAX_RX_CTX_BITS`]
/// is treated as that maximum, and 0 returns `fi_addr` unchanged.
/// `FI_ADDR_NOTAVAIL` (connected endpoints) keeps its all-ones low part, which
/// [`split_rx_addr`] maps back to `FI_ADDR_NOTAVAIL`.
pub fn rx_addr(fi_addr: FiAddr, rx_index: u32, rx_ctx_bits: u32) -> FiAddr {
    let bits = rx_ctx_bits.min(MAX_RX_CTX_BITS);
    if bits == 0 {
        return fi_addr;
    }
    let shift = 64 - bits;
    let rx = u64::from(rx_index) & low_mask(bits);
    (rx << shift) | (fi_addr & low_mask(shift))
}

/// Inverse of [`rx_addr`]: the handle without receive-context bits, and the
/// receive-context index.
///
/// An all-ones handle part is `FI_ADDR_NOTAVAIL`: no table ever hands it out.
pub fn split_rx_addr(fi_addr: FiAddr, rx_ctx_bits: u32) -> (FiAddr, u32) {
    let bits = rx_ctx_bits.min(MAX_RX_CTX_BITS);
    if bits == 0 {
        return (fi_addr, 0);
    }
    let shift = 64 - bits;
    let base = fi_addr & low_mask(shift);
    let base = if base == low_mask(shift) {
        FI_ADDR_NOTAVAIL
    } else {
        base
    };
    // `bits` <= 32, so the shifted value always fits.
    let rx = u32::try_from(fi_addr >> shift).unwrap_or(u32::MAX);
    (base, rx)
}

/// Copies as much of `src` as fits into `dst` and returns the full length of
/// `src`, the `fi_av_lookup` convention: a return value above `dst.len()`
/// means the copy was truncated.
pub fn copy_truncated(src: &[u8], dst: &mut [u8]) -> usize {
    let n = src.len().min(dst.len());
    dst[..n].copy_from_slice(&src[..n]);
    src.len()
}

/// Writes `s` into `dst` as a NUL-terminated string, truncated to fit (the
/// NUL always fits unless `dst` is empty), and returns the length a complete
/// copy needs including the NUL: the `fi_av_straddr` convention.
pub fn straddr_into(s: &str, dst: &mut [u8]) -> usize {
    let full = s.len() + 1;
    if let Some(room) = dst.len().checked_sub(1) {
        let n = s.len().min(room);
        dst[..n].copy_from_slice(&s.as_bytes()[..n]);
        dst[n] = 0;
    }
    full
}

/// Flags an insert call (`fi_av_insert`, `insertsvc`, `insertsym`) accepts.
const INSERT_FLAGS: AvFlags = AvFlags::MORE
    .union(AvFlags::EVENT)
    .union(AvFlags::SYNC_ERR)
    .union(AvFlags::AV_USER_ID);

/// Checks the flags of an insert call.
///
/// `EVENT | SYNC_ERR` and any flag outside `MORE | EVENT | SYNC_ERR |
/// AV_USER_ID` (unknown bits included) are `BadFlags`; `SYNC_ERR` without a
/// status buffer is `Inval`; a per-insert `AV_USER_ID` on an AV opened with
/// `AV_USER_ID` is `Inval` (such AVs take ids through `fi_av_set_user_id`).
pub fn check_insert_flags(
    flags: AvFlags,
    opened_with_user_id: bool,
    has_status_buffer: bool,
) -> Result<()> {
    if flags.contains(AvFlags::EVENT | AvFlags::SYNC_ERR) {
        return Err(Error::BadFlags);
    }
    if flags.bits() & !INSERT_FLAGS.bits() != 0 {
        return Err(Error::BadFlags);
    }
    if flags.contains(AvFlags::SYNC_ERR) && !has_status_buffer {
        return Err(Error::Inval);
    }
    if flags.contains(AvFlags::AV_USER_ID) && opened_with_user_id {
        return Err(Error::Inval);
    }
    Ok(())
}

/// One EQ event of an `FI_EVENT` insert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsertEvent {
    /// Error entry: the address at `index` (within the insert call) failed.
    Error {
        /// Index of the failed address in the insert call.
        index: usize,
        /// Why it failed.
        err: Error,
    },
    /// The completion entry that ends every insert call.
    Complete {
        /// Number of addresses inserted successfully.
        count: usize,
    },
}

/// The EQ events an `FI_EVENT` insert produces from its per-address results:
/// one [`InsertEvent::Error`] per failure in ascending index order, then
/// exactly one [`InsertEvent::Complete`], even for zero addresses or when
/// every address failed.
pub fn insert_events<T>(results: &[Result<T>]) -> Vec<InsertEvent> {
    let mut events: Vec<InsertEvent> = results
        .iter()
        .enumerate()
        .filter_map(|(index, r)| {
            r.as_ref()
                .err()
                .map(|&err| InsertEvent::Error { index, err })
        })
        .collect();
    let count = results.len() - events.len();
    events.push(InsertEvent::Complete { count });
    events
}

/// The `FI_SYNC_ERR` status array: 0 for an inserted address, the positive
/// libfabric code of the error otherwise.
pub fn sync_err_status<T>(results: &[Result<T>]) -> Vec<i32> {
    results
        .iter()
        .map(|r| r.as_ref().err().map_or(0, |e| e.code()))
        .collect()
}

#[cfg(test)]
mod rule_tests {
    use super::*;

    #[test]
    fn insert_flag_rules() {
        use AvFlags as F;
        assert_eq!(check_insert_flags(F::empty(), false, false), Ok(()));
        assert_eq!(check_insert_flags(F::MORE | F::EVENT, false, false), Ok(()));
        assert_eq!(check_insert_flags(F::SYNC_ERR, false, true), Ok(()));
        assert_eq!(
            check_insert_flags(F::SYNC_ERR, false, false),
            Err(Error::Inval)
        );
        assert_eq!(
            check_insert_flags(F::EVENT | F::SYNC_ERR, false, true),
            Err(Error::BadFlags)
        );
        assert_eq!(
            check_insert_flags(F::EVENT | F::SYNC_ERR, false, false),
            Err(Error::BadFlags)
        );
        assert_eq!(
            check_insert_flags(F::READ, false, false),
            Err(Error::BadFlags)
        );
        assert_eq!(
            check_insert_flags(F::SYMMETRIC, false, false),
            Err(Error::BadFlags)
        );
        assert_eq!(
            check_insert_flags(F::from_bits_retain(1 << 2), false, false),
            Err(Error::BadFlags)
        );
        assert_eq!(check_insert_flags(F::AV_USER_ID, false, false), Ok(()));
        assert_eq!(
            check_insert_flags(F::AV_USER_ID, true, false),
            Err(Error::Inval)
        );
        assert_eq!(check_insert_flags(F::MORE, true, false), Ok(()));
    }

    #[test]
    fn insert_event_sequences() {
        let none: [Result<FiAddr>; 0] = [];
        assert_eq!(
            insert_events(&none),
            vec![InsertEvent::Complete { count: 0 }]
        );
        assert_eq!(sync_err_status(&none), Vec::<i32>::new());

        let all_fail: Vec<Result<FiAddr>> = vec![Err(Error::Inval), Err(Error::Canceled)];
        assert_eq!(
            insert_events(&all_fail),
            vec![
                InsertEvent::Error {
                    index: 0,
                    err: Error::Inval
                },
                InsertEvent::Error {
                    index: 1,
                    err: Error::Canceled
                },
                InsertEvent::Complete { count: 0 },
            ]
        );

        let mixed: Vec<Result<FiAddr>> = vec![
            Ok(0),
            Err(Error::HostUnreach),
            Ok(1),
            Err(Error::Inval),
            Ok(2),
        ];
        assert_eq!(
            insert_events(&mixed),
            vec![
                InsertEvent::Error {
                    index: 1,
                    err: Error::HostUnreach
                },
                InsertEvent::Error {
                    index: 3,
                    err: Error::Inval
                },
                InsertEvent::Complete { count: 3 },
            ]
        );
        assert_eq!(sync_err_status(&mixed), vec![0, 113, 0, 22, 0]);
        let ok_only: Vec<Result<()>> = vec![Ok(()), Ok(())];
        assert_eq!(
            insert_events(&ok_only),
            vec![InsertEvent::Complete { count: 2 }]
        );
    }
}
