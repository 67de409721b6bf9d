//! The udp provider's datagram header (`docs/wire.md` section 15, "The udp
//! datagram header"): 24 bytes in front of the payload of every datagram,
//! little-endian.
//!
//! | bytes | field |
//! |---|---|
//! | 0..2 | magic `"WU"` |
//! | 2 | version, 1 |
//! | 3 | flags: 1 tagged, 2 remote CQ data, 4 keyed, 8 names its key |
//! | 4..8 | payload length (the datagram's length less 24, and less the trailer when keyed) |
//! | 8..16 | tag (0 unless tagged) |
//! | 16..24 | remote CQ data (0 unless flagged) |
//!
//! A keyed datagram (flag 4) ends with a trailer of
//! `weft_core::dgram_auth::TRAILER_LEN` (24) bytes after the payload: a
//! sequence number and a MAC that prove the sender's authorization key.
//! One that also names its key (flags 4 and 8: the sender holds an AV's
//! keys, `FI_AV_AUTH_KEY`) has the key's identifier in front of those,
//! `weft_core::dgram_auth::ID_TRAILER_LEN` (32) bytes in all. Flag 8
//! without flag 4 is refused.
//!
//! Everything a receiver needs is in one datagram, so the decoder checks
//! the header against the datagram it came in: a datagram that is not
//! exactly one header and the payload it announces is refused, whatever
//! sent it.

/// `"WU"`.
pub const MAGIC: [u8; 2] = *b"WU";
/// The version this decoder speaks.
pub const VERSION: u8 = 1;
/// Header length.
pub const HEADER_LEN: usize = 24;
/// The message is tagged (`fi_tsend`).
pub const FLAG_TAGGED: u8 = 1;
/// The message carries remote CQ data.
pub const FLAG_CQ_DATA: u8 = 2;
/// The datagram proves an authorization key: a trailer follows the
/// payload.
pub const FLAG_KEYED: u8 = 4;
/// The keyed datagram names its key: its trailer starts with the key's
/// identifier (`weft_core::dgram_auth::KeyId`).
pub const FLAG_NAMED: u8 = 8;
const KNOWN_FLAGS: u8 = FLAG_TAGGED | FLAG_CQ_DATA | FLAG_KEYED | FLAG_NAMED;
/// Bytes of a keyed datagram's trailer.
pub const TRAILER_LEN: usize = weft_core::dgram_auth::TRAILER_LEN;
/// Bytes of the trailer of a keyed datagram that names its key.
pub const NAMED_TRAILER_LEN: usize = weft_core::dgram_auth::ID_TRAILER_LEN;

/// The largest UDP payload over IPv4 (65535 less the IPv4 and UDP
/// headers); over IPv6, without jumbograms, it is 65527.
pub const UDP_MAX_V4: usize = 65_507;
/// The largest UDP payload over IPv6.
pub const UDP_MAX_V6: usize = 65_527;

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// `Some` for a tagged message.
    pub tag: Option<u64>,
    /// Remote CQ data.
    pub data: Option<u64>,
    /// Payload bytes after the header.
    pub len: u32,
    /// A keyed datagram: a trailer follows the payload.
    pub keyed: bool,
    /// A keyed datagram whose trailer names its key.
    pub named: bool,
}

/// Why a datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than a header.
    Short,
    /// Not `"WU"`: not a Weft datagram.
    BadMagic,
    /// Another version.
    BadVersion,
    /// A flag bit this version does not define.
    BadFlags,
    /// A tag or data field that its flag does not announce is not zero.
    Reserved,
    /// The length field is not the payload's length (with the trailer's,
    /// when keyed).
    BadLength,
}

impl Header {
    /// The header of a message of `len` payload bytes.
    pub fn new(tag: Option<u64>, data: Option<u64>, len: u32) -> Header {
        Header {
            tag,
            data,
            len,
            keyed: false,
            named: false,
        }
    }

    /// The same header, marked as keyed (`keyed`) or not.
    pub fn with_key(self, keyed: bool) -> Header {
        Header { keyed, ..self }
    }

