//! Atomics on the tcp provider: what it offers, rights per direction,
//! arrays up to the count limit, atomicity across keys onto the same
//! memory, and raw peers forging atomic frames (wrong keys, unsupported
//! combinations, bad lengths, answers nobody asked for, requests whose
//! answers are never read): the endpoint stays up, memory is touched
//! only by accepted requests, and a refused request leaves the
//! connection usable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use weft::{
    AtomicKind, AtomicOp, BindFlags, ConnLimits, Datatype, Error, MemoryRegion, MrAccess, MrAttr,
};
use weft_core::atomic::supported;
use weft_core::wire::atomic::{AtomicHdr, ATOMIC_MAX};
use weft_core::wire::rma::Target;
use weft_core::wire::{FrameKind, Header, HEADER_LEN};
use weft_integration::identity::{expect_closed, raw_hello, read_frame};
use weft_integration::{within, Harness, Provider, RdmEp};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);

fn tcp() -> Provider {
    Provider::named("tcp")
}

fn region(h: &Harness, len: usize, access: MrAccess, key: u64) -> MemoryRegion {
    h.domain
        .mr_regattr(MrAttr::alloc(len, access).requested_key(key))
        .unwrap()
}

fn u64s(v: &[u64]) -> Bytes {
    v.iter()
        .flat_map(|x| x.to_ne_bytes())
        .collect::<Vec<u8>>()
        .into()
}

fn read_u64(mr: &MemoryRegion, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read_at(off, &mut b).unwrap();
    u64::from_ne_bytes(b)
}

#[tokio::test]
async fn every_defined_real_combination_is_offered() {
    let h = Harness::rdm(&tcp());
    let (a, _b, _, _) = h.rdm_pair();
    let max = h.info.ep_attr.max_msg_size.min(ATOMIC_MAX);
    for kind in [AtomicKind::Plain, AtomicKind::Fetch, AtomicKind::Compare] {
        for op in AtomicOp::ALL {
            for dt in Datatype::ALL {
                let got = match kind {
                    AtomicKind::Plain => a.ep.atomicvalid(op, dt),
                    AtomicKind::Fetch => a.ep.fetch_atomicvalid(op, dt),
                    AtomicKind::Compare => a.ep.compare_atomicvalid(op, dt),
                };
                let want = supported(kind, op, dt).map(|()| max / dt.size());
                assert_eq!(got, want, "{kind:?} {op:?} {dt:?}");
            }
        }
    }
    assert_eq!(
        a.ep.atomicvalid(AtomicOp::Sum, Datatype::DoubleComplex),
        Err(Error::OpNotSupp),
        "complex types are refused"
    );
    assert_eq!(
        a.ep.fetch_atomicvalid(AtomicOp::Read, Datatype::LongDouble),
        Err(Error::OpNotSupp),
        "long double is refused"
    );
}

/// Updates need remote write, fetches remote read: a write-only region
/// takes plain atomics and refuses fetching ones, a read-only region the
/// other way round; refusals change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rights_follow_the_direction() {
    let h = Harness::rdm(&tcp());
    let (a, _b, to_b, _) = h.rdm_pair();
    let wo = region(&h, 64, MrAccess::REMOTE_WRITE, 1);
    let ro = region(&h, 64, MrAccess::REMOTE_READ, 2);
    ro.write_at(0, &u64s(&[7, 8])).unwrap();
    within(
        "plain sum",
        a.ep.atomic(to_b, AtomicOp::Sum, Datatype::U64, u64s(&[2, 3]), 0, 1),
    )
    .await
    .unwrap();
    assert_eq!((read_u64(&wo, 0), read_u64(&wo, 8)), (2, 3));
    let e =
        a.ep.fetch_atomic(to_b, AtomicOp::Sum, Datatype::U64, 2, u64s(&[1, 1]), 0, 1);
    assert_eq!(
        e.await.unwrap_err().err,
        Error::Access,
        "fetch on write-only"
    );
    assert_eq!((read_u64(&wo, 0), read_u64(&wo, 8)), (2, 3), "untouched");
    let old =
        a.ep.fetch_atomic(to_b, AtomicOp::Read, Datatype::U64, 2, Bytes::new(), 0, 2);
    assert_eq!(&old.await.unwrap()[..], &u64s(&[7, 8])[..]);
    let e =
        a.ep.atomic(to_b, AtomicOp::Write, Datatype::U64, u64s(&[0]), 0, 2);
    assert_eq!(
        e.await.unwrap_err().err,
        Error::Access,
        "write on read-only"
    );
    let e = a.ep.compare_swap(to_b, 0, 2, 7, 1);
    assert_eq!(
        e.await.unwrap_err().err,
        Error::Access,
        "cswap on read-only"
    );
    assert_eq!(ro.to_vec().unwrap()[..16], u64s(&[7, 8])[..]);
}

