//! Authorization keys kept in an AV (`FI_AV_AUTH_KEY`) on verbs RDM
//! endpoints (`docs/design.md`, "Authorization keys", verbs), on real
//! RDMA devices (soft-RoCE in the VM of `integration/run-rxe`; servers on
//! rxe1, clients on rxe2, as on two hosts). An endpoint holds the keys
//! its AV held when it was enabled: it dials each peer proving the key
//! the peer's entry names, accepts connectors that prove any key it
//! holds (and only those), and knows a sender as the entry of its
//! address under the key its connection proved. Two jobs sharing the
//! devices refuse each other's every send (counted on both sides,
//! nothing delivered); one endpoint holding both keys serves both, with
//! receives directed by key; held keys cannot be removed; bad keys,
//! handles and endpoints are refused; MSG and DGRAM refuse AV keys.
//!
//! Outside the VM every test is ignored; inside it a missing device is a
//! failure.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use weft::{
    AvAttr, AvFlags, Caps, Domain, EpType, Error, FiAddr, Info, MemoryRegion, MrAccess, MrAttr,
    MrMode, FI_ADDR_NOTAVAIL,
};
use weft_integration::av_keys::{
    delivered_within, directed_by_unheld_keys_refused, insert_keyed, insert_keyed_raw, AvKeyEp,
};
use weft_integration::{verbs_offer_with, QUIET};

const SERVER_DEV: &str = "rxe1";
const CLIENT_DEV: &str = "rxe2";
const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";
const JOB_C: &[u8] = b"job-c key";

/// How long any one step may take under the VM's emulation.
const T: Duration = Duration::from_secs(30);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    match tokio::time::timeout(T, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {T:?}: {what}"),
    }
}