    /// The same header, marked as keyed with a trailer that names the key.
    pub fn with_named_key(self) -> Header {
        Header {
            keyed: true,
            named: true,
            ..self
        }
    }

    /// Bytes of the trailer after the payload.
    pub fn trailer_len(&self) -> usize {
        trailer_len(self.keyed, self.named)
    }

    /// The 24 bytes on the wire.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        let mut flags = 0;
        if self.tag.is_some() {
            flags |= FLAG_TAGGED;
        }
        if self.data.is_some() {
            flags |= FLAG_CQ_DATA;
        }
        if self.keyed {
            flags |= FLAG_KEYED;
            if self.named {
                flags |= FLAG_NAMED;
            }
        }
        b[3] = flags;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.tag.unwrap_or(0).to_le_bytes());
        b[16..24].copy_from_slice(&self.data.unwrap_or(0).to_le_bytes());
        b
    }

    /// Decodes the datagram `d`: its header, the payload after it, and
    /// the trailer after that (empty unless the header says keyed; its
    /// contents are the key check's business, not the decoder's).
    pub fn decode(d: &[u8]) -> Result<(Header, &[u8], &[u8]), DecodeError> {
        // A fixed-size header: every field read below is at a known
        // place, with no bounds to check at run time.
        let (h, payload) = d
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(DecodeError::Short)?;
        if h[0..2] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        if h[2] != VERSION {
            return Err(DecodeError::BadVersion);
        }
        let flags = h[3];
        if flags & !KNOWN_FLAGS != 0 || flags & (FLAG_NAMED | FLAG_KEYED) == FLAG_NAMED {
            return Err(DecodeError::BadFlags);
        }
        let tag = u64_at(h, 8);
        let data = u64_at(h, 16);
        if (flags & FLAG_TAGGED == 0 && tag != 0) || (flags & FLAG_CQ_DATA == 0 && data != 0) {
            return Err(DecodeError::Reserved);
        }
        let keyed = flags & FLAG_KEYED != 0;
        let named = flags & FLAG_NAMED != 0;
        let (payload, trailer) = payload
            .len()
            .checked_sub(trailer_len(keyed, named))
            .map(|at| payload.split_at(at))
            .ok_or(DecodeError::BadLength)?;
        let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
        if usize::try_from(len).ok() != Some(payload.len()) {
            return Err(DecodeError::BadLength);
        }
        let hdr = Header {
            tag: (flags & FLAG_TAGGED != 0).then_some(tag),
            data: (flags & FLAG_CQ_DATA != 0).then_some(data),
            len,
            keyed,
            named,
        };
        Ok((hdr, payload, trailer))
    }
}

fn trailer_len(keyed: bool, named: bool) -> usize {
    match (keyed, named) {
        (false, _) => 0,
        (true, false) => TRAILER_LEN,
        (true, true) => NAMED_TRAILER_LEN,
    }
}

