//! Target-visible RMA access on the tcp provider: what getinfo grants,
//! regions confined to an endpoint (`FI_MR_ENDPOINT`), counters bound to
//! regions (`FI_MR_RMA_EVENT`) and to endpoints (`FI_REMOTE_READ`,
//! `FI_REMOTE_WRITE`), single-use keys (`FI_MR_SINGLE_USE`) raced by
//! several peers and taken by a raw peer that leaves part-way, and the
//! errors of every misuse. Counts are exact, a count is seen only once
//! its data is in place, and refused accesses touch and count nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use weft::{
    AtomicOp, BindFlags, Caps, Counter, Datatype, EpType, Error, FiAddr, Info, MemoryRegion,
    MrAccess, MrAttr, MrMode, MrRegFlags, OpFlags,
};
use weft_core::wire::rma::Target;
use weft_core::wire::{FrameKind, Header, FLAG_ACK_REQ};
use weft_integration::identity::{raw_hello, read_frame};
use weft_integration::{msg_pair, next_cq, payload, within, Harness, Provider, RdmEp, QUIET};

const RW: MrAccess = MrAccess::REMOTE_READ.union(MrAccess::REMOTE_WRITE);
/// What an application asking for remote events names.
const EV: Caps = Caps::MSG
    .union(Caps::RMA)
    .union(Caps::ATOMIC)
    .union(Caps::RMA_EVENT);

fn tcp() -> Provider {
    Provider::named("tcp")
}

/// tcp's `ep_type` offer for hints with `caps` and `mr_mode`.
fn info(ep_type: EpType, caps: Caps, mr_mode: MrMode) -> Info {
    tcp()
        .try_info_with(ep_type, |h| {
            h.caps = caps;
            h.domain_attr.mr_mode = mr_mode;
        })
        .expect("tcp offer")
}

fn harness(caps: Caps, mr_mode: MrMode) -> Harness {
    Harness::with_info(&tcp(), info(EpType::Rdm, caps, mr_mode))
}

fn region(h: &Harness, len: usize, key: u64, flags: MrRegFlags) -> MemoryRegion {
    h.domain
        .mr_regattr(MrAttr::alloc(len, RW).requested_key(key).flags(flags))
        .unwrap()
}

fn counter(h: &Harness) -> Counter {
    h.domain.counter().unwrap()
}

fn counts(c: &Counter) -> (u64, u64) {
    (c.read(), c.read_err())
}

fn u64s(v: &[u64]) -> Bytes {
    v.iter()
        .flat_map(|x| x.to_ne_bytes())
        .collect::<Vec<u8>>()
        .into()
}

/// An enabled RDM endpoint of `h` with remote counters bound as given.
fn counted_ep(h: &Harness, binds: &[(&Counter, BindFlags)]) -> RdmEp {
    let (av, cq) = (h.av(), h.cq());
    let ep = h.domain.endpoint(&h.info).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    for (c, f) in binds {
        ep.bind_counter(c, *f).unwrap();
    }
    ep.enable().unwrap();
    RdmEp { ep, av, cq }
}

/// Writes `data` at `addr` of `key` through `to` and returns the error
/// code, if any.
async fn write(a: &RdmEp, to: FiAddr, data: Bytes, addr: u64, key: u64) -> Result<(), Error> {
    within("write", a.ep.write(to, data, addr, key))
        .await
        .map(|_| ())
        .map_err(|e| e.err)
}

async fn read(a: &RdmEp, to: FiAddr, len: usize, addr: u64, key: u64) -> Result<Vec<u8>, Error> {
    within("read", a.ep.read(to, BytesMut::zeroed(len), addr, key))
        .await
        .map(|e| e.into_bytes().to_vec())
        .map_err(|e| e.err)
}

