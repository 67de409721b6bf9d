//! Completion delivery: `OpDone` -> `CqShared` -> reader, in batches, plus
//! the error path, the per-operation future path and counter increments.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use futures::channel::oneshot;
use weft_core::completion::{CqEntry, CqErrEntry, CqFormat, CqShared, OpDone, WaitMode};
use weft_core::counter::CounterShared;
use weft_core::flags::OpFlags;
use weft_core::Error;

fn cq(size: usize) -> Arc<CqShared> {
    CqShared::new(1, CqFormat::Tagged, WaitMode::Interrupt, size)
}

/// The `OpDone` a tagged receive carries, bound to `cq` and maybe a counter.
fn op(i: u64, cq: &Arc<CqShared>, cntr: Option<&Arc<CounterShared>>) -> OpDone {
    OpDone {
        context: i,
        flags: OpFlags::RECV | OpFlags::TAGGED,
        report: true,
        cq: Some(cq.clone()),
        cntr: cntr.cloned(),
        waiter: None,
    }
}

fn entry(i: u64) -> CqEntry {
    CqEntry {
        len: 64,
        tag: i,
        src: 3,
        ..CqEntry::default()
    }
}

fn complete_read(c: &mut Criterion) {
    let mut g = c.benchmark_group("completion/complete_read");
    for batch in [64u64, 1024] {
        g.throughput(Throughput::Elements(batch));
        let q = cq(batch as usize);
        let cntr = CounterShared::new(2);
        // OpDone::complete (CQ + counter) for each op, then one fi_cq_read
        // of the whole batch.
        g.bench_with_input(BenchmarkId::new("cq+cntr", batch), &batch, |b, &n| {
            b.iter(|| {
                for i in 0..n {
                    op(i, &q, Some(&cntr)).complete(entry(i));
                }
                let got = q.read(n as usize).unwrap();
                debug_assert_eq!(got.len(), n as usize);
                black_box(got);
            })
        });
        // CQ only, drained with pop_batch into a reused buffer (what the
        // async CompletionQueue reader does).
        let mut out = Vec::with_capacity(batch as usize);
        g.bench_with_input(BenchmarkId::new("cq_pop_batch", batch), &batch, |b, &n| {
            b.iter(|| {
                for i in 0..n {
                    op(i, &q, None).complete(entry(i));
                }
                let got = q.pop_batch(&mut out, n as usize);
                debug_assert_eq!(got, n as usize);
                black_box(&out);
                out.clear();
            })
        });
        // Error completions: OpDone::fail, then fi_cq_readerr per entry.
        g.bench_with_input(BenchmarkId::new("fail_readerr", batch), &batch, |b, &n| {
            b.iter(|| {
                for i in 0..n {
                    op(i, &q, Some(&cntr)).fail(CqErrEntry::new(
                        0,
                        OpFlags::empty(),
                        Error::Canceled,
                    ));
                }
                for _ in 0..n {
                    black_box(q.read_err().unwrap());
                }
            })
        });
    }
    g.finish();
}

/// An `async fn` operation: the completion goes to its oneshot instead of
/// the CQ (channel creation included: each operation makes one).
fn waiter(c: &mut Criterion) {
    let mut g = c.benchmark_group("completion/waiter");
    g.throughput(Throughput::Elements(1));
    let q = cq(64);
    g.bench_function("oneshot_complete_recv", |b| {
        b.iter(|| {
            let (tx, mut rx) = oneshot::channel();
            let d = OpDone {
                waiter: Some(tx),
                ..op(1, &q, None)
            };
            d.complete(entry(1));
            black_box(rx.try_recv().unwrap().unwrap().into_result(0).unwrap());
        })
    });
    g.finish();
}

fn counter(c: &mut Criterion) {
    let mut g = c.benchmark_group("completion/counter");
    g.throughput(Throughput::Elements(1));
    let cntr = CounterShared::new(2);
    g.bench_function("add", |b| {
        b.iter(|| {
            cntr.add(black_box(1));
        })
    });
    black_box(cntr.read());
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = complete_read, waiter, counter
}
criterion_main!(benches);