/// The count limit's worth of elements in one atomic, and one element
/// too many for the region: the first applies to all, the second is
/// refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrays_up_to_the_limit() {
    let h = Harness::rdm(&tcp());
    let (a, _b, to_b, _) = h.rdm_pair();
    let n =
        a.ep.fetch_atomicvalid(AtomicOp::Sum, Datatype::U32)
            .unwrap();
    assert_eq!(n, ATOMIC_MAX / 4);
    let mr = region(&h, 4 * n, RW, 3);
    let start: Vec<u8> = (0..n as u32).flat_map(|i| i.to_ne_bytes()).collect();
    mr.write_at(0, &start).unwrap();
    let add: Bytes = (0..n as u32)
        .flat_map(|_| 10u32.to_ne_bytes())
        .collect::<Vec<u8>>()
        .into();
    let old = within(
        "big fetch-add",
        a.ep.fetch_atomic(to_b, AtomicOp::Sum, Datatype::U32, n, add.clone(), 0, 3),
    )
    .await
    .unwrap();
    assert_eq!(&old[..], &start[..]);
    let now = mr.to_vec().unwrap();
    for (i, e) in now.chunks_exact(4).enumerate() {
        assert_eq!(u32::from_ne_bytes(e.try_into().unwrap()), i as u32 + 10);
    }
    // Shifted by one element, the last one falls outside.
    let e =
        a.ep.fetch_atomic(to_b, AtomicOp::Sum, Datatype::U32, n, add, 4, 3);
    assert_eq!(e.await.unwrap_err().err, Error::Access);
    assert_eq!(mr.to_vec().unwrap(), now, "refused whole");
}

/// Two peers adding to one counter, one through the region's key and
/// one through a sub-region's, while a third rewrites a neighbour with
/// RMA: the counter ends exact (atomics serialise on the memory, not
/// the key).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atomics_are_atomic_across_keys_onto_one_memory() {
    let h = Harness::rdm(&tcp());
    let target = h.rdm_ep();
    let base = region(&h, 64, RW, 4);
    let sub = h
        .domain
        .mr_regattr(MrAttr::sub(&base, 16, 16, RW).requested_key(5))
        .unwrap();
    let (p1, p2, p3) = (h.rdm_ep(), h.rdm_ep(), h.rdm_ep());
    let (t1, t2, t3) = (p1.insert(&target), p2.insert(&target), p3.insert(&target));
    let via_base = async {
        for _ in 0..200 {
            p1.ep.fetch_add(t1, 16, 4, 1).await.unwrap();
        }
    };
    let via_sub = async {
        for _ in 0..200 {
            p2.ep.fetch_add(t2, 0, 5, 2).await.unwrap();
        }
    };
    let rma = async {
        for i in 0..200u64 {
            p3.ep.write(t3, u64s(&[i]), 24, 4).await.unwrap();
        }
    };
    within("mixed", async { tokio::join!(via_base, via_sub, rma) }).await;
    assert_eq!(read_u64(&base, 16), 600);
    assert_eq!(read_u64(&base, 24), 199);
    drop(sub);
}

