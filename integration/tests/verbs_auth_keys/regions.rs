//! Regions under keys other than the domain's, and endpoints holding
//! them: one server domain holds two jobs' endpoints and regions (each
//! key's in a protection domain of its own), so a peer that proved one
//! key holds queue pairs where the other key's remote keys are not
//! valid. Its writes, reads and atomics on the other job's region fail at
//! the device (a remote access error, `FI_EACCES`) and leave the region
//! as it was; on its own job's region they work.

use super::*;
use weft::{Caps, MemoryRegion, MrMode};

/// A verbs offer of `ep_type` on `dev` with RMA and atomics, for hints
/// carrying `key`.
fn rma_info(dev: &str, ep_type: EpType, key: Option<&[u8]>) -> Info {
    verbs_offer_with(dev, ep_type, |h| {
        h.caps = Caps::MSG | Caps::RMA | Caps::ATOMIC;
        if ep_type == EpType::Rdm {
            h.caps |= Caps::TAGGED;
        }
        h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR;
        h.ep_attr.auth_key = key.map(<[u8]>::to_vec);
    })
    .unwrap()
}

fn rdm_with_rma(dev: &str, key: Option<&[u8]>) -> Rdm {
    let i = rma_info(dev, EpType::Rdm, key);
    let fabric = Fabric::open(&i).unwrap();
    let domain = fabric.domain(&i).unwrap();
    Rdm::on(&fabric, &domain, &i)
}

fn word(mr: &MemoryRegion, at: usize) -> u64 {
    let mut v = [0u8; 8];
    mr.read_at(at, &mut v).unwrap();
    u64::from_ne_bytes(v)
}

fn rw() -> MrAccess {
    MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE
}

/// Through `dest` of `from`, a write, a read and a fetch-add on `mr`
/// work: the region holds what was written and the sum.
async fn reaches(from: &Endpoint, dest: FiAddr, mr: &MemoryRegion, tag: u64) {
    let data = Bytes::from(tag.to_ne_bytes().to_vec());
    within(
        "a same-job write",
        from.write(dest, data, mr.addr(), mr.key()),
    )
    .await
    .unwrap();
    assert_eq!(word(mr, 0), tag);
    let got = within(
        "a same-job read",
        from.read(dest, BytesMut::zeroed(8), mr.addr(), mr.key()),
    )
    .await
    .unwrap();
    assert_eq!(&got.into_bytes()[..], &tag.to_ne_bytes());
    let before = word(mr, 8);
    let old = within(
        "a same-job atomic",
        from.fetch_add(dest, mr.addr() + 8, mr.key(), 1),
    )
    .await
    .unwrap();
    assert_eq!((old, word(mr, 8)), (before, before + 1));
}

