//! Message rate of a scalable endpoint with `CTXS` contexts (tcp, or the
//! provider `WEFT_SEP_PROV` names on the device `WEFT_SEP_DOMAIN`): one
//! process, a sending scalable endpoint with `CTXS` transmit contexts and
//! a receiving one with `CTXS` receive contexts, on a Tokio runtime of
//! `WORKERS` threads. Context `i` has two tasks of its own (a sender that
//! keeps up to `WINDOW` sends in flight on transmit context `i`, aimed at
//! receive context `i` with `weft::rx_addr`, and a receiver that keeps
//! `WINDOW` receives posted there), each reading only its own context's
//! CQ: the one-context-per-worker pattern of the `weft` crate docs.
//! `TOTAL` messages of `SIZE` bytes are split evenly over the contexts;
//! prints messages per second from the first send to the last receive.
//!
//! usage: `sep-rate CTXS [TOTAL] [SIZE] [WORKERS]` (defaults 400000 8 2)

use std::process::ExitCode;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use weft::{AvAttr, BindFlags, Caps, CqAttr, EpType, Error, Info, Result};

const WINDOW: usize = 256;

fn arg(args: &[String], i: usize, default: usize) -> std::result::Result<usize, String> {
    match args.get(i) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|_| format!("not a number: {v}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let parsed = (|| {
        Ok::<_, String>((
            arg(&args, 1, 1)?,
            arg(&args, 2, 400_000)?,
            arg(&args, 3, 8)?,
            arg(&args, 4, 2)?,
        ))
    })();
    let (ctxs, total, size, workers) = match parsed {
        Ok(v) if v.0 >= 1 && v.3 >= 1 => v,
        Ok(_) => {
            eprintln!("usage: sep-rate CTXS [TOTAL] [SIZE] [WORKERS]");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("{e}\nusage: sep-rate CTXS [TOTAL] [SIZE] [WORKERS]");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(ctxs, total / ctxs, size)) {
        Ok(secs) => {
            let n = (total / ctxs) * ctxs;
            println!(
                "contexts {ctxs} workers {workers} size {size} messages {n} secs {secs:.3} msg/s {:.0}",
                n as f64 / secs
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sep-rate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Receive-context bits for `n` contexts.
fn bits_for(n: usize) -> u32 {
    usize::BITS - (n.max(2) - 1).leading_zeros()
}

async fn run(ctxs: usize, per_ctx: usize, size: usize) -> Result<f64> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::Rdm;
    // `WEFT_SEP_PROV` (default tcp) and, for verbs, `WEFT_SEP_DOMAIN`
    // (the device, e.g. rxe1 in the VM of `integration/run-rxe`).
    hints.fabric_attr.prov_name =
        Some(std::env::var("WEFT_SEP_PROV").unwrap_or_else(|_| "tcp".into()));
    hints.domain_attr.name = std::env::var("WEFT_SEP_DOMAIN").ok();
    hints.caps = Caps::MSG | Caps::NAMED_RX_CTX;
    hints.ep_attr.tx_ctx_cnt = ctxs;
    hints.ep_attr.rx_ctx_cnt = ctxs;
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let domain = weft::Fabric::open(&info)?.domain(&info)?;
    let bits = bits_for(ctxs);
    let av_attr = AvAttr {
        rx_ctx_bits: bits,
        ..AvAttr::default()
    };
    let server = domain.scalable_endpoint(&info)?;
    server.bind_av(&domain.av(av_attr.clone())?)?;
    server.enable()?;
    let client = domain.scalable_endpoint(&info)?;
    let av = domain.av(av_attr)?;
    client.bind_av(&av)?;
    client.enable()?;
    let peer = av
        .insert_sync(&[server.local_addr()?], Default::default())?
        .fi_addrs[0];
    let mut tasks = Vec::new();
    for i in 0..ctxs {
        let rx = server.rx_context(i)?;
        let rx_cq = domain.cq(CqAttr::default())?;
        rx.bind_cq(&rx_cq, BindFlags::RECV)?;
        rx.enable()?;
        for k in 0..WINDOW {
            rx.post_recv(BytesMut::zeroed(size), k as u64)?;
        }
        let tx = client.tx_context(i)?;
        let tx_cq = domain.cq(CqAttr::default())?;
        tx.bind_cq(&tx_cq, BindFlags::TRANSMIT)?;
        tx.enable()?;
        let dest = weft::rx_addr(peer, i as u32, bits);
        tasks.push((rx, rx_cq, tx, tx_cq, dest));
    }
    let payload = Bytes::from(vec![7u8; size]);
    let start = Instant::now();
    let mut handles = Vec::new();
    for (rx, rx_cq, tx, tx_cq, dest) in tasks {
        let body = payload.clone();
        handles.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(WINDOW);
            let (mut sent, mut inflight) = (0usize, 0usize);
            while sent < per_ctx {
                while inflight < WINDOW && sent < per_ctx {
                    match tx.post_send(dest, body.clone(), sent as u64) {
                        Ok(()) => {
                            sent += 1;
                            inflight += 1;
                        }
                        Err(Error::Again) => break,
                        Err(e) => return Err(e),
                    }
                }
                out.clear();
                let n = tx_cq.read_batch(&mut out, WINDOW).await;
                for it in out.drain(..n) {
                    it.map_err(|e| e.err)?;
                    inflight -= 1;
                }
            }
            while inflight > 0 {
                out.clear();
                let n = tx_cq.read_batch(&mut out, WINDOW).await;
                for it in out.drain(..n) {
                    it.map_err(|e| e.err)?;
                    inflight -= 1;
                }
            }
            Ok::<(), Error>(())
        }));
        handles.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(WINDOW);
            let mut got = 0usize;
            while got < per_ctx {
                out.clear();
                let n = rx_cq.read_batch(&mut out, WINDOW).await;
                for it in out.drain(..n) {
                    let mut e = it.map_err(|e| e.err)?;
                    got += 1;
                    // The buffer goes straight back for the next message.
                    let mut b = e.bufs.pop().unwrap_or_default();
                    b.resize(size, 0);
                    if got + WINDOW <= per_ctx {
                        rx.post_recv(b, e.context)?;
                    }
                }
            }
            Ok::<(), Error>(())
        }));
    }
    for h in handles {
        h.await.map_err(|_| Error::Canceled)??;
    }
    Ok(start.elapsed().as_secs_f64())
}
