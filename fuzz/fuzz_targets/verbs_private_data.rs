//! Fuzzes the verbs provider's rdma_cm private-data decoders: plain CM
//! data and RDM hellos, the key proof's forms (open, challenge, proof,
//! notice, refusal) and the keyed hello
//! (`weft_verbs::private_data_check`).
//!
//! Properties checked (a failed check is a finding):
//! - nothing panics on arbitrary input;
//! - whatever decodes re-encodes to bytes that decode the same;
//! - a keyed hello decodes at exactly its length and no other.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(what) = weft_verbs::private_data_check::check(data) {
        panic!("{what}: {data:?}");
    }
});
