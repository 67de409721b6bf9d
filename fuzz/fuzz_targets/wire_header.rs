//! Fuzzes the frame-header decoder of `docs/wire.md` and the sockaddr
//! decoders used for the RDM `Hello` payload and `FI_ADDR_STR` addresses.
//!
//! Properties checked (a failed assertion is a finding):
//! - nothing panics on arbitrary input;
//! - only `Msg` and `Tagged` name a receive context (bytes 6..8);
//! - a header that decodes re-encodes to exactly the 40 bytes it came from
//!   and decodes again to the same `Header`;
//! - the decoder's answer is consistent across `max_data_len` values
//!   (accepted under a bound => accepted under every larger bound;
//!   `TooLong` reports the real length and bound);
//! - a `Hello`/`Verify` payload that parses as a claim (address and
//!   nonce) re-encodes to its own length and parses again to itself;
//! - `decode_sockaddr` / `encode_sockaddr` and `parse_sockaddr_str` /
//!   `sockaddr_to_str` round-trip whatever they accept;
//! - the RMA payload prefixes (`wire::rma`: a write's target, a read
//!   request) decode exactly the sizes they have and round-trip, and
//!   `range_in` never accepts a range that leaves the region;
//! - the atomic request prefix (`wire::atomic`) decodes only with the
//!   payload length its count and form call for, never more than
//!   `ATOMIC_REQ_MAX`, and round-trips; applying the decoded operation to
//!   arbitrary elements (`weft_core::atomic::apply`) never panics, and
//!   on an error leaves the target untouched.
//! - the key-proof payloads (`wire::auth`: `KeyChallenge`, `KeyProof`,
//!   `KeyedConnReq`, `KeyedHello`) decode exactly the sizes they have and
//!   round-trip, a refusal never yields a MAC, and a MAC check (or a key
//!   selector check) passes for exactly the MAC (selector) the key gives.
#![no_main]

use libfuzzer_sys::fuzz_target;
use weft_core::addr::{decode_sockaddr, encode_sockaddr, parse_sockaddr_str, sockaddr_to_str};
use weft_core::auth::{AuthKey, ConnKind, Role, Transcript, MAC_LEN, SELECTOR_LEN};
use weft_core::wire::auth::{
    decode_conn_req, decode_keyed_hello, decode_proof, encode_conn_req, encode_keyed_hello,
    Challenge, CHALLENGE_LEN, CONN_REQ_PREFIX, PROOF_LEN,
};

use weft_core::atomic::{apply, supported, AtomicKind, AtomicOp};
use weft_core::wire::atomic::{AtomicHdr, ATOMIC_HDR_LEN, ATOMIC_MAX, ATOMIC_REQ_MAX};
use weft_core::wire::claim::{Claim, NONCE_LEN};
use weft_core::wire::rma::{range_in, ReadReq, Target, READ_CHUNK, READ_REQ_LEN, TARGET_LEN};
use weft_core::wire::{
    decode, FrameKind, Header, WireError, FLAG_ACK_REQ, FLAG_CQ_DATA, HEADER_LEN, MAX_CONTROL_LEN,
};

/// `max_data_len` values every input is decoded with.
const MAX_LENS: [u64; 7] = [0, 1, 64, 4096, 1 << 20, u64::MAX - 1, u64::MAX];

fn check_header(data: &[u8]) {
    let mut accepted_at: Option<u64> = None;
    for &max in &MAX_LENS {
        match decode(data, max) {
            Ok(h) => {
                let kind = h.kind.expect("decoded header without a kind");
                // Field constraints of docs/wire.md.
                if kind == FrameKind::RmaWrite {
                    assert!(h.len <= max.saturating_add(TARGET_LEN as u64));
                    assert_eq!(h.flags & !(FLAG_CQ_DATA | FLAG_ACK_REQ), 0);
                } else if kind == FrameKind::AtomicReq {
                    assert!(h.len <= ATOMIC_REQ_MAX as u64);
                    assert_eq!(h.flags, 0, "atomic request with flags");
                } else if kind == FrameKind::RmaReadReq {
                    assert!(h.len <= READ_REQ_LEN as u64);
                    assert_eq!(h.flags, 0, "read request with flags");
                } else if kind.is_data() {
                    if !matches!(kind, FrameKind::Msg | FrameKind::Tagged) {
                        assert_eq!(h.rx_ctx, 0, "{kind:?} naming a receive context");
                    }
                    assert!(h.len <= max, "data frame len {} > max {max}", h.len);
                    assert_eq!(h.flags & !(FLAG_CQ_DATA | FLAG_ACK_REQ), 0);
                } else {
                    assert_eq!(h.flags, 0, "control frame with flags");
                    assert_eq!(h.rx_ctx, 0, "control frame naming a receive context");
                    let limit = match kind {
                        FrameKind::Hello
                        | FrameKind::ConnReq
                        | FrameKind::ConnResp
                        | FrameKind::Verify
                        | FrameKind::KeyedHello => MAX_CONTROL_LEN,
                        FrameKind::KeyedConnReq => MAX_CONTROL_LEN + NONCE_LEN as u64,
                        FrameKind::KeyChallenge => CHALLENGE_LEN as u64,
                        FrameKind::KeyProof => PROOF_LEN as u64,
                        FrameKind::RmaReadResp => READ_CHUNK as u64,
                        FrameKind::AtomicResp => ATOMIC_MAX as u64,
                        _ => 0,
                    };
                    assert!(h.len <= limit, "{kind:?} len {} > {limit}", h.len);
                }
                // Re-encoding is byte-exact (reserved bytes are zero) and
                // decodes to the same header.
                let enc = h.encode();
                assert_eq!(&enc[..], &data[..HEADER_LEN], "re-encoding differs");
                assert_eq!(decode(&enc, max), Ok(h), "re-decoding differs");
                // Trailing bytes (the payload) never change the header.
                assert_eq!(decode(&data[..HEADER_LEN], max), Ok(h));
                // Monotone in the bound.
                if accepted_at.is_none() {
                    accepted_at = Some(max);
                }
            }
            Err(e) => {
                // MAX_LENS is increasing: once accepted, always accepted.
                assert!(
                    accepted_at.is_none(),
                    "accepted with max {accepted_at:?} but rejected with max {max}: {e}"
                );
                match e {
                    WireError::Truncated(n) => {
                        assert!(data.len() < HEADER_LEN);
                        assert_eq!(n, data.len());
                    }
                    WireError::TooLong { len, max: m } => assert!(len > m),
                    _ => {}
                }
                // Display never panics.
                let _ = e.to_string();
                let _ = weft_core::Error::from(e);
            }
        }
    }
}

