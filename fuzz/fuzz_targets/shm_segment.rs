//! Fuzzes the shm provider's reading of a shared segment
//! (`weft_shm::scan`, `docs/wire.md` "The shm segment"): the input is
//! taken as the whole contents of a segment that a hostile process of the
//! same user wrote — header, channel control blocks (states, sender
//! names, tails and heads) and rings — and read the way an endpoint's
//! receive pass and a sender's look at a peer read it, through the same
//! checks (`weft_shm::ring`).
//!
//! Properties checked (a failed assertion is a finding):
//! - nothing panics, and no access leaves the segment (the accessors
//!   refuse such ranges; the scan asserts every accepted record's payload
//!   lies inside its channel's ring and every step stays within a ring);
//! - a sender's room computed from an untrusted head never exceeds the
//!   ring, and what it would write fits that room;
//! - messages are accepted only whole: first, continuation and last
//!   records within the declared total.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = weft_shm::scan::scan_bytes(data);
    assert!(s.messages <= s.records);
});
