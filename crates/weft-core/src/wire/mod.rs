//! The software providers' wire format: a fixed 40-byte frame header,
//! followed by `len` payload bytes. `docs/wire.md` is the normative
//! description; this module is its only encoder and decoder.
//!
//! Decoding never trusts the peer: every field is checked before it is used,
//! and a header the decoder rejects ends that connection with an error.
//!
//! [`rdm`] is the verbs RDM provider's message header; [`rma`] the
//! fixed prefixes of the RMA frames' payloads, [`atomic`] that of the
//! atomic request.

pub mod atomic;
pub mod auth;
pub mod claim;
pub mod rdm;
pub mod rma;

use std::fmt;

/// Frame magic, `"WF"` read as a little-endian `u16`.
pub const MAGIC: u16 = u16::from_le_bytes(*b"WF");
/// The wire version this code speaks (2: `Hello` carries a nonce that the
/// acceptor has the claimed address confirm through `Verify`, the RMA
/// frames, the atomic frames, and the key-proof frames of endpoints with an
/// authorization key).
pub const VERSION: u8 = 2;
/// Size of every frame header in bytes.
pub const HEADER_LEN: usize = 40;
/// Largest payload of a control frame (hello, connection request/response).
pub const MAX_CONTROL_LEN: u64 = 4096;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// RDM: first frame of a connection; payload = the sender's listening
    /// address (sockaddr bytes) and a fresh nonce ([`claim::Claim`]), so
    /// the acceptor can name the peer once the address confirms it.
    Hello = 1,
    /// RDM: the acceptor's answer to `Hello`; `data` = 0 (accepted) or the
    /// positive error code of the refusal (a simultaneous connect lost,
    /// an address that did not confirm the claim).
    HelloAck = 2,
    /// MSG: connection request; payload = CM data.
    ConnReq = 3,
    /// MSG: answer to `ConnReq`; `data` = 0 (accept) or an error code
    /// (reject); payload = CM data.
    ConnResp = 4,
    /// An untagged message; payload = the message.
    Msg = 5,
    /// A tagged message; `tag` is its tag; payload = the message.
    Tagged = 6,
    /// Orderly shutdown: the sender sends nothing more.
    Shutdown = 7,
    /// Delivery acknowledgement of message `seq`; `data` = 0 or an error code.
    /// Also the answer to every `RmaWrite`.
    Ack = 8,
    /// RMA write; payload = the 16-byte [`rma::Target`] then the bytes
    /// written; `data` = remote CQ data with [`FLAG_CQ_DATA`].
    RmaWrite = 9,
    /// RMA read request; payload = the 24-byte [`rma::ReadReq`].
    RmaReadReq = 10,
    /// A piece of the answer to read request `seq`: `tag` = its offset in
    /// the read, `data` = 0 or an error code, payload = the bytes (at most
    /// [`rma::READ_CHUNK`]).
    RmaReadResp = 11,
    /// Atomic request; payload = the 32-byte [`atomic::AtomicHdr`], the
    /// operand array, and for the compare form the compare array
    /// (elements little-endian).
    AtomicReq = 12,
    /// The answer to atomic request `seq`: `data` = 0 or an error code,
    /// payload = the old values (fetching forms, on success) or nothing.
    AtomicResp = 13,
    /// RDM: first frame of a connection the acceptor of a `Hello` opens to
    /// the claimed listening address; payload = the address the claimant
    /// dialled and the claim's nonce ([`claim::Claim`]).
    Verify = 14,
    /// RDM: the answer to `Verify`; `data` = 0 (this endpoint made that
    /// claim) or `FI_EACCES`.
    VerifyAck = 15,
    /// RDM: `Hello` from an endpoint that holds an authorization key;
    /// same payload. Only a keyed acceptor goes on, with `KeyChallenge`.
    KeyedHello = 16,
    /// Both: a keyed acceptor's answer to `KeyedHello`/`KeyedConnReq`;
    /// payload = its nonce and its MAC ([`auth::Challenge`]).
    KeyChallenge = 17,
    /// Both: the connector's answer to `KeyChallenge`; `data` = 0 and
    /// payload = its MAC, or `data` = `FI_EKEYREJECTED` and no payload.
    KeyProof = 18,
    /// MSG: `ConnReq` from an endpoint that holds an authorization key;
    /// payload = its nonce, then the CM data.
    KeyedConnReq = 19,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Hello,
            2 => FrameKind::HelloAck,
            3 => FrameKind::ConnReq,
            4 => FrameKind::ConnResp,
            5 => FrameKind::Msg,
            6 => FrameKind::Tagged,
            7 => FrameKind::Shutdown,
            8 => FrameKind::Ack,
            9 => FrameKind::RmaWrite,
            10 => FrameKind::RmaReadReq,
            11 => FrameKind::RmaReadResp,
            12 => FrameKind::AtomicReq,
            13 => FrameKind::AtomicResp,
            14 => FrameKind::Verify,
            15 => FrameKind::VerifyAck,
            16 => FrameKind::KeyedHello,
            17 => FrameKind::KeyChallenge,
            18 => FrameKind::KeyProof,
            19 => FrameKind::KeyedConnReq,
            _ => return None,
        })
    }

    /// Data frames carry application messages and RMA requests, are
    /// numbered (`seq`) and take a transmit credit; the rest are control
    /// frames.
    pub const fn is_data(self) -> bool {
        matches!(
            self,
            FrameKind::Msg
                | FrameKind::Tagged
                | FrameKind::RmaWrite
                | FrameKind::RmaReadReq
                | FrameKind::AtomicReq
        )
    }

    /// The header flags a frame of this kind may carry.
    pub const fn allowed_flags(self) -> u16 {
        match self {
            FrameKind::Msg | FrameKind::Tagged | FrameKind::RmaWrite => KNOWN_FLAGS,
            _ => 0,
        }
    }
}