/// Through `dest` of `from`, a write, a read and a fetch-add on `mr`
/// (another key's region) each fail with `Access`, and `mr` is unchanged.
async fn refused_by_the_device(from: &Endpoint, dest: FiAddr, mr: &MemoryRegion) {
    let before = (word(mr, 0), word(mr, 8));
    let e = within(
        "a cross-key write",
        from.write(dest, Bytes::from_static(b"intruder"), mr.addr(), mr.key()),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::Access, "{e:?}");
    let e = within(
        "a cross-key read",
        from.read(dest, BytesMut::zeroed(8), mr.addr(), mr.key()),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::Access, "{e:?}");
    let e = within(
        "a cross-key atomic",
        from.fetch_add(dest, mr.addr() + 8, mr.key(), 1),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::Access, "{e:?}");
    assert_eq!((word(mr, 0), word(mr, 8)), before, "the region changed");
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdm_regions_keep_to_the_job_whose_key_they_hold() {
    // One server domain keyed A; job B's endpoint and region live there
    // too, under B's key.
    let mut di = rma_info(SERVER_DEV, EpType::Rdm, None);
    di.domain_attr.auth_key = Some(JOB_A.to_vec());
    let fabric = Fabric::open(&di).unwrap();
    let domain = fabric.domain(&di).unwrap();
    let ea = Rdm::on(&fabric, &domain, &rma_info(SERVER_DEV, EpType::Rdm, None));
    let eb = Rdm::on(
        &fabric,
        &domain,
        &rma_info(SERVER_DEV, EpType::Rdm, Some(JOB_B)),
    );
    let ra = domain.mr_regattr(MrAttr::alloc(64, rw())).unwrap();
    let rb = domain
        .mr_regattr(MrAttr::alloc(64, rw()).auth_key(JOB_B))
        .unwrap();
    let ra_given = domain
        .mr_regattr(MrAttr::alloc(64, rw()).auth_key(JOB_A))
        .unwrap();
    let ca = rdm_with_rma(CLIENT_DEV, Some(JOB_A));
    let cb = rdm_with_rma(CLIENT_DEV, Some(JOB_B));
    // No connection across jobs, either way, and nothing delivered.
    refused_both_ways(&cb, &ea).await;
    refused_both_ways(&ca, &eb).await;
    // Messages within each job.
    exchange(&ca, &ea, 2).await;
    exchange(&cb, &eb, 2).await;
    exchange(&eb, &cb, 1).await;

    let (to_a, to_b) = (ca.handle_of(&ea), cb.handle_of(&eb));
    reaches(&ca.ep, to_a, &ra, 0x0a0a).await;
    reaches(&ca.ep, to_a, &ra_given, 0x0a0b).await;
    reaches(&cb.ep, to_b, &rb, 0x0b0b).await;
    // Each job's connection holds the other's remote keys in vain.
    refused_by_the_device(&ca.ep, to_a, &rb).await;
    refused_by_the_device(&cb.ep, to_b, &ra).await;
    refused_by_the_device(&cb.ep, to_b, &ra_given).await;
    // A failed access costs its connection only: both jobs go on.
    reaches(&ca.ep, to_a, &ra, 0x1a1a).await;
    reaches(&cb.ep, to_b, &rb, 0x1b1b).await;
    exchange(&ca, &ea, 1).await;
    exchange(&cb, &eb, 1).await;
    // A sub-region keeps its base's key.
    let sub = domain.mr_regattr(MrAttr::sub(&rb, 16, 16, rw())).unwrap();
    let old = within(
        "an atomic on a sub-region of the job's own",
        cb.ep.fetch_add(to_b, sub.addr(), sub.key(), 5),
    )
    .await
    .unwrap();
    assert_eq!(old, word(&rb, 16) - 5);
    let e = within(
        "an atomic on a sub-region of another job's",
        ca.ep.fetch_add(to_a, sub.addr(), sub.key(), 5),
    )
    .await
    .unwrap_err();
    assert_eq!(e.err, Error::Access);
    assert_eq!(word(&rb, 16), old + 5);
}

/// An MSG connection goes where the key it proved is: a listener keyed B
/// on an unkeyed domain hands its connections B's protection domain,
/// where the domain's unkeyed region is out of reach, and an unkeyed
/// connection there cannot reach B's region.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_connections_reach_the_regions_of_the_key_they_proved() {
    let si = rma_info(SERVER_DEV, EpType::Msg, None);
    let fabric = Fabric::open(&si).unwrap();
    let domain = fabric.domain(&si).unwrap();
    let plain = domain.mr_regattr(MrAttr::alloc(64, rw())).unwrap();
    let keyed = domain
        .mr_regattr(MrAttr::alloc(64, rw()).auth_key(JOB_B))
        .unwrap();
    for (key, own, other) in [(Some(JOB_B), &keyed, &plain), (None, &plain, &keyed)] {
        let pair = msg_rma_pair(&fabric, &domain, key).await;
        let c = &pair.client;
        reaches(c, FI_ADDR_UNSPEC, own, 0x0c0c).await;
        // The first failure ends a MSG connection (a critical error), so
        // one operation only.
        let before = word(other, 0);
        let e = within(
            "a cross-key write",
            c.write(
                FI_ADDR_UNSPEC,
                Bytes::from_static(b"intruder"),
                other.addr(),
                other.key(),
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(e.err, Error::Access, "{e:?}");
        assert_eq!(word(other, 0), before, "the region changed");
    }
}

/// A connected MSG pair and what it needs to stay up.
struct MsgRma {
    client: Endpoint,
    _server: Endpoint,
    _bound: [(EventQueue, CompletionQueue); 2],
    _pep: weft::PassiveEndpoint,
    _peq: EventQueue,
}

/// A client on rxe2 holding `key`, connected to a listener holding `key`
/// on `domain`'s fabric, whose accepting endpoint (of `domain`) holds no
/// key of its own.
async fn msg_rma_pair(fabric: &Fabric, domain: &Domain, key: Option<&[u8]>) -> MsgRma {
    let li = rma_info(SERVER_DEV, EpType::Msg, key);
    let pep = fabric.passive_endpoint(&li, None).unwrap();
    let peq = fabric.eq(16).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let ci = rma_info(CLIENT_DEV, EpType::Msg, key);
    let cf = Fabric::open(&ci).unwrap();
    let cd = cf.domain(&ci).unwrap();
    let enable = |d: &Domain, ep: &Endpoint| {
        let eq = d.fabric().eq(16).unwrap();
        let cq = d.cq(CqAttr::default()).unwrap();
        ep.bind_eq(&eq).unwrap();
        ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
            .unwrap();
        ep.enable().unwrap();
        (eq, cq)
    };
    let c = cd.endpoint(&ci).unwrap();
    let c_bound = enable(&cd, &c);
    let (c2, dest) = (c.clone(), pep.local_addr().unwrap());
    let connecting = tokio::spawn(async move { c2.connect(dest, Vec::new()).await });
    let ev = within("FI_CONNREQ", peq.next_timeout(T))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev.kind, EqEventKind::ConnReq);
    let req = ConnRequest::from_event(&ev).unwrap();
    let s = domain
        .accept_endpoint(&rma_info(SERVER_DEV, EpType::Msg, None), &req)
        .unwrap();
    let s_bound = enable(domain, &s);
    within("accept", s.accept(Vec::new())).await.unwrap();
    within("connect", connecting).await.unwrap().unwrap();
    MsgRma {
        client: c,
        _server: s,
        _bound: [c_bound, s_bound],
        _pep: pep,
        _peq: peq,
    }
}

/// A keyed endpoint of an unkeyed domain sends from its key's protection
/// domain, through that key's registration cache: rendezvous sends
/// (256 KiB, past the source slots) of one buffer register it once, as
/// on the domain's own.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_endpoints_of_unkeyed_domains_cache_their_registrations() {
    let (c, s) = (
        rdm_with_rma(CLIENT_DEV, Some(JOB_A)),
        rdm_with_rma(SERVER_DEV, Some(JOB_A)),
    );
    assert!(c.domain.info().domain_attr.auth_key.is_none());
    let before = c.domain.mr_cache_stats().unwrap();
    let dest = c.handle_of(&s);
    let buf = Bytes::from(vec![0x5a; 256 << 10]);
    for i in 0..3 {
        let (got, sent) = within("a rendezvous send", async {
            tokio::join!(
                s.ep.trecv(BytesMut::zeroed(buf.len()), FI_ADDR_UNSPEC, i, 0),
                c.ep.tsend(dest, buf.clone(), i)
            )
        })
        .await;
        sent.unwrap();
        assert!(got.unwrap().into_bytes() == buf, "received bytes differ");
    }
    let st = c.domain.mr_cache_stats().unwrap();
    assert_eq!(
        (st.misses - before.misses, st.hits - before.hits),
        (1, 2),
        "{st:?}"
    );
}

