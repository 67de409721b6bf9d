//! The bytes of a named AV's segment: header, commit slots and records,
//! their encoding, and the checks every value read back goes through.
//!
//! All integers are little-endian. Nothing here trusts the segment: each
//! decoder returns an error for any value it could not have written.

use crate::addr::FiAddr;
use crate::attr::{AddrFormat, AvType};
use crate::{Error, Result};

/// First bytes of every segment; written last when one is created.
pub(super) const MAGIC: [u8; 8] = *b"WEFT-SAV";
/// The layout this code reads and writes.
pub(super) const VERSION: u32 = 1;
/// Bytes before the first record (header and both commit slots).
pub(super) const HEADER_LEN: u64 = 256;
/// Offset of commit slot 0; slot 1 follows it.
pub(super) const COMMIT_OFF: u64 = 128;
/// Bytes of one commit slot.
pub(super) const COMMIT_LEN: usize = 32;
/// Bytes of the header proper (covered by its checksum from byte 8 on).
const FIELDS_END: usize = 104;
/// Longest domain label kept in the header; the full identity is hashed.
pub(super) const LABEL_LEN: usize = 48;
/// Longest address a record can carry.
pub(super) const MAX_ADDR_LEN: u32 = 256;
/// Bytes of a record before its address.
const RECORD_HEAD: usize = 16;
/// Records a segment may hold over its life: bounds the file (about
/// 200 MiB at Weft's 48-byte records) and what an opener reads.
pub const MAX_RECORDS: u64 = 1 << 22;

/// FNV-1a offset basis: the chain value of an empty log.
pub(super) const CHAIN_START: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// Continues an FNV-1a hash over `bytes`. Fixed and unseeded on purpose:
/// every process, whatever its build, must compute the same value.
pub(super) fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Bytes of one record for addresses of up to `max_addr_len` bytes.
pub(super) fn record_len(max_addr_len: u32) -> usize {
    (RECORD_HEAD + max_addr_len as usize).div_ceil(8) * 8
}

/// Offset of record `n`.
pub(super) fn record_off(n: u64, record_len: usize) -> u64 {
    HEADER_LEN + n * record_len as u64
}

