//! What the CQ driver's interrupt sequence (`cq_poller`) relies on, shown
//! on a real completion channel: no completion is lost between taking an
//! event and re-arming, and Tokio's readiness keeps an edge that comes
//! while the driver still holds the previous one.

use super::*;

/// Rounds of each race on a multi-thread runtime. The test's own pause
/// makes the reactor see the edge before the clear in nearly every
/// round, which is the order the driver relies on; the rounds repeat it,
/// they do not promise to meet the other order.
const ROUNDS: u64 = 20;

/// A completion that lands after the event was taken and before the
/// re-arm raises no event, and the arming does not raise one for it
/// either: the poll after the re-arm is what finds it. (A driver that
/// slept on the channel without that poll would sleep with a completion
/// waiting, the lost wake-up.) One that lands after the re-arm raises an
/// event. "Arming raises no event for a completion already queued" is
/// how rxe behaves (its re-arm has no report-missed-events flag); some
/// hardware raises one, which the driver would take as one more wake-up,
/// so it does not rely on either.
#[test]
fn completion_while_disarmed_is_found_by_the_poll_after_arming() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let ch = CompChannel::new(&ctx).unwrap();
    let p = rc_pair(&ctx, Some(&ch), false);
    let buf = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    p.cq_b.req_notify(false).unwrap();
    recv_then_send(&p, &buf, 500, 0, b"armed");
    assert!(poll_readable(&*ch, TIMEOUT).unwrap(), "event while armed");
    assert_ok(&wait_one(&p.cq_a), 0, WcOpcode::Send);
    assert_ok(&wait_one(&p.cq_b), 500, WcOpcode::Recv);
    let ev = ch
        .get_event()
        .unwrap()
        .expect("the armed completion's event");
    assert_eq!(ev.cq_id, p.cq_b.id());

    // Disarmed now (an event was raised): this completion lands unseen.
    recv_then_send(&p, &buf, 501, 1, b"disarmed");
    assert_ok(&wait_one(&p.cq_a), 1, WcOpcode::Send);
    assert!(
        !poll_readable(&*ch, Duration::from_millis(200)).unwrap(),
        "no event while disarmed"
    );
    p.cq_b.req_notify(false).unwrap();
    assert!(
        !poll_readable(&*ch, Duration::from_millis(200)).unwrap(),
        "arming raises no event for a completion already queued"
    );
    assert_ok(&wait_one(&p.cq_b), 501, WcOpcode::Recv);

    // Still armed (nothing was raised): the next completion raises one.
    recv_then_send(&p, &buf, 502, 2, b"re-armed");
    assert!(poll_readable(&*ch, TIMEOUT).unwrap(), "event after re-arm");
    assert_eq!(ch.get_event().unwrap().map(|e| e.cq_id), Some(p.cq_b.id()));
    assert_ok(&wait_one(&p.cq_b), 502, WcOpcode::Recv);
    assert_ok(&wait_one(&p.cq_a), 2, WcOpcode::Send);
}

/// The driver reads one event per wake-up and then clears the readiness
/// it was woken for, without reading on to `EAGAIN`. An event that
/// arrives before that clear (a readiness with no event read, the CQ
/// still armed, and a completion landing before the clear; on a
/// multi-thread runtime perhaps already seen by a worker's reactor) must
/// still wake the next `readable()`: Tokio clears only
/// the readiness of the tick the guard saw, and the edge-triggered
/// registration reports every new event.
#[test]
fn asyncfd_keeps_an_edge_that_comes_before_clear_ready() {
    let Some(ctx) = open_or_skip("rxe0") else {
        return;
    };
    let ch = CompChannel::new(&ctx).unwrap();
    let p = rc_pair(&ctx, Some(&ch), false);
    let buf = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
    let runtimes = [
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap(),
    ];
    let mut id = 1000;
    for rt in &runtimes {
        rt.block_on(async {
            let afd = ch.register_async().unwrap();
            p.cq_b.req_notify(false).unwrap();
            recv_then_send(&p, &buf, id, id, b"first");
            for _ in 0..ROUNDS {
                let mut guard = tokio::time::timeout(TIMEOUT, afd.readable())
                    .await
                    .expect("the event wakes readable()")
                    .unwrap();
                let ev = ch.get_event().unwrap().expect("one event per wake-up");
                assert_eq!(ev.cq_id, p.cq_b.id());
                assert_ok(&wait_one(&p.cq_b), id, WcOpcode::Recv);
                assert_ok(&wait_one(&p.cq_a), id, WcOpcode::Send);
                // The next event arrives before the clear.
                id += 1;
                p.cq_b.req_notify(false).unwrap();
                recv_then_send(&p, &buf, id, id, b"next");
                assert!(poll_readable(&*ch, TIMEOUT).unwrap());
                // Room for an idle worker's reactor to take the edge first.
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard.clear_ready();
            }
            let _guard = tokio::time::timeout(TIMEOUT, afd.readable())
                .await
                .expect("the last event wakes readable()")
                .unwrap();
            assert!(ch.get_event().unwrap().is_some());
            assert_ok(&wait_one(&p.cq_b), id, WcOpcode::Recv);
            assert_ok(&wait_one(&p.cq_a), id, WcOpcode::Send);
            id += 1;
        });
    }
}
