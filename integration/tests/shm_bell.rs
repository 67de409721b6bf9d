//! A spinning shm sender that finds its ring full is rung by its
//! receiver, not found by its driver's next sweep. In a binary of its
//! own: the sweep period is lengthened for the whole process
//! (`weft_shm::set_sweep_every`), so a lost doorbell leaves the sender
//! asleep past the test's timeout instead of 100 ms later.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use bytes::BytesMut;
use weft::{EpType, WaitMode};
use weft_integration::{enabled_endpoint, next_cq, payload, within, Harness, Provider, TIMEOUT};

mod shm_common;

/// Far past [`TIMEOUT`]: a sender's driver that sleeps this long was
/// never rung.
const NO_SWEEP: Duration = Duration::from_secs(3600);

/// A spinning sender that finds the ring full does not ask to be rung
/// (it looks again on its next pass; asked on every full ring, the
/// receiver rang it 1.6 times a 1 MiB message). Once nobody waits on it
/// its driver asks before it sleeps, and is rung when the receiver makes
/// room: a message four times the ring, parked for want of unexpected
/// budget, arrives whole once a receive is posted, and its send ends.
/// Nothing waits inline on the sender meanwhile (its queue is read
/// without progress), so only its driver, woken by the doorbell, refills
/// the ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_sender_asks_to_be_rung_before_its_driver_sleeps() {
    use weft_shm::layout::{C_TX_WAIT, RING};
    weft_shm::set_sweep_every(NO_SWEEP);
    // The ring's path is the one under test: no message goes by CMA to
    // be split while both sides spin.
    weft_shm::split::set_spin_min(usize::MAX);
    let shm = Provider::named("shm");
    let info = shm
        .try_info_with(EpType::Rdm, |i| i.rx_attr.total_buffered_recv = 1000)
        .expect("an shm RDM offer");
    let h = Harness::with_info(&shm, info.clone());
    let (aav, bav) = (h.av(), h.av());
    // A busy-poll receiver never says it sleeps: the sender takes the ring.
    let (a, acq) = enabled_endpoint(&h.domain, &info, &aav, WaitMode::Inline);
    let (b, _bcq) = enabled_endpoint(&h.domain, &info, &bav, WaitMode::BusyPoll);
    let b_in_a = aav
        .insert_sync(&[b.local_addr().unwrap()], Default::default())
        .unwrap()
        .fi_addrs[0];
    a.post_send(b_in_a, payload(8, 1), 1).unwrap();
    within("first", b.recv(BytesMut::zeroed(8))).await.unwrap();
    within("first send", next_cq(&acq)).await.unwrap();
    let msg = payload(4 * RING, 5);
    a.post_send(b_in_a, msg.clone(), 2).unwrap();
    let start = Instant::now();
    while shm_common::chan_word(&b, C_TX_WAIT) != Some(1) {
        assert!(
            start.elapsed() < TIMEOUT,
            "the sender's driver never asked to be rung"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let got = within(
        "late receive (the sender never rung)",
        b.recv(BytesMut::zeroed(4 * RING)),
    )
    .await
    .unwrap();
    assert!(got.into_bytes()[..] == msg[..], "arrived whole");
    let start = Instant::now();
    let mut done = Vec::new();
    while acq.try_read_batch(&mut done, 1) == 0 {
        assert!(start.elapsed() < TIMEOUT, "the send never ended");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(done.pop().unwrap().unwrap().context, 2);
    // Through the ring, which says nothing where CMA is denied anyway.
    shm_common::cma_denied("the ring was the only path");
    assert_eq!(b.stats().unwrap().rx_direct, 0, "through the ring");
}
