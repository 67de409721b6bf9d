//! Authorization keys kept in an AV (`FI_AV_AUTH_KEY`) on udp DGRAM
//! (`docs/design.md`, "Authorization keys", udp DGRAM; `docs/wire.md`
//! section 15.2): a datagram to an AV entry proves that entry's key and
//! names it by its identifier; the receiver checks it against the held
//! key it names and knows the sender as the AV entry of its address under
//! that key. Two jobs on one loopback refuse each other's every datagram
//! (counted, nothing delivered); one endpoint holding both keys serves
//! both; receives directed by key take only their job's datagrams; keys
//! held by an enabled endpoint cannot be removed; bad keys, handles and
//! flags are refused; a multicast group, which has no key, cannot be
//! sent to by an endpoint that holds keys.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, AvFlags, Caps, CompletionQueue, Domain, EpType, Error, FiAddr, Info,
    OpFlags, WaitMode, FI_ADDR_UNSPEC,
};
use weft_core::auth::AuthKey;
use weft_core::dgram_auth::{addr_bytes, DgramKey, ID_TRAILER_LEN, TRAILER_LEN};
use weft_integration::{
    assert_cq_quiet, by_key, enabled_endpoint, payload, stats_until, within, TIMEOUT,
};

const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";
const JOB_C: &[u8] = b"job-c key";

fn hints(caps: Caps) -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = EpType::Dgram;
    h.fabric_attr.prov_name = Some("udp".into());
    h.caps = caps;
    h.domain_attr.av_auth_key = true;
    h
}

/// A loopback domain whose DGRAM endpoints take their keys from their AV.
fn av_key_domain(caps: Caps) -> Domain {
    let i = weft::getinfo(Some(&hints(caps))).unwrap().remove(0);
    assert!(i.domain_attr.av_auth_key);
    assert_eq!(i.addr_format, weft::AddrFormat::SockaddrIn);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

fn plain_caps() -> Caps {
    Caps::MSG | Caps::TAGGED | Caps::SOURCE | Caps::DIRECTED_RECV
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    cq: CompletionQueue,
    addr: SocketAddr,
}

impl Ep {
    /// An endpoint whose AV holds `keys` when it is enabled; their
    /// handles in order.
    fn open(d: &Domain, keys: &[&[u8]]) -> (Ep, Vec<FiAddr>) {
        let av = d.av(AvAttr::default()).unwrap();
        let handles = keys
            .iter()
            .map(|k| av.insert_auth_key(k).unwrap())
            .collect();
        let (ep, cq) = enabled_endpoint(d, d.info(), &av, WaitMode::Interrupt);
        let addr = weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap();
        (Ep { ep, av, cq, addr }, handles)
    }

    /// `peer`'s entry under the key handle `key`.
    fn keyed(&self, peer: SocketAddr, key: FiAddr) -> FiAddr {
        weft_integration::av_keys::insert_keyed(&self.av, peer, key)
    }

    fn plain(&self, peer: SocketAddr) -> FiAddr {
        self.av
            .insert_sync(&[weft::encode_sockaddr(&peer)], AvFlags::empty())
            .unwrap()
            .fi_addrs[0]
    }
}

/// `from` sends a tagged datagram to `dest`; `to_ep` takes it and reports
/// `src` as its source.
async fn delivered(from: &Ep, dest: FiAddr, to_ep: &Ep, tag: u64, src: FiAddr) {
    let recv = to_ep.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, tag, 0);
    let body = Bytes::from(tag.to_le_bytes().to_vec());
    let (got, sent) = within("delivery", async {
        tokio::join!(recv, from.ep.tsend(dest, body, tag))
    })
    .await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.src, src, "the source under the proven key");
    assert_eq!(&got.into_bytes()[..], &tag.to_le_bytes());
}

