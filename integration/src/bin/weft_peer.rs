//! The other process of `tests/multiprocess.rs`.
//!
//! Prints its RDM endpoint's address (hex) on stdout, reads the test's
//! address (hex) from stdin, sends `WEFT_PEER_COUNT` (default 100,000)
//! tagged messages — payload: the sequence number (little-endian `u64`)
//! followed by filler derived from it; tag: sequence number mod 1024 —
//! and exits 0 once every send completed and the test acknowledged with a
//! message tagged [`ACK_TAG`]. Anything else exits non-zero.

use std::io::{BufRead, Write};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, BindFlags, CqAttr, EpType, Error, Info, FI_ADDR_UNSPEC};

/// Tag of the test's final acknowledgement (outside the data tags).
const ACK_TAG: u64 = 1 << 40;
const PAYLOAD: usize = 32;
/// Sends in flight before the peer waits for completions.
const WINDOW: usize = 512;
/// No single wait may exceed this: a stuck peer must fail, not hang.
const STEP: Duration = Duration::from_secs(10);

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Res<Vec<u8>> {
    let s = s.trim();
    if s.len() % 2 != 0 {
        return Err("odd hex length".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&s[i..i + 2], 16)?))
        .collect()
}

fn payload(seq: u64) -> Bytes {
    let mut p = vec![(seq % 251) as u8; PAYLOAD];
    p[..8].copy_from_slice(&seq.to_le_bytes());
    Bytes::from(p)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let count: u64 = match std::env::var("WEFT_PEER_COUNT") {
        Ok(v) => v.parse()?,
        Err(_) => 100_000,
    };
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.caps = weft::Caps::TAGGED;
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let av = domain.av(AvAttr::default())?;
    let cq = domain.cq(CqAttr::default())?;
    let ep = domain.endpoint(&info)?;
    ep.bind_av(&av)?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    ep.enable()?;

    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", hex(&ep.local_addr()?))?;
        out.flush()?;
    }
    let line = tokio::time::timeout(
        STEP,
        tokio::task::spawn_blocking(|| {
            let mut l = String::new();
            std::io::stdin().lock().read_line(&mut l).map(|_| l)
        }),
    )
    .await???;
    let parent = av
        .insert_sync(&[unhex(&line)?], Default::default())?
        .fi_addrs[0];

    // The ack receive goes up first so the ack can never be unexpected
    // behind anything.
    let ack = {
        let ep = ep.clone();
        tokio::spawn(async move {
            ep.trecv(BytesMut::zeroed(16), FI_ADDR_UNSPEC, ACK_TAG, 0)
                .await
        })
    };

    let mut done = 0u64;
    let mut items = Vec::with_capacity(WINDOW);
    let reap = |items: &mut Vec<weft::CqItem>, done: &mut u64| -> Res<()> {
        for it in items.drain(..) {
            match it {
                Ok(_) => *done += 1,
                Err(e) => return Err(format!("send {:#x} failed: {}", e.context, e.err).into()),
            }
        }
        Ok(())
    };
    for seq in 0..count {
        loop {
            let in_flight = seq - done;
            if (in_flight as usize) < WINDOW {
                match ep.post_tsend(parent, payload(seq), seq % 1024, seq) {
                    Ok(()) => break,
                    Err(Error::Again) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if tokio::time::timeout(STEP, cq.read_batch(&mut items, WINDOW))
                .await
                .is_err()
            {
                return Err("send completions stalled".into());
            }
            reap(&mut items, &mut done)?;
        }
        cq.try_read_batch(&mut items, WINDOW);
        reap(&mut items, &mut done)?;
    }
    while done < count {
        if tokio::time::timeout(STEP, cq.read_batch(&mut items, WINDOW))
            .await
            .is_err()
        {
            return Err("final send completions stalled".into());
        }
        reap(&mut items, &mut done)?;
    }

    let got = tokio::time::timeout(STEP, ack).await???;
    if &got.into_bytes()[..] != b"ack" {
        return Err("bad ack".into());
    }
    ep.close()?;
    Ok(())
}
