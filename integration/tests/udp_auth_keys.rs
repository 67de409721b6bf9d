//! Authorization keys on udp DGRAM (`docs/wire.md` section 15, "Keyed
//! datagrams"): every datagram of a keyed endpoint carries a sequence
//! number and a MAC over its source, header and payload. Endpoints of one
//! key talk (tagged and untagged, `FI_SOURCE` right); datagrams of another
//! key, of no key to a keyed endpoint, or of a key to an unkeyed one are
//! dropped and counted (`rx_key_rejected`) while the receiver goes on
//! serving its legitimate peer; forged, truncated and replayed datagrams
//! from a raw socket are refused. Keys of the wrong size are refused when
//! the endpoint is created, keys on SOCK_DGRAM are `OpNotSupp`. Keys
//! held in the AV: `udp_av_auth_keys.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, CompletionQueue, Domain, EpType, Error, Info, OpFlags, WaitMode, FI_ADDR_UNSPEC,
};
use weft_core::auth::{AuthKey, MAX_KEY_LEN};
use weft_core::dgram_auth::{addr_bytes, DgramKey, TRAILER_LEN};
use weft_integration::{
    assert_cq_quiet, bad_keys_refused_at_open, delivered, enabled_endpoint, next_cq, payload,
    stats_until, within, TIMEOUT,
};

const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";

fn hints() -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = EpType::Dgram;
    h.fabric_attr.prov_name = Some("udp".into());
    h
}

/// The IPv4 loopback DGRAM offer for an endpoint holding `key`.
fn info(key: Option<&[u8]>) -> Info {
    let mut h = hints();
    h.ep_attr.auth_key = key.map(<[u8]>::to_vec);
    let i = weft::getinfo(Some(&h)).unwrap().remove(0);
    assert_eq!(i.ep_attr.auth_key.as_deref(), key, "the hint's key");
    assert_eq!(i.addr_format, weft::AddrFormat::SockaddrIn);
    i
}

fn domain(domain_key: Option<&[u8]>) -> Domain {
    let mut i = info(None);
    i.domain_attr.auth_key = domain_key.map(<[u8]>::to_vec);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    cq: CompletionQueue,
    addr: SocketAddr,
}

impl Ep {
    fn open(d: &Domain, key: Option<&[u8]>) -> Ep {
        let av = d.av(Default::default()).unwrap();
        let (ep, cq) = enabled_endpoint(d, &info(key), &av, WaitMode::Interrupt);
        let addr = weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap();
        Ep { ep, av, cq, addr }
    }

    fn insert(&self, peer: SocketAddr) -> weft::FiAddr {
        self.av
            .insert_sync(&[weft::encode_sockaddr(&peer)], Default::default())
            .unwrap()
            .fi_addrs[0]
    }
}

#[tokio::test]
async fn getinfo_offers_keys_on_dgram_only() {
    let mut h = hints();
    h.ep_attr.auth_key = Some(JOB_A.to_vec());
    let all = weft::getinfo(Some(&h)).unwrap();
    assert!(all.iter().all(|i| i.ep_attr.ep_type == EpType::Dgram));
    assert!(all.iter().all(|i| i.domain_attr.max_ep_auth_key == 256));
    // The trailer's room comes off what a keyed message carries
    // (`keyed_sizes` sends exactly that much).
    assert_eq!(all[0].ep_attr.max_msg_size, 65_507 - 24 - TRAILER_LEN);
    assert!(all
        .iter()
        .all(|i| i.tx_attr.inject_size <= i.ep_attr.max_msg_size));
    let mut h = hints();
    h.domain_attr.auth_key = Some(JOB_A.to_vec());
    let by_domain = weft::getinfo(Some(&h)).unwrap().remove(0);
    assert_eq!(by_domain.ep_attr.max_msg_size, 65_507 - 24 - TRAILER_LEN);
    let unkeyed = weft::getinfo(Some(&hints())).unwrap().remove(0);
    assert_eq!(unkeyed.ep_attr.max_msg_size, 65_507 - 24);
    // A hint that asks for the unkeyed size with a key asks for more than
    // a keyed endpoint sends.
    let mut h = hints();
    h.ep_attr.auth_key = Some(JOB_A.to_vec());
    h.ep_attr.max_msg_size = 65_507 - 24;
    assert_eq!(weft::getinfo(Some(&h)).unwrap_err(), Error::NoData);
    for bad in [Vec::new(), vec![1; MAX_KEY_LEN + 1]] {
        let mut h = hints();
        h.ep_attr.auth_key = Some(bad);
        assert_eq!(weft::getinfo(Some(&h)).unwrap_err(), Error::NoData);
    }
    let mut h = hints();
    h.ep_attr.ep_type = EpType::SockDgram;
    h.domain_attr.auth_key = Some(JOB_A.to_vec());
    assert_eq!(weft::getinfo(Some(&h)).unwrap_err(), Error::NoData);
}