fn check_sockaddr(data: &[u8]) {
    if let Ok(a) = decode_sockaddr(data) {
        let enc = encode_sockaddr(&a);
        assert_eq!(enc.len(), data.len());
        // sockaddr_in's sin_zero (bytes 8..16) is ignored by the decoder;
        // everything else must round-trip byte for byte.
        let n = if a.is_ipv4() { 8 } else { data.len() };
        assert_eq!(&enc[..n], &data[..n], "sockaddr re-encoding differs");
        assert_eq!(decode_sockaddr(&enc), Ok(a));
    }
    // Also try the slice as a Hello frame: header then payload.
    if data.len() > HEADER_LEN {
        if let Ok(h) = decode(data, 0) {
            if matches!(
                h.kind,
                Some(FrameKind::Hello | FrameKind::Verify | FrameKind::KeyedHello)
            ) {
                let end = data.len().min(HEADER_LEN.saturating_add(h.len as usize));
                if let Ok(c) = Claim::decode(&data[HEADER_LEN..end]) {
                    // A claim that parses re-encodes to the same bytes
                    // (sin_zero aside) and parses again to itself.
                    let enc = c.encode();
                    assert_eq!(enc.len(), end - HEADER_LEN);
                    assert_eq!(Claim::decode(&enc), Ok(c));
                }
            }
        }
    }
}

fn check_rma(data: &[u8]) {
    match Target::decode(data) {
        Ok(t) => {
            assert!(data.len() >= TARGET_LEN);
            assert_eq!(&t.encode()[..], &data[..TARGET_LEN]);
        }
        Err(e) => assert!(data.len() < TARGET_LEN && e.got == data.len()),
    }
    match ReadReq::decode(data) {
        Ok(r) => {
            assert_eq!(data.len(), READ_REQ_LEN);
            assert_eq!(&r.encode()[..], data);
            // Whatever the peer asks, an accepted range stays inside.
            for region_len in [0usize, 1, 4096, usize::MAX] {
                for base in [0u64, r.target.addr, u64::MAX] {
                    if let Some(off) = range_in(base, region_len, r.target.addr, r.len) {
                        let end = (off as u128) + (r.len as u128);
                        assert!(end <= region_len as u128, "range leaves the region");
                        assert!(r.target.addr >= base);
                    }
                }
            }
        }
        Err(e) => assert_ne!(e.got, READ_REQ_LEN),
    }
    // Also as an RMA frame: header, then its prefix.
    if data.len() > HEADER_LEN {
        if let Ok(h) = decode(data, 1 << 20) {
            let rest = &data[HEADER_LEN..];
            match h.kind {
                Some(FrameKind::RmaWrite) => {
                    let _ = Target::decode(rest);
                }
                Some(FrameKind::RmaReadReq) => {
                    let _ = ReadReq::decode(&rest[..rest.len().min(h.len as usize)]);
                }
                _ => {}
            }
        }
    }
}

