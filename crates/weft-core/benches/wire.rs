//! The 40-byte frame header codec.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use weft_core::wire::{decode, FrameKind, Header, FLAG_CQ_DATA, HEADER_LEN};

const MAX_LEN: u64 = 1 << 20;
const STREAM: usize = 1024;

fn sample(i: u64) -> Header {
    Header {
        kind: Some(FrameKind::Tagged),
        flags: FLAG_CQ_DATA,
        len: 1234 + (i & 0xFF),
        tag: 0xdead_beef_0000_0000 | i,
        data: 42,
        seq: i,
        rx_ctx: 0,
    }
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));

    let h = sample(7);
    g.bench_function("encode", |b| b.iter(|| black_box(black_box(&h).encode())));

    let bytes = h.encode();
    g.bench_function("decode", |b| {
        b.iter(|| black_box(decode(black_box(&bytes), MAX_LEN).unwrap()))
    });

    // A receive buffer of back-to-back headers, decoded in order.
    let stream: Vec<u8> = (0..STREAM as u64)
        .flat_map(|i| sample(i).encode())
        .collect();
    g.throughput(Throughput::Elements(STREAM as u64));
    g.bench_function("decode_stream_1024", |b| {
        b.iter(|| {
            for frame in black_box(&stream).chunks_exact(HEADER_LEN) {
                black_box(decode(frame, MAX_LEN).unwrap());
            }
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30);
    targets = codec
}
criterion_main!(benches);
