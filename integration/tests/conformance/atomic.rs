//! Atomics (spec/fi_atomic.3.txt) between RDM endpoints of one domain.
//!
//! Written against what the provider says it supports: every test asks
//! the `*atomicvalid` queries first and exercises only what they accept,
//! and checks that what they refuse is refused with the documented
//! error (`OpNotSupp`, which every combination libfabric does not define
//! must get). The expected results come from `weft_core::atomic::apply`,
//! the arithmetic unit-tested on its own, applied locally.

use std::collections::HashSet;

use bytes::{Bytes, BytesMut};
use weft::{AtomicKind, AtomicOp, Caps, Datatype, EpType, Error, Info, MrAccess, MrAttr, OpFlags};
use weft_core::atomic::{apply, defined};
use weft_integration::{within, Harness, Provider, RdmEp};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);
const KINDS: [AtomicKind; 3] = [AtomicKind::Plain, AtomicKind::Fetch, AtomicKind::Compare];

fn atomic_info(p: &Provider) -> Option<Info> {
    p.try_info_with(EpType::Rdm, |h| {
        h.caps = Caps::MSG | Caps::RMA | Caps::ATOMIC;
        h.domain_attr.mr_mode =
            weft::MrMode::PROV_KEY | weft::MrMode::VIRT_ADDR | weft::MrMode::LOCAL;
        h.mode = weft::Mode::RX_CQ_DATA;
    })
}

/// The harness, or `None` (said on stderr) for a provider or device
/// without atomics.
fn harness(p: &Provider) -> Option<Harness> {
    match atomic_info(p) {
        Some(i) => Some(Harness::with_info(p, i)),
        None => {
            eprintln!("{}: no FI_ATOMIC offered; atomic tests skipped", p.name);
            None
        }
    }
}

fn valid(ep: &weft::Endpoint, kind: AtomicKind, op: AtomicOp, dt: Datatype) -> weft::Result<usize> {
    match kind {
        AtomicKind::Plain => ep.atomicvalid(op, dt),
        AtomicKind::Fetch => ep.fetch_atomicvalid(op, dt),
        AtomicKind::Compare => ep.compare_atomicvalid(op, dt),
    }
}

/// `vals` as elements of `dt`, host byte order.
fn elems(dt: Datatype, vals: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in vals {
        match dt {
            Datatype::I8 => out.extend_from_slice(&(v as i8).to_ne_bytes()),
            Datatype::U8 => out.extend_from_slice(&(v as u8).to_ne_bytes()),
            Datatype::I16 => out.extend_from_slice(&(v as i16).to_ne_bytes()),
            Datatype::U16 => out.extend_from_slice(&(v as u16).to_ne_bytes()),
            Datatype::I32 => out.extend_from_slice(&(v as i32).to_ne_bytes()),
            Datatype::U32 => out.extend_from_slice(&(v as u32).to_ne_bytes()),
            Datatype::I64 => out.extend_from_slice(&v.to_ne_bytes()),
            Datatype::U64 => out.extend_from_slice(&(v as u64).to_ne_bytes()),
            Datatype::F32 => out.extend_from_slice(&(v as f32 * 1.5).to_ne_bytes()),
            Datatype::F64 => out.extend_from_slice(&(v as f64 * 1.5).to_ne_bytes()),
            other => panic!("no values for {other:?}"),
        }
    }
    out
}

/// Hints asking for atomics get them; the queries accept only what
/// libfabric defines, refuse the rest with `OpNotSupp`, and never accept
/// the complex or `long double` types (refused by every provider here).
async fn atomicvalid_answers_every_combination(p: Provider) {
    let Some(h) = harness(&p) else { return };
    assert!(h.info.caps.contains(Caps::ATOMIC));
    assert!(h.info.tx_attr.caps.contains(Caps::ATOMIC));
    let (a, _b, _, _) = h.rdm_pair();
    let mut accepted = 0;
    for kind in KINDS {
        for op in AtomicOp::ALL {
            for dt in Datatype::ALL {
                match valid(&a.ep, kind, op, dt) {
                    Ok(n) => {
                        assert!(n >= 1, "{kind:?} {op:?} {dt:?}: count {n}");
                        assert!(defined(kind, op, dt), "{kind:?} {op:?} {dt:?} is undefined");
                        assert!(dt.is_real(), "{dt:?}");
                        let max = h.info.ep_attr.max_msg_size / dt.size();
                        assert!(n <= max, "{kind:?} {op:?} {dt:?}: {n} > {max}");
                        accepted += 1;
                    }
                    Err(e) => assert_eq!(e, Error::OpNotSupp, "{kind:?} {op:?} {dt:?}"),
                }
            }
        }
    }
    assert!(accepted >= 2, "at least fetch-add and compare-swap of u64");
    assert!(a.ep.fetch_atomicvalid(AtomicOp::Sum, Datatype::U64).is_ok());
    assert!(a
        .ep
        .compare_atomicvalid(AtomicOp::Cswap, Datatype::U64)
        .is_ok());
    // An endpoint whose caps lack FI_ATOMIC has no atomics at all.
    let plain = p.rma_info(EpType::Rdm);
    if !plain.caps.contains(Caps::ATOMIC) {
        let h2 = Harness::with_info(&p, plain);
        let (c, _, _, _) = h2.rdm_pair();
        assert_eq!(
            c.ep.atomicvalid(AtomicOp::Sum, Datatype::U64),
            Err(Error::NoSys)
        );
    }
}