/// Large fetching atomics, several in flight, at a target whose share
/// of the budget holds about one at a time: each waits its turn (the
/// reader parks and resumes as answers are written) and all arrive
/// right.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn atomics_wait_for_budget_and_resume() {
    let h = Harness::rdm(&tcp());
    let target = {
        let (av, cq) = (h.av(), h.cq());
        let ep = h.domain.endpoint(&h.info).unwrap();
        ep.set_conn_limits(ConnLimits::default().with_peer_buffered(ATOMIC_MAX))
            .unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        RdmEp { ep, av, cq }
    };
    let peer = h.rdm_ep();
    let to_t = peer.insert(&target);
    let n = ATOMIC_MAX / 8;
    let mr = region(&h, ATOMIC_MAX, RW, 8);
    let ones = u64s(&vec![1; n]);
    let ops = (0..16).map(|_| {
        peer.ep
            .fetch_atomic(to_t, AtomicOp::Sum, Datatype::U64, n, ones.clone(), 0, 8)
    });
    let olds = within("parked atomics", futures::future::join_all(ops)).await;
    let mut firsts: Vec<u64> = olds
        .into_iter()
        .map(|r| {
            let old = r.unwrap();
            let v: Vec<u64> = old
                .chunks_exact(8)
                .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            assert!(v.iter().all(|&x| x == v[0]), "one atomic saw one state");
            v[0]
        })
        .collect();
    firsts.sort_unstable();
    assert_eq!(firsts, (0..16).collect::<Vec<u64>>());
    assert!(mr
        .to_vec()
        .unwrap()
        .chunks_exact(8)
        .all(|c| c == 16u64.to_ne_bytes()));
    // An answer's charge is given back once it is written, which may
    // be a moment after the initiator has read it.
    let held = weft_integration::settled_unexpected_bytes(&target.ep).await;
    assert_eq!(held, 0, "charges given back");
}

// ---- Raw peers forging atomic frames ----

/// An `AtomicReq` frame: header, prefix, then `arrays` (little-endian
/// elements), with the header's length covering them.
fn atomic_req(seq: u64, a: AtomicHdr, arrays: &[u8]) -> Vec<u8> {
    let mut h = Header::new(FrameKind::AtomicReq);
    h.seq = seq;
    h.len = (32 + arrays.len()) as u64;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(&a.encode());
    v.extend_from_slice(arrays);
    v
}