#[tokio::test]
async fn bad_keys_are_refused_at_open() {
    let d = domain(None);
    bad_keys_refused_at_open(&d, &info(None));
    // SOCK_DGRAM datagrams are the payload alone: no room for a proof.
    let mut sh = hints();
    sh.ep_attr.ep_type = EpType::SockDgram;
    let mut si = weft::getinfo(Some(&sh)).unwrap().remove(0);
    si.ep_attr.auth_key = Some(JOB_A.to_vec());
    let sd = weft::Fabric::open(&si).unwrap().domain(&si).unwrap();
    assert_eq!(weft_integration::enable_error(&sd, &si), Error::OpNotSupp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_talks_tagged_and_untagged() {
    // b takes its key from the domain, a has its own: the same key.
    let (da, db) = (domain(None), domain(Some(JOB_A)));
    let a = Ep::open(&da, Some(JOB_A));
    let b = Ep::open(&db, None);
    let (b_in_a, a_in_b) = (a.insert(b.addr), b.insert(a.addr));
    for i in 0..100u64 {
        let msg = payload(1 + (i as usize * 131) % 4000, i as u8);
        assert_eq!(delivered(&a.ep, &b.ep, b_in_a, msg.clone()).await, a_in_b);
        b.ep.post_trecv(BytesMut::zeroed(4096), FI_ADDR_UNSPEC, i, 0, 100 + i)
            .unwrap();
        a.ep.post_tsend(b_in_a, msg.clone(), i, 200 + i).unwrap();
        let s = within("send", next_cq(&a.cq)).await.unwrap();
        assert_eq!(s.context, 200 + i);
        let r = within("receive", next_cq(&b.cq)).await.unwrap();
        assert_eq!((r.context, r.tag), (100 + i, i));
        assert!(r.flags.contains(OpFlags::RECV | OpFlags::TAGGED));
        assert_eq!(r.src, a_in_b, "FI_SOURCE");
        assert_eq!(&r.into_bytes()[..], &msg[..]);
    }
    // And back, with remote CQ data.
    a.ep.post_recv(BytesMut::zeroed(16), 7).unwrap();
    b.ep.post_senddata(a_in_b, payload(10, 1), 0xD0, 8).unwrap();
    let r = within("receive", next_cq(&a.cq)).await.unwrap();
    assert_eq!((r.context, r.data, r.src), (7, 0xD0, b_in_a));
    assert!(r.flags.contains(OpFlags::REMOTE_CQ_DATA));
    let s = b.ep.stats().unwrap();
    assert_eq!(
        (s.rx_key_rejected, s.rx_replayed, s.rx_malformed),
        (0, 0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_sizes() {
    let d = domain(Some(JOB_A));
    let (a, b) = (Ep::open(&d, None), Ep::open(&d, None));
    let b_in_a = a.insert(b.addr);
    b.insert(a.addr);
    // The trailer's 24 bytes come off what one datagram carries, and
    // getinfo with the key says so.
    let max = 65_507 - 24 - TRAILER_LEN;
    assert_eq!(info(Some(JOB_A)).ep_attr.max_msg_size, max);
    let over = a.ep.send(b_in_a, payload(max + 1, 3)).await;
    assert_eq!(over.unwrap_err().err, Error::MsgSize);
    delivered(&a.ep, &b.ep, b_in_a, payload(max, 4)).await;
    delivered(&a.ep, &b.ep, b_in_a, Bytes::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_keys_and_no_key_are_dropped_while_the_peer_is_served() {
    let d = domain(None);
    let b = Ep::open(&d, Some(JOB_A));
    let friend = Ep::open(&d, Some(JOB_A));
    let other_job = Ep::open(&d, Some(JOB_B));
    let unkeyed = Ep::open(&d, None);
    let a_in_b = b.insert(friend.addr);
    b.insert(other_job.addr);
    b.insert(unkeyed.addr);
    let to_b = |e: &Ep| e.insert(b.addr);
    let (f, o, u) = (to_b(&friend), to_b(&other_job), to_b(&unkeyed));
    const N: u64 = 50;
    for i in 0..N {
        // The strangers' datagrams go first: had they been taken, the
        // friend's receive would hold one of theirs.
        other_job.ep.send(o, payload(100, 0xB0)).await.unwrap();
        unkeyed.ep.send(u, payload(100, 0xC0)).await.unwrap();
        let got = delivered(&friend.ep, &b.ep, f, payload(100, i as u8)).await;
        assert_eq!(got, a_in_b);
    }
    stats_until(&b.ep, "refusals", |s| s.rx_key_rejected == 2 * N).await;
    let s = b.ep.stats().unwrap();
    assert_eq!((s.unexpected_bytes, s.rx_replayed), (0, 0), "nothing held");
    // The other way round: an unkeyed endpoint drops keyed datagrams.
    let b_in_u = unkeyed.insert(b.addr);
    unkeyed.insert(friend.addr);
    let u_in_f = friend.insert(unkeyed.addr);
    for _ in 0..5 {
        friend.ep.send(u_in_f, payload(10, 1)).await.unwrap();
    }
    stats_until(&unkeyed.ep, "keyed at unkeyed", |s| s.rx_key_rejected == 5).await;
    // ... while its keyed peers it sends to refuse its datagrams.
    unkeyed.ep.send(b_in_u, payload(10, 2)).await.unwrap();
    stats_until(&b.ep, "unkeyed at keyed", |s| {
        s.rx_key_rejected == 2 * N + 1
    })
    .await;
    unkeyed.ep.post_recv(BytesMut::zeroed(64), 9).unwrap();
    assert_cq_quiet(&unkeyed.cq, "keyed datagrams at an unkeyed endpoint").await;
}

/// A keyed datagram built by hand (`docs/wire.md` section 15.2), as a
/// holder of `key` at `src` would send it to `dst`.
fn keyed_datagram(
    key: &[u8],
    (src, dst): (SocketAddr, SocketAddr),
    tag: Option<u64>,
    seq: u64,
    body: &[u8],
) -> Vec<u8> {
    let k = DgramKey::new(&AuthKey::new(key).unwrap()).unwrap();
    let mut d = vec![b'W', b'U', 1, 4 | u8::from(tag.is_some())];
    d.extend_from_slice(&(body.len() as u32).to_le_bytes());
    d.extend_from_slice(&tag.unwrap_or(0).to_le_bytes());
    d.extend_from_slice(&0u64.to_le_bytes());
    let t = k.seal(&addr_bytes(&src), &addr_bytes(&dst), &d, seq, [body]);
    d.extend_from_slice(body);
    d.extend_from_slice(&t);
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_truncated_and_replayed_datagrams_are_refused() {
    let d = domain(None);
    let b = Ep::open(&d, Some(JOB_A));
    let friend = Ep::open(&d, Some(JOB_A));
    let b_in_f = friend.insert(b.addr);
    let f_in_b = b.insert(friend.addr);
    let raw = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let raw_addr = raw.local_addr().unwrap();
    raw.set_read_timeout(Some(TIMEOUT)).unwrap();

    // A datagram of the friend's, captured on its way (sent to the raw
    // socket), then sent to b from elsewhere: its MAC names the friend's
    // address, so it proves nothing from the raw socket's.
    let raw_in_f = friend.insert(raw_addr);
    friend
        .ep
        .send(raw_in_f, Bytes::from_static(b"captured"))
        .await
        .unwrap();
    let mut buf = [0u8; 2048];
    let (n, from) = raw.recv_from(&mut buf).unwrap();
    assert_eq!(from, friend.addr);
    let captured = buf[..n].to_vec();
    assert_eq!(captured[3] & 4, 4, "keyed");
    assert_eq!(n, 24 + 8 + TRAILER_LEN);

    // A good datagram of the raw socket's own (it holds the key), then
    // bad ones: every refusal below is counted, nothing is delivered.
    let good = keyed_datagram(JOB_A, (raw_addr, b.addr), Some(5), 1000, b"good");
    raw.send_to(&good, b.addr).unwrap();
    let got = within(
        "good",
        b.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 5, 0),
    )
    .await
    .unwrap();
    assert_eq!(&got.into_bytes()[..], b"good");

    // The same datagram sent to another holder of the key: its MAC names
    // b as the receiver.
    raw.send_to(&good, friend.addr).unwrap();
    stats_until(&friend.ep, "sent elsewhere", |s| s.rx_key_rejected == 1).await;

    let mut flipped = keyed_datagram(JOB_A, (raw_addr, b.addr), None, 1001, b"flipped");
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let mut body = keyed_datagram(JOB_A, (raw_addr, b.addr), None, 1002, b"body");
    body[24] ^= 1;
    let mut seq = keyed_datagram(JOB_A, (raw_addr, b.addr), None, 1003, b"seq");
    let at = seq.len() - TRAILER_LEN;
    seq[at] ^= 1;
    let unkeyed = {
        let mut d = vec![b'W', b'U', 1, 0];
        d.extend_from_slice(&4u32.to_le_bytes());
        d.extend_from_slice(&[0; 16]);
        d.extend_from_slice(b"none");
        d
    };
    let rejected: Vec<Vec<u8>> = vec![
        captured.clone(),
        flipped,
        body,
        seq,
        keyed_datagram(JOB_B, (raw_addr, b.addr), None, 1004, b"other key"),
        unkeyed,
    ];
    for d in &rejected {
        raw.send_to(d, b.addr).unwrap();
    }
    // Replays: the good datagram again, and one older than the window.
    raw.send_to(&good, b.addr).unwrap();
    let newer = keyed_datagram(JOB_A, (raw_addr, b.addr), None, 1100, b"newer");
    raw.send_to(&newer, b.addr).unwrap();
    let old = keyed_datagram(JOB_A, (raw_addr, b.addr), None, 1100 - 64, b"too old");
    raw.send_to(&old, b.addr).unwrap();
    raw.send_to(&newer, b.addr).unwrap();
    // Truncated: a byte short of its trailer, or no trailer at all.
    raw.send_to(&newer[..newer.len() - 1], b.addr).unwrap();
    raw.send_to(&newer[..newer.len() - TRAILER_LEN], b.addr)
        .unwrap();
    let rej = rejected.len() as u64;
    stats_until(&b.ep, "refusals", |s| {
        s.rx_key_rejected == rej && s.rx_replayed == 3 && s.rx_malformed == 2
    })
    .await;
    // Only "newer" (once) was taken; the friend is still served.
    let got = within("newer", b.ep.recv(BytesMut::zeroed(16)))
        .await
        .unwrap();
    assert_eq!(&got.into_bytes()[..], b"newer");
    assert_eq!(
        delivered(&friend.ep, &b.ep, b_in_f, Bytes::from_static(b"still")).await,
        f_in_b
    );
    // Within the window, a late datagram not seen yet is taken.
    let late = keyed_datagram(JOB_A, (raw_addr, b.addr), None, 1100 - 63, b"late");
    raw.send_to(&late, b.addr).unwrap();
    let got = within("late", b.ep.recv(BytesMut::zeroed(16)))
        .await
        .unwrap();
    assert_eq!(&got.into_bytes()[..], b"late");
    b.ep.post_recv(BytesMut::zeroed(64), 1).unwrap();
    assert_cq_quiet(&b.cq, "nothing else delivered").await;
}