fn check_atomic(data: &[u8]) {
    let lens = [
        data.len() as u64,
        data.len().saturating_sub(HEADER_LEN) as u64,
        ATOMIC_REQ_MAX as u64,
    ];
    for len in lens {
        let Ok(a) = AtomicHdr::decode(data, len) else {
            continue;
        };
        assert!(data.len() >= ATOMIC_HDR_LEN);
        assert_eq!(&a.encode()[..], &data[..ATOMIC_HDR_LEN], "re-encoding differs");
        assert_eq!(a.payload_len(), Some(len as usize));
        assert!(len as usize <= ATOMIC_REQ_MAX);
        let n = a.bytes().expect("decoded count within the bound");
        assert!(n <= ATOMIC_MAX && a.answer_len() <= n);
        // The arithmetic on whatever elements follow the prefix.
        let rest = &data[ATOMIC_HDR_LEN..];
        if n == 0 || rest.len() < n {
            continue;
        }
        let mut target = rest[..n].to_vec();
        let before = target.clone();
        let operand = if a.op == AtomicOp::Read {
            &rest[..0]
        } else {
            &rest[..n]
        };
        let compare = if a.kind == AtomicKind::Compare {
            &rest[..n]
        } else {
            &rest[..0]
        };
        match apply(a.op, a.datatype, &mut target, operand, compare) {
            Ok(old) => {
                assert!(supported(a.kind, a.op, a.datatype).is_ok() || a.kind == AtomicKind::Plain);
                assert_eq!(old, before);
            }
            Err(_) => assert_eq!(target, before, "a refused atomic changed its target"),
        }
    }
}

fn check_key_payloads(data: &[u8]) {
    match Challenge::decode(data) {
        Ok(c) => {
            assert_eq!(data.len(), CHALLENGE_LEN);
            assert_eq!(&c.encode()[..], data, "challenge re-encoding differs");
        }
        Err(e) => {
            assert_ne!(data.len(), CHALLENGE_LEN);
            assert_eq!(e, weft_core::Error::KeyRejected);
        }
    }
    let status = data.first().map_or(0, |&b| u64::from(b));
    for s in [0, 129, status] {
        match decode_proof(s, data) {
            Ok(mac) => {
                assert_eq!(s, 0, "a refusal yielded a MAC");
                assert_eq!(data.len(), PROOF_LEN);
                assert_eq!(&mac[..], data);
            }
            Err(_) => assert!(s != 0 || data.len() != PROOF_LEN),
        }
    }
    match decode_conn_req(data) {
        Ok((nonce, sel, cm)) => {
            assert!(data.len() >= CONN_REQ_PREFIX);
            assert_eq!(encode_conn_req(&nonce, &sel, cm), data, "request re-encoding differs");
        }
        Err(_) => assert!(data.len() < CONN_REQ_PREFIX),
    }
    match decode_keyed_hello(data) {
        Ok((claim, sel)) => {
            assert_eq!(&data[data.len() - SELECTOR_LEN..], &sel[..]);
            let again = encode_keyed_hello(&claim, &sel);
            assert_eq!(decode_keyed_hello(&again), Ok((claim, sel)), "keyed hello round trip");
        }
        Err(_) => {}
    }
    if data.len() < SELECTOR_LEN {
        assert!(decode_keyed_hello(data).is_err(), "short keyed hello accepted");
    }
    // A selector check on arbitrary bytes passes for the key's own
    // selector only.
    if let Ok(key) = AuthKey::new(b"fuzz key") {
        let nonce = [3; NONCE_LEN];
        let sel = key.selector(&nonce).expect("a selector");
        let given = &data[..data.len().min(SELECTOR_LEN + 1)];
        assert_eq!(key.selects(&nonce, given), given == &sel[..], "selector check");
    }
    // A MAC check on arbitrary bytes passes for the key's own MAC only.
    if let Ok(key) = AuthKey::new(b"fuzz key") {
        let t = Transcript {
            kind: ConnKind::Rdm,
            connector_nonce: [1; NONCE_LEN],
            acceptor_nonce: [2; NONCE_LEN],
            connector: ([127, 0, 0, 1], 1).into(),
            acceptor: ([127, 0, 0, 1], 2).into(),
        };
        let good = key.prove(&t, Role::Connector).expect("a MAC");
        let tag = &data[..data.len().min(MAC_LEN + 1)];
        assert_eq!(
            key.verify(&t, Role::Connector, tag).is_ok(),
            tag == &good[..],
            "MAC check disagrees with equality"
        );
    }
    // Also as a key-proof frame: header, then its payload.
    if data.len() > HEADER_LEN {
        if let Ok(h) = decode(data, 0) {
            let rest = &data[HEADER_LEN..];
            let p = &rest[..rest.len().min(h.len as usize)];
            match h.kind {
                Some(FrameKind::KeyChallenge) => {
                    let _ = Challenge::decode(p);
                }
                Some(FrameKind::KeyProof) => {
                    let _ = decode_proof(h.data, p);
                }
                Some(FrameKind::KeyedConnReq) => {
                    let _ = decode_conn_req(p);
                }
                _ => {}
            }
        }
    }
}

fn check_str(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    if let Ok(a) = parse_sockaddr_str(&s) {
        // The string form carries ip and port only (no flowinfo / scope id).
        let back = parse_sockaddr_str(&sockaddr_to_str(&a)).expect("formatted address reparses");
        assert_eq!((back.ip(), back.port()), (a.ip(), a.port()));
    }
}

fuzz_target!(|data: &[u8]| {
    check_header(data);
    check_sockaddr(data);
    check_rma(data);
    check_atomic(data);
    check_key_payloads(data);
    check_str(data);
    // Keep `Header` constructible from the public API in the target too.
    let _ = Header::new(FrameKind::Ack).encode();
});
