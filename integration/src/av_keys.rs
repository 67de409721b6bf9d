//! Endpoints whose AV holds their authorization keys (`FI_AV_AUTH_KEY`),
//! as the keys-in-the-AV tests of every provider build them.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{
    AddressVector, AvAttr, AvFlags, CompletionQueue, Domain, Error, EventQueue, FiAddr, OpFlags,
    WaitMode, FI_ADDR_UNSPEC,
};

/// Inserts `peer` into `av` under the key handle `key`: its entry.
pub fn insert_keyed(av: &AddressVector, peer: SocketAddr, key: FiAddr) -> FiAddr {
    insert_keyed_raw(av, weft::encode_sockaddr(&peer), key)
}

/// Inserts the raw address `bytes` (a provider's own form) into `av`
/// under the key handle `key`: its entry.
pub fn insert_keyed_raw(av: &AddressVector, bytes: Vec<u8>, key: FiAddr) -> FiAddr {
    let r = av
        .insert_with_auth_key(&[bytes], key, AvFlags::empty(), 0)
        .unwrap()
        .now()
        .unwrap();
    r.results[0].unwrap()
}

/// An enabled endpoint of an `FI_AV_AUTH_KEY` domain, its AV, CQ and EQ,
/// and its address.
#[derive(Debug)]
pub struct AvKeyEp {
    /// The endpoint.
    pub ep: weft::Endpoint,
    /// Its AV (keys and peers).
    pub av: AddressVector,
    /// Its CQ, both directions.
    pub cq: CompletionQueue,
    /// Its EQ (refusals are reported there).
    pub eq: EventQueue,
    /// Its address.
    pub addr: SocketAddr,
}

impl AvKeyEp {
    /// An endpoint whose AV holds `keys` when it is enabled; their
    /// handles in order.
    pub fn open(d: &Domain, keys: &[&[u8]]) -> (AvKeyEp, Vec<FiAddr>) {
        let av = d.av(AvAttr::default()).unwrap();
        let handles = keys
            .iter()
            .map(|k| av.insert_auth_key(k).unwrap())
            .collect();
        let eq = d.fabric().eq(64).unwrap();
        let (ep, cq) =
            crate::enabled_endpoint_with_eq(d, d.info(), &av, Some(&eq), WaitMode::Interrupt);
        let addr = weft::decode_sockaddr(&ep.local_addr().unwrap()).unwrap();
        (
            AvKeyEp {
                ep,
                av,
                cq,
                eq,
                addr,
            },
            handles,
        )
    }

    /// `peer`'s entry under the key handle `key`.
    pub fn keyed(&self, peer: SocketAddr, key: FiAddr) -> FiAddr {
        insert_keyed(&self.av, peer, key)
    }

    /// `peer`'s entry under no key.
    pub fn plain(&self, peer: SocketAddr) -> FiAddr {
        self.av
            .insert_sync(&[weft::encode_sockaddr(&peer)], AvFlags::empty())
            .unwrap()
            .fi_addrs[0]
    }
}

/// `from` sends a tagged message to `dest`; `to` takes it and reports
/// `src` as its source. Fails after `limit`.
pub async fn delivered_within(
    limit: Duration,
    (from, dest): (&AvKeyEp, FiAddr),
    (to, src): (&AvKeyEp, FiAddr),
    tag: u64,
) {
    let recv = to.ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, tag, 0);
    let body = Bytes::from(tag.to_le_bytes().to_vec());
    let both = async { tokio::join!(recv, from.ep.tsend(dest, body, tag)) };
    let (got, sent) = tokio::time::timeout(limit, both)
        .await
        .expect("a delivery timed out");
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!(got.src, src, "the source under the proven key");
    assert_eq!(&got.into_bytes()[..], &tag.to_le_bytes());
}

/// Receives directed by a key `ep` does not hold (`not_held`), or by no
/// key, are `Inval`.
pub async fn directed_by_unheld_keys_refused(ep: &weft::Endpoint, not_held: FiAddr) {
    for k in [not_held, FI_ADDR_UNSPEC] {
        let r = ep.recvmsg(crate::by_key(k, 1, 0), OpFlags::AUTH_KEY).await;
        assert_eq!(r.unwrap_err().err, Error::Inval, "key {k:#x}");
    }
}
