//! Where things are in a segment (`docs/wire.md`, "The shm segment").
//! Every offset here is a constant or computed from the two sizes a
//! segment's header gives, after [`Geometry::check`] has bounded them.
//!
//! All integers are in the host's byte order: both sides are on one host.

/// "WEFTSHM1" as a little-endian u64; written with the rest of the
/// header but the version before the segment takes its name
/// (`create::create_segment`), so a file under a segment name without it
/// is none of ours being made.
pub const MAGIC: u64 = u64::from_le_bytes(*b"WEFTSHM1");
/// Layout version (3: the key proof fields; 4: the key id, direct RMA;
/// 5: RMA request ids; 6: endpoint serials; 7: the segment made under a
/// private name and linked under its own with its header but the
/// version, the version stored last, once the doorbell is made — a
/// segment whose version is 0 is not ready; 8: records published in
/// band, by their first word written last, and no tail word — bytes
/// 128–135 of a control block are unused, and a version-7 sender's
/// records would never be seen; 9: a channel's state and claim count
/// one 64-bit word, `C_STATE_GEN`, and its pid after it, where version 8
/// kept the count; 10: a claimer holds its channel's claim lock, a byte
/// lock on the segment file at the channel's control block, from before
/// its claim's swap until after its last, and the owner never voids a
/// claim whose lock is held (`claim_lock`) — a version-9 claimer takes
/// none, and a version-9 owner would void a live one; 11: the owner's
/// CMA probe word in the header (`H_CMA_PROBE`), an offer block per
/// channel after the control blocks (`Geometry::offer`), and `F_SPLIT`
/// on CMA records: a large message copied half by each side; 12: a CMA
/// announcement's second word says whether a shared pool reference
/// follows its ranges, and an offer block names the owner's pool at
/// `O_POOL`: both sides of a message between shared pools copy through
/// mappings of them, `pool`). Versions do not read
/// each other's segments: a peer of another version is refused
/// (`ring::header_geometry`), whatever it wrote.
pub const VERSION: u32 = 12;

/// Header fields.
pub const H_MAGIC: usize = 0;
pub const H_VERSION: usize = 8;
pub const H_CHANNELS: usize = 12;
pub const H_RING: usize = 16;
pub const H_PID: usize = 24;
pub const H_START: usize = 32;
/// 1: the owner holds an authorization key, so every sender waits for its
/// verdict before writing (`keyproof`). Only advice for senders: what the
/// owner enforces is its own key.
pub const H_KEYED: usize = 40;
/// The owner's endpoint serial (`live::serial`): with its pid and start
/// time, it tells this endpoint from any other that had or will have the
/// name, in this process too. A sender writes its own at `C_SERIAL` when
/// it claims a channel, so an initiator knows which target instance an
/// answer channel speaks for (`docs/design.md`, "RMA: executed at the
/// target").
pub const H_SERIAL: usize = 48;
/// The owner sleeps on its doorbell: a sender that publishes a record
/// rings it (once: the sender that swaps it from 1 to 0 does).
pub const H_SLEEPING: usize = 64;
/// The address of the owner's CMA probe word (`cma::PROBE_MAGIC`): a
/// sender that can read it may write the owner's memory too, and so
/// take a split offer (`split`).
pub const H_CMA_PROBE: usize = 72;
/// Bytes of the header.
pub const HEADER: usize = 256;

