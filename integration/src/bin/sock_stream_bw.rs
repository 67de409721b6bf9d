//! `FI_EP_SOCK_STREAM` bandwidth against the raw TCP floor, in one run:
//! the same transfer (1 MiB writes, read into a 1 MiB buffer) over a Weft
//! `SockStream` on tcp and over a plain Tokio `TcpStream`, both on
//! loopback, alternated round by round.
//!
//! usage: `sock-stream-bw [ROUNDS] [MIB]` (default 5 rounds of 2048 MiB)
//!
//! `sock-stream-bw --verbs [ROUNDS] [MIB]` (inside the rxe VM, a build
//! with `--features verbs`): the stream on verbs, server on rxe1 and
//! client on rxe2, against raw TCP over the same veth pair (10.66.0.2 to
//! 10.66.0.1).

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

fn stream_info(prov: &str, domain: Option<&str>) -> Res<Info> {
    let mut hints = Info::default();
    hints.ep_attr.ep_type = EpType::SockStream;
    hints.fabric_attr.prov_name = Some(prov.into());
    hints.domain_attr.name = domain.map(Into::into);
    let mut v = weft::getinfo(Some(&hints))?;
    if v.is_empty() {
        return Err(format!("no {prov} SOCK_STREAM offer").into());
    }
    Ok(v.remove(0))
}

/// A connected pair on tcp (loopback), or on verbs from rxe2 to rxe1.
async fn weft_pair(verbs: bool) -> Res<(weft::SockStream, weft::SockStream)> {
    let (info, cinfo) = if verbs {
        let dev = |v: &str, d: &str| std::env::var(v).unwrap_or_else(|_| d.into());
        let s = dev("WEFT_RXE_SERVER_DEV", "rxe1");
        let c = dev("WEFT_RXE_CLIENT_DEV", "rxe2");
        (
            stream_info("verbs", Some(&s))?,
            stream_info("verbs", Some(&c))?,
        )
    } else {
        let i = stream_info("tcp", None)?;
        (i.clone(), i)
    };
    let fabric = weft::Fabric::open(&info)?;
    let sdomain = fabric.domain(&info)?;
    let cfabric = weft::Fabric::open(&cinfo)?;
    let cdomain = cfabric.domain(&cinfo)?;
    let pep = fabric.passive_endpoint(&info, None)?;
    let peq = fabric.eq(8)?;
    pep.bind_eq(&peq)?;
    pep.listen()?;
    let cep = cdomain.endpoint(&cinfo)?;
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
    let sep = sdomain.accept_endpoint(&info, &req)?;
    let seq = fabric.eq(8)?;
    sep.bind_eq(&seq)?;
    sep.accept(Vec::new()).await?;
    conn.await??;
    Ok((cep.stream()?, sep.stream()?))
}

/// A connected TCP pair on loopback, or over the VM's veth pair.
async fn raw_pair(verbs: bool) -> Res<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    let ip = |v: &str, d: &str| std::env::var(v).unwrap_or_else(|_| d.into());
    let (server, client) = if verbs {
        (
            ip("WEFT_RXE_SERVER_IP", "10.66.0.1"),
            ip("WEFT_RXE_CLIENT_IP", "10.66.0.2"),
        )
    } else {
        ("127.0.0.1".into(), "127.0.0.1".into())
    };
    let l = tokio::net::TcpListener::bind((server.parse::<std::net::IpAddr>()?, 0)).await?;
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind((client.parse::<std::net::IpAddr>()?, 0).into())?;
    let c = sock.connect(l.local_addr()?).await?;
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
    let mut args = std::env::args().skip(1).peekable();
    let verbs = args.next_if(|a| a == "--verbs").is_some();
    let (floor, name) = if verbs {
        ("raw TCP over the veth pair", "weft verbs SOCK_STREAM")
    } else {
        ("raw TCP", "weft SOCK_STREAM")
    };
    let rounds: usize = args.next().map_or(Ok(5), |a| a.parse())?;
    let mib: usize = args.next().map_or(Ok(2048), |a| a.parse())?;
    let (mut weft_bw, mut raw_bw, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (c, s) = raw_pair(verbs).await?;
        let raw = transfer(c, s, mib).await?;
        let (c, s) = weft_pair(verbs).await?;
        let w = transfer(c, s, mib).await?;
        println!(
            "round {r}: {floor} {raw:.0} MB/s, {name} {w:.0} MB/s, ratio {:.3}",
            w / raw
        );
        raw_bw.push(raw);
        weft_bw.push(w);
        ratios.push(w / raw);
    }
    println!(
        "medians of {rounds} rounds, {mib} MiB each: {floor} {:.0} MB/s, {name} {:.0} MB/s, ratio {:.3} (lowest {:.3})",
        median(&mut raw_bw),
        median(&mut weft_bw),
        median(&mut ratios.clone()),
        ratios.iter().copied().fold(f64::INFINITY, f64::min)
    );
    Ok(())
}
