//! tcp RDM connections retired while idle (`FI_TCP_IDLE_TIMEOUT`) lose
//! and reorder nothing: a peer that starts sending just as the other end
//! retires their connection has its messages delivered once each, in
//! order, whether they left on the old connection or on the new one, and
//! every send completes without error (delivery-complete ones too).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::join_all;
use futures::FutureExt;
use weft::{AvAttr, Caps, EpType, Info, OpFlags, SendMsg};
use weft_core::limits::ConnLimits;

const IDLE: Duration = Duration::from_millis(60);
const ROUNDS: u64 = 40;
const BURST: u64 = 48;

fn open(
    domain: &weft::Domain,
    info: &Info,
    limits: ConnLimits,
) -> (weft::Endpoint, weft::AddressVector) {
    let av = domain.av(AvAttr::default()).unwrap();
    let ep = domain.endpoint(info).unwrap();
    ep.set_conn_limits(limits).unwrap();
    let cq = domain.cq(weft::CqAttr::default()).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, weft::BindFlags::TRANSMIT | weft::BindFlags::RECV)
        .unwrap();
    ep.enable().unwrap();
    (ep, av)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retiring_idle_connections_loses_and_reorders_nothing() {
    bursts_around_the_idle_timeout(None).await;
}

/// The same over TLS: the peer's half-close ends a TLS stream without
/// `close_notify`, which must read as the stream's end, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retiring_idle_tls_connections_loses_and_reorders_nothing() {
    let pki = weft_integration::tls::TestPki::new();
    let files = pki.issue("retire-ca");
    bursts_around_the_idle_timeout(Some(files)).await;
}

/// Bursts sent at moments around the idle timeout, in both directions:
/// some go out while the connection is being retired.
async fn bursts_around_the_idle_timeout(tls: Option<weft::TlsFiles>) {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = Caps::MSG;
    hints.fabric_attr.prov_name = Some("tcp".into());
    hints.domain_attr.tls = tls;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let short = ConnLimits::default()
        .with_idle_timeout(Some(IDLE))
        .with_stall_timeout(Duration::from_secs(2));
    let (a, a_av) = open(&domain, &info, short);
    let (b, b_av) = open(&domain, &info, short);
    let b_in_a = a_av
        .insert_sync(&[b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let a_in_b = b_av
        .insert_sync(&[a.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    let mut seq = 0u64;
    let mut retired = 0;
    for round in 0..ROUNDS {
        // 0.7x to 1.5x the idle timeout, spread over the rounds (bursts
        // that may meet a connection being retired), and every fourth
        // round 4x (a connection surely retired, even on a loaded host).
        let pause = if round % 4 == 3 {
            IDLE * 4
        } else {
            IDLE.mul_f64(0.7 + 0.8 * (round as f64 / ROUNDS as f64))
        };
        tokio::time::sleep(pause).await;
        if a.stats().unwrap().conns + b.stats().unwrap().conns < 2 {
            retired += 1;
        }
        let (from, to, dest) = if round % 3 == 2 {
            (&a, &b, b_in_a)
        } else {
            (&b, &a, a_in_b)
        };
        let first = seq;
        // Every eighth delivery-complete: its completion waits for the
        // peer's ack, which a retirement must not lose either.
        let sends: Vec<_> = (0..BURST)
            .map(|k| {
                let payload = Bytes::copy_from_slice(&(first + k).to_le_bytes());
                if k % 8 == 7 {
                    let msg = SendMsg {
                        dest,
                        iov: vec![payload],
                        ..SendMsg::default()
                    };
                    from.sendmsg(msg, OpFlags::DELIVERY_COMPLETE).boxed()
                } else {
                    from.send(dest, payload).boxed()
                }
            })
            .collect();
        let recvs = async {
            for k in 0..BURST {
                let got = to.recv(BytesMut::zeroed(8)).await.unwrap();
                let n = u64::from_le_bytes(got.into_bytes()[..8].try_into().unwrap());
                assert_eq!(n, first + k, "round {round}: out of order or lost");
            }
        };
        let (sent, ()) = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(join_all(sends), recvs)
        })
        .await
        .unwrap_or_else(|_| {
            // What each end holds, for the next one to read this.
            panic!(
                "round {round} timed out; a: {:?}; b: {:?}",
                a.stats(),
                b.stats()
            )
        });
        for s in sent {
            s.unwrap();
        }
        seq += BURST;
    }
    assert!(
        retired >= ROUNDS / 8,
        "only {retired} of {ROUNDS} bursts met a retired connection"
    );
    // Nothing extra arrived at either end.
    for ep in [&a, &b] {
        let r =
            tokio::time::timeout(Duration::from_millis(200), ep.recv(BytesMut::zeroed(8))).await;
        assert!(r.is_err(), "a message arrived twice");
    }
}