/// Offset of commit slot `slot` (0 or 1).
pub(super) fn commit_off(slot: usize) -> u64 {
    COMMIT_OFF + (slot as u64) * COMMIT_LEN as u64
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(off..off + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(off..off + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

/// True when `b[range]` exists and is all zero (reserved bytes).
fn zero(b: &[u8], range: std::ops::Range<usize>) -> bool {
    b.get(range).is_some_and(|r| r.iter().all(|&x| x == 0))
}

fn put(b: &mut [u8], off: usize, v: &[u8]) {
    if let Some(d) = b.get_mut(off..off + v.len()) {
        d.copy_from_slice(v);
    }
}

const fn av_type_code(t: AvType) -> u32 {
    match t {
        AvType::Unspec | AvType::Table => 1,
        AvType::Map => 2,
    }
}

fn av_type_of(code: u32) -> Option<AvType> {
    match code {
        1 => Some(AvType::Table),
        2 => Some(AvType::Map),
        _ => None,
    }
}

const fn addr_format_code(f: AddrFormat) -> u32 {
    match f {
        AddrFormat::Unspec => 0,
        AddrFormat::SockaddrIn => 1,
        AddrFormat::SockaddrIn6 => 2,
        AddrFormat::Sockaddr => 3,
        AddrFormat::Str => 4,
    }
}

fn addr_format_of(code: u32) -> Option<AddrFormat> {
    match code {
        0 => Some(AddrFormat::Unspec),
        1 => Some(AddrFormat::SockaddrIn),
        2 => Some(AddrFormat::SockaddrIn6),
        3 => Some(AddrFormat::Sockaddr),
        4 => Some(AddrFormat::Str),
        _ => None,
    }
}

/// What a segment was created with: every opener must match it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedHeader {
    /// `Table` or `Map` (never `Unspec`).
    pub av_type: AvType,
    /// Receive-context bits of every handle.
    pub rx_ctx_bits: u32,
    /// Address format of the domain that created it.
    pub addr_format: AddrFormat,
    /// Longest address a record holds.
    pub max_addr_len: u32,
    /// `map_addr` of a MAP AV (0 for a TABLE).
    pub map_addr: u64,
    /// The creating domain's identity, cut to its first 48 bytes.
    pub domain_label: String,
    /// Hash of the creating domain's full identity.
    pub domain_hash: u64,
}

impl SharedHeader {
    /// Hash of a domain identity, as stored in the header.
    pub(super) fn hash_domain(domain: &str) -> u64 {
        fnv(CHAIN_START, domain.as_bytes())
    }

    /// The label stored for a domain identity: its first bytes, cut at a
    /// character boundary.
    pub(super) fn label_of(domain: &str) -> String {
        let mut end = domain.len().min(LABEL_LEN);
        while !domain.is_char_boundary(end) {
            end -= 1;
        }
        domain.get(..end).unwrap_or_default().to_string()
    }

    /// The whole first [`HEADER_LEN`] bytes of a new segment: header, then
    /// commit slot 0 holding the empty log. The magic is left zero, for
    /// [`magic`] to be written last.
    pub(super) fn encode_without_magic(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN as usize];
        put(&mut b, 8, &VERSION.to_le_bytes());
        put(&mut b, 12, &(HEADER_LEN as u32).to_le_bytes());
        put(&mut b, 16, &av_type_code(self.av_type).to_le_bytes());
        put(&mut b, 20, &self.rx_ctx_bits.to_le_bytes());
        put(
            &mut b,
            24,
            &addr_format_code(self.addr_format).to_le_bytes(),
        );
        put(&mut b, 28, &self.max_addr_len.to_le_bytes());
        put(
            &mut b,
            32,
            &(record_len(self.max_addr_len) as u32).to_le_bytes(),
        );
        put(&mut b, 40, &self.map_addr.to_le_bytes());
        put(&mut b, 48, &self.domain_hash.to_le_bytes());
        let label = self.domain_label.as_bytes();
        put(
            &mut b,
            56,
            label.get(..label.len().min(LABEL_LEN)).unwrap_or_default(),
        );
        let check = fnv(CHAIN_START, b.get(8..FIELDS_END).unwrap_or_default());
        put(&mut b, FIELDS_END, &check.to_le_bytes());
        let empty = Commit {
            seq: 1,
            records: 0,
            chain: CHAIN_START,
        };
        put(&mut b, COMMIT_OFF as usize, &empty.encode());
        b
    }

    /// Decodes the first [`HEADER_LEN`] bytes. `Ok(None)`: no magic yet (a
    /// creator died before finishing, or nobody created it). `Inval`:
    /// another file, or another layout version. `Io`: a damaged header.
    pub(super) fn decode(b: &[u8]) -> Result<Option<SharedHeader>> {
        if b.len() < HEADER_LEN as usize {
            return Err(Error::Io);
        }
        let magic = b.get(..8).unwrap_or_default();
        // The magic goes in last, in one write; only part of it (a
        // creator killed inside that write) means unfinished, like none.
        let written = magic.iter().take_while(|&&x| x != 0).count();
        if magic
            .get(written..)
            .is_some_and(|rest| rest.iter().all(|&x| x == 0))
            && magic.get(..written) == MAGIC.get(..written)
            && written < MAGIC.len()
        {
            return Ok(None);
        }
        if magic != MAGIC || u32_at(b, 8) != VERSION || u32_at(b, 12) != HEADER_LEN as u32 {
            return Err(Error::Inval);
        }
        let check = fnv(CHAIN_START, b.get(8..FIELDS_END).unwrap_or_default());
        if u64_at(b, FIELDS_END) != check {
            return Err(Error::Io);
        }
        let av_type = av_type_of(u32_at(b, 16)).ok_or(Error::Io)?;
        let rx_ctx_bits = u32_at(b, 20);
        let addr_format = addr_format_of(u32_at(b, 24)).ok_or(Error::Io)?;
        let max_addr_len = u32_at(b, 28);
        if rx_ctx_bits > crate::av::MAX_RX_CTX_BITS
            || max_addr_len == 0
            || max_addr_len > MAX_ADDR_LEN
            || u32_at(b, 32) as usize != record_len(max_addr_len)
            || u32_at(b, 36) != 0
            || !zero(b, FIELDS_END + 8..COMMIT_OFF as usize)
            || !zero(b, COMMIT_OFF as usize + 2 * COMMIT_LEN..HEADER_LEN as usize)
        {
            return Err(Error::Io);
        }
        let raw = b.get(56..56 + LABEL_LEN).unwrap_or_default();
        let end = raw.iter().position(|&x| x == 0).unwrap_or(raw.len());
        let domain_label = std::str::from_utf8(raw.get(..end).unwrap_or_default())
            .map_err(|_| Error::Io)?
            .to_string();
        Ok(Some(SharedHeader {
            av_type,
            rx_ctx_bits,
            addr_format,
            max_addr_len,
            map_addr: u64_at(b, 40),
            domain_label,
            domain_hash: u64_at(b, 48),
        }))
    }
}

/// The magic, written over the first bytes once everything else is.
pub(super) fn magic() -> [u8; 8] {
    MAGIC
}

/// One published state of the log: the first `records` records, whose
/// bytes hash (chained FNV-1a from [`CHAIN_START`]) to `chain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Commit {
    /// Bumped by every commit; 0 is never valid.
    pub(super) seq: u64,
    pub(super) records: u64,
    pub(super) chain: u64,
}