/// Header flag: `data` holds remote CQ data for the target's completion.
pub const FLAG_CQ_DATA: u16 = 1 << 0;
/// Header flag: the sender waits for an [`FrameKind::Ack`] of this frame
/// (`FI_DELIVERY_COMPLETE`).
pub const FLAG_ACK_REQ: u16 = 1 << 1;
const KNOWN_FLAGS: u16 = FLAG_CQ_DATA | FLAG_ACK_REQ;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Frame kind.
    pub kind: Option<FrameKind>,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Payload length in bytes.
    pub len: u64,
    /// Tag of a tagged message (0 otherwise).
    pub tag: u64,
    /// Remote CQ data, or a status code in control frames.
    pub data: u64,
    /// Sender's sequence number of this frame on its connection.
    pub seq: u64,
    /// `Msg` and `Tagged`: the receive context of a scalable endpoint the
    /// message is for (`fi_rx_addr`); 0 in every other kind. It sits in
    /// what version 2 reserved, so a frame for context 0 is byte for byte
    /// what every version-2 peer sends and accepts.
    pub rx_ctx: u16,
}

impl Header {
    /// A header of `kind` with everything else zero.
    pub fn new(kind: FrameKind) -> Header {
        Header {
            kind: Some(kind),
            ..Header::default()
        }
    }

    /// Encodes into the fixed-size header (little-endian fields).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2] = VERSION;
        b[3] = self.kind.map_or(0, |k| k as u8);
        b[4..6].copy_from_slice(&self.flags.to_le_bytes());
        b[6..8].copy_from_slice(&self.rx_ctx.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.data.to_le_bytes());
        b[32..40].copy_from_slice(&self.seq.to_le_bytes());
        b
    }
}

/// Why a header was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer than [`HEADER_LEN`] bytes.
    Truncated(usize),
    /// Not a Weft frame.
    BadMagic(u16),
    /// A version this code does not speak.
    BadVersion(u8),
    /// Unknown frame kind.
    UnknownKind(u8),
    /// Unknown flag bits, or flags not valid for the kind.
    BadFlags(u16),
    /// Reserved bytes not zero.
    Reserved,
    /// Payload longer than allowed for this kind / this endpoint.
    TooLong {
        /// Length announced by the peer.
        len: u64,
        /// Largest accepted.
        max: u64,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated(n) => write!(f, "truncated header ({n} of {HEADER_LEN} bytes)"),
            WireError::BadMagic(m) => write!(f, "bad magic {m:#06x}"),
            WireError::BadVersion(v) => write!(f, "unsupported wire version {v}"),
            WireError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            WireError::BadFlags(fl) => write!(f, "invalid flags {fl:#06x}"),
            WireError::Reserved => write!(f, "reserved header bytes not zero"),
            WireError::TooLong { len, max } => write!(f, "payload of {len} bytes exceeds {max}"),
        }
    }
}

impl std::error::Error for WireError {}

impl From<WireError> for crate::Error {
    fn from(e: WireError) -> Self {
        match e {
            WireError::TooLong { .. } => crate::Error::MsgSize,
            _ => crate::Error::Io,
        }
    }
}

