//! The verbs RDM provider's wire format: the header in front of every
//! RDM message on an RC queue pair. (It lives here, beside the software
//! providers' frame codec, so it builds, is tested and is fuzzed without
//! an RDMA stack.)
//!
//! RC gives reliable, ordered delivery between two QPs but knows nothing of
//! tags, sources or rendezvous, so each send carries one fixed header:
//!
//! | bytes | field |
//! |---|---|
//! | 0 | op: 1 eager, 2 request-to-send, 3 finished |
//! | 1 | flags: 1 tagged, 2 CQ data, 4 failed (finished only), 8 acknowledge, 16 no such receive context (finished only), 32 window (request-to-send and finished) |
//! | 2 | version (1) |
//! | 3 | receive context of a scalable endpoint the message is for (`fi_rx_addr`; 0 otherwise) |
//! | 4..8 | rkey of the sender's buffer (request-to-send) |
//! | 8..16 | tag |
//! | 16..24 | remote CQ data |
//! | 24..32 | message length |
//! | 32..40 | address of the sender's buffer (request-to-send) |
//! | 40..48 | cookie: the sender's handle for the transfer |
//!
//! Little-endian throughout. An eager message's payload follows the header
//! in the same send; a request-to-send announces a buffer the receiver
//! reads with RDMA read once a receive matches, and answers with
//! "finished" carrying the cookie back. A message flagged "acknowledge"
//! (a delivery-complete send) is answered with "finished" as soon as it is
//! matched or buffered at the receiver; an announced one is then pulled
//! into a buffer at once rather than when a receive matches.
//!
//! **Windows.** A request-to-send flagged "window" announces a memory
//! window bound to the connection it came on, rather than a registered
//! region: its "finished" carries the flag and the same rkey and goes,
//! on that connection, as a send with invalidate of that rkey, so that
//! the window is revoked by the time the sender learns the transfer is
//! over. A sender flags windows only towards a peer whose hello said it
//! answers them so.
//!
//! **Bare eager sends.** A message that needs none of the header's
//! fields but its length, receive context and a tag below 2^16 (no
//! remote CQ data, no acknowledgement) may go without the header, as a
//! send with immediate data ([`Header::bare_imm`]): the completion's byte
//! count is the length, the immediate says the rest. A page-sized
//! payload then fits one packet of a 4096-byte path MTU, where with the
//! header it takes two. A sender uses the form only towards a peer whose
//! hello said it takes it.

use crate::{Error, Result};

/// Header bytes.
pub const HDR: usize = 48;
const VERSION: u8 = 1;

const F_TAGGED: u8 = 1;
const F_DATA: u8 = 2;
const F_FAILED: u8 = 4;
const F_ACK: u8 = 8;
const F_NO_CTX: u8 = 16;
const F_WINDOW: u8 = 32;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Header and payload in one send.
    Eager,
    /// The payload waits in the sender's registered buffer.
    Rts,
    /// The receiver is done with a request-to-send's buffer.
    Fin,
    /// An RDMA write just before it carried remote CQ data: the target
    /// reports `len` bytes written with `data`. (The RC connection keeps
    /// the write ahead of this note.)
    WriteData,
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the message is.
    pub op: Op,
    /// Sent as a tagged message.
    pub tagged: bool,
    /// Remote CQ data, if any.
    pub data: Option<u64>,
    /// The transfer failed at the receiver (`Fin` only).
    pub failed: bool,
    /// Answer with `Fin` once the message is matched or buffered.
    pub ack: bool,
    /// The transfer failed because the receiver has no receive context
    /// `rx_ctx` (`Fin` only, with `failed`).
    pub no_ctx: bool,
    /// The announced buffer is a memory window, revoked by the `Fin`
    /// (request-to-send, and its `Fin`).
    pub window: bool,
    /// The receive context of a scalable endpoint the message is for.
    pub rx_ctx: u8,
    /// Key of the sender's buffer (request-to-send).
    pub rkey: u32,
    /// The message tag (tagged messages).
    pub tag: u64,
    /// Payload length in bytes.
    pub len: u64,
    /// Address of the sender's buffer (request-to-send).
    pub addr: u64,
    /// The sender's handle for the transfer, echoed by `Fin`.
    pub cookie: u64,
}

impl Header {
    /// A header of `op` with everything else zero.
    pub fn new(op: Op) -> Header {
        Header {
            op,
            tagged: false,
            data: None,
            failed: false,
            ack: false,
            no_ctx: false,
            window: false,
            rx_ctx: 0,
            rkey: 0,
            tag: 0,
            len: 0,
            addr: 0,
            cookie: 0,
        }
    }

    /// The wire form.
    pub fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0] = match self.op {
            Op::Eager => 1,
            Op::Rts => 2,
            Op::Fin => 3,
            Op::WriteData => 4,
        };
        let mut f = 0;
        if self.tagged {
            f |= F_TAGGED;
        }
        if self.data.is_some() {
            f |= F_DATA;
        }
        if self.failed {
            f |= F_FAILED;
        }
        if self.ack {
            f |= F_ACK;
        }
        if self.no_ctx {
            f |= F_NO_CTX;
        }
        if self.window {
            f |= F_WINDOW;
        }
        b[1] = f;
        b[2] = VERSION;
        b[3] = self.rx_ctx;
        b[4..8].copy_from_slice(&self.rkey.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.data.unwrap_or(0).to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..48].copy_from_slice(&self.cookie.to_le_bytes());
        b
    }

    /// Parses a header; anything but a well-formed version-1 header is
    /// `Io` (the connection that sent it is torn down).
    pub fn decode(b: &[u8]) -> Result<Header> {
        if b.len() < HDR || b[2] != VERSION {
            return Err(Error::Io);
        }
        let op = match b[0] {
            1 => Op::Eager,
            2 => Op::Rts,
            3 => Op::Fin,
            4 => Op::WriteData,
            _ => return Err(Error::Io),
        };
        let f = b[1];
        if f & !(F_TAGGED | F_DATA | F_FAILED | F_ACK | F_NO_CTX | F_WINDOW) != 0 {
            return Err(Error::Io);
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let mut rk = [0u8; 4];
        rk.copy_from_slice(&b[4..8]);
        Ok(Header {
            op,
            tagged: f & F_TAGGED != 0,
            data: (f & F_DATA != 0).then(|| u64_at(16)),
            failed: f & F_FAILED != 0,
            ack: f & F_ACK != 0,
            no_ctx: f & F_NO_CTX != 0,
            window: f & F_WINDOW != 0,
            rx_ctx: b[3],
            rkey: u32::from_le_bytes(rk),
            tag: u64_at(8),
            len: u64_at(24),
            addr: u64_at(32),
            cookie: u64_at(40),
        })
    }
}