/// Bytes of one channel's control block.
pub const CTL: usize = 256;
// Channel control fields (offsets within the block).
/// The channel's state (bits 0–31: `FREE`, `CLAIMING | pid`, `ACTIVE`,
/// `CLOSED`) and its claim count (bits 32–63), one 64-bit word: every
/// move a sender makes on its own claim is one compare-and-swap of both,
/// so it never moves a later claim's state (`state.rs`; `docs/design.md`,
/// "The state word"). Only ever read and written whole: a 32-bit look at
/// either half would depend on the host's byte order.
pub const C_STATE_GEN: usize = 0;
pub const C_PID: usize = 8;
pub const C_NAME_LEN: usize = 12;
pub const C_NAME: usize = 16;
/// Written by the sender at its claim: its endpoint's serial (`H_SERIAL`).
pub const C_SERIAL: usize = 64;
pub const C_START: usize = 80;
/// Key proof, written by the sender at its claim (`keyproof`): its nonce,
/// whether it proves a key (1) or not (0), and its MAC.
pub const C_TX_NONCE: usize = 88;
pub const C_PROVES: usize = 104;
/// Written by the sender at its claim when it proves a key: the key's id
/// (`keys::key_id`), which tells an owner holding several keys which one
/// to check the MAC with.
pub const C_KEY_ID: usize = 112;
pub const C_TX_PROOF: usize = 152;
/// Bytes 128–135 are unused (0): the tail word of versions before 8.
/// The receiver learns what is published from the word at its head
/// (`ring::Chan::next`); nothing read per message lives in this line.
/// The sender waits for room: the receiver rings the sender's doorbell
/// when it consumes.
pub const C_TX_WAIT: usize = 136;
/// Written by the sender at its claim: the address of its CMA probe word
/// (`cma::PROBE_MAGIC`), read by the receiver with `process_vm_readv`.
pub const C_CMA_PROBE: usize = 144;
/// Written by the receiver only: bytes consumed (monotonic).
pub const C_HEAD: usize = 192;
/// Written by the receiver only: whether it can read the sender's memory
/// (`CMA_UNKNOWN` until it first sees the channel).
pub const C_CMA: usize = 200;
/// `C_CMA` values: only a channel at `CMA_OK` carries CMA records.
pub const CMA_UNKNOWN: u32 = 0;
pub const CMA_OK: u32 = 1;
pub const CMA_NO: u32 = 2;
/// Key proof, written by the owner only: its verdict on the claim, the
/// nonce it published for the channel's next claim, and its MAC.
pub const C_AUTH: usize = 204;
pub const C_RX_NONCE: usize = 208;
pub const C_RX_PROOF: usize = 224;
/// `C_AUTH` values: a sender that waits for the verdict writes nothing
/// before `AUTH_OK`.
pub const AUTH_UNKNOWN: u32 = 0;
pub const AUTH_OK: u32 = 1;
pub const AUTH_REFUSED: u32 = 2;

/// Bytes of one channel's offer block (`Geometry::offer`): two lines.
pub const OFFER: usize = 128;
/// Offer fields (offsets within the block). The state word: a split
/// state (`O_OFFERED` ...) in bits 0–2 and, above, the ring position
/// that ends the CMA record it is about (`split_word`).
pub const O_STATE: usize = 0;
/// Where in the message the sender's part begins (bytes).
pub const O_AT: usize = 8;
/// How many ranges of the owner's memory follow (at most `O_MAX`).
pub const O_N: usize = 16;
/// The ranges (address, length; 16 bytes each) the sender's part goes
/// to, in order, their lengths the part's length.
pub const O_RANGES: usize = 24;
/// Ranges an offer lists at most.
pub const O_MAX: usize = 4;
/// The owner's shared pool holding every range, if one does
/// (`pool::PoolRef`, 32 bytes; a length of 0 when none): the sender may
/// map it and write its part without the kernel.
pub const O_POOL: usize = O_RANGES + 16 * O_MAX;
/// Split states. Written by the owner: `O_OFFERED`, `O_REVOKED`; by the
/// sender: `O_TAKEN` (a compare-and-swap from `O_OFFERED`), then
/// `O_DONE` or `O_FAILED` (it could not write: the owner copies the part
/// itself).
pub const O_OFFERED: u64 = 1;
pub const O_TAKEN: u64 = 2;
pub const O_DONE: u64 = 3;
pub const O_FAILED: u64 = 4;
pub const O_REVOKED: u64 = 5;

/// The offer state word for split state `state` about the CMA record
/// that ends at ring position `end`.
#[inline(always)]
pub const fn split_word(end: u64, state: u64) -> u64 {
    (end << 3) | state
}

