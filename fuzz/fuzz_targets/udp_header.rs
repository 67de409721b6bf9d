//! Fuzzes the udp provider's datagram header decoder
//! (`weft_udp::wire`, `docs/wire.md` section 15).
//!
//! Properties checked (a failed assertion is a finding):
//! - nothing panics on arbitrary input;
//! - a datagram that decodes is exactly one header and the payload its
//!   length field announces, re-encodes to the same 24 header bytes and
//!   decodes again to the same `Header`;
//! - a datagram cut short or padded by a byte is always refused;
//! - input shorter than the header is always refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_udp::wire::{DecodeError, Header, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    match Header::decode(data) {
        Ok((h, payload)) => {
            assert!(data.len() >= HEADER_LEN);
            assert_eq!(payload, &data[HEADER_LEN..], "payload is the rest");
            assert_eq!(h.len as usize, payload.len(), "length field");
            let enc = h.encode();
            assert_eq!(&enc[..], &data[..HEADER_LEN], "re-encoding differs");
            let again = Header::decode(data).map(|(h2, _)| h2);
            assert_eq!(again, Ok(h), "re-decoding differs");
            let mut longer = data.to_vec();
            longer.push(0);
            assert_eq!(
                Header::decode(&longer).map(|(h, _)| h),
                Err(DecodeError::BadLength),
                "a padded datagram accepted"
            );
            if !payload.is_empty() {
                assert_eq!(
                    Header::decode(&data[..data.len() - 1]).map(|(h, _)| h),
                    Err(DecodeError::BadLength),
                    "a truncated datagram accepted"
                );
            }
        }
        Err(_) => {}
    }
    if data.len() < HEADER_LEN {
        assert_eq!(
            Header::decode(data).map(|(h, _)| h),
            Err(DecodeError::Short),
            "short input accepted"
        );
    }
});