#[tokio::test]
async fn getinfo_offers_av_keys_with_the_named_trailer_off() {
    let all = weft::getinfo(Some(&hints(plain_caps()))).unwrap();
    assert!(all.iter().all(|i| i.ep_attr.ep_type == EpType::Dgram));
    assert!(all.iter().all(|i| i.domain_attr.av_auth_key));
    assert!(all.iter().all(|i| i.domain_attr.max_ep_auth_key == 256));
    assert_eq!(all[0].ep_attr.max_msg_size, 65_507 - 24 - ID_TRAILER_LEN);
    // A domain key as well as AV keys matches nothing.
    let mut h = hints(plain_caps());
    h.domain_attr.auth_key = Some(JOB_A.to_vec());
    assert!(weft::getinfo(Some(&h)).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_size_getinfo_reports_is_the_size_that_fits() {
    let d = av_key_domain(plain_caps());
    let (a, ka) = Ep::open(&d, &[JOB_A]);
    let (b, kb) = Ep::open(&d, &[JOB_A]);
    let b_in_a = a.keyed(b.addr, ka[0]);
    b.keyed(a.addr, kb[0]);
    let max = d.info().ep_attr.max_msg_size;
    assert_eq!(max, 65_507 - 24 - ID_TRAILER_LEN);
    let over = a.ep.send(b_in_a, payload(max + 1, 3)).await;
    assert_eq!(over.unwrap_err().err, Error::MsgSize);
    let recv = b.ep.recv(BytesMut::zeroed(max));
    let (got, sent) = within("largest", async {
        tokio::join!(recv, a.ep.send(b_in_a, payload(max, 4)))
    })
    .await;
    sent.unwrap();
    assert_eq!(got.unwrap().into_bytes(), payload(max, 4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jobs_on_one_loopback_refuse_each_others_every_datagram() {
    let d = av_key_domain(plain_caps());
    let (a1, ka1) = Ep::open(&d, &[JOB_A]);
    let (a2, ka2) = Ep::open(&d, &[JOB_A]);
    let (b1, kb1) = Ep::open(&d, &[JOB_B]);
    let (b2, kb2) = Ep::open(&d, &[JOB_B]);
    let jobs = [(&a1, ka1[0]), (&a2, ka2[0]), (&b1, kb1[0]), (&b2, kb2[0])];
    // Everyone's AV holds everyone, under its own (only) key: whatever
    // one sends proves its own job's key.
    let mut at = [[0; 4]; 4];
    for (i, (from, k)) in jobs.iter().enumerate() {
        for (j, (peer, _)) in jobs.iter().enumerate() {
            at[i][j] = from.keyed(peer.addr, *k);
        }
    }
    const N: u64 = 20;
    for round in 0..N {
        for (i, (from, _)) in jobs.iter().enumerate() {
            for (j, &dest) in at[i].iter().enumerate() {
                if (i < 2) != (j < 2) {
                    from.ep.send(dest, payload(64, round as u8)).await.unwrap();
                }
            }
        }
        // Same job, both ways: delivered, known by the entry under the
        // job's key.
        delivered(&a1, at[0][1], &a2, round, at[1][0]).await;
        delivered(&b2, at[3][2], &b1, round, at[2][3]).await;
    }
    // Each endpoint got N datagrams from each of the other job's two.
    for (e, _) in &jobs {
        stats_until(&e.ep, "cross-job refusals", |s| s.rx_key_rejected == 2 * N).await;
        let s = e.ep.stats().unwrap();
        assert_eq!(
            (s.unexpected_bytes, s.rx_replayed, s.rx_malformed),
            (0, 0, 0)
        );
        e.ep.post_recv(BytesMut::zeroed(64), 77).unwrap();
    }
    for (e, _) in &jobs {
        assert_cq_quiet(&e.cq, "a cross-job datagram").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_serves_two_jobs_and_receives_directed_by_key() {
    let d = av_key_domain(plain_caps());
    let (svc, keys) = Ep::open(&d, &[JOB_A, JOB_B]);
    let (ka, kb) = (keys[0], keys[1]);
    let (a1, k1) = Ep::open(&d, &[JOB_A]);
    let (a2, k2) = Ep::open(&d, &[JOB_A]);
    let (b, k3) = Ep::open(&d, &[JOB_B]);
    let (c, k4) = Ep::open(&d, &[JOB_C]);
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
    delivered(&a1, to_svc[0], &svc, 1, at_svc[0]).await;
    delivered(&b, to_svc[2], &svc, 2, at_svc[2]).await;
    delivered(&svc, at_svc[0], &a1, 3, to_svc[0]).await;
    delivered(&svc, at_svc[2], &b, 4, to_svc[2]).await;

    // The same address under the other key is another peer: job B's
    // entry for a1 sends under B, which a1 does not hold.
    let a1_under_b = svc.keyed(a1.addr, kb);
    svc.ep
        .send(a1_under_b, Bytes::from_static(b"under b"))
        .await
        .unwrap();
    stats_until(&a1.ep, "another job's key", |s| s.rx_key_rejected == 1).await;

    // An entry under no key, or under a key inserted after the endpoint
    // was enabled, cannot be reached: the endpoint holds keys.
    let plain = svc.plain(c.addr);
    let r = svc.ep.send(plain, Bytes::from_static(b"x")).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);
    let kc = svc.av.insert_auth_key(JOB_C).unwrap();
    let c_at_svc = svc.keyed(c.addr, kc);
    let r = svc.ep.send(c_at_svc, Bytes::from_static(b"x")).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);
    // Job C's datagrams to the service are refused and counted.
    let svc_from_c = c.keyed(svc.addr, k4[0]);
    for _ in 0..3 {
        c.ep.send(svc_from_c, Bytes::from_static(b"c"))
            .await
            .unwrap();
    }
    stats_until(&svc.ep, "job C", |s| s.rx_key_rejected == 3).await;

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

    // A key the endpoint was not enabled with, or no key: Inval; the flag
    // on an endpoint of a plain domain: BadFlags.
    let r = svc.ep.recvmsg(by_key(kc, 1, 0), OpFlags::AUTH_KEY).await;
    assert_eq!(r.unwrap_err().err, Error::Inval);
    let r = svc
        .ep
        .recvmsg(by_key(FI_ADDR_UNSPEC, 1, 0), OpFlags::AUTH_KEY)
        .await;
    assert_eq!(r.unwrap_err().err, Error::Inval);
    let mut ph = hints(plain_caps());
    ph.domain_attr.av_auth_key = false;
    let pi = weft::getinfo(Some(&ph)).unwrap().remove(0);
    let pd = weft::Fabric::open(&pi).unwrap().domain(&pi).unwrap();
    let pav = pd.av(AvAttr::default()).unwrap();
    let (pep, _pcq) = enabled_endpoint(&pd, &pi, &pav, WaitMode::Interrupt);
    let r = pep.recvmsg(by_key(0, 1, 0), OpFlags::AUTH_KEY).await;
    assert_eq!(r.unwrap_err().err, Error::BadFlags);

    // Keys held by the enabled endpoint cannot be removed; a key no
    // endpoint holds can, and its handle is dead after.
    weft_integration::held_keys_busy_until_close(&svc.av, &svc.ep, &[ka, kb], kc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_senders_report_the_key_they_proved() {
    let d = av_key_domain(plain_caps() | Caps::SOURCE_ERR);
    assert!(d.info().caps.contains(Caps::SOURCE_ERR));
    let (rx, kr) = Ep::open(&d, &[JOB_B, JOB_A]);
    let (tx, kt) = Ep::open(&d, &[JOB_A]);
    let dest = tx.keyed(rx.addr, kt[0]);
    let recv = rx.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 1, 0);
    let (got, sent) = within("unknown", async {
        tokio::join!(recv, tx.ep.tsend(dest, Bytes::from_static(b"who"), 1))
    })
    .await;
    sent.unwrap();
    let e = got.unwrap_err();
    assert_eq!(e.err, Error::AddrNotAvail);
    assert_eq!(e.src, kr[1], "the handle of the key it proved");
    assert_eq!(&e.bufs[0][..3], b"who");
    assert_eq!(e.err_data, weft::encode_sockaddr(&tx.addr));
    // Inserted under another key, it is still unknown under this one.
    rx.keyed(tx.addr, kr[0]);
    let recv = rx.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, 2, 0);
    let (got, _) = within("under another key", async {
        tokio::join!(recv, tx.ep.tsend(dest, Bytes::from_static(b"again"), 2))
    })
    .await;
    assert_eq!(got.unwrap_err().src, kr[1]);
    let known = rx.keyed(tx.addr, kr[1]);
    delivered(&tx, dest, &rx, 3, known).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_that_name_a_key_are_checked_by_its_identifier() {
    let d = av_key_domain(plain_caps());
    let (b, kb) = Ep::open(&d, &[JOB_A, JOB_B]);
    let raw = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let raw_addr = raw.local_addr().unwrap();
    raw.set_read_timeout(Some(TIMEOUT)).unwrap();
    let raw_at_b = b.keyed(raw_addr, kb[1]);
    // Built by hand (docs/wire.md section 15.2): flags 4|8, the key's
    // identifier, the sequence number, the MAC.
    let named = |key: &[u8], seq: u64, body: &[u8]| {
        let k = DgramKey::new(&AuthKey::new(key).unwrap()).unwrap();
        let mut d = vec![b'W', b'U', 1, 4 | 8];
        d.extend_from_slice(&(body.len() as u32).to_le_bytes());
        d.extend_from_slice(&[0; 16]);
        let t = k.seal_with_id(
            &addr_bytes(&raw_addr),
            &addr_bytes(&b.addr),
            &d,
            seq,
            [body],
        );
        d.extend_from_slice(body);
        d.extend_from_slice(&t);
        d
    };
    raw.send_to(&named(JOB_B, 10, b"good"), b.addr).unwrap();
    let got = within("good", b.ep.recv(BytesMut::zeroed(8)))
        .await
        .unwrap();
    assert_eq!(got.src, raw_at_b);
    assert_eq!(&got.into_bytes()[..], b"good");
    // What b sends names its key and is 32 bytes longer than the body.
    let b_to_raw = b.keyed(raw_addr, kb[0]);
    b.ep.send(b_to_raw, Bytes::from_static(b"out"))
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let (n, _) = raw.recv_from(&mut buf).unwrap();
    assert_eq!((n, buf[3]), (24 + 3 + ID_TRAILER_LEN, 4 | 8));
    let id = DgramKey::new(&AuthKey::new(JOB_A).unwrap()).unwrap().id();
    assert_eq!(&buf[24 + 3..24 + 3 + 8], &id);

    // Refused: a key b does not hold; the right identifier in front of
    // another key's MAC; the unnamed form of a held key; a replay.
    let stranger = named(JOB_C, 11, b"c");
    let mut swapped = named(JOB_C, 12, b"c");
    let at = swapped.len() - ID_TRAILER_LEN;
    swapped[at..at + 8].copy_from_slice(&id);
    let unnamed = {
        let k = DgramKey::new(&AuthKey::new(JOB_A).unwrap()).unwrap();
        let mut d = vec![b'W', b'U', 1, 4];
        d.extend_from_slice(&1u32.to_le_bytes());
        d.extend_from_slice(&[0; 16]);
        let t = k.seal(
            &addr_bytes(&raw_addr),
            &addr_bytes(&b.addr),
            &d,
            13,
            [&b"u"[..]],
        );
        d.push(b'u');
        d.extend_from_slice(&t);
        assert_eq!(t.len(), TRAILER_LEN);
        d
    };
    for dg in [&stranger, &swapped, &unnamed] {
        raw.send_to(dg, b.addr).unwrap();
    }
    raw.send_to(&named(JOB_B, 10, b"good"), b.addr).unwrap();
    stats_until(&b.ep, "refusals", |s| {
        s.rx_key_rejected == 3 && s.rx_replayed == 1
    })
    .await;
    b.ep.post_recv(BytesMut::zeroed(64), 5).unwrap();
    assert_cq_quiet(&b.cq, "nothing else delivered").await;
}

#[tokio::test]
async fn bad_keys_handles_and_endpoints_are_refused() {
    let d = av_key_domain(plain_caps());
    let av = d.av(AvAttr::default()).unwrap();
    assert_eq!(av.insert_auth_key(b""), Err(Error::Inval));
    assert_eq!(av.insert_auth_key(&[7; 65]), Err(Error::Inval));
    let k = av.insert_auth_key(JOB_A).unwrap();
    assert_eq!(av.lookup_auth_key(k, AvFlags::AUTH_KEY).unwrap(), JOB_A);
    let addr = weft::encode_sockaddr(&"127.0.0.1:9".parse().unwrap());
    assert_eq!(
        av.insert_with_auth_key(std::slice::from_ref(&addr), 99, AvFlags::empty(), 0)
            .err(),
        Some(Error::Inval)
    );
    assert_eq!(av.remove_auth_keys(&[99]), Err(Error::Inval));
    // A DGRAM endpoint of such a domain takes no key of its own.
    let mut i = d.info().clone();
    i.ep_attr.auth_key = Some(JOB_A.to_vec());
    assert_eq!(d.endpoint(&i).err(), Some(Error::Inval));
    // SOCK_DGRAM has no room for a proof.
    let mut si = d.info().clone();
    si.ep_attr.ep_type = EpType::SockDgram;
    si.caps = Caps::MSG | Caps::SOURCE;
    si.tx_attr.caps = Caps::MSG;
    si.rx_attr.caps = Caps::MSG | Caps::SOURCE;
    assert_eq!(weft_integration::enable_error(&d, &si), Error::OpNotSupp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_has_no_key_so_an_endpoint_holding_keys_cannot_send_to_it() {
    let d = av_key_domain(plain_caps() | Caps::MULTICAST);
    let av = d.av(AvAttr::default()).unwrap();
    av.insert_auth_key(JOB_A).unwrap();
    let eq = d.fabric().eq(8).unwrap();
    let (ep, _cq) = weft_integration::enabled_endpoint_with_eq(
        &d,
        d.info(),
        &av,
        Some(&eq),
        WaitMode::Interrupt,
    );
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let g = SocketAddr::from((Ipv4Addr::new(239, 255, 78, 1), port));
    let mc = within("join", ep.join(&weft::encode_sockaddr(&g), 0))
        .await
        .unwrap();
    let r = ep
        .send(mc.fi_addr(), Bytes::from_static(b"to the group"))
        .await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);
}