/// Channel states.
pub const FREE: u32 = 0;
pub const ACTIVE: u32 = 2;
pub const CLOSED: u32 = 3;
/// Being claimed: this bit and the claimer's pid, set in the one
/// compare-and-swap that takes a free channel, so the owner can tell a
/// claim whose process died before finishing it.
pub const CLAIMING: u32 = 1 << 31;

/// The state of a claim being made by process `pid`.
#[inline(always)]
pub const fn claiming(pid: u32) -> u32 {
    CLAIMING | (pid & !CLAIMING)
}

/// The state word (`C_STATE_GEN`) of `state` at claim count `gen`.
#[inline(always)]
pub const fn state_gen(state: u32, gen: u32) -> u64 {
    ((gen as u64) << 32) | state as u64
}

/// A state word's state.
#[inline(always)]
pub const fn state_of(word: u64) -> u32 {
    word as u32
}

/// A state word's claim count.
#[inline(always)]
pub const fn gen_of(word: u64) -> u32 {
    (word >> 32) as u32
}

/// Longest endpoint name, bytes.
pub const NAME_MAX: usize = 48;

/// Record header bytes; payload follows, the record padded to 8. The
/// first 4 are the record's word (kind, flags, id), never 0: stored last,
/// with release, it publishes the record (`ring::Chan::publish`).
pub const REC_HDR: usize = 32;
/// Record kinds (low byte of the first word).
pub const K_FIRST: u32 = 1;
pub const K_CONT: u32 = 2;
pub const K_PAD: u32 = 3;
/// A whole message the receiver reads from the sender's memory: the
/// payload lists where it lies (`cma::Announce`); always `F_LAST`.
pub const K_CMA: u32 = 4;
/// RMA (`docs/wire.md`, "RMA records"): a write request (`tag` the key,
/// `data` remote CQ data with `F_DATA`, `total` the bytes that follow as
/// continuation records, payload the 8-byte target offset), a read
/// request (`tag` the key, `data` the length, payload the offset; one
/// record) and an answer (`data` 0 or an error code, `total` the read
/// bytes that follow as continuation records).
pub const K_RMA_W: u32 = 5;
pub const K_RMA_R: u32 = 6;
pub const K_RESP: u32 = 7;
/// An atomic request: payload weft-core's 32-byte atomic prefix, `total`
/// the operand and compare bytes that follow as continuation records.
pub const K_ATOMIC: u32 = 8;
/// Direct RMA (cross-memory attach): a write request whose bytes the
/// target reads from the initiator's buffers, and a read request whose
/// bytes the target writes into the initiator's buffers. `tag` the key,
/// `data` remote CQ data with `F_DATA` (writes), `total` the bytes moved,
/// payload the 8-byte target offset and the initiator's ranges
/// (`cma::DirectReq`); one record, always `F_LAST`; answered by one
/// `K_RESP` without bytes.
pub const K_RMA_WD: u32 = 9;
pub const K_RMA_RD: u32 = 10;
/// Record flags.
pub const F_TAGGED: u32 = 1 << 8;
pub const F_DATA: u32 = 1 << 9;
pub const F_LAST: u32 = 1 << 10;
/// Every flag a record may carry.
pub const F_ALL: u32 = F_TAGGED | F_DATA | F_LAST;
/// On a CMA record only: its sender can write the owner's memory and
/// looks for a split offer (`Geometry::offer`) while the record waits,
/// so the owner may ask it to copy the message's back part itself
/// (`split`).
pub const F_SPLIT: u32 = 1 << 11;
/// An RMA or atomic request's id (kinds 5, 6, 8, 9, 10 only; every other
/// kind keeps these bits 0): bits 12–31 of its first word, echoed by its
/// answer's `tag`, so that an answer finds its own operation rather than
/// the oldest one (`docs/design.md`, "RMA: executed at the target").
/// Bit 11 is `F_SPLIT`, on CMA records only.
pub const ID_SHIFT: u32 = 12;
pub const ID_MASK: u32 = !0 << ID_SHIFT;
/// The largest id; ids wrap around past it.
pub const ID_MAX: u32 = ID_MASK >> ID_SHIFT;