#[tokio::test]
async fn getinfo_grants_events_and_their_modes_on_request_only() {
    for t in [EpType::Rdm, EpType::Msg] {
        // Default hints and plain RMA hints: nothing changes for them.
        let plain = tcp().info(t);
        assert!(!plain.caps.contains(Caps::RMA_EVENT), "{t:?}");
        assert_eq!(plain.domain_attr.mr_mode, MrMode::empty());
        let rma = info(t, Caps::MSG | Caps::RMA, MrMode::empty());
        assert!(!rma.caps.contains(Caps::RMA_EVENT));
        // Asked for: the cap, on the receive side too, and no mode.
        let ev = info(t, EV, MrMode::empty());
        assert!(ev.caps.contains(Caps::RMA_EVENT));
        assert!(ev.rx_attr.caps.contains(Caps::RMA_EVENT));
        assert!(!ev.tx_attr.caps.contains(Caps::RMA_EVENT));
        assert_eq!(ev.domain_attr.mr_mode, MrMode::empty());
        // Modes the hints accept are granted, and nothing else.
        let modes = MrMode::RMA_EVENT | MrMode::ENDPOINT;
        let both = info(t, EV, modes | MrMode::PROV_KEY | MrMode::VIRT_ADDR);
        assert_eq!(both.domain_attr.mr_mode, modes);
        let ep_only = info(t, Caps::MSG | Caps::RMA, modes);
        assert_eq!(ep_only.domain_attr.mr_mode, MrMode::ENDPOINT);
    }
    // No other provider's offer has the cap (verbs cannot see remote
    // accesses), and none grants the modes.
    for o in weft::all_offers() {
        if o.fabric_attr.prov_name.as_deref() != Some("tcp") {
            assert!(!o.caps.contains(Caps::RMA_EVENT), "{o:?}");
        }
    }
}

