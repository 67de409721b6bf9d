//! shm shared pools: buffers of `Domain::buffer_pool` live in a sealed
//! memfd a peer may map, so a large message sent from one is read by the
//! receiver with plain copies from its mapping (and a split part written
//! into a pool receive the same way), no system call per message. Every
//! combination of pool and plain buffers on either side arrives whole
//! in every wait mode; the mapped path is taken whenever the sender's
//! buffer is a pool's (counted by `weft_shm::pool::mapped_copies`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::BytesMut;
use weft::{BufferPool, EpType, WaitMode};
use weft_integration::{payload, within, Harness, Provider};

mod shm_common;

/// Whether pools are shared here (CMA permitted outright), said when
/// not.
fn shared() -> bool {
    let ok = weft_shm::pool::enabled();
    if !ok {
        eprintln!("CMA not permitted here: pools are plain memory");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_messages_arrive_whole_through_the_mapping() {
    for mode in [WaitMode::BusyPoll, WaitMode::Inline, WaitMode::Interrupt] {
        let h = Harness::new(&Provider::named("shm"), EpType::Rdm);
        let (a, _acq, b, _bcq, b_in_a) = shm_common::two(&h, &h.info, mode);
        let big = 1 << 20;
        let pool: BufferPool = h.domain.buffer_pool(4, big).expect("pool");
        for (round, len) in [(0u8, 64), (1, 40 << 10), (2, 300 << 10), (3, big)] {
            // Pool to pool, pool to plain, plain to pool.
            for (send_pool, recv_pool) in [(true, true), (true, false), (false, true)] {
                let msg = payload(len, round);
                let before = weft_shm::pool::mapped_copies();
                let recv = async {
                    if recv_pool {
                        let mut buf = pool.get().await.expect("get");
                        buf.set_len(len).expect("len");
                        let r = b.recv_pooled(buf).await.expect("recv");
                        r.buf.to_vec()
                    } else {
                        let c = b.recv(BytesMut::zeroed(len)).await.expect("recv");
                        c.into_bytes().to_vec()
                    }
                };
                let a2 = a.clone();
                let (pool2, msg2) = (pool.clone(), msg.clone());
                // The send in a task of its own: in inline mode the task
                // awaiting an operation drives its endpoint.
                let send = tokio::spawn(async move {
                    if send_pool {
                        let mut buf = pool2.get().await.expect("get");
                        buf.set_len(msg2.len()).expect("len");
                        buf.copy_from_slice(&msg2);
                        a2.send_pooled(b_in_a, buf).await.map(|_| ())
                    } else {
                        a2.send(b_in_a, msg2).await.map(|_| ())
                    }
                });
                let (got, sent) = within("pool message", async { tokio::join!(recv, send) }).await;
                sent.unwrap().expect("send");
                assert!(
                    got == msg[..],
                    "{mode:?} {len} B pool {send_pool}/{recv_pool}"
                );
                // A message that goes by CMA in every mode (split-able,
                // past 256 KiB), from a pool, is read through the mapping
                // (the receiver's part at least).
                if shared() && send_pool && len >= 256 << 10 {
                    let after = weft_shm::pool::mapped_copies();
                    assert!(
                        after > before,
                        "{mode:?} {len} B: not read through the mapping"
                    );
                }
            }
        }
        if shared() && mode == WaitMode::BusyPoll {
            // A plain send into a pool receive: the sender's part, when it
            // takes it, is written through its mapping of the receiver's
            // pool — the only mapped copy of such a message. A busy-poll
            // sender's thread is awake for the offer, but a loaded
            // machine can keep it off a core for the whole of the
            // receiver's half, round after round: the receiver waits for
            // the take (bounded; an offer not taken is still copied by
            // the receiver), and more rounds, bounded, until one is.
            weft_shm::split::set_take_grace(std::time::Duration::from_millis(200));
            let msg = payload(big, 9);
            let mut pushed = false;
            for _ in 0..1000 {
                let (split, copies) =
                    (b.stats().unwrap().rx_split, weft_shm::pool::mapped_copies());
                let mut buf = pool.get().await.expect("get");
                buf.set_len(big).expect("len");
                let (got, sent) = within("pushed part", async {
                    tokio::join!(b.recv_pooled(buf), a.send(b_in_a, msg.clone()))
                })
                .await;
                sent.expect("send");
                assert!(got.expect("recv").buf[..] == msg[..], "plain to pool");
                if b.stats().unwrap().rx_split > split {
                    assert!(
                        weft_shm::pool::mapped_copies() > copies,
                        "the sender's part was written by the kernel"
                    );
                    pushed = true;
                    break;
                }
            }
            weft_shm::split::set_take_grace(std::time::Duration::ZERO);
            assert!(pushed, "no part written by the sender");
        }
        let s = b.stats().unwrap();
        assert_eq!(s.rx_malformed, 0);
        drop((a, b));
        // Every buffer back in the pool.
        let st = pool.stats();
        assert_eq!((st.free, st.lost), (4, 0), "{mode:?}");
    }
}