/// The bits of a record's first word past its kind that a record of
/// kind `kind` may set: the flags, and for requests their id.
#[inline(always)]
pub fn word_bits(kind: u32) -> u32 {
    match kind {
        K_RMA_W | K_RMA_R | K_ATOMIC | K_RMA_WD | K_RMA_RD => F_ALL | ID_MASK,
        K_CMA => F_ALL | F_SPLIT,
        _ => F_ALL,
    }
}

/// Ring sizes a segment may declare (powers of two).
pub const RING_MIN: usize = 4096;
pub const RING_MAX: usize = 16 << 20;
/// Channels a segment may declare.
pub const CHANNELS_MAX: usize = 64;

/// What this provider creates: 16 senders at once, 256 KiB each.
pub const CHANNELS: usize = 16;
pub const RING: usize = 256 << 10;

/// A segment's shape: channel count and ring size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub channels: usize,
    /// Bytes of each ring: a power of two (`check`; the ring masks with it).
    pub ring: usize,
}

impl Geometry {
    /// The shape this provider creates.
    pub const OURS: Geometry = Geometry {
        channels: CHANNELS,
        ring: RING,
    };

    /// Accepts what a header declares only within the bounds above.
    pub fn check(channels: u32, ring: u32) -> Option<Geometry> {
        let (channels, ring) = (channels as usize, ring as usize);
        let ok = (1..=CHANNELS_MAX).contains(&channels)
            && (RING_MIN..=RING_MAX).contains(&ring)
            && ring.is_power_of_two();
        ok.then_some(Geometry { channels, ring })
    }

    /// Offset of channel `i`'s control block.
    pub fn ctl(&self, i: usize) -> usize {
        HEADER + i * CTL
    }

    /// Offset of channel `i`'s offer block ([`OFFER`] bytes, after every
    /// control block): the owner's offer to a CMA sender of a part of
    /// its message to write (`split`). Apart from the control blocks, so
    /// nothing of it shares a line the message path reads.
    pub fn offer(&self, i: usize) -> usize {
        HEADER + self.channels * CTL + i * OFFER
    }

    /// Offset of the first ring (page aligned). Rounded up by a mask:
    /// `next_multiple_of` takes a remainder, a test and a conditional
    /// move, and this is worked out on every send and every drain of a
    /// channel. (The sum is small: at most `CHANNELS_MAX` blocks.)
    #[inline(always)]
    pub fn rings(&self) -> usize {
        (HEADER + self.channels * (CTL + OFFER) + 4095) & !4095
    }

    /// Offset of channel `i`'s ring.
    pub fn ring_at(&self, i: usize) -> usize {
        self.rings() + i * self.ring
    }

    /// Bytes of the whole segment.
    pub fn bytes(&self) -> usize {
        self.rings() + self.channels * self.ring
    }

    /// Largest payload of one record: a quarter of the ring, so records
    /// of a long message follow each other while the receiver drains.
    pub fn chunk(&self) -> usize {
        self.ring / 4
    }
}

