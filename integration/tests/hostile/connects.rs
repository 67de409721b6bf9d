//! Connection set-up corners: simultaneous connects, sending to oneself,
//! a second connection claiming a live identity.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::FI_ADDR_UNSPEC;
use weft_integration::identity::Identity;

use super::wait_modes::exchange;
use super::{addr_of, assert_alive, expect_closed, hello_as, open, setup, sockaddr, to, T};

/// Both endpoints send to each other first, at the same moment, so both
/// connect at once and one connection must give way. Repeated on fresh
/// pairs to meet the race from both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn simultaneous_connect_loses_and_duplicates_nothing() {
    let (domain, info) = setup();
    for round in 0..20 {
        let a = open(&domain, &info);
        let b = open(&domain, &info);
        let to_b = addr_of(&a, &b);
        let to_a = addr_of(&b, &a);
        // Post everything from both sides before any connection can exist.
        const N: u64 = 50;
        for i in 0..N {
            a.ep.post_tsend(to_b, Bytes::from(i.to_le_bytes().to_vec()), i, i)
                .unwrap();
            b.ep.post_tsend(to_a, Bytes::from(i.to_le_bytes().to_vec()), i, i)
                .unwrap();
        }
        for ep in [&a, &b] {
            let mut got = Vec::new();
            while got.len() < N as usize {
                let e = to(ep
                    .ep
                    .trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 0, u64::MAX))
                .await
                .unwrap();
                got.push(e.tag);
            }
            assert_eq!(got, (0..N).collect::<Vec<_>>(), "round {round}");
        }
        // Each send completed exactly once, successfully.
        for ep in [&a, &b] {
            let mut ctxs = Vec::new();
            while ctxs.len() < N as usize {
                let item = to(ep.cq.next_timeout(T))
                    .await
                    .expect("missing send completion");
                ctxs.push(item.unwrap().context);
            }
            ctxs.sort_unstable();
            assert_eq!(ctxs, (0..N).collect::<Vec<_>>());
            assert!(ep.cq.is_empty());
            assert_eq!(ep.ep.tx_size_left().unwrap(), info.tx_attr.size);
        }
        exchange(&a, &b, 10, 16, 100).await;
    }
}

/// An endpoint sending to its own address: both ends of the connection
/// belong to one endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_to_self() {
    let (domain, info) = setup();
    let a = open(&domain, &info);
    let me = addr_of(&a, &a);
    for i in 0..50u64 {
        let recv = a.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, i, 0);
        let send = a.ep.tsend(me, Bytes::from(i.to_le_bytes().to_vec()), i);
        let (got, sent) = to(async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        assert_eq!(&got.unwrap().into_bytes()[..], &i.to_le_bytes());
    }
    assert_eq!(a.ep.tx_size_left().unwrap(), info.tx_attr.size);
}

/// A second connection claiming the identity of a live one either is
/// refused or replaces it (which closes the first): either way the
/// endpoint keeps working. Both orders of the identities are tried, so
/// both outcomes are met.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_connection_from_same_identity() {
    let (domain, info) = setup();
    let victim = open(&domain, &info);
    let good = open(&domain, &info);
    let va = sockaddr(&victim);
    let mut replaced = 0;
    // Identities whose address compares below and above the victim's (the
    // simultaneous-connect rule decides by that order).
    let (mut below, mut above) = (None, None);
    for _ in 0..1000 {
        let id = Identity::new().await.unwrap();
        let lower = weft::encode_sockaddr(&id.addr()) < weft::encode_sockaddr(&va);
        match lower {
            true if below.is_none() => below = Some(id),
            false if above.is_none() => above = Some(id),
            _ => {}
        }
        if below.is_some() && above.is_some() {
            break;
        }
    }
    let idents = [below.expect("a lower port"), above.expect("a higher port")];
    for (i, ident) in idents.iter().enumerate() {
        let (first, st) = hello_as(va, ident).await;
        assert_eq!(st, 0);
        // The victim answers the first handshake before it attaches the
        // connection, and refuses a second one that comes meanwhile (two
        // handshakes of one identity in flight): the lower identity, the
        // one that may replace, tries again until the first has settled.
        for attempt in 0..50 {
            let (second, st) = hello_as(va, ident).await;
            if st == 0 {
                replaced += 1;
                expect_closed(first).await;
                break;
            }
            expect_closed(second).await;
            if i == 1 || attempt == 49 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_alive(&victim, &good, i as u64).await;
    }
    assert!(replaced >= 1, "the replacing path was not reached");
}
