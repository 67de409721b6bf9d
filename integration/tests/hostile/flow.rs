//! Flow control and credits: an unexpected-message flood held back, not
//! dropped, and transmit credits returned by every kind of send.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{OpFlags, SendMsg, FI_ADDR_UNSPEC};

use super::{addr_of, assert_alive, open, setup, to, T};

/// Messages beyond the unexpected-message budget are held back by the
/// sender's connection (the reader parks), not dropped: once receives are
/// posted every one arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unexpected_flood_is_flow_controlled_not_lost() {
    let (domain, info) = setup();
    let mut small = info.clone();
    small.rx_attr.total_buffered_recv = 4096;
    let victim = open(&domain, &small);
    let good = open(&domain, &info);
    let dest = addr_of(&good, &victim);

    const N: usize = 600;
    const LEN: usize = 1024;
    let sent = Arc::new(AtomicUsize::new(0));
    let sender = {
        let ep = good.ep.clone();
        let sent = sent.clone();
        tokio::spawn(async move {
            for i in 0..N {
                let mut p = vec![(i % 251) as u8; LEN];
                p[..8].copy_from_slice(&(i as u64).to_le_bytes());
                to(ep.tsend(dest, Bytes::from(p), i as u64)).await.unwrap();
                sent.fetch_add(1, Ordering::Release);
            }
        })
    };
    // Let far more than the budget go out before anything is posted.
    to(async {
        while sent.load(Ordering::Acquire) < 64 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;

    for i in 0..N {
        let got = to(victim
            .ep
            .trecv(BytesMut::zeroed(LEN), FI_ADDR_UNSPEC, 0, u64::MAX))
        .await
        .unwrap();
        assert_eq!(got.tag, i as u64, "out of order or lost");
        let b = got.into_bytes();
        assert_eq!(b.len(), LEN);
        assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), i as u64);
        assert!(b[8..].iter().all(|&x| x == (i % 251) as u8));
    }
    to(sender).await.unwrap();
    assert_alive(&victim, &good, 1 << 40).await;
}

/// Transmit credits balance: delivery-complete sends (which make the
/// receiver send Acks), plain sends and failed sends all give back exactly
/// what they took.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transmit_credits_return_after_every_kind_of_send() {
    let (domain, info) = setup();
    let a = open(&domain, &info);
    let b = open(&domain, &info);
    let to_b = addr_of(&a, &b);
    let size = info.tx_attr.size;
    assert_eq!(a.ep.tx_size_left().unwrap(), size);

    const N: u64 = 100;
    let sends = async {
        for i in 0..N {
            let msg = SendMsg {
                dest: to_b,
                iov: vec![Bytes::from(vec![1u8; 100])],
                tag: Some(i),
                ..SendMsg::default()
            };
            a.ep.sendmsg(msg, OpFlags::DELIVERY_COMPLETE).await.unwrap();
        }
    };
    let recvs = async {
        for i in 0..N {
            let e =
                b.ep.trecv(BytesMut::zeroed(100), FI_ADDR_UNSPEC, i, 0)
                    .await
                    .unwrap();
            assert_eq!(e.len, 100);
        }
    };
    to(async { tokio::join!(sends, recvs) }).await;
    assert_eq!(a.ep.tx_size_left().unwrap(), size);
    // b sent N Acks: control frames, which must not have moved its count.
    assert_eq!(b.ep.tx_size_left().unwrap(), size);
    assert_eq!(b.ep.rx_size_left().unwrap(), info.rx_attr.size);

    // Delivery-complete to a message that arrives before its receive.
    let early = a.ep.sendmsg(
        SendMsg {
            dest: to_b,
            iov: vec![Bytes::from_static(b"early")],
            tag: Some(9999),
            ..SendMsg::default()
        },
        OpFlags::DELIVERY_COMPLETE,
    );
    to(early).await.unwrap();
    let e = to(b.ep.trecv(BytesMut::zeroed(8), FI_ADDR_UNSPEC, 9999, 0))
        .await
        .unwrap();
    assert_eq!(&e.into_bytes()[..], b"early");

    // Sends to an address nobody listens on fail, and give back credits.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let nowhere =
        a.av.insert_sync(&[weft::encode_sockaddr(&dead)], Default::default())
            .unwrap()
            .fi_addrs[0];
    for i in 0..10 {
        a.ep.post_tsend(nowhere, Bytes::from_static(b"x"), 0, 500 + i)
            .unwrap();
    }
    for _ in 0..10 {
        let item = to(a.cq.next_timeout(T)).await.expect("no completion");
        assert!(item.is_err());
    }
    assert_eq!(a.ep.tx_size_left().unwrap(), size);
    assert_alive(&b, &a, 4242).await;
    assert_eq!(a.ep.tx_size_left().unwrap(), size);
}
