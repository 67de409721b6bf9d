//! Authorization keys kept in an AV (`FI_AV_AUTH_KEY`) and on memory
//! regions, on tcp: one service endpoint holds the keys of two jobs and
//! talks to each job's clients under that job's key. A message is known
//! to come from the AV entry of its sender's address under the key its
//! connection proved; a client of a third job is refused; a send through
//! an entry under another key than the connection's is refused; a region
//! with a key is reachable only by connections that proved it. Keys held
//! by an enabled endpoint cannot be removed (`Busy`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, AvFlags, CompletionQueue, Domain, EpType, Error, EventQueue, FiAddr,
    Info, MrAccess, MrAttr, WaitMode, FI_ADDR_UNSPEC,
};

const T: Duration = Duration::from_secs(10);
const JOB_A: &[u8] = b"job-a key";
const JOB_B: &[u8] = b"job-b key";
const JOB_C: &[u8] = b"job-c key";

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

fn hints() -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = EpType::Rdm;
    h.caps = weft::Caps::MSG
        | weft::Caps::TAGGED
        | weft::Caps::SOURCE
        | weft::Caps::DIRECTED_RECV
        | weft::Caps::RMA;
    h.fabric_attr.prov_name = Some("tcp".into());
    h
}

/// A domain whose endpoints take their keys from their AV.
fn av_key_domain() -> Domain {
    let mut h = hints();
    h.domain_attr.av_auth_key = true;
    let i = weft::getinfo(Some(&h)).unwrap().remove(0);
    assert!(i.domain_attr.av_auth_key);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

/// A plain domain; its endpoints carry `key` (a client of one job).
fn client_domain(key: &[u8]) -> (Domain, Info) {
    let mut h = hints();
    h.ep_attr.auth_key = Some(key.to_vec());
    let i = weft::getinfo(Some(&h)).unwrap().remove(0);
    (weft::Fabric::open(&i).unwrap().domain(&i).unwrap(), i)
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    _cq: CompletionQueue,
    eq: EventQueue,
    addr: SocketAddr,
}

/// An endpoint on `domain` whose AV already holds `keys` when it is
/// enabled; their handles in order.
fn open(domain: &Domain, info: &Info, keys: &[&[u8]]) -> (Ep, Vec<FiAddr>) {
    let eq = domain.fabric().eq(64).unwrap();
    let av = domain.av(AvAttr::default()).unwrap();
    let handles = keys
        .iter()
        .map(|k| av.insert_auth_key(k).unwrap())
        .collect();
    let (ep, cq) = weft_integration::enabled_endpoint_with_eq(
        domain,
        info,
        &av,
        Some(&eq),
        WaitMode::Interrupt,
    );
    let addr = weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap();
    let ep = Ep {
        ep,
        av,
        _cq: cq,
        eq,
        addr,
    };
    (ep, handles)
}

fn client(key: &[u8]) -> Ep {
    let (d, i) = client_domain(key);
    open(&d, &i, &[]).0
}

async fn plain_handle(from: &Ep, of: SocketAddr) -> FiAddr {
    let bytes = weft::encode_sockaddr(&of);
    to(from.av.insert(&[bytes], AvFlags::empty(), 0).unwrap())
        .await
        .fi_addrs[0]
}

fn keyed_handle(from: &Ep, of: SocketAddr, key: FiAddr) -> FiAddr {
    weft_integration::av_keys::insert_keyed(&from.av, of, key)
}

/// `from` sends one tagged message to `dest`; `to_ep` receives it and
/// reports `src` as its source.
async fn delivered(from: &Ep, dest: FiAddr, to_ep: &Ep, tag: u64, src: FiAddr) {
    let recv = to_ep.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, tag, 0);
    let send = from
        .ep
        .tsend(dest, Bytes::from(tag.to_le_bytes().to_vec()), tag);
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.src, src, "the source under the proven key");
    assert_eq!(&got.into_bytes()[..], &tag.to_le_bytes());
}

