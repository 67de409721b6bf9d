//! The CQ driver in interrupt mode on a real device (rxe0, loopback RC
//! queue pairs): every completion reaches the sink, including those that
//! land just as the driver takes an event, re-arms or goes to sleep.
//! In busy-poll mode, the spinning thread delivers what nobody waits for,
//! takes over again when a waiter leaves without going idle, and ends
//! with its watcher at close.
//! Run in the rxe VM (`integration/run-rxe`); outside it there is no
//! device and the test fails saying so, as `tests/sys.rs` does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use weft_core::completion::WaitMode;
use weft_core::sync::lock;

use super::{start, CqSink, PollerSlot};
use crate::sys::{
    AccessFlags, CompChannel, Context, Cq, OwnedMr, Payload, ProtectionDomain, QpCaps, QpInitAttr,
    QpType, QueuePair, RcConnectParams, RecvRequest, SendOp, SendRequest, WcOpcode, WorkCompletion,
};

/// Messages per runtime flavour.
const MESSAGES: u64 = 1500;
/// A wait longer than this for one completion is a lost wake-up.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Counts receive completions, in order.
#[derive(Default)]
struct Counter {
    got: Mutex<u64>,
    more: Condvar,
    bad: AtomicU64,
}

impl CqSink for Counter {
    fn on_completion(&self, wc: &WorkCompletion) {
        let mut got = self.got.lock().unwrap();
        if !wc.is_ok() || wc.opcode != WcOpcode::Recv || wc.wr_id != *got {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
        *got += 1;
        self.more.notify_all();
    }
}

impl Counter {
    /// Waits until `n` completions arrived; false after [`TIMEOUT`].
    fn wait_for(&self, n: u64) -> bool {
        let deadline = Instant::now() + TIMEOUT;
        let mut got = self.got.lock().unwrap();
        while *got < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            got = self.more.wait_timeout(got, left).unwrap().0;
        }
        true
    }
}

/// Sender `a` (its CQ polled here) and receiver `b` (its CQ, on a
/// completion channel, left to the driver), connected on one device.
struct Pair {
    pd: Arc<ProtectionDomain>,
    cq_a: Arc<Cq>,
    a: Arc<QueuePair>,
    b: Arc<QueuePair>,
}

fn pair(ctx: &Arc<Context>, cq_b: &Arc<Cq>) -> Pair {
    let pd = ProtectionDomain::new(ctx).unwrap();
    let cq_a = Cq::new(ctx, 256, None).unwrap();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let init = |cq: &Arc<Cq>| QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: Arc::clone(cq),
        recv_cq: Arc::clone(cq),
        srq: None,
        caps,
        sq_sig_all: false,
    };
    let a = QueuePair::new(&pd, &init(&cq_a)).unwrap();
    let b = QueuePair::new(&pd, &init(cq_b)).unwrap();
    // The loopback GID's index, as the sys tests take it (`RXE_LO_GID`).
    let gidx: u8 = std::env::var("RXE_LO_GID")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let gid = ctx.query_gid(1, u32::from(gidx)).unwrap();
    let mtu = ctx.query_port(1).unwrap().active_mtu;
    a.connect_rc(&RcConnectParams::roce(
        1,
        gidx,
        mtu,
        gid,
        b.qp_num(),
        300,
        400,
    ))
    .unwrap();
    b.connect_rc(&RcConnectParams::roce(
        1,
        gidx,
        mtu,
        gid,
        a.qp_num(),
        400,
        300,
    ))
    .unwrap();
    Pair { pd, cq_a, a, b }
}

/// The device the tests run on (rxe0, in the rxe VM).
fn rxe0() -> Arc<Context> {
    Context::open("rxe0").unwrap_or_else(|e| {
        panic!("no RDMA device rxe0 ({e}): run this test in the rxe VM (integration/run-rxe)")
    })
}

/// A [`Pair`] whose receiver's CQ a driver started for `wait` polls,
/// delivering to `sink`, and the buffer its receives land in.
// Fields drop in this order: the driver's slot before the sink, the
// buffer before the queue pairs and their protection domain.
struct Rig {
    sent: Vec<WorkCompletion>,
    /// The driver's task ([`start`]'s).
    task: Option<tokio::task::AbortHandle>,
    slot: PollerSlot,
    sink: Arc<Counter>,
    buf: OwnedMr,
    p: Pair,
}

impl Rig {
    fn start(rt: &tokio::runtime::Handle, ctx: &Arc<Context>, wait: WaitMode) -> Rig {
        let ch = CompChannel::new(ctx).unwrap();
        let cq_b = Cq::new(ctx, 256, Some(&ch)).unwrap();
        let p = pair(ctx, &cq_b);
        let buf = OwnedMr::new(&p.pd, 4096, AccessFlags::LOCAL_WRITE).unwrap();
        let sink = Arc::new(Counter::default());
        let slot: PollerSlot = Arc::default();
        let task = start(rt, wait, (cq_b, ch), &sink, &slot).unwrap();
        Rig {
            sent: Vec::new(),
            task,
            slot,
            sink,
            buf,
            p,
        }
    }