fn le(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn fetch_add_hdr(key: u64, addr: u64, count: u64) -> AtomicHdr {
    AtomicHdr {
        target: Target { addr, key },
        op: AtomicOp::Sum,
        datatype: Datatype::U64,
        kind: AtomicKind::Fetch,
        count,
    }
}

/// The victim still serves a well-behaved peer: a message and an atomic.
async fn alive(victim: &RdmEp, good: &RdmEp, key: u64, n: u8) {
    let to_v = good.insert(victim);
    let (got, sent) = tokio::join!(
        victim.ep.recv(BytesMut::zeroed(8)),
        good.ep.send(to_v, Bytes::from(vec![n; 4]))
    );
    sent.unwrap();
    assert_eq!(&got.unwrap().into_bytes()[..], &[n; 4]);
    within("good atomic", good.ep.fetch_add(to_v, 0, key, 0))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_atomic_frames_are_answered_or_end_their_connection() {
    let h = Harness::rdm(&tcp());
    let victim = h.rdm_ep();
    let good = h.rdm_ep();
    let va = weft::decode_sockaddr(&victim.addr()).unwrap();
    let mr = region(&h, 64, RW, 6);
    mr.write_at(0, &u64s(&[100, 200])).unwrap();
    let (mut s, _id) = raw_hello(va).await;
    // A good fetch-add of two elements: the old values, little-endian.
    s.write_all(&atomic_req(1, fetch_add_hdr(6, 0, 2), &le(&[1, 2])))
        .await
        .unwrap();
    let (r, p) = read_frame(&mut s).await;
    assert_eq!((r.kind, r.seq, r.data), (Some(FrameKind::AtomicResp), 1, 0));
    assert_eq!(p, le(&[100, 200]));
    assert_eq!((read_u64(&mr, 0), read_u64(&mr, 8)), (101, 202));
    let after = mr.to_vec().unwrap();
    // Refusals, each answered on the same stream, nothing touched.
    let mut bor_f32 = fetch_add_hdr(6, 0, 2);
    bor_f32.op = AtomicOp::Bor;
    bor_f32.datatype = Datatype::F32;
    let mut complex = fetch_add_hdr(6, 0, 1);
    complex.datatype = Datatype::FloatComplex;
    let mut write_ro = fetch_add_hdr(6, 0, 1);
    write_ro.kind = AtomicKind::Plain;
    let refused: Vec<(AtomicHdr, Vec<u8>, u64)> = vec![
        (fetch_add_hdr(99, 0, 1), le(&[1]), 13),
        (fetch_add_hdr(6, 60, 1), le(&[1]), 13),
        (fetch_add_hdr(6, u64::MAX - 3, 1), le(&[1]), 13),
        (bor_f32, vec![0; 8], 95),
        (complex, vec![0; 8], 95),
    ];
    for (i, (a, arrays, code)) in refused.into_iter().enumerate() {
        let seq = 10 + i as u64;
        s.write_all(&atomic_req(seq, a, &arrays)).await.unwrap();
        let (r, p) = read_frame(&mut s).await;
        assert_eq!(
            (r.kind, r.seq, r.data),
            (Some(FrameKind::AtomicResp), seq, code),
            "{a:?}"
        );
        assert!(p.is_empty());
    }
    assert_eq!(mr.to_vec().unwrap(), after, "refusals touched nothing");
    // A plain atomic: answered with a status only.
    s.write_all(&atomic_req(20, write_ro, &le(&[5])))
        .await
        .unwrap();
    let (r, p) = read_frame(&mut s).await;
    assert_eq!((r.seq, r.data, p.len()), (20, 0, 0));
    assert_eq!(read_u64(&mr, 0), 106);
    drop(s);
    alive(&victim, &good, 6, 1).await;

    // Malformed atomic frames end only their connection.
    let good_req = atomic_req(1, fetch_add_hdr(6, 0, 1), &le(&[1]));
    let attacks: Vec<Vec<u8>> = vec![
        // Payload shorter than its count says.
        {
            let mut v = good_req.clone();
            v[8] -= 1;
            v.pop();
            v
        },
        // A prefix cut short.
        {
            let mut h = Header::new(FrameKind::AtomicReq);
            h.len = 31;
            let mut v = h.encode().to_vec();
            v.extend_from_slice(&[0; 31]);
            v
        },
        // Unknown operation, unknown form, reserved bytes set.
        {
            let mut v = good_req.clone();
            v[HEADER_LEN + 16] = 19;
            v
        },
        {
            let mut v = good_req.clone();
            v[HEADER_LEN + 18] = 3;
            v
        },
        {
            let mut v = good_req.clone();
            v[HEADER_LEN + 20] = 1;
            v
        },
        // A count whose arrays would exceed the bound.
        atomic_req(1, fetch_add_hdr(6, 0, u64::MAX / 4), &[]),
        // An answer to an atomic nobody made.
        {
            let mut h = Header::new(FrameKind::AtomicResp);
            h.seq = 777;
            h.len = 8;
            let mut v = h.encode().to_vec();
            v.extend_from_slice(&[0; 8]);
            v
        },
    ];
    for (i, a) in attacks.into_iter().enumerate() {
        let (mut s, _id) = raw_hello(va).await;
        s.write_all(&a).await.unwrap();
        expect_closed(s).await;
        alive(&victim, &good, 6, 10 + i as u8).await;
    }
    // Nothing but the well-behaved atomics (adding 0) touched memory.
    let now = mr.to_vec().unwrap();
    assert_eq!(&now[..16], &u64s(&[106, 202])[..]);
}

/// A peer sending fetching atomics without reading its socket: the
/// target stops reading it once what it holds for that peer (arrays and
/// answers) fills the peer's share of the budget, and goes on serving
/// others.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn endless_atomic_requests_are_bounded_by_the_budget() {
    let h = Harness::rdm(&tcp());
    let share = 4 * ATOMIC_MAX;
    let victim = {
        let (av, cq) = (h.av(), h.cq());
        let ep = h.domain.endpoint(&h.info).unwrap();
        ep.set_conn_limits(ConnLimits::default().with_peer_buffered(share))
            .unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        RdmEp { ep, av, cq }
    };
    let good = h.rdm_ep();
    let count = (ATOMIC_MAX / 8) as u64;
    let _mr = region(&h, ATOMIC_MAX, RW, 7);
    let va = weft::decode_sockaddr(&victim.addr()).unwrap();
    let (mut s, _id) = raw_hello(va).await;
    // 256 requests of 64 KiB operands, each answered with 64 KiB.
    let one = le(&vec![1u64; count as usize]);
    let mut reqs = Vec::new();
    for i in 0..256 {
        reqs.extend_from_slice(&atomic_req(i + 1, fetch_add_hdr(7, 0, count), &one));
    }
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), s.write_all(&reqs)).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let st = victim.ep.stats().unwrap();
    assert!(
        st.unexpected_bytes <= share,
        "held {} bytes for one peer, share {share}",
        st.unexpected_bytes
    );
    assert_eq!(st.parked, 1, "the reader stopped for that peer");
    alive(&victim, &good, 7, 1).await;
    drop(s);
}