async fn stats_until(ep: &weft::Endpoint, what: &str, ok: impl Fn(&weft::EpStats) -> bool) {
    let start = Instant::now();
    loop {
        let s = ep.stats().unwrap();
        if ok(&s) {
            return;
        }
        assert!(start.elapsed() < T, "{what}: stats stuck at {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn caps() -> Caps {
    Caps::MSG | Caps::TAGGED | Caps::SOURCE | Caps::DIRECTED_RECV
}

/// The verbs RDM offer on `dev` for hints with `FI_AV_AUTH_KEY` and
/// `caps`.
fn av_key_info_with(dev: &str, caps: Caps) -> Info {
    let i = verbs_offer_with(dev, EpType::Rdm, |h| {
        h.caps = caps;
        h.domain_attr.av_auth_key = true;
        if caps.contains(Caps::RMA) {
            h.domain_attr.mr_mode = MrMode::PROV_KEY | MrMode::VIRT_ADDR;
        }
    })
    .unwrap();
    assert!(i.domain_attr.av_auth_key);
    assert_eq!(i.domain_attr.max_ep_auth_key, 256);
    i
}

fn av_key_info(dev: &str) -> Info {
    av_key_info_with(dev, caps())
}

fn av_key_domain(dev: &str) -> Domain {
    av_key_domain_with(dev, caps())
}

fn av_key_domain_with(dev: &str, caps: Caps) -> Domain {
    let i = av_key_info_with(dev, caps);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

type Ep = AvKeyEp;

async fn delivered(from: &Ep, dest: FiAddr, to: &Ep, tag: u64, src: FiAddr) {
    delivered_within(T, (from, dest), (to, src), tag).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test]
async fn getinfo_offers_av_keys_on_rdm_only() {
    let i = av_key_info(SERVER_DEV);
    assert_eq!(i.ep_attr.ep_type, EpType::Rdm);
    for t in [EpType::Msg, EpType::Dgram] {
        let mut h = Info::default();
        h.fabric_attr.prov_name = Some("verbs".into());
        h.ep_attr.ep_type = t;
        h.domain_attr.av_auth_key = true;
        assert_eq!(weft::getinfo(Some(&h)).err(), Some(Error::NoData), "{t:?}");
        // Opened anyway: refused, with the reason.
        let mut o = verbs_offer_with(SERVER_DEV, t, |_| {}).unwrap();
        o.domain_attr.av_auth_key = true;
        let f = weft::Fabric::open(&o).unwrap();
        assert_eq!(f.domain(&o).err(), Some(Error::OpNotSupp), "{t:?}");
    }
    // A domain key besides the AV's keys matches nothing.
    let mut h = Info::default();
    h.fabric_attr.prov_name = Some("verbs".into());
    h.ep_attr.ep_type = EpType::Rdm;
    h.domain_attr.av_auth_key = true;
    h.domain_attr.auth_key = Some(JOB_A.to_vec());
    assert!(weft::getinfo(Some(&h)).is_err());
    // Without the hint, RDM offers keep one key per endpoint.
    let plain = verbs_offer_with(SERVER_DEV, EpType::Rdm, |_| {}).unwrap();
    assert_eq!(plain.domain_attr.max_ep_auth_key, 1);
    assert!(!plain.domain_attr.av_auth_key);
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_refuse_each_others_every_send() {
    // Both jobs share one domain per device.
    let (d1, d2) = (av_key_domain(SERVER_DEV), av_key_domain(CLIENT_DEV));
    let (a1, ka1) = Ep::open(&d1, &[JOB_A]);
    let (b1, kb1) = Ep::open(&d1, &[JOB_B]);
    let (a2, ka2) = Ep::open(&d2, &[JOB_A]);
    let (b2, kb2) = Ep::open(&d2, &[JOB_B]);
    let jobs = [(&a1, ka1[0]), (&a2, ka2[0]), (&b1, kb1[0]), (&b2, kb2[0])];
    // Everyone's AV holds everyone under its own (only) key: whatever
    // one sends proves its own job's key.
    let mut at = [[0; 4]; 4];
    for (i, (from, k)) in jobs.iter().enumerate() {
        for (j, (peer, _)) in jobs.iter().enumerate() {
            at[i][j] = from.keyed(peer.addr, *k);
        }
    }
    const N: u64 = 2;
    for round in 0..N {
        for (i, (from, _)) in jobs.iter().enumerate() {
            for (j, &dest) in at[i].iter().enumerate() {
                if (i < 2) != (j < 2) {
                    let r = within(
                        "a cross-job send",
                        from.ep.send(dest, Bytes::from_static(b"x")),
                    )
                    .await;
                    assert_eq!(r.unwrap_err().err, Error::KeyRejected, "{i} -> {j}");
                }
            }
        }
        // Same job, both ways, across the devices: delivered, known by
        // the entry under the job's key.
        delivered(&a1, at[0][1], &a2, round, at[1][0]).await;
        delivered(&a2, at[1][0], &a1, round, at[0][1]).await;
        delivered(&b2, at[3][2], &b1, round, at[2][3]).await;
    }
    // Each endpoint refused N connects from each of the other job's two,
    // and was refused N times by each of them.
    for (e, _) in &jobs {
        stats_until(&e.ep, "cross-job refusals", |s| s.rx_key_rejected == 4 * N).await;
        assert_eq!(e.ep.stats().unwrap().unexpected_bytes, 0);
        e.ep.post_recv(BytesMut::zeroed(64), 77).unwrap();
    }
    for (e, _) in &jobs {
        if let Some(it) = e.cq.next_timeout(QUIET).await {
            panic!("a cross-job message was delivered: {it:?}");
        }
    }
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_serves_two_jobs_and_receives_directed_by_key() {
    let (d1, d2) = (av_key_domain(SERVER_DEV), av_key_domain(CLIENT_DEV));
    let (svc, keys) = Ep::open(&d1, &[JOB_A, JOB_B]);
    let (ka, kb) = (keys[0], keys[1]);
    let (a1, k1) = Ep::open(&d2, &[JOB_A]);
    let (a2, k2) = Ep::open(&d2, &[JOB_A]);
    let (b, k3) = Ep::open(&d2, &[JOB_B]);
    let (c, k4) = Ep::open(&d2, &[JOB_C]);
    let at_svc = [
        svc.keyed(a1.addr, ka),
        svc.keyed(a2.addr, ka),
        svc.keyed(b.addr, kb),
    ];
    let to_svc = [
        a1.keyed(svc.addr, k1[0]),
        a2.keyed(svc.addr, k2[0]),
        b.keyed(svc.addr, k3[0]),
    ];
    // Connections made by either side, under either key.
    delivered(&a1, to_svc[0], &svc, 1, at_svc[0]).await;
    delivered(&b, to_svc[2], &svc, 2, at_svc[2]).await;
    delivered(&svc, at_svc[1], &a2, 3, to_svc[1]).await;
    delivered(&svc, at_svc[0], &a1, 4, to_svc[0]).await;
    delivered(&svc, at_svc[2], &b, 5, to_svc[2]).await;
    delivered(&a2, to_svc[1], &svc, 6, at_svc[1]).await;

    // The same address under the other key is another peer, which the
    // live connection (under A) cannot carry.
    let a1_under_b = svc.keyed(a1.addr, kb);
    let r = within("under b", svc.ep.send(a1_under_b, Bytes::from_static(b"b"))).await;
    assert_eq!(r.unwrap_err().err, Error::KeyRejected);
    // An entry under no key, or under a key inserted after the endpoint
    // was enabled, cannot be reached: the endpoint holds keys.
    let plain = svc.plain(c.addr);
    let r = svc.ep.send(plain, Bytes::from_static(b"x")).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);
    let kc = svc.av.insert_auth_key(JOB_C).unwrap();
    let c_at_svc = svc.keyed(c.addr, kc);
    let r = svc.ep.send(c_at_svc, Bytes::from_static(b"x")).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);
    // Job C's connects to the service are refused and counted on both
    // sides.
    let svc_from_c = c.keyed(svc.addr, k4[0]);
    for _ in 0..2 {
        let r = within("job C", c.ep.send(svc_from_c, Bytes::from_static(b"c"))).await;
        assert_eq!(r.unwrap_err().err, Error::KeyRejected);
    }
    stats_until(&svc.ep, "job C refused", |s| s.rx_key_rejected == 2).await;
    stats_until(&c.ep, "job C's refusals", |s| s.rx_key_rejected == 2).await;

    weft_integration::directed_by_key(
        &svc.ep,
        ka,
        [
            (&a1.ep, to_svc[0], at_svc[0]),
            (&a2.ep, to_svc[1], at_svc[1]),
            (&b.ep, to_svc[2], at_svc[2]),
        ],
    )
    .await;
    // A key the endpoint was not enabled with, or no key: Inval.
    directed_by_unheld_keys_refused(&svc.ep, kc).await;

    // Keys held by the enabled endpoint cannot be removed; a key no
    // endpoint holds can, and its handle is dead after.
    weft_integration::held_keys_busy_until_close(&svc.av, &svc.ep, &[ka, kb], kc);
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_is_known_only_under_the_key_it_proved() {
    let (d1, d2) = (av_key_domain(SERVER_DEV), av_key_domain(CLIENT_DEV));
    let (rx, kr) = Ep::open(&d1, &[JOB_B, JOB_A]);
    let (tx, kt) = Ep::open(&d2, &[JOB_A]);
    let dest = tx.keyed(rx.addr, kt[0]);
    // Not in the AV: no source.
    delivered(&tx, dest, &rx, 1, FI_ADDR_NOTAVAIL).await;
    // Inserted under the other key: still unknown under this one.
    rx.keyed(tx.addr, kr[0]);
    delivered(&tx, dest, &rx, 2, FI_ADDR_NOTAVAIL).await;
    // Under the key it proved: known.
    let known = rx.keyed(tx.addr, kr[1]);
    delivered(&tx, dest, &rx, 3, known).await;
    delivered(&rx, known, &tx, 4, dest).await;
    // The key behind a handle, and behind an entry.
    assert_eq!(
        rx.av.lookup_auth_key(kr[1], AvFlags::AUTH_KEY).unwrap(),
        JOB_A
    );
    assert_eq!(
        rx.av.lookup_auth_key(known, AvFlags::empty()).unwrap(),
        JOB_A
    );
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_handles_and_endpoints_are_refused() {
    let d = av_key_domain(SERVER_DEV);
    let av = d.av(AvAttr::default()).unwrap();
    assert_eq!(av.insert_auth_key(b""), Err(Error::Inval));
    assert_eq!(av.insert_auth_key(&[7; 65]), Err(Error::Inval));
    let k = av.insert_auth_key(JOB_A).unwrap();
    assert_eq!(av.lookup_auth_key(k, AvFlags::AUTH_KEY).unwrap(), JOB_A);
    assert_eq!(
        av.lookup_auth_key(99, AvFlags::AUTH_KEY).err(),
        Some(Error::Inval)
    );
    let addr = weft::encode_sockaddr(&"10.66.0.1:9".parse().unwrap());
    assert_eq!(
        av.insert_with_auth_key(std::slice::from_ref(&addr), 99, AvFlags::empty(), 0)
            .err(),
        Some(Error::Inval)
    );
    assert_eq!(av.remove_auth_keys(&[99]), Err(Error::Inval));
    // An RDM endpoint of such a domain takes no key of its own, and a
    // wrong-sized one is refused first.
    for key in [JOB_A.to_vec(), Vec::new(), vec![7; 65]] {
        let mut i = d.info().clone();
        i.ep_attr.auth_key = Some(key);
        assert_eq!(d.endpoint(&i).err(), Some(Error::Inval));
    }
    // A key inserted after the endpoint was enabled, then removed, was
    // never held: its entries cannot be reached.
    let (e, ks) = Ep::open(&d, &[JOB_B]);
    let gone = e.av.insert_auth_key(JOB_C).unwrap();
    let peer = e.keyed("10.66.0.2:9".parse().unwrap(), gone);
    e.av.remove_auth_keys(&[gone]).unwrap();
    let r = e.ep.send(peer, Bytes::from_static(b"x")).await;
    assert!(r.is_err());
    assert_eq!(e.av.remove_auth_keys(&ks), Err(Error::Busy));
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_senders_report_the_key_they_proved() {
    let d1 = av_key_domain_with(SERVER_DEV, caps() | Caps::SOURCE_ERR);
    assert!(d1.info().caps.contains(Caps::SOURCE_ERR));
    let d2 = av_key_domain(CLIENT_DEV);
    let (rx, kr) = Ep::open(&d1, &[JOB_B, JOB_A]);
    let (tx, kt) = Ep::open(&d2, &[JOB_A]);
    let dest = tx.keyed(rx.addr, kt[0]);
    let unknown = |tag: u64, body: &'static [u8]| {
        let recv = rx
            .ep
            .trecv(BytesMut::zeroed(16), weft::FI_ADDR_UNSPEC, tag, 0);
        let send = tx.ep.tsend(dest, Bytes::from_static(body), tag);
        async move {
            let (got, sent) = within("an unknown sender", async { tokio::join!(recv, send) }).await;
            sent.unwrap();
            got.unwrap_err()
        }
    };
    // Matched on arrival: the message, the sender's address, and as its
    // source the handle of the key it proved.
    let e = unknown(1, b"who").await;
    assert_eq!(e.err, Error::AddrNotAvail);
    assert_eq!(e.src, kr[1], "the handle of the key it proved");
    assert_eq!(&e.bufs[0][..3], b"who");
    assert_eq!(e.err_data, weft::encode_sockaddr(&tx.addr));
    // Buffered first, then taken: the same.
    within(
        "sent ahead",
        tx.ep.tsend(dest, Bytes::from_static(b"early"), 2),
    )
    .await
    .unwrap();
    tokio::time::sleep(QUIET).await;
    let e = within(
        "taken late",
        rx.ep
            .trecv(BytesMut::zeroed(16), weft::FI_ADDR_UNSPEC, 2, 0),
    )
    .await
    .unwrap_err();
    assert_eq!((e.err, e.src), (Error::AddrNotAvail, kr[1]));
    assert_eq!(&e.bufs[0][..5], b"early");
    // Inserted under the other key, it is still unknown under this one.
    rx.keyed(tx.addr, kr[0]);
    assert_eq!(unknown(3, b"again").await.src, kr[1]);
    let known = rx.keyed(tx.addr, kr[1]);
    delivered(&tx, dest, &rx, 4, known).await;
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_holding_a_full_av_of_keys_serves_the_last() {
    // 256 keys (the most an AV holds): the CQ is sized for a lane each,
    // lanes are made only for keys in use.
    let (d1, d2) = (av_key_domain(SERVER_DEV), av_key_domain(CLIENT_DEV));
    let fillers: Vec<Vec<u8>> = (0..255u32)
        .map(|i| format!("filler key {i}").into_bytes())
        .collect();
    let mut keys: Vec<&[u8]> = fillers.iter().map(Vec::as_slice).collect();
    keys.push(JOB_A);
    let (svc, ks) = Ep::open(&d1, &keys);
    assert_eq!(svc.av.insert_auth_key(JOB_B), Err(Error::NoSpc));
    let (a, ka) = Ep::open(&d2, &[JOB_A]);
    let to_svc = a.keyed(svc.addr, ka[0]);
    let at_svc = svc.keyed(a.addr, ks[255]);
    delivered(&a, to_svc, &svc, 1, at_svc).await;
    delivered(&svc, at_svc, &a, 2, to_svc).await;
}

fn word(mr: &MemoryRegion) -> u64 {
    let mut v = [0u8; 8];
    mr.read_at(0, &mut v).unwrap();
    u64::from_ne_bytes(v)
}

#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_under_av_keys_keep_to_their_job() {
    // One endpoint holds both jobs' keys; each job's region is keyed by
    // its AV key handle, so it lives in that key's protection domain, as
    // do the connections that proved the key.
    let rma = caps() | Caps::RMA;
    let (d1, d2) = (
        av_key_domain_with(SERVER_DEV, rma),
        av_key_domain_with(CLIENT_DEV, rma),
    );
    let (svc, keys) = Ep::open(&d1, &[JOB_A, JOB_B]);
    let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
    let regions: Vec<MemoryRegion> = keys
        .iter()
        .map(|&k| {
            d1.mr_regattr(MrAttr::alloc(64, rw).av_auth_key(&svc.av, k))
                .unwrap()
        })
        .collect();
    let (a, ka) = Ep::open(&d2, &[JOB_A]);
    let (b, kb) = Ep::open(&d2, &[JOB_B]);
    let jobs = [
        (&a, a.keyed(svc.addr, ka[0])),
        (&b, b.keyed(svc.addr, kb[0])),
    ];
    for (j, (from, dest)) in jobs.iter().enumerate() {
        let tag = 0x5eed_0000 + j as u64;
        let own = &regions[j];
        let data = Bytes::from(tag.to_ne_bytes().to_vec());
        within(
            "own job's write",
            from.ep.write(*dest, data, own.addr(), own.key()),
        )
        .await
        .unwrap();
        assert_eq!(word(own), tag);
        let got = within(
            "own job's read",
            from.ep
                .read(*dest, BytesMut::zeroed(8), own.addr(), own.key()),
        )
        .await
        .unwrap();
        assert_eq!(&got.into_bytes()[..], &tag.to_ne_bytes());
        // The other job's region: refused by the device, untouched. The
        // connection ends with the error; the next operation makes a new
        // one.
        let other = &regions[1 - j];
        let before = word(other);
        let e = within(
            "a cross-job write",
            from.ep.write(
                *dest,
                Bytes::from_static(b"intruder"),
                other.addr(),
                other.key(),
            ),
        )
        .await
        .unwrap_err();
        assert_eq!(e.err, Error::Access, "{e:?}");
        let e = within(
            "a cross-job read",
            from.ep
                .read(*dest, BytesMut::zeroed(8), other.addr(), other.key()),
        )
        .await
        .unwrap_err();
        assert_eq!(e.err, Error::Access, "{e:?}");
        assert_eq!(word(other), before, "the other job's region changed");
    }
    // A region keyed by a handle that is not a live key is Inval.
    let e = d1
        .mr_regattr(MrAttr::alloc(64, rw).av_auth_key(&svc.av, 99))
        .err()
        .unwrap();
    assert_eq!(e.error, Error::Inval);
}

/// A client of [`a_scalable_endpoints_contexts_share_its_keys`]: an
/// endpoint holding `key`, whose AV names receive contexts (one bit),
/// that AV and its entry for `peer` under that key.
fn ctx_client(
    d: &Domain,
    key: &[u8],
    peer: std::net::SocketAddr,
) -> (weft::Endpoint, weft::AddressVector, FiAddr) {
    let av = d
        .av(AvAttr {
            rx_ctx_bits: 1,
            ..AvAttr::default()
        })
        .unwrap();
    let k = av.insert_auth_key(key).unwrap();
    let (ep, _cq) = weft_integration::enabled_endpoint_with_eq(
        d,
        d.info(),
        &av,
        None,
        weft::WaitMode::Interrupt,
    );
    let entry = insert_keyed(&av, peer, k);
    (ep, av, entry)
}

/// A scalable endpoint on an `FI_AV_AUTH_KEY` domain holding two jobs'
/// keys: its receive contexts share its keys and connections, so each
/// context takes messages proven under either key, reports the sender's
/// entry under the key it proved, and takes receives directed by key
/// (only by keys the endpoint holds).
#[cfg_attr(
    not(feature = "verbs"),
    ignore = "needs an RDMA device: built without the verbs feature (integration/run-rxe runs it)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scalable_endpoints_contexts_share_its_keys() {
    let info = verbs_offer_with(SERVER_DEV, EpType::Rdm, |h| {
        h.caps = caps() | Caps::NAMED_RX_CTX;
        h.domain_attr.av_auth_key = true;
        h.ep_attr.tx_ctx_cnt = 2;
        h.ep_attr.rx_ctx_cnt = 2;
    })
    .unwrap();
    assert!(info.domain_attr.av_auth_key);
    let d1 = weft::Fabric::open(&info).unwrap().domain(&info).unwrap();
    let av = d1
        .av(AvAttr {
            rx_ctx_bits: 1,
            ..AvAttr::default()
        })
        .unwrap();
    let ka = av.insert_auth_key(JOB_A).unwrap();
    let kb = av.insert_auth_key(JOB_B).unwrap();
    let sep = d1.scalable_endpoint(&info).unwrap();
    sep.bind_av(&av).unwrap();
    sep.enable().unwrap();
    // Not held: inserted after the endpoint was enabled.
    let kc = av.insert_auth_key(JOB_C).unwrap();
    let rx: Vec<weft::Endpoint> = (0..2)
        .map(|i| {
            let cq = d1.cq(weft::CqAttr::default()).unwrap();
            let c = sep.rx_context(i).unwrap();
            c.bind_cq(&cq, weft::BindFlags::RECV).unwrap();
            c.enable().unwrap();
            c
        })
        .collect();
    let at = weft::decode_sockaddr(&sep.local_addr().unwrap()).unwrap();
    let d2 = av_key_domain(CLIENT_DEV);
    let clients = [
        ctx_client(&d2, JOB_A, at),
        ctx_client(&d2, JOB_A, at),
        ctx_client(&d2, JOB_B, at),
    ];
    let srcs: Vec<FiAddr> = clients
        .iter()
        .zip([ka, ka, kb])
        .map(|((ep, ..), k)| insert_keyed_raw(&av, ep.local_addr().unwrap(), k))
        .collect();
    // Every client to each context: it lands where it was sent, known by
    // its key.
    for (i, c) in rx.iter().enumerate() {
        for (j, (ep, cav, entry)) in clients.iter().enumerate() {
            let tag = (10 * i + j) as u64;
            let dest = cav.rx_addr(*entry, i as u32);
            let recv = c.trecv(BytesMut::zeroed(16), weft::FI_ADDR_UNSPEC, tag, 0);
            let body = Bytes::from(tag.to_le_bytes().to_vec());
            let (got, sent) = within("a context's message", async {
                tokio::join!(recv, ep.tsend(dest, body, tag))
            })
            .await;
            sent.unwrap();
            let got = got.unwrap();
            assert_eq!(got.src, srcs[j], "context {i}, client {j}");
            assert_eq!(&got.into_bytes()[..8], &tag.to_le_bytes());
        }
    }
    let to_1: Vec<FiAddr> = clients.iter().map(|(_, a, e)| a.rx_addr(*e, 1)).collect();
    weft_integration::directed_by_key(
        &rx[1],
        ka,
        [
            (&clients[0].0, to_1[0], srcs[0]),
            (&clients[1].0, to_1[1], srcs[1]),
            (&clients[2].0, to_1[2], srcs[2]),
        ],
    )
    .await;
    directed_by_unheld_keys_refused(&rx[0], kc).await;
    assert_eq!(sep.stats().unwrap().rx_bad_ctx, 0);
}
