//! `FI_SOURCE_ERR` on tcp RDM: a message from a sender that is not in the
//! receiver's AV completes as an `FI_EADDRNOTAVAIL` error entry that
//! carries the message and the sender's address; nothing is lost, and
//! once the sender is inserted its messages complete normally. On an
//! `FI_AV_AUTH_KEY` endpoint the error names the key the sender proved
//! (its handle, or its user id). Only hints that ask for the cap get it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, AvFlags, Caps, CompletionQueue, Domain, EpType, Error, FiAddr, Info,
    WaitMode, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC,
};

const T: Duration = Duration::from_secs(10);

async fn to<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(T, f).await.expect("timed out")
}

fn hints(caps: Caps) -> Info {
    let mut h = Info::default();
    h.ep_attr.ep_type = EpType::Rdm;
    h.caps = caps;
    h.fabric_attr.prov_name = Some("tcp".into());
    h
}

fn domain(h: &Info) -> Domain {
    let i = weft::getinfo(Some(h)).unwrap().remove(0);
    weft::Fabric::open(&i).unwrap().domain(&i).unwrap()
}

struct Ep {
    ep: weft::Endpoint,
    av: AddressVector,
    _cq: CompletionQueue,
    addr: SocketAddr,
}

fn open(d: &Domain, info: &Info, attr: AvAttr, keys: &[&[u8]]) -> (Ep, Vec<FiAddr>) {
    let av = d.av(attr).unwrap();
    let handles = keys
        .iter()
        .map(|k| av.insert_auth_key(k).unwrap())
        .collect();
    let eq = d.fabric().eq(16).unwrap();
    let (ep, cq) =
        weft_integration::enabled_endpoint_with_eq(d, info, &av, Some(&eq), WaitMode::Interrupt);
    let addr = weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap();
    let ep = Ep {
        ep,
        av,
        _cq: cq,
        addr,
    };
    (ep, handles)
}

async fn handle(from: &Ep, of: SocketAddr) -> FiAddr {
    let bytes = weft::encode_sockaddr(&of);
    to(from.av.insert(&[bytes], AvFlags::empty(), 0).unwrap())
        .await
        .fi_addrs[0]
}

/// `from` sends `body` tagged `tag` to `dest`; what `at`'s receive got.
async fn send_recv(
    from: &Ep,
    dest: FiAddr,
    at: &Ep,
    tag: u64,
    body: &'static [u8],
) -> Result<weft::CqEntry, weft::CqErrEntry> {
    let recv = at.ep.trecv(BytesMut::zeroed(64), FI_ADDR_UNSPEC, tag, 0);
    let send = from.ep.tsend(dest, Bytes::from_static(body), tag);
    let (got, sent) = to(async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_senders_are_errors_that_carry_the_message_and_address() {
    let h = hints(Caps::TAGGED | Caps::SOURCE | Caps::SOURCE_ERR);
    let d = domain(&h);
    assert!(d.info().caps.contains(Caps::SOURCE_ERR));
    let (rx, _) = open(&d, d.info(), AvAttr::default(), &[]);
    let (tx, _) = open(&d, d.info(), AvAttr::default(), &[]);
    let dest = handle(&tx, rx.addr).await;

    // Unknown: an error entry with the bytes, the length and the
    // sender's address; the source is not available.
    let e = send_recv(&tx, dest, &rx, 1, b"who am i").await.unwrap_err();
    assert_eq!(e.err, Error::AddrNotAvail);
    assert_eq!(e.src, FI_ADDR_NOTAVAIL);
    assert_eq!(e.len, 8);
    assert_eq!(&e.bufs[0][..8], b"who am i");
    assert_eq!(e.err_data, weft::encode_sockaddr(&tx.addr));

    // Inserted from the address the error gave: an ordinary completion.
    let known = to(rx
        .av
        .insert(std::slice::from_ref(&e.err_data), AvFlags::empty(), 0)
        .unwrap())
    .await
    .fi_addrs[0];
    let ok = send_recv(&tx, dest, &rx, 2, b"known").await.unwrap();
    assert_eq!(ok.src, known);
    assert_eq!(&ok.into_bytes()[..], b"known");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_asking_unknown_senders_complete_as_before() {
    let h = hints(Caps::TAGGED | Caps::SOURCE);
    let d = domain(&h);
    assert!(!d.info().caps.contains(Caps::SOURCE_ERR), "only on request");
    let (rx, _) = open(&d, d.info(), AvAttr::default(), &[]);
    let (tx, _) = open(&d, d.info(), AvAttr::default(), &[]);
    let dest = handle(&tx, rx.addr).await;
    let ok = send_recv(&tx, dest, &rx, 1, b"anon").await.unwrap();
    assert_eq!(ok.src, FI_ADDR_NOTAVAIL);

    // FI_SOURCE_ERR without FI_SOURCE matches nothing and is refused.
    let bad = hints(Caps::TAGGED | Caps::SOURCE_ERR);
    assert!(weft::getinfo(Some(&bad)).map_or(true, |v| v.is_empty()));
    let mut i = d.info().clone();
    i.caps = (i.caps - Caps::SOURCE) | Caps::SOURCE_ERR;
    assert_eq!(d.endpoint(&i).err(), Some(Error::Inval));
    // MSG endpoints do not offer it.
    let mut i = d.info().clone();
    i.ep_attr.ep_type = EpType::Msg;
    i.caps |= Caps::SOURCE_ERR;
    assert_eq!(d.endpoint(&i).err(), Some(Error::NoSys));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_av_key_endpoints_the_error_names_the_proven_key() {
    let mut h = hints(Caps::TAGGED | Caps::SOURCE | Caps::SOURCE_ERR);
    h.domain_attr.av_auth_key = true;
    let d = domain(&h);
    for user_ids in [false, true] {
        let attr = AvAttr {
            flags: if user_ids {
                AvFlags::AV_USER_ID
            } else {
                AvFlags::empty()
            },
            ..AvAttr::default()
        };
        let (rx, keys) = open(&d, d.info(), attr, &[b"job key"]);
        if user_ids {
            rx.av.set_auth_key_user_id(keys[0], 4242).unwrap();
        }
        // The sender proves the key with its own endpoint key.
        let mut ch = hints(Caps::TAGGED | Caps::SOURCE);
        ch.ep_attr.auth_key = Some(b"job key".to_vec());
        let cd = domain(&ch);
        let (tx, _) = open(&cd, cd.info(), AvAttr::default(), &[]);
        let dest = handle(&tx, rx.addr).await;
        let e = send_recv(&tx, dest, &rx, 1, b"keyed").await.unwrap_err();
        assert_eq!(e.err, Error::AddrNotAvail);
        let want = if user_ids { 4242 } else { keys[0] };
        assert_eq!(e.src, want);
        assert_eq!(e.err_data, weft::encode_sockaddr(&tx.addr));
        assert_eq!(&e.bufs[0][..5], b"keyed");
    }
}
