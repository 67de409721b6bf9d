//! Fuzzes the verbs RDM message header decoder (`weft_core::wire::rdm`).
//!
//! Properties checked (a failed assertion is a finding):
//! - nothing panics on arbitrary input;
//! - a header that decodes re-encodes to the 48 bytes it came from, except
//!   the remote-data field when no data was flagged (the encoder writes
//!   zero there), and decodes again to the same `Header`;
//! - trailing bytes (the eager payload) never change the header;
//! - input shorter than the header is always refused;
//! - the first four bytes as a bare send's immediate data: accepted only
//!   as what `bare_imm` makes of the header it decodes to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_core::wire::rdm::{Header, HDR};

fuzz_target!(|data: &[u8]| {
    match Header::decode(data) {
        Ok(h) => {
            assert!(data.len() >= HDR);
            let enc = h.encode();
            let mut want = [0u8; HDR];
            want.copy_from_slice(&data[..HDR]);
            if h.data.is_none() {
                want[16..24].fill(0);
            }
            assert_eq!(enc, want, "re-encoding differs");
            assert_eq!(Header::decode(&enc), Ok(h), "re-decoding differs");
            assert_eq!(Header::decode(&data[..HDR]), Ok(h), "payload changed the header");
        }
        Err(_) => {
            // Refusals are fine; a short input must always be one.
        }
    }
    if let Some(b) = data.get(..4) {
        let imm = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if let Ok(h) = Header::from_bare(imm, data.len() as u64) {
            assert_eq!(h.bare_imm(), Some(imm), "bare form does not round-trip");
            assert_eq!(h.len, data.len() as u64, "bare length is not the byte count");
        }
    }
    if data.len() < HDR {
        assert!(Header::decode(data).is_err(), "short input accepted");
    }
});