/// The immediate data's top byte on a bare eager send: what the send
/// is (untagged, or tagged with a tag below 2^16), and the form's version.
const BARE_UNTAGGED: u32 = 0xB1;
const BARE_TAGGED: u32 = 0xB2;

impl Header {
    /// The immediate data that sends this header's message bare (without
    /// the header), if its fields allow it: an eager message, untagged or
    /// with a tag below 2^16, without remote CQ data or acknowledgement.
    /// Bits 24..32 are `0xB1` (untagged) or `0xB2` (tagged), 16..24 the
    /// receive context, 0..16 the tag (zero when untagged).
    pub fn bare_imm(&self) -> Option<u32> {
        let plain = self.op == Op::Eager
            && self.data.is_none()
            && !self.ack
            && !self.failed
            && !self.no_ctx
            && !self.window;
        let (mark, tag) = match (self.tagged, u16::try_from(self.tag)) {
            (false, _) => (BARE_UNTAGGED, 0),
            (true, Ok(t)) => (BARE_TAGGED, u32::from(t)),
            (true, Err(_)) => return None,
        };
        plain.then(|| (mark << 24) | (u32::from(self.rx_ctx) << 16) | tag)
    }

    /// The header of a bare eager message of `len` bytes that arrived
    /// with immediate data `imm`; anything but a well-formed bare mark is
    /// `Io` (the connection that sent it is torn down).
    pub fn from_bare(imm: u32, len: u64) -> Result<Header> {
        let mut h = Header::new(Op::Eager);
        match imm >> 24 {
            BARE_UNTAGGED if imm & 0xffff == 0 => {}
            BARE_TAGGED => {
                h.tagged = true;
                h.tag = u64::from(imm & 0xffff);
            }
            _ => return Err(Error::Io),
        }
        h.rx_ctx = (imm >> 16) as u8;
        h.len = len;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut h = Header::new(Op::Rts);
        h.tagged = true;
        h.data = Some(0xdead_beef_0000_0001);
        h.rkey = 0x1234_5678;
        h.tag = u64::MAX - 3;
        h.len = 1 << 20;
        h.addr = 0x7fff_0000_1000;
        h.cookie = 42;
        h.ack = true;
        h.rx_ctx = 200;
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        h.window = true;
        assert_eq!(h.encode()[1] & 32, 32);
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut f = Header::new(Op::Fin);
        f.failed = true;
        f.no_ctx = true;
        f.cookie = 7;
        assert_eq!(Header::decode(&f.encode()), Ok(f));
    }

    #[test]
    fn bare_form_round_trip_and_limits() {
        let mut h = Header::new(Op::Eager);
        h.len = 4096;
        h.rx_ctx = 7;
        let imm = h.bare_imm().unwrap_or_default();
        assert_eq!(imm, 0xB107_0000);
        assert_eq!(Header::from_bare(imm, 4096), Ok(h));
        // Tags below 2^16 fit beside the receive context.
        let mut t = h;
        t.tagged = true;
        t.tag = 0xffff;
        assert_eq!(t.bare_imm(), Some(0xB207_FFFF));
        assert_eq!(Header::from_bare(0xB207_FFFF, 4096), Ok(t));
        t.tag = 0;
        assert_eq!(
            Header::from_bare(t.bare_imm().unwrap_or_default(), 4096),
            Ok(t)
        );
        // Anything the immediate cannot carry keeps the header.
        t.tag = 1 << 16;
        assert_eq!(t.bare_imm(), None);
        let mut d = h;
        d.data = Some(0);
        assert_eq!(d.bare_imm(), None);
        let mut a = h;
        a.ack = true;
        assert_eq!(a.bare_imm(), None);
        assert_eq!(Header::new(Op::Rts).bare_imm(), None);
        assert_eq!(Header::new(Op::Fin).bare_imm(), None);
        // Another mark, or an untagged form with tag bits set, is refused.
        assert_eq!(Header::from_bare(0xB307_0000, 1), Err(Error::Io));
        assert_eq!(Header::from_bare(0xB107_0001, 1), Err(Error::Io));
        assert_eq!(Header::from_bare(0, 1), Err(Error::Io));
    }

    #[test]
    fn rejects_garbage() {
        let good = Header::new(Op::Eager).encode();
        assert_eq!(Header::decode(&good[..HDR - 1]), Err(Error::Io));
        let mut bad = good;
        bad[0] = 9;
        assert_eq!(Header::decode(&bad), Err(Error::Io));
        let mut bad = good;
        bad[2] = 2;
        assert_eq!(Header::decode(&bad), Err(Error::Io));
        let mut bad = good;
        bad[1] = 0x80;
        assert_eq!(Header::decode(&bad), Err(Error::Io));
    }
}