/// `FI_MR_ENDPOINT`: a region is reachable only once bound to an
/// endpoint and enabled, and then only through that endpoint; the other
/// endpoint of the same domain gets `FI_EACCES`, as does every access
/// before, and none of them touches memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_bound_regions_answer_only_their_endpoint_once_enabled() {
    let h = harness(Caps::MSG | Caps::RMA | Caps::ATOMIC, MrMode::ENDPOINT);
    assert_eq!(h.domain.info().domain_attr.mr_mode, MrMode::ENDPOINT);
    let (b1, b2, a) = (h.rdm_ep(), h.rdm_ep(), h.rdm_ep());
    let (to_b1, to_b2) = (a.insert(&b1), a.insert(&b2));
    b1.insert(&a);
    b2.insert(&a);
    let mr = region(&h, 4096, 7, MrRegFlags::empty());
    let zeros = vec![0u8; 4096];
    let try_all = |what: &'static str| {
        let (a, mr) = (a.clone(), &mr);
        async move {
            for to in [to_b1, to_b2] {
                let w = write(&a, to, Bytes::from_static(b"early"), 0, mr.key()).await;
                assert_eq!(w, Err(Error::Access), "{what}: write");
                let r = read(&a, to, 8, 0, mr.key()).await;
                assert_eq!(r, Err(Error::Access), "{what}: read");
                let f = a.ep.fetch_add(to, 8, mr.key(), 1).await;
                assert_eq!(f.unwrap_err().err, Error::Access, "{what}: atomic");
            }
        }
    };
    try_all("registered").await;
    // Enabling needs an endpoint first.
    assert_eq!(mr.enable(), Err(Error::Inval));
    mr.bind_endpoint(&b1.ep).unwrap();
    try_all("bound, not enabled").await;
    assert_eq!(mr.to_vec().unwrap(), zeros, "nothing moved");
    mr.enable().unwrap();
    write(&a, to_b1, Bytes::from_static(b"landed"), 16, mr.key())
        .await
        .unwrap();
    assert_eq!(read(&a, to_b1, 6, 16, mr.key()).await.unwrap(), b"landed");
    assert_eq!(
        within("fetch-add", a.ep.fetch_add(to_b1, 64, mr.key(), 5))
            .await
            .unwrap(),
        0
    );
    // The other endpoint of the domain does not reach it.
    let before = mr.to_vec().unwrap();
    assert_eq!(
        write(&a, to_b2, Bytes::from_static(b"x"), 0, mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(read(&a, to_b2, 1, 0, mr.key()).await, Err(Error::Access));
    assert_eq!(mr.to_vec().unwrap(), before, "refused: nothing moved");
    // No more bindings once enabled; enabling again is harmless.
    assert_eq!(mr.bind_endpoint(&b2.ep), Err(Error::OpBadState));
    mr.enable().unwrap();
    // A sub-region is a region of the domain like any other: it waits
    // for its own binding, which may name another endpoint.
    let sub = h
        .domain
        .mr_regattr(MrAttr::sub(&mr, 16, 6, MrAccess::REMOTE_READ).requested_key(8))
        .unwrap();
    assert_eq!(read(&a, to_b1, 6, 0, sub.key()).await, Err(Error::Access));
    sub.bind_endpoint(&b2.ep).unwrap();
    sub.enable().unwrap();
    assert_eq!(read(&a, to_b2, 6, 0, sub.key()).await.unwrap(), b"landed");
    assert_eq!(read(&a, to_b1, 6, 0, sub.key()).await, Err(Error::Access));
    // The connections took every refusal in their stride.
    write(&a, to_b1, Bytes::from_static(b"still"), 32, mr.key())
        .await
        .unwrap();
}

/// Without `FI_MR_ENDPOINT` a region is reachable from registration and
/// may still be confined to an endpoint, from the bind on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binding_an_endpoint_confines_a_live_region() {
    let h = harness(Caps::MSG | Caps::RMA, MrMode::empty());
    let (b1, b2, a) = (h.rdm_ep(), h.rdm_ep(), h.rdm_ep());
    let (to_b1, to_b2) = (a.insert(&b1), a.insert(&b2));
    let mr = region(&h, 64, 3, MrRegFlags::empty());
    for to in [to_b1, to_b2] {
        write(&a, to, Bytes::from_static(b"both"), 0, mr.key())
            .await
            .unwrap();
    }
    mr.bind_endpoint(&b1.ep).unwrap();
    write(&a, to_b1, Bytes::from_static(b"one"), 0, mr.key())
        .await
        .unwrap();
    assert_eq!(
        write(&a, to_b2, Bytes::from_static(b"two"), 0, mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(&mr.to_vec().unwrap()[..4], b"oneh");
}

/// `FI_MR_RMA_EVENT`: an `FI_RMA_EVENT` region waits for `enable`; its
/// counters then count every completed write, writedata, read and
/// atomic as fi_mr(3) says (writes: anything that may modify the
/// region; reads: anything that returns it), each exactly once, and
/// refused accesses count nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_counters_count_each_completed_access() {
    let h = harness(EV, MrMode::RMA_EVENT);
    let (a, b, to_b, _) = h.rdm_pair();
    let mr = region(&h, 4096, 1, MrRegFlags::RMA_EVENT);
    let (wc, rc) = (counter(&h), counter(&h));
    // Waiting for enable: refused, untouched, uncounted.
    assert_eq!(
        write(&a, to_b, Bytes::from_static(b"early"), 0, mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(mr.to_vec().unwrap(), vec![0u8; 4096]);
    mr.bind_counter(&wc, BindFlags::REMOTE_WRITE).unwrap();
    mr.bind_counter(&rc, BindFlags::REMOTE_READ).unwrap();
    assert_eq!(read(&a, to_b, 8, 0, mr.key()).await, Err(Error::Access));
    mr.enable().unwrap();
    for i in 0..3u64 {
        write(&a, to_b, payload(8, i as u8), i * 8, mr.key())
            .await
            .unwrap();
    }
    assert_eq!((wc.read(), rc.read()), (3, 0));
    within(
        "writedata",
        a.ep.writedata(to_b, Bytes::from_static(b"wd"), 9, 100, mr.key()),
    )
    .await
    .unwrap();
    let t = within("target entry", next_cq(&b.cq)).await.unwrap();
    assert!(t
        .flags
        .contains(OpFlags::REMOTE_WRITE | OpFlags::REMOTE_CQ_DATA));
    assert_eq!((wc.read(), rc.read()), (4, 0), "writedata is a write");
    for _ in 0..2 {
        assert_eq!(
            read(&a, to_b, 8, 8, mr.key()).await.unwrap(),
            &payload(8, 1)[..]
        );
    }
    assert_eq!((wc.read(), rc.read()), (4, 2));
    // Atomics: a plain sum modifies; a fetch-add modifies and returns
    // (one count on each); an atomic read only returns; a compare-swap
    // may modify and returns.
    within(
        "sum",
        a.ep.atomic(
            to_b,
            AtomicOp::Sum,
            Datatype::U64,
            u64s(&[2]),
            1024,
            mr.key(),
        ),
    )
    .await
    .unwrap();
    assert_eq!((wc.read(), rc.read()), (5, 2));
    let old = within("fetch-add", a.ep.fetch_add(to_b, 1024, mr.key(), 3)).await;
    assert_eq!(old.unwrap(), 2);
    assert_eq!((wc.read(), rc.read()), (6, 3));
    within(
        "atomic read",
        a.ep.fetch_atomic(
            to_b,
            AtomicOp::Read,
            Datatype::U64,
            1,
            Bytes::new(),
            1024,
            mr.key(),
        ),
    )
    .await
    .unwrap();
    assert_eq!((wc.read(), rc.read()), (6, 4));
    let old = within("cswap", a.ep.compare_swap(to_b, 1024, mr.key(), 5, 50)).await;
    assert_eq!(old.unwrap(), 5);
    assert_eq!((wc.read(), rc.read()), (7, 5));
    // Refused: past the end, a key that does not exist.
    let before = mr.to_vec().unwrap();
    assert_eq!(
        write(&a, to_b, Bytes::from_static(b"xx"), 4095, mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(read(&a, to_b, 2, 4095, mr.key()).await, Err(Error::Access));
    let f = within(
        "atomic past the end",
        a.ep.fetch_add(to_b, 4096, mr.key(), 1),
    )
    .await;
    assert_eq!(f.unwrap_err().err, Error::Access);
    assert_eq!(
        counts(&wc),
        (7, 0),
        "refusals count nothing, not even errors"
    );
    assert_eq!(counts(&rc), (5, 0));
    assert_eq!(mr.to_vec().unwrap(), before);
    // A counter bound for both directions counts an access once.
    let one = region(&h, 64, 2, MrRegFlags::RMA_EVENT);
    let both = counter(&h);
    one.bind_counter(&both, BindFlags::REMOTE_WRITE | BindFlags::REMOTE_READ)
        .unwrap();
    one.enable().unwrap();
    within("fetch-add", a.ep.fetch_add(to_b, 0, one.key(), 1))
        .await
        .unwrap();
    write(&a, to_b, Bytes::from_static(b"w"), 8, one.key())
        .await
        .unwrap();
    read(&a, to_b, 1, 8, one.key()).await.unwrap();
    assert_eq!(both.read(), 3);
    // A region registered without FI_RMA_EVENT is reachable at once in
    // this domain, and takes no counter.
    let plain = region(&h, 64, 3, MrRegFlags::empty());
    write(&a, to_b, Bytes::from_static(b"plain"), 0, plain.key())
        .await
        .unwrap();
    assert_eq!(
        plain.bind_counter(&wc, BindFlags::REMOTE_WRITE),
        Err(Error::Inval)
    );
    assert_eq!(counts(&wc), (7, 0), "only its own region's accesses");
}

/// A counter is bumped only once the access's bytes are in place (or,
/// for a read, copied out): a target task woken by the count sees the
/// whole write, and a read counted before the target overwrites the
/// region returned the bytes from before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_count_is_seen_only_after_its_data() {
    let h = harness(EV, MrMode::RMA_EVENT);
    let (a, _b, to_b, _) = h.rdm_pair();
    const LEN: usize = 1 << 20;
    let mr = region(&h, LEN, 9, MrRegFlags::RMA_EVENT);
    let (wc, rc) = (counter(&h), counter(&h));
    mr.bind_counter(&wc, BindFlags::REMOTE_WRITE).unwrap();
    mr.bind_counter(&rc, BindFlags::REMOTE_READ).unwrap();
    mr.enable().unwrap();
    let mr = std::sync::Arc::new(mr);
    for round in 0..8u8 {
        let data = payload(LEN, round);
        let (m, c) = (mr.clone(), wc.clone());
        let want = u64::from(round) + 1;
        let seen = tokio::spawn(async move {
            c.wait_timeout(want, weft_integration::TIMEOUT)
                .await
                .unwrap();
            m.to_vec().unwrap()
        });
        write(&a, to_b, data.clone(), 0, mr.key()).await.unwrap();
        let got = within("waiter", seen).await.unwrap();
        assert!(got == data[..], "round {round}: the counted write is whole");
    }
    for round in 0..8u8 {
        let before = mr.to_vec().unwrap();
        let (m, c) = (mr.clone(), rc.clone());
        let want = u64::from(round) + 1;
        let overwrite = tokio::spawn(async move {
            c.wait_timeout(want, weft_integration::TIMEOUT)
                .await
                .unwrap();
            m.write_at(0, &payload(LEN, 0xee)).unwrap();
        });
        let got = read(&a, to_b, LEN, 0, mr.key()).await.unwrap();
        within("overwrite", overwrite).await.unwrap();
        assert!(
            got == before,
            "round {round}: copied out before it was counted"
        );
        mr.write_at(0, &payload(LEN, round)).unwrap();
    }
}

/// Remote counters bound to an endpoint count every access completed
/// at that endpoint, by form (fi_endpoint(3)): `FI_REMOTE_WRITE` writes,
/// writedata and plain atomics; `FI_REMOTE_READ` reads and fetching or
/// compare atomics. Accesses through another endpoint, and refused ones,
/// count nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_remote_counters_count_every_access_at_the_endpoint() {
    let h = harness(EV, MrMode::empty());
    let (rr, rw) = (counter(&h), counter(&h));
    let b = counted_ep(
        &h,
        &[
            (&rr, BindFlags::REMOTE_READ),
            (&rw, BindFlags::REMOTE_WRITE),
        ],
    );
    let (other, a) = (h.rdm_ep(), h.rdm_ep());
    let (to_b, to_other) = (a.insert(&b), a.insert(&other));
    b.insert(&a);
    // Two regions, neither registered for events: the endpoint counts.
    let (m1, m2) = (
        region(&h, 256, 1, MrRegFlags::empty()),
        region(&h, 256, 2, MrRegFlags::empty()),
    );
    write(&a, to_b, Bytes::from_static(b"one"), 0, m1.key())
        .await
        .unwrap();
    write(&a, to_b, Bytes::from_static(b"two"), 0, m2.key())
        .await
        .unwrap();
    within(
        "writedata",
        a.ep.writedata(to_b, Bytes::from_static(b"d"), 1, 8, m1.key()),
    )
    .await
    .unwrap();
    within(
        "sum",
        a.ep.atomic(to_b, AtomicOp::Sum, Datatype::U64, u64s(&[1]), 64, m2.key()),
    )
    .await
    .unwrap();
    assert_eq!((rw.read(), rr.read()), (4, 0));
    read(&a, to_b, 3, 0, m1.key()).await.unwrap();
    within("fetch-add", a.ep.fetch_add(to_b, 64, m2.key(), 1))
        .await
        .unwrap();
    within("cswap", a.ep.compare_swap(to_b, 64, m2.key(), 2, 7))
        .await
        .unwrap();
    assert_eq!(
        (rw.read(), rr.read()),
        (4, 3),
        "fetch and compare are reads"
    );
    // Through another endpoint of the domain: not this endpoint's.
    write(&a, to_other, Bytes::from_static(b"x"), 0, m1.key())
        .await
        .unwrap();
    read(&a, to_other, 1, 0, m1.key()).await.unwrap();
    // Refused at this endpoint: nothing, not even errors.
    assert_eq!(
        write(&a, to_b, Bytes::from_static(b"x"), 0, 99).await,
        Err(Error::Access)
    );
    assert_eq!(read(&a, to_b, 1, 256, m1.key()).await, Err(Error::Access));
    assert_eq!((counts(&rw), counts(&rr)), ((4, 0), (3, 0)));
    // Binding a direction twice, or without FI_RMA_EVENT, is refused.
    let ep = h.domain.endpoint(&h.info).unwrap();
    ep.bind_counter(&rw, BindFlags::REMOTE_WRITE).unwrap();
    assert_eq!(
        ep.bind_counter(&rr, BindFlags::REMOTE_WRITE | BindFlags::REMOTE_READ),
        Err(Error::Inval)
    );
    ep.bind_counter(&rr, BindFlags::REMOTE_READ).unwrap();
    let no_events = tcp().info(EpType::Rdm);
    let plain = h.domain.endpoint(&no_events).unwrap();
    for f in [BindFlags::REMOTE_READ, BindFlags::REMOTE_WRITE] {
        assert_eq!(plain.bind_counter(&rw, f), Err(Error::NoSys));
    }
}

/// Region and endpoint counters together, over a MSG connection, on a
/// domain with both modes: the region is bound to the accepting endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_endpoints_take_bound_regions_and_count_them() {
    let si = info(EpType::Msg, EV, MrMode::ENDPOINT | MrMode::RMA_EVENT);
    let ci = info(EpType::Msg, EV, MrMode::empty());
    let p = msg_pair(&si, &ci).await;
    let mr =
        p.sd.mr_regattr(
            MrAttr::alloc(128, RW)
                .requested_key(5)
                .flags(MrRegFlags::RMA_EVENT),
        )
        .unwrap();
    let wc = p.sd.counter().unwrap();
    let none = FiAddr::default();
    let w = within(
        "early",
        p.cep.write(none, Bytes::from_static(b"x"), 0, mr.key()),
    )
    .await;
    assert_eq!(w.unwrap_err().err, Error::Access);
    mr.bind_endpoint(&p.sep).unwrap();
    mr.bind_counter(&wc, BindFlags::REMOTE_WRITE).unwrap();
    mr.enable().unwrap();
    within(
        "write",
        p.cep.write(none, Bytes::from_static(b"msg"), 4, mr.key()),
    )
    .await
    .unwrap();
    assert_eq!(wc.read(), 1);
    assert_eq!(&mr.to_vec().unwrap()[4..7], b"msg");
}

/// `FI_MR_SINGLE_USE`: the first access completes, every later one is
/// `FI_EACCES` with memory untouched, and the key is free for a new
/// region once it is spent — for writes, reads and atomics alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_use_keys_take_one_access() {
    let h = harness(Caps::MSG | Caps::RMA | Caps::ATOMIC, MrMode::empty());
    let (a, _b, to_b, _) = h.rdm_pair();
    let single = MrRegFlags::SINGLE_USE;
    let mr = region(&h, 64, 40, single);
    write(&a, to_b, Bytes::from_static(b"first"), 0, mr.key())
        .await
        .unwrap();
    assert_eq!(
        write(&a, to_b, Bytes::from_static(b"again"), 0, mr.key()).await,
        Err(Error::Access)
    );
    assert_eq!(read(&a, to_b, 5, 0, mr.key()).await, Err(Error::Access));
    assert_eq!(
        &mr.to_vec().unwrap()[..5],
        b"first",
        "local copies still work"
    );
    // The key died with its access: a new region may take it.
    let next = region(&h, 64, 40, single);
    assert_eq!(read(&a, to_b, 5, 0, next.key()).await.unwrap(), vec![0; 5]);
    assert_eq!(read(&a, to_b, 5, 0, next.key()).await, Err(Error::Access));
    let atomic = region(&h, 64, 41, single);
    within("fetch-add", a.ep.fetch_add(to_b, 0, atomic.key(), 9))
        .await
        .unwrap();
    let f = within("second fetch-add", a.ep.fetch_add(to_b, 0, atomic.key(), 9)).await;
    assert_eq!(f.unwrap_err().err, Error::Access);
    let mut v = [0u8; 8];
    atomic.read_at(0, &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 9);
    // A refused access (past the end) does not spend the key.
    let spare = region(&h, 64, 42, single);
    assert_eq!(
        write(&a, to_b, Bytes::from_static(b"xx"), 63, spare.key()).await,
        Err(Error::Access)
    );
    write(&a, to_b, Bytes::from_static(b"ok"), 62, spare.key())
        .await
        .unwrap();
    // Its buffers come back with what the one access wrote.
    let app = h
        .domain
        .mr_regattr(
            MrAttr::buffer(BytesMut::zeroed(16), RW)
                .requested_key(43)
                .flags(single),
        )
        .unwrap();
    write(&a, to_b, Bytes::from_static(b"kept"), 0, app.key())
        .await
        .unwrap();
    assert_eq!(&app.take_buffers().unwrap()[0][..4], b"kept");
}

/// Several peers race one single-use key with large writes: exactly one
/// lands, every other gets `FI_EACCES`, and the region holds the winner's
/// bytes and nothing of the losers'; a region counter sees one write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_peers_get_exactly_one_single_use_access() {
    let h = harness(EV, MrMode::empty());
    let target = h.rdm_ep();
    const PEERS: usize = 6;
    const LEN: usize = 256 << 10;
    let peers: Vec<(RdmEp, FiAddr)> = (0..PEERS)
        .map(|_| {
            let p = h.rdm_ep();
            let to = p.insert(&target);
            (p, to)
        })
        .collect();
    for round in 0..5u8 {
        let mr = region(&h, LEN, 100, MrRegFlags::SINGLE_USE | MrRegFlags::RMA_EVENT);
        let wc = counter(&h);
        mr.bind_counter(&wc, BindFlags::REMOTE_WRITE).unwrap();
        let key = mr.key();
        let tasks: Vec<_> = peers
            .iter()
            .enumerate()
            .map(|(i, (p, to))| {
                let (ep, to) = (p.ep.clone(), *to);
                let data = Bytes::from(vec![i as u8 + 1; LEN]);
                tokio::spawn(async move { ep.write(to, data, 0, key).await.map_err(|e| e.err) })
            })
            .collect();
        let mut won = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            match within("racing write", t).await.unwrap() {
                Ok(_) => won.push(i),
                Err(e) => assert_eq!(e, Error::Access, "round {round}, peer {i}"),
            }
        }
        assert_eq!(
            won.len(),
            1,
            "round {round}: exactly one winner, got {won:?}"
        );
        let mem = mr.to_vec().unwrap();
        assert!(
            mem.iter().all(|&b| b == won[0] as u8 + 1),
            "round {round}: only the winner's bytes"
        );
        assert_eq!(counts(&wc), (1, 0));
        // Spent: the key is free for the next round's region.
    }
}

