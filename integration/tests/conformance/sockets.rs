//! The socket endpoint types (`FI_EP_SOCK_STREAM`, `FI_EP_SOCK_DGRAM`),
//! for every provider: one that offers a type carries bytes through it
//! (a stream round trip with its end; datagrams both ways), and one that
//! does not has no offer for it and opens no endpoint of it (`NoSys`).
//! The deeper cases are `tests/sock_stream.rs` and `tests/sock_dgram.rs`.

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use weft::{EpType, Error, Info};
use weft_integration::{next_eq, within, Harness, Provider};

/// A provider without `ep_type`: no offer, and an endpoint of that type
/// built from its other offer does not open.
fn refused(p: &Provider, ep_type: EpType) {
    assert!(
        p.try_info(ep_type).is_none(),
        "{} offers {ep_type:?}",
        p.name
    );
    let h = Harness::connless(p);
    let mut i = h.info.clone();
    i.ep_attr.ep_type = ep_type;
    let opened = h.domain.endpoint(&i).and_then(|ep| {
        if ep_type == EpType::SockStream {
            ep.bind_eq(&h.eq())?;
        } else {
            ep.bind_av(&h.av())?;
            ep.bind_cq(&h.cq(), weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)?;
        }
        ep.enable()
    });
    assert_eq!(opened.unwrap_err(), Error::NoSys, "{} {ep_type:?}", p.name);
}

/// `FI_EP_SOCK_STREAM`: 1 MB each way through one connection, each side
/// reading to the other's end.
async fn sock_stream_carries_bytes_or_is_refused(p: Provider) {
    let Some(info) = p.try_info(EpType::SockStream) else {
        refused(&p, EpType::SockStream);
        return;
    };
    let (mut c, mut s) = stream_pair(&info).await;
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    let (got_s, got_c) = weft_integration::trade_both_ways(&mut c, &mut s, &data).await;
    assert_eq!(got_c, data);
    assert_eq!(got_s, data);
}

async fn stream_pair(info: &Info) -> (weft::SockStream, weft::SockStream) {
    let fabric = weft::Fabric::open(info).unwrap();
    let domain = fabric.domain(info).unwrap();
    let pep = fabric.passive_endpoint(info, None).unwrap();
    let peq = fabric.eq(8).unwrap();
    pep.bind_eq(&peq).unwrap();
    pep.listen().unwrap();
    let (cep, ceq) = (domain.endpoint(info).unwrap(), fabric.eq(8).unwrap());
    cep.bind_eq(&ceq).unwrap();
    let to = pep.local_addr().unwrap();
    let c2 = cep.clone();
    let conn = tokio::spawn(async move { c2.connect(to, Vec::new()).await });
    let ev = within("connreq", next_eq(&peq)).await.unwrap();
    let req = weft::ConnRequest::from_event(&ev).unwrap();
    let sep = domain.accept_endpoint(info, &req).unwrap();
    let seq = fabric.eq(8).unwrap();
    sep.bind_eq(&seq).unwrap();
    within("accept", sep.accept(Vec::new())).await.unwrap();
    within("connect", conn).await.unwrap().unwrap();
    (cep.stream().unwrap(), sep.stream().unwrap())
}

/// `FI_EP_SOCK_DGRAM`: datagrams both ways between two endpoints, with
/// their sources.
async fn sock_dgram_carries_datagrams_or_is_refused(p: Provider) {
    let Some(info) = p.try_info(EpType::SockDgram) else {
        refused(&p, EpType::SockDgram);
        return;
    };
    let h = Harness::with_info(&p, info.clone());
    let (a, b, b_in_a, a_in_b) = h.rdm_pair_with(&info);
    let (mut da, mut db) = (a.ep.datagrams().unwrap(), b.ep.datagrams().unwrap());
    for i in 0..50u8 {
        let payload = Bytes::from(vec![i; usize::from(i) * 7]);
        da.send((b_in_a, payload.clone())).await.unwrap();
        let got = within("datagram", db.next()).await.unwrap().unwrap();
        assert_eq!((&got.data[..], got.src), (&payload[..], a_in_b));
        db.send((a_in_b, payload.clone())).await.unwrap();
        let got = within("datagram back", da.next()).await.unwrap().unwrap();
        assert_eq!((&got.data[..], got.src), (&payload[..], b_in_a));
    }
}

provider_tests! {
    sock_stream_carries_bytes_or_is_refused,
    sock_dgram_carries_datagrams_or_is_refused,
}

udp_tests! {
    sock_stream_carries_bytes_or_is_refused,
    sock_dgram_carries_datagrams_or_is_refused,
}

shm_tests! {
    sock_stream_carries_bytes_or_is_refused,
    sock_dgram_carries_datagrams_or_is_refused,
}