/// Every accepted combination, with as many elements as allowed up to
/// three, at an element-aligned offset: the target's memory ends as the
/// arithmetic says, the fetching forms return the values before, and the
/// completion carries `ATOMIC` and the direction.
async fn every_supported_op_and_type(p: Provider) {
    let Some(h) = harness(&p) else { return };
    let (a, _b, to_b, _) = h.rdm_pair();
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(4096, RW).requested_key(71))
        .unwrap();
    let mut ran = 0;
    for kind in KINDS {
        for op in AtomicOp::ALL {
            for dt in Datatype::ALL {
                let Ok(limit) = valid(&a.ep, kind, op, dt) else {
                    continue;
                };
                let count = limit.min(3);
                let n = count * dt.size();
                let off = 64 + dt.size();
                let start = elems(dt, &[5, 0, -7][..count]);
                let operand = if op == AtomicOp::Read {
                    Vec::new()
                } else {
                    elems(dt, &[3, 0b0110, -7][..count])
                };
                let compare = if kind == AtomicKind::Compare {
                    elems(dt, &[5, 2, -9][..count])
                } else {
                    Vec::new()
                };
                mr.write_at(off, &start).unwrap();
                let mut want = start.clone();
                let old = apply(op, dt, &mut want, &operand, &compare).unwrap();
                let addr = mr.addr() + off as u64;
                let what = format!("{kind:?} {op:?} {dt:?} x{count}");
                let got = match kind {
                    AtomicKind::Plain => {
                        let e = within(
                            &what,
                            a.ep.atomic(to_b, op, dt, operand.into(), addr, mr.key()),
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {:?}", e.err));
                        assert!(e.flags.contains(OpFlags::ATOMIC | OpFlags::WRITE), "{what}");
                        None
                    }
                    AtomicKind::Fetch => Some(
                        within(
                            &what,
                            a.ep.fetch_atomic(to_b, op, dt, count, operand.into(), addr, mr.key()),
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {:?}", e.err)),
                    ),
                    AtomicKind::Compare => Some(
                        within(
                            &what,
                            a.ep.compare_atomic(
                                to_b,
                                op,
                                dt,
                                operand.into(),
                                compare.into(),
                                addr,
                                mr.key(),
                            ),
                        )
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {:?}", e.err)),
                    ),
                };
                if let Some(got) = got {
                    assert_eq!(&got[..], &old[..], "{what}: values before");
                }
                let mut now = vec![0u8; n];
                mr.read_at(off, &mut now).unwrap();
                assert_eq!(now, want, "{what}: target after");
                ran += 1;
            }
        }
    }
    assert!(ran >= 2, "ran {ran}");
}

/// Misuse the initiator catches: a combination refused by the query is
/// refused by the operation with the same error; no elements, more than
/// the query's count, a misaligned address or an operand of the wrong
/// length are `Inval` / `MsgSize`.
async fn misuse_is_refused_before_posting(p: Provider) {
    let Some(h) = harness(&p) else { return };
    let (a, _b, to_b, _) = h.rdm_pair();
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(4096, RW).requested_key(72))
        .unwrap();
    let key = mr.key();
    let at = mr.addr();
    let one = Bytes::from(vec![0u8; 8]);
    let refused = a.ep.compare_atomicvalid(AtomicOp::Mswap, Datatype::F64);
    assert_eq!(refused, Err(Error::OpNotSupp), "undefined on floats");
    let e = a.ep.compare_atomic(
        to_b,
        AtomicOp::Mswap,
        Datatype::F64,
        one.clone(),
        one.clone(),
        at,
        key,
    );
    assert_eq!(e.await.unwrap_err().err, Error::OpNotSupp);
    let e =
        a.ep.fetch_atomic(to_b, AtomicOp::Sum, Datatype::U64, 0, Bytes::new(), at, key);
    assert_eq!(e.await.unwrap_err().err, Error::Inval, "no elements");
    let limit =
        a.ep.fetch_atomicvalid(AtomicOp::Sum, Datatype::U64)
            .unwrap();
    let big = Bytes::from(vec![0u8; 8 * (limit + 1)]);
    let e =
        a.ep.fetch_atomic(to_b, AtomicOp::Sum, Datatype::U64, limit + 1, big, at, key);
    assert_eq!(
        e.await.unwrap_err().err,
        Error::MsgSize,
        "past the count limit"
    );
    let e = a.ep.fetch_atomic(
        to_b,
        AtomicOp::Sum,
        Datatype::U64,
        1,
        one.clone(),
        at + 4,
        key,
    );
    assert_eq!(e.await.unwrap_err().err, Error::Inval, "misaligned");
    let e = a.ep.fetch_atomic(
        to_b,
        AtomicOp::Sum,
        Datatype::U64,
        1,
        one.slice(..4),
        at,
        key,
    );
    assert_eq!(e.await.unwrap_err().err, Error::Inval, "short operand");
    // Still usable.
    let old = within("fetch_add", a.ep.fetch_add(to_b, at, key, 1))
        .await
        .unwrap();
    assert_eq!(old, 0);
}