// The key proof's fields fit where nothing else is, checked when this
// compiles: the sender's before the unused word and after its probe, the
// owner's after its cma word, the header's before `sleeping`.
const _: () = {
    use weft_core::auth::MAC_LEN;
    use weft_core::wire::claim::NONCE_LEN;
    assert!(C_START + 8 <= C_TX_NONCE && C_TX_NONCE + NONCE_LEN <= C_PROVES);
    assert!(C_PROVES + 4 <= C_KEY_ID && C_KEY_ID + crate::keys::KEY_ID_LEN <= 128);
    assert!(C_CMA_PROBE + 8 <= C_TX_PROOF && C_TX_PROOF + MAC_LEN <= C_HEAD);
    assert!(C_CMA + 4 <= C_AUTH && C_AUTH + 4 <= C_RX_NONCE);
    assert!(C_RX_NONCE + NONCE_LEN <= C_RX_PROOF && C_RX_PROOF + MAC_LEN <= CTL);
    assert!(H_START + 8 <= H_KEYED && H_KEYED + 4 <= H_SERIAL);
    assert!(H_SERIAL + 8 <= H_SLEEPING && H_SLEEPING + 4 <= H_CMA_PROBE);
    assert!(H_CMA_PROBE + 8 <= HEADER);
    assert!(O_POOL + crate::pool::POOL_REF_LEN <= OFFER && OFFER % 8 == 0);
    assert!(C_NAME + NAME_MAX <= C_SERIAL && C_SERIAL + 8 <= C_START);
    // The words a channel's `segment::Block` reads and writes lie inside
    // the control block (a word past it would read as `None`, not fail
    // to build: `Block`'s checks are made at run time and folded away).
    assert!(C_STATE_GEN + 8 <= C_PID && C_PID + 4 <= C_NAME_LEN && C_NAME_LEN + 4 <= C_NAME);
    assert!(128 + 8 <= C_TX_WAIT);
    assert!(C_TX_WAIT + 4 <= CTL && C_HEAD + 8 <= C_CMA);
    // The state word is reached by 64-bit atomics, which need it 8-aligned
    // in the mapping: the header and every control block start at a
    // multiple of 8 (the mapping is page-aligned).
    assert!(C_STATE_GEN % 8 == 0 && CTL % 8 == 0 && HEADER % 8 == 0);
};

/// A record's size in the ring for `payload` bytes. Rounded up by a
/// mask, as `Geometry::rings`: every record sent and read works it out.
/// Payloads are record lengths (`u32`), far from overflowing.
#[inline(always)]
pub fn rec_len(payload: usize) -> usize {
    REC_HDR + ((payload + 7) & !7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_bounds() {
        assert_eq!(Geometry::check(16, 256 << 10), Some(Geometry::OURS));
        assert_eq!(Geometry::check(0, 4096), None);
        assert_eq!(Geometry::check(65, 4096), None);
        assert_eq!(Geometry::check(1, 4095), None);
        assert_eq!(Geometry::check(1, 6000), None);
        assert_eq!(Geometry::check(1, 32 << 20), None);
        let g = Geometry::OURS;
        assert_eq!(g.rings(), 8192);
        assert_eq!(g.offer(0), HEADER + CHANNELS * CTL);
        assert!(g.offer(CHANNELS - 1) + OFFER <= g.rings());
        for payload in [0, 1, 7, 8, 9, 64, 65, RING_MAX / 4, u32::MAX as usize] {
            assert_eq!(rec_len(payload), REC_HDR + payload.next_multiple_of(8));
        }
        // The mask rounds as `next_multiple_of` does, for every shape.
        for channels in 1..=CHANNELS_MAX {
            let g = Geometry {
                channels,
                ring: RING_MIN,
            };
            let blocks = HEADER + channels * (CTL + OFFER);
            assert_eq!(g.rings(), blocks.next_multiple_of(4096));
        }
        assert_eq!(g.bytes(), 8192 + 16 * (256 << 10));
        // The largest declared shape stays far from overflow.
        let big = Geometry::check(64, 16 << 20).unwrap_or(g);
        assert_eq!(big.bytes(), 28672 + (1 << 30));
    }

    #[test]
    fn a_state_word_holds_both_halves() {
        let w = state_gen(claiming(u32::MAX), u32::MAX);
        assert_eq!((state_of(w), gen_of(w)), (u32::MAX, u32::MAX));
        let w = state_gen(ACTIVE, 7);
        assert_eq!((state_of(w), gen_of(w)), (ACTIVE, 7));
        assert_eq!(state_gen(FREE, 0), 0, "a new segment's channels are free");
        assert_eq!(claiming(5), CLAIMING | 5);
    }
}
