//! Fuzzes the shm provider's reading of a shared segment
//! (`weft_shm::scan`, `docs/wire.md` "The shm segment"): the input is
//! taken as the whole contents of a segment that a hostile process of the
//! same user wrote — header, channel control blocks (state words: state
//! and claim count in one 64-bit word; sender names, heads) and rings (records published in band, by their first
//! word) — and read the way an endpoint's receive pass and a sender's
//! look at a peer read it, through the same checks (`weft_shm::ring`).
//!
//! Properties checked (a failed assertion is a finding):
//! - nothing panics, and no access leaves the segment (the accessors
//!   refuse such ranges; the scan asserts every accepted record's payload
//!   lies inside its channel's ring and every step stays within a ring);
//! - a sender's room computed from an untrusted head never reaches the
//!   word before that head (the ring less the word written ahead), and
//!   what it would write fits that room;
//! - messages are accepted only whole: first, continuation and last
//!   records within the declared total;
//! - no claim's key proof passes an owner holding one key, or two AV
//!   keys found through the claim's key id (the input cannot hold a MAC
//!   under a key it does not know);
//! - a direct RMA request's announcement is accepted only when it adds
//!   up to the request's total;
//! - a CMA record's announcement (`weft_shm::cma::Announce`) is accepted
//!   only when its ranges add up to the record's total, and then
//!   re-encodes to exactly the bytes read (the input's tail is also fed
//!   to the announcement parser directly, with the total its ranges
//!   would need).
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_shm::cma::Announce;

fuzz_target!(|data: &[u8]| {
    let s = weft_shm::scan::scan_bytes(data);
    assert!(s.messages <= s.records);
    for cut in [data.len().min(8), data.len().min(24), data.len() / 2] {
        let b = &data[cut..];
        let total = b
            .chunks(16)
            .skip(1)
            .filter_map(|c| c.get(0..8))
            .fold(0u64, |t, l| {
                t.wrapping_add(u64::from_ne_bytes(l.try_into().unwrap_or([0; 8])))
            });
        for t in [total, total.wrapping_add(1)] {
            let Ok(t) = usize::try_from(t) else { continue };
            if let Some(a) = Announce::parse(b, t) {
                assert_eq!(&a.encode()[..], b, "re-encodes");
                let sum: u64 = a.ranges.iter().map(|r| r.1).sum();
                assert_eq!(sum as usize, t);
                assert!(a.ranges.iter().all(|r| r.0.checked_add(r.1).is_some()));
                assert!(a.pool.is_none_or(|p| p.holds(&a.ranges)), "a pool holds its ranges");
            }
        }
    }
});