/// N peers each doing M fetch-adds of 1 on one counter: it ends at N·M,
/// and every fetched value is distinct (no two adds saw the same value).
async fn contended_fetch_adds_are_atomic(p: Provider) {
    const N: usize = 4;
    const M: usize = 50;
    let Some(h) = harness(&p) else { return };
    let target = h.rdm_ep();
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(64, RW).requested_key(73))
        .unwrap();
    let peers: Vec<(RdmEp, weft::FiAddr)> = (0..N)
        .map(|_| {
            let p = h.rdm_ep();
            let to = p.insert(&target);
            (p, to)
        })
        .collect();
    let (addr, key) = (mr.addr() + 8, mr.key());
    let runs = peers.iter().map(|(p, to)| {
        let (ep, to) = (p.ep.clone(), *to);
        tokio::spawn(async move {
            let mut seen = Vec::with_capacity(M);
            for _ in 0..M {
                seen.push(ep.fetch_add(to, addr, key, 1).await.map_err(|e| e.err)?);
            }
            Ok::<_, Error>(seen)
        })
    });
    let all = within("contended fetch-adds", futures::future::join_all(runs)).await;
    let mut seen = HashSet::new();
    for r in all {
        for v in r.unwrap().unwrap() {
            assert!(seen.insert(v), "value {v} fetched twice");
        }
    }
    assert_eq!(seen.len(), N * M);
    assert_eq!(seen, (0..(N * M) as u64).collect::<HashSet<_>>());
    let mut now = [0u8; 8];
    mr.read_at(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), (N * M) as u64);
}

/// A wrong key, a range past the region and a region without remote
/// write: each atomic fails with `Access`, the memory is untouched, and
/// the pair goes on working.
async fn refused_atomics_fail_with_access(p: Provider) {
    let Some(h) = harness(&p) else { return };
    let (a, b, to_b, _) = h.rdm_pair();
    let mr = h
        .domain
        .mr_regattr(MrAttr::alloc(64, RW).requested_key(74))
        .unwrap();
    let ro = h
        .domain
        .mr_regattr(MrAttr::alloc(64, MrAccess::REMOTE_READ).requested_key(75))
        .unwrap();
    mr.write_at(0, &[0x11; 64]).unwrap();
    ro.write_at(0, &[0x22; 64]).unwrap();
    let bad_key = if mr.key() == 76 { 77 } else { 76 };
    let cases = [
        ("wrong key", mr.addr(), bad_key),
        ("past the end", mr.addr() + 64, mr.key()),
        ("read-only region", ro.addr(), ro.key()),
    ];
    for (what, addr, key) in cases {
        let e = within(what, a.ep.fetch_add(to_b, addr, key, 5))
            .await
            .expect_err(what);
        assert_eq!(e.err, Error::Access, "{what}");
        let e = within(
            what,
            a.ep.compare_swap(to_b, addr, key, 0x1111_1111_1111_1111, 9),
        )
        .await
        .expect_err(what);
        assert_eq!(e.err, Error::Access, "{what}");
    }
    assert_eq!(mr.to_vec().unwrap(), vec![0x11; 64]);
    assert_eq!(ro.to_vec().unwrap(), vec![0x22; 64]);
    let old = within("good", a.ep.fetch_add(to_b, mr.addr() + 56, mr.key(), 1))
        .await
        .unwrap();
    assert_eq!(old, 0x1111_1111_1111_1111);
    let (got, sent) = within("send after refusals", async {
        tokio::join!(
            b.ep.recv(BytesMut::zeroed(8)),
            a.ep.send(to_b, Bytes::from_static(b"x"))
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], b"x");
}

provider_tests! {
    atomicvalid_answers_every_combination,
    every_supported_op_and_type,
    misuse_is_refused_before_posting,
    contended_fetch_adds_are_atomic,
    refused_atomics_fail_with_access,
}

shm_tests! {
    atomicvalid_answers_every_combination,
    every_supported_op_and_type,
    misuse_is_refused_before_posting,
    contended_fetch_adds_are_atomic,
    refused_atomics_fail_with_access,
}
