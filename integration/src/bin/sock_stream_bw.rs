//! `FI_EP_SOCK_STREAM` bandwidth against the raw TCP floor, in one run:
//! the same transfer (1 MiB writes, read into a 1 MiB buffer) over a Weft
//! `SockStream` on tcp and over a plain Tokio `TcpStream`, both on
//! loopback, alternated round by round.
//!
//! usage: `sock-stream-bw [ROUNDS] [MIB]` (default 5 rounds of 2048 MiB)

use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use weft::{EpType, Info};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CHUNK: usize = 1 << 20;

/// MB/s of `mib` MiB written by `tx` and read by `rx`.
async fn transfer<W, R>(mut tx: W, mut rx: R, mib: usize) -> Res<f64>
where
    W: AsyncWrite + Unpin + Send + 'static,
    R: AsyncRead + Unpin + Send + 'static,
{
    let t0 = Instant::now();
    let writer = tokio::spawn(async move {
        let buf = vec![0x5au8; CHUNK];
        for _ in 0..mib {
            tx.write_all(&buf).await?;
        }
        tx.shutdown().await?;
        Ok::<_, std::io::Error>(())
    });
    let mut buf = vec![0u8; CHUNK];
    let mut total = 0usize;
    loop {
        let n = rx.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n;
    }
    writer.await??;
    if total != mib * CHUNK {
        return Err(format!("read {total} bytes of {}", mib * CHUNK).into());
    }
    Ok(total as f64 / t0.elapsed().as_secs_f64() / 1e6)
}

async fn weft_pair() -> Res<(weft::SockStream, weft::SockStream)> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::SockStream;
    hints.fabric_attr.prov_name = Some("tcp".into());
    let info = weft::getinfo(Some(&hints))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let pep = fabric.passive_endpoint(&info, None)?;
    let peq = fabric.eq(8)?;
    pep.bind_eq(&peq)?;
    pep.listen()?;
    let cep = domain.endpoint(&info)?;
    let ceq = fabric.eq(8)?;
    cep.bind_eq(&ceq)?;
    cep.enable()?;
    let to = pep.local_addr()?;
    let c2 = cep.clone();
    let conn = tokio::spawn(async move { c2.connect(to, Vec::new()).await });
    let ev = match peq.next_timeout(std::time::Duration::from_secs(10)).await? {
        weft::EqItem::Ok(ev) => ev,
        weft::EqItem::Err(e) => return Err(format!("connection request: {e:?}").into()),
    };
    let req = weft::ConnRequest::from_event(&ev)?;
    let sep = domain.accept_endpoint(&info, &req)?;
    let seq = fabric.eq(8)?;
    sep.bind_eq(&seq)?;
    sep.accept(Vec::new()).await?;
    conn.await??;
    Ok((cep.stream()?, sep.stream()?))
}

async fn raw_pair() -> Res<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let c = tokio::net::TcpStream::connect(l.local_addr()?).await?;
    let (s, _) = l.accept().await?;
    c.set_nodelay(true)?;
    s.set_nodelay(true)?;
    Ok((c, s))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    let mib: usize = args.next().map_or(Ok(2048), |a| a.parse())?;
    let (mut weft_bw, mut raw_bw, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (c, s) = raw_pair().await?;
        let raw = transfer(c, s, mib).await?;
        let (c, s) = weft_pair().await?;
        let w = transfer(c, s, mib).await?;
        println!(
            "round {r}: raw TCP {raw:.0} MB/s, weft SOCK_STREAM {w:.0} MB/s, ratio {:.3}",
            w / raw
        );
        raw_bw.push(raw);
        weft_bw.push(w);
        ratios.push(w / raw);
    }
    println!(
        "medians of {rounds} rounds, {mib} MiB each: raw TCP floor {:.0} MB/s, weft SOCK_STREAM {:.0} MB/s, ratio {:.3} (lowest {:.3})",
        median(&mut raw_bw),
        median(&mut weft_bw),
        median(&mut ratios.clone()),
        ratios.iter().copied().fold(f64::INFINITY, f64::min)
    );
    Ok(())
}