/// Decodes and validates a header. `max_data_len` bounds data frames (the
/// receiving endpoint's `max_msg_size`; an `RmaWrite` may add its 16-byte
/// target); control frames are bounded by [`MAX_CONTROL_LEN`], read
/// requests and responses by their fixed sizes, atomic requests and
/// answers by [`atomic::ATOMIC_REQ_MAX`] and [`atomic::ATOMIC_MAX`],
/// and frames that carry no payload must say 0.
pub fn decode(b: &[u8], max_data_len: u64) -> Result<Header, WireError> {
    if b.len() < HEADER_LEN {
        return Err(WireError::Truncated(b.len()));
    }
    let u64_at = |o: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[o..o + 8]);
        u64::from_le_bytes(a)
    };
    let magic = u16::from_le_bytes([b[0], b[1]]);
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    if b[2] != VERSION {
        return Err(WireError::BadVersion(b[2]));
    }
    let kind = FrameKind::from_u8(b[3]).ok_or(WireError::UnknownKind(b[3]))?;
    let flags = u16::from_le_bytes([b[4], b[5]]);
    if flags & !kind.allowed_flags() != 0 {
        return Err(WireError::BadFlags(flags));
    }
    let rx_ctx = u16::from_le_bytes([b[6], b[7]]);
    if rx_ctx != 0 && !matches!(kind, FrameKind::Msg | FrameKind::Tagged) {
        return Err(WireError::Reserved);
    }
    let len = u64_at(8);
    let max = match kind {
        FrameKind::Msg | FrameKind::Tagged => max_data_len,
        FrameKind::RmaWrite => max_data_len.saturating_add(rma::TARGET_LEN as u64),
        FrameKind::RmaReadReq => rma::READ_REQ_LEN as u64,
        FrameKind::RmaReadResp => rma::READ_CHUNK as u64,
        FrameKind::AtomicReq => atomic::ATOMIC_REQ_MAX as u64,
        FrameKind::AtomicResp => atomic::ATOMIC_MAX as u64,
        FrameKind::Hello
        | FrameKind::ConnReq
        | FrameKind::ConnResp
        | FrameKind::Verify
        | FrameKind::KeyedHello => MAX_CONTROL_LEN,
        FrameKind::KeyedConnReq => MAX_CONTROL_LEN + auth::CONN_REQ_PREFIX as u64,
        FrameKind::KeyChallenge => auth::CHALLENGE_LEN as u64,
        FrameKind::KeyProof => auth::PROOF_LEN as u64,
        FrameKind::HelloAck | FrameKind::Shutdown | FrameKind::Ack | FrameKind::VerifyAck => 0,
    };
    if len > max {
        return Err(WireError::TooLong { len, max });
    }
    Ok(Header {
        kind: Some(kind),
        flags,
        len,
        tag: u64_at(16),
        data: u64_at(24),
        seq: u64_at(32),
        rx_ctx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            kind: Some(FrameKind::Tagged),
            flags: FLAG_CQ_DATA,
            len: 1234,
            tag: 0xdead_beef_0000_0001,
            data: 42,
            seq: 7,
            rx_ctx: 3,
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(decode(&h.encode(), 1 << 20), Ok(h));
    }

    #[test]
    fn every_truncation_is_rejected() {
        let b = sample().encode();
        for n in 0..HEADER_LEN {
            assert_eq!(decode(&b[..n], 1 << 20), Err(WireError::Truncated(n)));
        }
    }

    #[test]
    fn oversize_and_garbage_are_rejected() {
        let b = sample().encode();
        assert_eq!(
            decode(&b, 100),
            Err(WireError::TooLong {
                len: 1234,
                max: 100
            })
        );
        let mut bad = b;
        bad[0] = b'X';
        assert!(matches!(decode(&bad, 1 << 20), Err(WireError::BadMagic(_))));
        let mut bad = b;
        bad[2] = 9;
        assert_eq!(decode(&bad, 1 << 20), Err(WireError::BadVersion(9)));
        let mut bad = b;
        bad[3] = 0;
        assert_eq!(decode(&bad, 1 << 20), Err(WireError::UnknownKind(0)));
        let mut bad = b;
        bad[4] = 0x80;
        assert!(matches!(decode(&bad, 1 << 20), Err(WireError::BadFlags(_))));
        // A message names a receive context there; other kinds keep the
        // bytes reserved.
        let mut named = b;
        named[6] = 0;
        named[7] = 1;
        assert_eq!(decode(&named, 1 << 20).map(|h| h.rx_ctx), Ok(256));
        let mut bad = Header::new(FrameKind::Ack).encode();
        bad[6] = 1;
        assert_eq!(decode(&bad, 1 << 20), Err(WireError::Reserved));
        let mut ack = Header::new(FrameKind::Ack);
        ack.len = 1;
        assert!(matches!(
            decode(&ack.encode(), 1 << 20),
            Err(WireError::TooLong { .. })
        ));
        let mut hello = Header::new(FrameKind::Hello);
        hello.flags = FLAG_CQ_DATA;
        assert!(matches!(
            decode(&hello.encode(), 1 << 20),
            Err(WireError::BadFlags(_))
        ));
    }

    #[test]
    fn key_frames_have_their_own_bounds() {
        for (k, max) in [
            (FrameKind::KeyedHello, MAX_CONTROL_LEN),
            (FrameKind::KeyChallenge, auth::CHALLENGE_LEN as u64),
            (FrameKind::KeyProof, auth::PROOF_LEN as u64),
            (FrameKind::KeyedConnReq, MAX_CONTROL_LEN + 32),
        ] {
            let mut h = Header::new(k);
            h.len = max;
            assert_eq!(decode(&h.encode(), 0), Ok(h), "{k:?}");
            h.len += 1;
            assert_eq!(
                decode(&h.encode(), u64::MAX),
                Err(WireError::TooLong { len: max + 1, max }),
                "{k:?}"
            );
            h.len = 0;
            h.flags = FLAG_ACK_REQ;
            assert!(matches!(
                decode(&h.encode(), 0),
                Err(WireError::BadFlags(_))
            ));
            assert!(!k.is_data());
        }
        let mut b = Header::new(FrameKind::Msg).encode();
        for unknown in [20u8, 21, 255] {
            b[3] = unknown;
            assert_eq!(decode(&b, 0), Err(WireError::UnknownKind(unknown)));
        }
    }

    #[test]
    fn rma_frames_have_their_own_bounds_and_flags() {
        let mut w = Header::new(FrameKind::RmaWrite);
        w.flags = FLAG_CQ_DATA | FLAG_ACK_REQ;
        w.len = 100 + rma::TARGET_LEN as u64;
        assert_eq!(decode(&w.encode(), 100), Ok(w), "max_msg_size + target");
        w.len += 1;
        assert!(matches!(
            decode(&w.encode(), 100),
            Err(WireError::TooLong { .. })
        ));
        let mut r = Header::new(FrameKind::RmaReadReq);
        r.len = rma::READ_REQ_LEN as u64;
        assert_eq!(decode(&r.encode(), 0), Ok(r));
        r.flags = FLAG_CQ_DATA;
        assert!(matches!(
            decode(&r.encode(), 0),
            Err(WireError::BadFlags(_))
        ));
        let mut a = Header::new(FrameKind::RmaReadResp);
        a.len = rma::READ_CHUNK as u64 + 1;
        assert!(matches!(
            decode(&a.encode(), u64::MAX),
            Err(WireError::TooLong { .. })
        ));
        assert!(FrameKind::RmaWrite.is_data() && !FrameKind::RmaReadResp.is_data());
    }

    #[test]
    fn atomic_frames_have_fixed_bounds_and_no_flags() {
        let mut q = Header::new(FrameKind::AtomicReq);
        q.len = atomic::ATOMIC_REQ_MAX as u64;
        assert_eq!(decode(&q.encode(), 0), Ok(q), "not tied to max_msg_size");
        q.len += 1;
        assert!(matches!(
            decode(&q.encode(), u64::MAX),
            Err(WireError::TooLong { .. })
        ));
        q.len = 40;
        q.flags = FLAG_ACK_REQ;
        assert!(matches!(
            decode(&q.encode(), 0),
            Err(WireError::BadFlags(_))
        ));
        let mut a = Header::new(FrameKind::AtomicResp);
        a.len = atomic::ATOMIC_MAX as u64 + 1;
        assert!(matches!(
            decode(&a.encode(), u64::MAX),
            Err(WireError::TooLong { .. })
        ));
        assert!(FrameKind::AtomicReq.is_data() && !FrameKind::AtomicResp.is_data());
        assert_eq!(FrameKind::from_u8(12), Some(FrameKind::AtomicReq));
        assert_eq!(FrameKind::from_u8(13), Some(FrameKind::AtomicResp));
        assert_eq!(FrameKind::from_u8(20), None);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small deterministic xorshift sweep; the fuzz target does the rest.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            let mut b = [0u8; HEADER_LEN];
            for chunk in b.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
            b[2] = VERSION;
            let _ = decode(&b, 1 << 30);
        }
    }
}