/// The little-endian `u64` at `at` of a header (`at` is 8 or 16).
#[inline(always)]
fn u64_at(h: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(b) = h.get(at..at + 8) {
        w.copy_from_slice(b);
    }
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn datagram(h: &Header, payload: &[u8]) -> Vec<u8> {
        let mut v = h.encode().to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn round_trips() {
        for h in [
            Header::new(None, None, 5),
            Header::new(Some(0x1234), None, 5),
            Header::new(None, Some(7), 5),
            Header::new(Some(u64::MAX), Some(0), 5),
        ] {
            let d = datagram(&h, b"hello");
            let (got, p, t) = Header::decode(&d).unwrap();
            assert_eq!(got, h);
            assert_eq!(p, b"hello");
            assert!(t.is_empty());
        }
    }

    #[test]
    fn keyed_datagrams_split_off_the_trailer() {
        let h = Header::new(Some(9), None, 5).with_key(true);
        assert_eq!(h.encode()[3], FLAG_TAGGED | FLAG_KEYED);
        let mut d = datagram(&h, b"hello");
        d.extend_from_slice(&[0xAB; TRAILER_LEN]);
        let (got, p, t) = Header::decode(&d).unwrap();
        assert_eq!(got, h);
        assert_eq!(p, b"hello");
        assert_eq!(t, &[0xAB; TRAILER_LEN]);
        // A trailer cut short or padded, or missing altogether, is a
        // length the header does not announce.
        assert_eq!(
            Header::decode(&d[..d.len() - 1]),
            Err(DecodeError::BadLength)
        );
        let mut long = d.clone();
        long.push(0);
        assert_eq!(Header::decode(&long), Err(DecodeError::BadLength));
        let bare = datagram(&h, b"hello");
        assert_eq!(Header::decode(&bare), Err(DecodeError::BadLength));
        let mut tiny = datagram(&Header::new(None, None, 0).with_key(true), b"");
        tiny.extend_from_slice(&[0; TRAILER_LEN - 1]);
        assert_eq!(Header::decode(&tiny), Err(DecodeError::BadLength));
    }

    #[test]
    fn named_keys_carry_a_longer_trailer() {
        let h = Header::new(None, Some(3), 2).with_named_key();
        assert_eq!(h.encode()[3], FLAG_CQ_DATA | FLAG_KEYED | FLAG_NAMED);
        assert_eq!(h.trailer_len(), NAMED_TRAILER_LEN);
        let mut d = datagram(&h, b"hi");
        d.extend_from_slice(&[0xCD; NAMED_TRAILER_LEN]);
        let (got, p, t) = Header::decode(&d).unwrap();
        assert_eq!((got, p, t.len()), (h, &b"hi"[..], NAMED_TRAILER_LEN));
        // The short trailer of an unnamed key is a length mismatch.
        let cut = d.len() - (NAMED_TRAILER_LEN - TRAILER_LEN);
        assert_eq!(Header::decode(&d[..cut]), Err(DecodeError::BadLength));
        // A name without a key is not a flag combination that exists.
        let mut bare = datagram(&Header::new(None, None, 2), b"hi");
        bare[3] = FLAG_NAMED;
        assert_eq!(Header::decode(&bare), Err(DecodeError::BadFlags));
        // Unkeyed headers never carry the name.
        let plain = Header {
            named: true,
            ..Header::new(None, None, 0)
        };
        assert_eq!(plain.encode()[3], 0);
        assert_eq!(plain.trailer_len(), 0);
    }

    #[test]
    fn the_documented_example_encodes_as_documented() {
        // docs/wire.md: a tagged 64-byte message with tag 0x1234 and data 7.
        let h = Header::new(Some(0x1234), Some(7), 64);
        let want = [
            0x57, 0x55, 0x01, 0x03, 0x40, 0, 0, 0, 0x34, 0x12, 0, 0, 0, 0, 0, 0, 0x07, 0, 0, 0, 0,
            0, 0, 0,
        ];
        assert_eq!(h.encode(), want);
    }

    #[test]
    fn refusals() {
        let good = datagram(&Header::new(Some(1), None, 3), b"abc");
        assert_eq!(
            Header::decode(&good[..HEADER_LEN - 1]),
            Err(DecodeError::Short)
        );
        let mut d = good.clone();
        d[0] = b'X';
        assert_eq!(Header::decode(&d), Err(DecodeError::BadMagic));
        let mut d = good.clone();
        d[2] = 2;
        assert_eq!(Header::decode(&d), Err(DecodeError::BadVersion));
        let mut d = good.clone();
        d[3] |= 16;
        assert_eq!(Header::decode(&d), Err(DecodeError::BadFlags));
        let mut d = good.clone();
        d[16] = 1;
        assert_eq!(Header::decode(&d), Err(DecodeError::Reserved));
        let mut d = good.clone();
        d[3] = 0;
        assert_eq!(Header::decode(&d), Err(DecodeError::Reserved));
        // Truncated or padded payloads.
        assert_eq!(
            Header::decode(&good[..good.len() - 1]),
            Err(DecodeError::BadLength)
        );
        let mut d = good.clone();
        d.push(0);
        assert_eq!(Header::decode(&d), Err(DecodeError::BadLength));
    }
}