    /// Receive `i` posted, its message sent `pause` later, and delivered
    /// by `driver` (named in the failure) within [`TIMEOUT`].
    fn message(&mut self, i: u64, pause: Duration, driver: &str) {
        let p = &self.p;
        p.b.post_recv(&RecvRequest {
            wr_id: i,
            sges: &[self.buf.sge(0, 64).unwrap()],
        })
        .unwrap();
        let until = Instant::now() + pause;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        p.a.post_send(&SendRequest::new(i, SendOp::Send, Payload::Inline(b"ping")))
            .unwrap();
        assert!(
            self.sink.wait_for(i + 1),
            "message {i} completed but {driver} did not deliver it within {TIMEOUT:?}"
        );
        self.sent.clear();
        p.cq_a.poll(&mut self.sent, 16).unwrap();
    }

    fn assert_in_order(&self) {
        assert_eq!(
            self.sink.bad.load(Ordering::Relaxed),
            0,
            "receives out of order or failed"
        );
    }
}

/// Sends `MESSAGES` one at a time, each only after the driver delivered
/// the previous one (so it is on its way to sleep, or asleep), after a
/// pause that varies from none to a few tens of microseconds: the
/// completions land at every point of the driver's
/// drain / read / re-arm / drain / sleep sequence.
fn ping(rt: &tokio::runtime::Handle, ctx: &Arc<Context>) {
    let mut r = Rig::start(rt, ctx, WaitMode::Interrupt);
    let task = r.task.take().expect("interrupt mode runs a driver task");
    for i in 0..MESSAGES {
        r.message(i, Duration::from_micros((i * 7) % 40), "the driver");
    }
    r.assert_in_order();
    task.abort();
    super::stop(&r.slot);
}

#[test]
fn interrupt_driver_delivers_every_completion() {
    let ctx = rxe0();
    // A current-thread runtime on a thread of its own (the driver and the
    // reactor on one thread, as in `weft pingpong`), then a multi-thread
    // one (the reactor on whichever worker parks).
    let ct = CurrentThread::start();
    ping(&ct.handle, &ctx);
    ct.end();
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    ping(mt.handle(), &ctx);
}

/// Busy-poll on a current-thread runtime of its own thread (as in
/// `weft pingpong`): messages nobody waits for are delivered by the
/// spinning thread, before and after a waiter held the CQ (renewing the
/// hold as `InlinePoll` does, long enough for the thread's naps to grow
/// past a hold) and left without going idle; `stop` ends the thread's
/// watcher.
#[test]
fn busy_poll_thread_takes_over_after_a_hold() {
    let ctx = rxe0();
    let ct = CurrentThread::start();
    let mut r = Rig::start(&ct.handle, &ctx, WaitMode::BusyPoll);
    let watch = r.task.take().expect("busy-poll runs a watcher task");
    let poller = lock(&r.slot).clone().expect("the poller is in its slot");
    let thread = "the busy-poll thread";
    for i in 0..50 {
        r.message(i, Duration::ZERO, thread);
    }
    // From here the thread's naps beside a hold last 10 minutes: a
    // message after the hold arrives in time only if the watcher wakes
    // the thread at the hold's end.
    poller.nap_floor.store(600_000_000_000, Ordering::Relaxed);
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        poller.hold.waiter_active();
        std::thread::sleep(Duration::from_micros(200));
    }
    for i in 50..100 {
        r.message(i, Duration::ZERO, thread);
    }
    r.assert_in_order();
    assert!(
        !watch.is_finished(),
        "the watcher runs while the thread does"
    );
    super::stop(&r.slot);
    let deadline = Instant::now() + TIMEOUT;
    while !watch.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the watcher did not end within {TIMEOUT:?} of the close"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // The thread ended too (it held the last other reference).
    while Arc::strong_count(&poller) > 1 {
        assert!(
            Instant::now() < deadline,
            "the busy-poll thread did not end within {TIMEOUT:?} of the close"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    ct.end();
}

/// A current-thread runtime driven by a thread of its own until `end`.
struct CurrentThread {
    handle: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl CurrentThread {
    fn start() -> CurrentThread {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = rt.handle().clone();
        let thread = std::thread::spawn(move || {
            rt.block_on(async {
                let _ = stopped.await;
            })
        });
        CurrentThread {
            handle,
            stop,
            thread,
        }
    }

    fn end(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
    }
}