impl Commit {
    fn check(b: &[u8]) -> u64 {
        // Salted so that an all-zero slot never checks out.
        fnv(CHAIN_START ^ 0x5eed, b.get(..24).unwrap_or_default())
    }

    pub(super) fn encode(&self) -> [u8; COMMIT_LEN] {
        let mut b = [0u8; COMMIT_LEN];
        put(&mut b, 0, &self.seq.to_le_bytes());
        put(&mut b, 8, &self.records.to_le_bytes());
        put(&mut b, 16, &self.chain.to_le_bytes());
        let check = Commit::check(&b);
        put(&mut b, 24, &check.to_le_bytes());
        b
    }

    /// `None` for a slot that is torn, damaged or was never written.
    pub(super) fn decode(b: &[u8]) -> Option<Commit> {
        if b.len() < COMMIT_LEN || u64_at(b, 24) != Commit::check(b) {
            return None;
        }
        let c = Commit {
            seq: u64_at(b, 0),
            records: u64_at(b, 8),
            chain: u64_at(b, 16),
        };
        (c.seq != 0).then_some(c)
    }

    /// The newest valid commit of the two slots (`slots`: both, back to
    /// back), with its slot number.
    pub(super) fn newest(slots: &[u8]) -> Option<(usize, Commit)> {
        let a = slots.get(..COMMIT_LEN).and_then(Commit::decode);
        let b = slots
            .get(COMMIT_LEN..2 * COMMIT_LEN)
            .and_then(Commit::decode);
        match (a, b) {
            (Some(a), Some(b)) if b.seq > a.seq => Some((1, b)),
            (Some(a), _) => Some((0, a)),
            (None, Some(b)) => Some((1, b)),
            (None, None) => None,
        }
    }
}

const INSERT: u8 = 1;
const RESERVE: u8 = 2;
const FILL: u8 = 3;
const RELEASE: u8 = 4;
const REMOVE: u8 = 5;