fn write_frame_head(seq: u64, t: Target, len: usize) -> Vec<u8> {
    let mut h = Header::new(FrameKind::RmaWrite);
    h.flags = FLAG_ACK_REQ;
    h.seq = seq;
    h.len = (16 + len) as u64;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(&t.encode());
    v
}

/// A single-use key is taken when a write's header is admitted: a peer
/// racing in while that write's payload is still arriving is refused,
/// and a write that then never finishes (its peer leaves part-way)
/// spends the key all the same, counting nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_single_use_key_is_taken_by_the_first_admitted_access() {
    let h = harness(EV, MrMode::empty());
    let victim = h.rdm_ep();
    let good = h.rdm_ep();
    let to_v = good.insert(&victim);
    let va = weft::decode_sockaddr(&victim.addr()).unwrap();
    let flags = MrRegFlags::SINGLE_USE | MrRegFlags::RMA_EVENT;
    // A raw peer's write admitted first, finished after a racer's try.
    let mr = region(&h, 4096, 1, flags);
    let wc = counter(&h);
    mr.bind_counter(&wc, BindFlags::REMOTE_WRITE).unwrap();
    let (mut s, _id) = raw_hello(va).await;
    let t = Target { addr: 0, key: 1 };
    s.write_all(&write_frame_head(1, t, 1000)).await.unwrap();
    s.write_all(&[0xaa; 400]).await.unwrap();
    // Nothing reports that the target read the header; on loopback it
    // has long before this pause ends.
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        write(&good, to_v, Bytes::from_static(b"racer"), 0, 1).await,
        Err(Error::Access),
        "the key is taken"
    );
    assert_eq!(counts(&wc), (0, 0));
    s.write_all(&[0xaa; 600]).await.unwrap();
    let (ack, _) = within("ack", read_frame(&mut s)).await;
    assert_eq!((ack.kind, ack.seq, ack.data), (Some(FrameKind::Ack), 1, 0));
    assert_eq!(&mr.to_vec().unwrap()[..1000], &[0xaa; 1000][..]);
    assert_eq!(counts(&wc), (1, 0));
    // A raw peer that leaves part-way: the key is spent, nothing counted.
    let mr2 = region(&h, 4096, 2, flags);
    let wc2 = counter(&h);
    mr2.bind_counter(&wc2, BindFlags::REMOTE_WRITE).unwrap();
    let (mut s, _id) = raw_hello(va).await;
    let t = Target { addr: 0, key: 2 };
    s.write_all(&write_frame_head(1, t, 2000)).await.unwrap();
    s.write_all(&[0xbb; 100]).await.unwrap();
    tokio::time::sleep(QUIET).await;
    drop(s);
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        write(&good, to_v, Bytes::from_static(b"late"), 0, 2).await,
        Err(Error::Access)
    );
    assert_eq!(counts(&wc2), (0, 0));
    let again = region(&h, 64, 2, MrRegFlags::empty());
    write(&good, to_v, Bytes::from_static(b"free"), 0, again.key())
        .await
        .unwrap();
}