/// The next error on `eq`.
async fn next_err(eq: &EventQueue) -> weft::EqErrEntry {
    to(async {
        loop {
            match eq.read_err() {
                Ok(e) => return e,
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_endpoint_serves_two_jobs_under_their_keys_and_refuses_a_third() {
    let d = av_key_domain();
    let (svc, keys) = open(&d, d.info(), &[JOB_A, JOB_B]);
    let (ka, kb) = (keys[0], keys[1]);
    let (a, b, c) = (client(JOB_A), client(JOB_B), client(JOB_C));
    let a_at_svc = keyed_handle(&svc, a.addr, ka);
    let b_at_svc = keyed_handle(&svc, b.addr, kb);

    // Clients reach the service; it knows each by its entry under the
    // key its connection proved.
    let svc_from_a = plain_handle(&a, svc.addr).await;
    let svc_from_b = plain_handle(&b, svc.addr).await;
    delivered(&a, svc_from_a, &svc, 1, a_at_svc).await;
    delivered(&b, svc_from_b, &svc, 2, b_at_svc).await;
    // And the service reaches them.
    delivered(&svc, a_at_svc, &a, 3, svc_from_a).await;
    delivered(&svc, b_at_svc, &b, 4, svc_from_b).await;

    // A third job's client is refused on both sides; nothing arrives.
    let svc_from_c = plain_handle(&c, svc.addr).await;
    let sent = to(c.ep.tsend(svc_from_c, Bytes::from_static(b"x"), 5)).await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);
    assert_eq!(next_err(&svc.eq).await.err, Error::KeyRejected);
    assert_eq!(next_err(&c.eq).await.err, Error::KeyRejected);

    // Job A's address under job B's key: the connection proved A, so a
    // send through this entry is refused rather than sent under A.
    let a_under_b = keyed_handle(&svc, a.addr, kb);
    let sent = to(svc.ep.tsend(a_under_b, Bytes::from_static(b"x"), 6)).await;
    assert_eq!(sent.unwrap_err().err, Error::KeyRejected);

    // An entry under no key, and one under a key inserted after the
    // endpoint was enabled, cannot be reached: the endpoint holds keys.
    let plain = plain_handle(&svc, c.addr).await;
    let r = svc.ep.tsend(plain, Bytes::from_static(b"x"), 7).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);
    let kc = svc.av.insert_auth_key(JOB_C).unwrap();
    let c_at_svc = keyed_handle(&svc, c.addr, kc);
    let r = svc.ep.tsend(c_at_svc, Bytes::from_static(b"x"), 8).await;
    assert_eq!(r.unwrap_err().err, Error::NoKey);

    // Both jobs still served.
    delivered(&a, svc_from_a, &svc, 9, a_at_svc).await;
    delivered(&svc, b_at_svc, &b, 10, svc_from_b).await;

    // Keys held by the enabled endpoint cannot be removed; a key no
    // endpoint holds can, and its handle is dead after.
    weft_integration::held_keys_busy_until_close(&svc.av, &svc.ep, &[ka, kb], kc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_with_a_key_take_only_connections_that_proved_it() {
    let d = av_key_domain();
    let (svc, keys) = open(&d, d.info(), &[JOB_A, JOB_B]);
    let (a, b) = (client(JOB_A), client(JOB_B));
    keyed_handle(&svc, a.addr, keys[0]);
    keyed_handle(&svc, b.addr, keys[1]);
    let rw = MrAccess::REMOTE_READ | MrAccess::REMOTE_WRITE;
    let b_only = d
        .mr_regattr(MrAttr::alloc(64, rw).requested_key(1).auth_key(JOB_B))
        .unwrap();
    let anyone = d
        .mr_regattr(MrAttr::alloc(64, rw).requested_key(2))
        .unwrap();
    let (to_svc_a, to_svc_b) = (
        plain_handle(&a, svc.addr).await,
        plain_handle(&b, svc.addr).await,
    );

    // Job A cannot write, read or update job B's region: the same
    // refusal as for a key that does not exist.
    let w =
        to(a.ep.write(to_svc_a, Bytes::from_static(b"from a"), 0, b_only.key())).await;
    assert_eq!(w.unwrap_err().err, Error::Access);
    let r = to(a.ep.read(to_svc_a, BytesMut::zeroed(8), 0, b_only.key())).await;
    assert_eq!(r.unwrap_err().err, Error::Access);
    assert_eq!(b_only.to_vec().unwrap(), vec![0; 64], "nothing written");

    // Job B can; both reach the region without a key.
    to(b.ep.write(to_svc_b, Bytes::from_static(b"from b"), 0, b_only.key()))
        .await
        .unwrap();
    assert_eq!(&b_only.to_vec().unwrap()[..6], b"from b");
    to(a.ep.write(to_svc_a, Bytes::from_static(b"a"), 0, anyone.key()))
        .await
        .unwrap();
    to(b.ep.write(to_svc_b, Bytes::from_static(b"b"), 1, anyone.key()))
        .await
        .unwrap();
    assert_eq!(&anyone.to_vec().unwrap()[..2], b"ab");

    // The same by key handle (FI_AUTH_KEY on fi_mr_regattr).
    let by_handle = d
        .mr_regattr(
            MrAttr::alloc(64, rw)
                .requested_key(3)
                .av_auth_key(&svc.av, keys[1]),
        )
        .unwrap();
    let w =
        to(a.ep.write(to_svc_a, Bytes::from_static(b"a"), 0, by_handle.key())).await;
    assert_eq!(w.unwrap_err().err, Error::Access);
    to(b.ep.write(to_svc_b, Bytes::from_static(b"b"), 0, by_handle.key()))
        .await
        .unwrap();
    assert_eq!(&by_handle.to_vec().unwrap()[..1], b"b");
    let bad = d.mr_regattr(MrAttr::alloc(8, rw).av_auth_key(&svc.av, 99));
    assert_eq!(bad.err().map(|e| e.error), Some(Error::Inval));
}

#[tokio::test]
async fn bad_keys_handles_and_flags_are_refused() {
    let d = av_key_domain();
    let av = d.av(AvAttr::default()).unwrap();
    assert_eq!(av.insert_auth_key(b""), Err(Error::Inval));
    assert_eq!(av.insert_auth_key(&[7; 65]), Err(Error::Inval));
    let k = av.insert_auth_key(JOB_A).unwrap();
    assert_eq!(av.lookup_auth_key(k, AvFlags::AUTH_KEY).unwrap(), JOB_A);
    let mut short = [0u8; 3];
    assert_eq!(
        av.lookup_auth_key_into(k, AvFlags::AUTH_KEY, &mut short),
        Ok(JOB_A.len())
    );
    assert_eq!(&short, &JOB_A[..3]);
    assert_eq!(av.lookup_auth_key(k, AvFlags::EVENT), Err(Error::BadFlags));
    let addr = weft::encode_sockaddr(&"127.0.0.1:9".parse().unwrap());
    // Unknown key handle; per-insert user ids (fi_av(3) refuses them
    // on these domains); the AUTH_KEY flag on a plain insert.
    assert_eq!(
        av.insert_with_auth_key(std::slice::from_ref(&addr), 99, AvFlags::empty(), 0)
            .err(),
        Some(Error::Inval)
    );
    assert_eq!(
        av.insert_with_user_ids(std::slice::from_ref(&addr), &[1], AvFlags::empty(), 0)
            .err(),
        Some(Error::Inval)
    );
    assert_eq!(
        av.insert(std::slice::from_ref(&addr), AvFlags::AUTH_KEY, 0)
            .err(),
        Some(Error::BadFlags)
    );
    let plain = av
        .insert_sync(std::slice::from_ref(&addr), AvFlags::empty())
        .unwrap();
    assert_eq!(
        av.lookup_auth_key(plain.fi_addrs[0], AvFlags::empty()),
        Err(Error::NoKey)
    );
    let keyed = av
        .insert_with_auth_key(&[addr], k, AvFlags::empty(), 0)
        .unwrap()
        .now()
        .unwrap();
    assert_eq!(
        av.lookup_auth_key(keyed.fi_addrs[0], AvFlags::empty())
            .unwrap(),
        JOB_A
    );
    assert_eq!(
        av.set_auth_key_user_id(k, 5),
        Err(Error::Inval),
        "no FI_AV_USER_ID"
    );
    assert_eq!(av.remove_auth_keys(&[99]), Err(Error::Inval));

    // An RDM endpoint of such a domain takes no key of its own.
    let mut i = d.info().clone();
    i.ep_attr.auth_key = Some(JOB_A.to_vec());
    assert_eq!(d.endpoint(&i).err(), Some(Error::Inval));

    // A domain with a key and FI_AV_AUTH_KEY both; AV keys on a plain
    // domain; a region key of the wrong size.
    let mut i = d.info().clone();
    i.domain_attr.auth_key = Some(JOB_A.to_vec());
    let fabric = d.fabric();
    assert_eq!(fabric.domain(&i).err(), Some(Error::Inval));
    let mut h = hints();
    h.domain_attr.av_auth_key = true;
    h.domain_attr.auth_key = Some(JOB_A.to_vec());
    assert!(weft::getinfo(Some(&h)).map_or(true, |v| v.is_empty()));
    let (plain_d, _) = client_domain(JOB_A);
    let plain_av = plain_d.av(AvAttr::default()).unwrap();
    assert_eq!(plain_av.insert_auth_key(JOB_A), Err(Error::Inval));
    let bad = d.mr_regattr(MrAttr::alloc(8, MrAccess::REMOTE_READ).auth_key(b""));
    assert_eq!(bad.err().map(|e| e.error), Some(Error::Inval));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receives_directed_by_key_take_only_that_jobs_messages() {
    let d = av_key_domain();
    assert!(d.info().caps.contains(weft::Caps::DIRECTED_RECV));
    let (svc, keys) = open(&d, d.info(), &[JOB_A, JOB_B]);
    let (ka, kb) = (keys[0], keys[1]);
    let (a1, a2, b) = (client(JOB_A), client(JOB_A), client(JOB_B));
    let mut at_svc = Vec::new();
    let mut to_svc = Vec::new();
    for (c, k) in [(&a1, ka), (&a2, ka), (&b, kb)] {
        at_svc.push(keyed_handle(&svc, c.addr, k));
        to_svc.push(plain_handle(c, svc.addr).await);
    }
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

    // A key the endpoint does not hold, no key, or a domain without AV
    // keys: refused.
    let kc = svc.av.insert_auth_key(JOB_C).unwrap();
    let by_key = weft_integration::by_key;
    let r = svc
        .ep
        .recvmsg(by_key(kc, 1, 0), weft::OpFlags::AUTH_KEY)
        .await;
    assert_eq!(r.unwrap_err().err, Error::Inval);
    let r = svc
        .ep
        .recvmsg(by_key(FI_ADDR_UNSPEC, 1, 0), weft::OpFlags::AUTH_KEY)
        .await;
    assert_eq!(r.unwrap_err().err, Error::Inval);
    let r = a1
        .ep
        .recvmsg(by_key(0, 1, 0), weft::OpFlags::AUTH_KEY)
        .await;
    assert_eq!(r.unwrap_err().err, Error::BadFlags);
}