/// One operation of the log. Replaying the log in order on an empty table
/// gives every process the same table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Record<'a> {
    /// `fi_av_insert` of one address.
    Insert(&'a [u8]),
    /// One handle of an asynchronous insert, filled later.
    Reserve,
    /// The address of a reserved handle.
    Fill(FiAddr, &'a [u8]),
    /// A reserved handle whose address failed.
    Release(FiAddr),
    /// `fi_av_remove` of one handle.
    Remove(FiAddr),
}

impl Record<'_> {
    /// Writes the record into `out` (exactly one record's bytes, zeroed).
    pub(super) fn encode_into(&self, out: &mut [u8]) {
        let (kind, handle, addr): (u8, FiAddr, &[u8]) = match *self {
            Record::Insert(a) => (INSERT, 0, a),
            Record::Reserve => (RESERVE, 0, &[]),
            Record::Fill(h, a) => (FILL, h, a),
            Record::Release(h) => (RELEASE, h, &[]),
            Record::Remove(h) => (REMOVE, h, &[]),
        };
        put(out, 0, &[kind]);
        // Callers check lengths against the segment's maximum first.
        put(
            out,
            2,
            &(addr.len().min(usize::from(u16::MAX)) as u16).to_le_bytes(),
        );
        put(out, 8, &handle.to_le_bytes());
        put(out, RECORD_HEAD, addr);
    }

    /// Decodes one record of `b` (a whole record) for a segment whose
    /// addresses are at most `max_addr_len` bytes. Any byte the encoder
    /// would not have written is `Io`.
    pub(super) fn decode(b: &[u8], max_addr_len: u32) -> Result<Record<'_>> {
        let (kind, flags_a, len, flags_b) = (
            b.first().copied().ok_or(Error::Io)?,
            b.get(1).copied().ok_or(Error::Io)?,
            usize::from(u16::from_le_bytes([
                b.get(2).copied().unwrap_or(0),
                b.get(3).copied().unwrap_or(0),
            ])),
            u32_at(b, 4),
        );
        if flags_a != 0 || flags_b != 0 || len > max_addr_len as usize {
            return Err(Error::Io);
        }
        let handle = u64_at(b, 8);
        let addr = b.get(RECORD_HEAD..RECORD_HEAD + len).ok_or(Error::Io)?;
        let tail = b.get(RECORD_HEAD + len..).unwrap_or_default();
        if tail.iter().any(|&x| x != 0) {
            return Err(Error::Io);
        }
        let no_addr = len == 0;
        match kind {
            INSERT if handle == 0 => Ok(Record::Insert(addr)),
            RESERVE if handle == 0 && no_addr => Ok(Record::Reserve),
            FILL => Ok(Record::Fill(handle, addr)),
            RELEASE if no_addr => Ok(Record::Release(handle)),
            REMOVE if no_addr => Ok(Record::Remove(handle)),
            _ => Err(Error::Io),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> SharedHeader {
        SharedHeader {
            av_type: AvType::Map,
            rx_ctx_bits: 4,
            addr_format: AddrFormat::SockaddrIn6,
            max_addr_len: 28,
            map_addr: 0x1234,
            domain_label: SharedHeader::label_of("tcp/lo"),
            domain_hash: SharedHeader::hash_domain("tcp/lo"),
        }
    }

    #[test]
    fn header_round_trips_and_rejects_every_damaged_byte() {
        let h = header();
        let mut b = h.encode_without_magic();
        assert_eq!(SharedHeader::decode(&b), Ok(None));
        b[..8].copy_from_slice(&magic());
        assert_eq!(SharedHeader::decode(&b), Ok(Some(h.clone())));
        let slots = COMMIT_OFF as usize..COMMIT_OFF as usize + 2 * COMMIT_LEN;
        for i in (0..HEADER_LEN as usize).filter(|i| !slots.contains(i)) {
            let mut d = b.clone();
            d[i] ^= 0x40;
            assert!(SharedHeader::decode(&d).is_err(), "byte {i}");
        }
        assert_eq!(SharedHeader::decode(&b[..100]), Err(Error::Io));
        let mut other = b.clone();
        other[..8].copy_from_slice(b"NOT-WEFT");
        assert_eq!(SharedHeader::decode(&other), Err(Error::Inval));
        for cut in 0..8 {
            let mut part = b.clone();
            part[cut..8].fill(0);
            assert_eq!(SharedHeader::decode(&part), Ok(None), "magic cut at {cut}");
        }
    }

    #[test]
    fn labels_cut_at_char_boundaries() {
        let long = "é".repeat(40);
        let l = SharedHeader::label_of(&long);
        assert!(l.len() <= LABEL_LEN && long.starts_with(&l));
        assert_eq!(SharedHeader::label_of("tcp/lo"), "tcp/lo");
    }

    #[test]
    fn commit_slots_pick_newest_valid() {
        let c1 = Commit {
            seq: 1,
            records: 0,
            chain: CHAIN_START,
        };
        let c2 = Commit {
            seq: 2,
            records: 3,
            chain: 99,
        };
        let mut slots = [0u8; 2 * COMMIT_LEN];
        assert_eq!(Commit::newest(&slots), None);
        slots[..COMMIT_LEN].copy_from_slice(&c1.encode());
        assert_eq!(Commit::newest(&slots), Some((0, c1)));
        slots[COMMIT_LEN..].copy_from_slice(&c2.encode());
        assert_eq!(Commit::newest(&slots), Some((1, c2)));
        // A torn newer slot leaves the older one in force.
        for cut in 0..COMMIT_LEN {
            let mut torn = slots;
            torn[COMMIT_LEN + cut..].copy_from_slice(&[0xAA; COMMIT_LEN][cut..]);
            assert_eq!(Commit::newest(&torn), Some((0, c1)), "cut {cut}");
        }
    }

    #[test]
    fn records_round_trip_and_refuse_what_was_never_written() {
        let rl = record_len(28);
        assert_eq!(rl, 48);
        let addr = [7u8; 16];
        for r in [
            Record::Insert(&addr),
            Record::Reserve,
            Record::Fill(5, &addr),
            Record::Release(6),
            Record::Remove(1 << 40),
        ] {
            let mut b = vec![0u8; rl];
            r.encode_into(&mut b);
            assert_eq!(Record::decode(&b, 28), Ok(r));
        }
        let mut b = vec![0u8; rl];
        Record::Insert(&addr).encode_into(&mut b);
        let mut long = b.clone();
        long[2] = 29;
        assert_eq!(Record::decode(&long, 28), Err(Error::Io));
        let mut kind = b.clone();
        kind[0] = 9;
        assert_eq!(Record::decode(&kind, 28), Err(Error::Io));
        let mut pad = b.clone();
        pad[rl - 1] = 1;
        assert_eq!(Record::decode(&pad, 28), Err(Error::Io));
        let mut reserve = vec![0u8; rl];
        Record::Reserve.encode_into(&mut reserve);
        reserve[8] = 1;
        assert_eq!(Record::decode(&reserve, 28), Err(Error::Io));
        assert_eq!(Record::decode(&b[..10], 28), Err(Error::Io));
    }
}
