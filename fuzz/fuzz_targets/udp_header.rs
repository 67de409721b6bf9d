//! Fuzzes the udp provider's datagram header decoder
//! (`weft_udp::wire`, `docs/wire.md` section 15).
//!
//! Properties checked (a failed assertion is a finding):
//! - nothing panics on arbitrary input;
//! - a datagram that decodes is exactly one header, the payload its
//!   length field announces and, when the header says keyed, a trailer
//!   of `TRAILER_LEN` bytes (`NAMED_TRAILER_LEN` when it also names its
//!   key; else none); it re-encodes to the same 24
//!   header bytes and decodes again to the same `Header`;
//! - a datagram cut short or padded by a byte is always refused;
//! - input shorter than the header is always refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_udp::wire::{DecodeError, Header, HEADER_LEN, NAMED_TRAILER_LEN, TRAILER_LEN};

fuzz_target!(|data: &[u8]| {
    match Header::decode(data) {
        Ok((h, payload, trailer)) => {
            assert!(data.len() >= HEADER_LEN);
            let want_trailer = match (h.keyed, h.named) {
                (false, _) => 0,
                (true, false) => TRAILER_LEN,
                (true, true) => NAMED_TRAILER_LEN,
            };
            assert_eq!(trailer.len(), want_trailer, "trailer length");
            let end = data.len() - want_trailer;
            assert_eq!(payload, &data[HEADER_LEN..end], "payload is the rest");
            assert_eq!(trailer, &data[end..], "trailer is the end");
            assert_eq!(h.len as usize, payload.len(), "length field");
            let enc = h.encode();
            assert_eq!(&enc[..], &data[..HEADER_LEN], "re-encoding differs");
            let again = Header::decode(data).map(|(h2, _, _)| h2);
            assert_eq!(again, Ok(h), "re-decoding differs");
            let mut longer = data.to_vec();
            longer.push(0);
            assert_eq!(
                Header::decode(&longer).map(|(h, _, _)| h),
                Err(DecodeError::BadLength),
                "a padded datagram accepted"
            );
            if !payload.is_empty() || h.keyed {
                assert_eq!(
                    Header::decode(&data[..data.len() - 1]).map(|(h, _, _)| h),
                    Err(DecodeError::BadLength),
                    "a truncated datagram accepted"
                );
            }
        }
        Err(_) => {}
    }
    if data.len() < HEADER_LEN {
        assert_eq!(
            Header::decode(data).map(|(h, _, _)| h),
            Err(DecodeError::Short),
            "short input accepted"
        );
    }
});
