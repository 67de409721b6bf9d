//! Two OS processes over RDM: the `weft-peer` binary sends 100,000 tagged
//! messages and this test receives them through wildcard receives, checking
//! that none is lost, duplicated or reordered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, BindFlags, CqAttr, EpType, Info, FI_ADDR_UNSPEC};
use weft_integration::child::Reap;

const T: Duration = Duration::from_secs(10);
const COUNT: u64 = 100_000;
const ACK_TAG: u64 = 1 << 40;
const PAYLOAD: usize = 32;
const WINDOW: u64 = 256;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s = s.trim();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_thousand_tagged_messages_between_processes() {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED;
    let info = weft::getinfo(Some(&hints)).unwrap().remove(0);
    let fabric = weft::Fabric::open(&info).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let av = domain.av(AvAttr::default()).unwrap();
    let cq = domain.cq(CqAttr::default()).unwrap();
    let ep = domain.endpoint(&info).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)
        .unwrap();
    ep.enable().unwrap();

    let mut child = Reap(
        Command::new(env!("CARGO_BIN_EXE_weft-peer"))
            .env("WEFT_PEER_COUNT", COUNT.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::time::timeout(
        T,
        tokio::task::spawn_blocking(move || {
            let mut l = String::new();
            BufReader::new(stdout).read_line(&mut l).unwrap();
            l
        }),
    )
    .await
    .expect("peer printed no address")
    .unwrap();
    let peer = av
        .insert_sync(&[unhex(&line)], Default::default())
        .unwrap()
        .fi_addrs[0];

    // Receives up before the peer learns where to send.
    for ctx in 0..WINDOW {
        ep.post_trecv(BytesMut::zeroed(PAYLOAD), FI_ADDR_UNSPEC, 0, u64::MAX, ctx)
            .unwrap();
    }
    {
        let mut stdin = child.0.stdin.take().unwrap();
        writeln!(stdin, "{}", hex(&ep.local_addr().unwrap())).unwrap();
        stdin.flush().unwrap();
    }

    let mut next = 0u64;
    let mut posted = WINDOW;
    let mut items = Vec::with_capacity(WINDOW as usize);
    while next < COUNT {
        let n = tokio::time::timeout(T, cq.read_batch(&mut items, WINDOW as usize))
            .await
            .unwrap_or_else(|_| panic!("stalled after {next} messages"));
        assert!(n > 0, "completion queue closed");
        for it in items.drain(..) {
            let e = it.unwrap_or_else(|e| panic!("receive failed after {next}: {e}"));
            assert_eq!(e.tag, next % 1024, "message {next}: wrong tag");
            let ctx = e.context;
            let b = e.into_bytes();
            assert_eq!(b.len(), PAYLOAD, "message {next}: wrong length");
            let seq = u64::from_le_bytes(b[..8].try_into().unwrap());
            // One sender and one connection: arrival order is send order,
            // so anything but `next` is a loss, a duplicate or a reorder.
            assert_eq!(seq, next, "lost, duplicated or reordered");
            assert!(b[8..].iter().all(|&x| x == (seq % 251) as u8));
            next += 1;
            if posted < COUNT {
                ep.post_trecv(BytesMut::zeroed(PAYLOAD), FI_ADDR_UNSPEC, 0, u64::MAX, ctx)
                    .unwrap();
                posted += 1;
            }
        }
    }

    tokio::time::timeout(T, ep.tsend(peer, Bytes::from_static(b"ack"), ACK_TAG))
        .await
        .unwrap()
        .unwrap();
    let status = tokio::time::timeout(
        T,
        tokio::task::spawn_blocking(move || child.0.wait().unwrap()),
    )
    .await
    .expect("peer did not exit")
    .unwrap();
    assert!(status.success(), "peer exited with {status}");
    // Every receive was consumed by exactly one message, the ack send's
    // completion went to its own future, and nothing is left over.
    assert!(cq.is_empty());
    assert_eq!(ep.rx_size_left().unwrap(), info.rx_attr.size);
    assert_eq!(ep.tx_size_left().unwrap(), info.tx_attr.size);
}