/// The domain's shared receive context keeps its receive queue in the
/// domain key's protection domain, where a MSG endpoint holding another
/// key has no queue pair: such an endpoint bound to it cannot connect
/// (`OpNotSupp`), and nothing reaches the listener.
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_keys_other_than_the_domains_take_no_shared_context() {
    let l = listener(Some(JOB_B));
    let ci = rma_info(CLIENT_DEV, EpType::Msg, Some(JOB_B));
    let fabric = Fabric::open(&ci).unwrap();
    let domain = fabric.domain(&ci).unwrap();
    assert!(domain.info().domain_attr.auth_key.is_none());
    let srx = domain.srx_context(16).unwrap();
    let ep = domain.endpoint(&ci).unwrap();
    let (eq, cq) = (
        fabric.eq(16).unwrap(),
        domain.cq(CqAttr::default()).unwrap(),
    );
    ep.bind_eq(&eq).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.bind_srx(&srx).unwrap();
    ep.enable().unwrap();
    let r = within("a connect", ep.connect(l.addr.clone(), Vec::new())).await;
    assert_eq!(r.err(), Some(Error::OpNotSupp));
    let heard = tokio::time::timeout(QUIET, l.eq.next_timeout(T)).await;
    assert!(heard.is_err(), "the listener heard of it: {heard:?}");
    // Without the context the same endpoint's job is served.
    msg_connects(&l, Some(JOB_B), b"no context").await;
}