/// Every misuse of the bindings gets its documented error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misuse_is_refused_with_the_documented_errors() {
    let h = harness(EV, MrMode::ENDPOINT | MrMode::RMA_EVENT);
    let other = h.other_domain();
    let ep = h.endpoint();
    let c = counter(&h);
    let mr = region(&h, 64, 1, MrRegFlags::RMA_EVENT);
    // Counter flags: only the two remote directions.
    for f in [
        BindFlags::empty(),
        BindFlags::READ,
        BindFlags::WRITE,
        BindFlags::REMOTE_WRITE | BindFlags::TRANSMIT,
        BindFlags::REMOTE_READ | BindFlags::SELECTIVE_COMPLETION,
    ] {
        assert_eq!(mr.bind_counter(&c, f), Err(Error::BadFlags), "{f:?}");
    }
    // Objects of another domain.
    let oc = other.counter().unwrap();
    assert_eq!(
        mr.bind_counter(&oc, BindFlags::REMOTE_WRITE),
        Err(Error::Domain)
    );
    let oep = other.endpoint(&h.info).unwrap();
    assert_eq!(mr.bind_endpoint(&oep), Err(Error::Domain));
    // Twice.
    mr.bind_endpoint(&ep).unwrap();
    assert_eq!(mr.bind_endpoint(&ep), Err(Error::Inval));
    mr.bind_counter(&c, BindFlags::REMOTE_WRITE).unwrap();
    assert_eq!(
        mr.bind_counter(&c, BindFlags::REMOTE_WRITE | BindFlags::REMOTE_READ),
        Err(Error::Inval),
        "one direction bound already"
    );
    mr.bind_counter(&c, BindFlags::REMOTE_READ)
        .expect("the refused bind bound nothing");
    // After enable: no more bindings; enabling again is fine.
    mr.enable().unwrap();
    mr.enable().unwrap();
    let c2 = counter(&h);
    let mr2 = region(&h, 64, 2, MrRegFlags::RMA_EVENT);
    assert_eq!(
        mr2.enable(),
        Err(Error::Inval),
        "FI_MR_ENDPOINT: no endpoint"
    );
    mr2.bind_endpoint(&ep).unwrap();
    mr2.enable().unwrap();
    assert_eq!(
        mr2.bind_counter(&c2, BindFlags::REMOTE_WRITE),
        Err(Error::OpBadState)
    );
    assert_eq!(mr2.bind_endpoint(&ep), Err(Error::OpBadState));
    // A region registered without FI_RMA_EVENT takes no counter.
    let plain = region(&h, 64, 3, MrRegFlags::empty());
    assert_eq!(
        plain.bind_counter(&c2, BindFlags::REMOTE_WRITE),
        Err(Error::Inval)
    );
    // Closed regions take nothing.
    plain.close().unwrap();
    assert_eq!(plain.bind_endpoint(&ep), Err(Error::Canceled));
    assert_eq!(
        plain.bind_counter(&c2, BindFlags::REMOTE_WRITE),
        Err(Error::Canceled)
    );
    assert_eq!(plain.enable(), Err(Error::Canceled));
    // Sub-regions have no flags of their own.
    let e = h
        .domain
        .mr_regattr(MrAttr::sub(&mr, 0, 8, RW).flags(MrRegFlags::SINGLE_USE))
        .unwrap_err();
    assert_eq!(e.error, Error::BadFlags);
    // A domain without FI_RMA_EVENT: the flag is BadFlags, counters NoSys;
    // single-use keys and endpoint bindings need no capability.
    let plain_h = harness(Caps::MSG | Caps::RMA, MrMode::empty());
    let e = plain_h
        .domain
        .mr_regattr(MrAttr::alloc(8, RW).flags(MrRegFlags::RMA_EVENT))
        .unwrap_err();
    assert_eq!(e.error, Error::BadFlags);
    let m = region(&plain_h, 8, 1, MrRegFlags::SINGLE_USE);
    let pc = plain_h.domain.counter().unwrap();
    assert_eq!(
        m.bind_counter(&pc, BindFlags::REMOTE_WRITE),
        Err(Error::NoSys)
    );
    m.bind_endpoint(&plain_h.endpoint()).unwrap();
    m.enable().unwrap();
    // Flags tcp does not honour at all.
    let e = plain_h
        .domain
        .mr_regattr(MrAttr::alloc(8, RW).flags(MrRegFlags::RMA_PMEM))
        .unwrap_err();
    assert_eq!(e.error, Error::BadFlags);
}
