//! The other processes of `tests/shared_av.rs`: opens the named AV given
//! by the environment (`WEFT_SHAV_NAME`, `WEFT_SHAV_TYPE`,
//! `WEFT_SHAV_READ`) and an RDM endpoint bound to it, prints
//! `ready <map_addr> <address hex>` (or `err <error>` and exits 1), then
//! answers one line per command read from stdin:
//!
//! * `insert <hex>...` → `ok` and, per address, its handle or `!<error>`
//! * `lookup <h>` → `ok <hex>`; `remove <h>` → `ok`; `len` → `ok <n>`
//! * `send <h> <tag> <text>` → `ok` once sent
//! * `recv <tag>` → `ok <source handle> <text>`
//! * `churn` → inserts [`churn_addr`]`(n, n + 1, ...)`, `n` the AV's
//!   length, in batches of 8 until killed, printing `churning` after the
//!   first batch
//! * `quit` → `ok`, then exits 0
//!
//! An operation that fails answers `err <error>`.

use std::io::{BufRead, Write};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use weft::{AvType, BindFlags, CqAttr, Error, FiAddr, FI_ADDR_UNSPEC};
use weft_integration::shared_av::{
    attr, churn_addr, hex, hints, unhex, ENV_NAME, ENV_READ, ENV_TYPE,
};

/// No single wait may exceed this: a stuck peer must fail, not hang.
const STEP: Duration = Duration::from_secs(10);

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let _in_rt = rt.enter();
    let name = std::env::var(ENV_NAME)?;
    let av_type = match std::env::var(ENV_TYPE).as_deref() {
        Ok("map") => AvType::Map,
        Ok("unspec") => AvType::Unspec,
        _ => AvType::Table,
    };
    let read_only = std::env::var(ENV_READ).as_deref() == Ok("1");
    let mut out = std::io::stdout().lock();
    let info = weft::getinfo(Some(&hints()))?.remove(0);
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let av = match domain.av(attr(&name, av_type, read_only)) {
        Ok(av) => av,
        Err(e) => {
            writeln!(out, "err {e:?}")?;
            out.flush()?;
            std::process::exit(1);
        }
    };
    let cq = domain.cq(CqAttr::default())?;
    let ep = domain.endpoint(&info)?;
    ep.bind_av(&av)?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    ep.enable()?;
    writeln!(out, "ready {} {}", av.map_addr(), hex(&ep.local_addr()?))?;
    out.flush()?;

    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply: std::result::Result<String, Error> = match words.as_slice() {
            ["insert", addrs @ ..] => {
                let addrs: Option<Vec<Vec<u8>>> = addrs.iter().map(|a| unhex(a)).collect();
                let addrs = addrs.ok_or("bad hex")?;
                av.insert_sync(&addrs, Default::default()).map(|r| {
                    r.results
                        .iter()
                        .map(|x| match x {
                            Ok(h) => h.to_string(),
                            Err(e) => format!("!{e:?}"),
                        })
                        .collect::<Vec<_>>()
                        .join(" ")
                })
            }
            ["lookup", h] => av.lookup(h.parse()?).map(|a| hex(&a)),
            ["remove", h] => av.remove(&[h.parse()?]).map(|()| String::new()),
            ["len"] => Ok(av.len().to_string()),
            ["send", h, tag, text] => {
                let (h, tag): (FiAddr, u64) = (h.parse()?, tag.parse()?);
                let text = Bytes::from(text.to_string());
                rt.block_on(async { tokio::time::timeout(STEP, ep.tsend(h, text, tag)).await })
                    .map_err(|_| Error::TimedOut)
                    .and_then(|r| r.map_err(|e| e.err))
                    .map(|_| String::new())
            }
            ["recv", tag] => {
                let tag: u64 = tag.parse()?;
                let buf = BytesMut::zeroed(256);
                rt.block_on(async {
                    tokio::time::timeout(STEP, ep.trecv(buf, FI_ADDR_UNSPEC, tag, 0)).await
                })
                .map_err(|_| Error::TimedOut)
                .and_then(|r| r.map_err(|e| e.err))
                .map(|got| {
                    let src = got.src;
                    let text = String::from_utf8_lossy(&got.into_bytes()).into_owned();
                    format!("{src} {text}")
                })
            }
            ["churn"] => churn(&av, &mut out)?,
            ["quit"] => {
                writeln!(out, "ok")?;
                out.flush()?;
                return Ok(());
            }
            _ => Err(Error::Inval),
        };
        match reply {
            Ok(s) if s.is_empty() => writeln!(out, "ok")?,
            Ok(s) => writeln!(out, "ok {s}")?,
            Err(e) => writeln!(out, "err {e:?}")?,
        }
        out.flush()?;
    }
    Ok(())
}

/// Inserts until the process is killed: whatever instant the kill lands,
/// the test then checks the AV.
fn churn(
    av: &weft::AddressVector,
    out: &mut impl Write,
) -> Res<std::result::Result<String, Error>> {
    let first = u32::try_from(av.len())?;
    let mut next = first;
    loop {
        let batch: Vec<Vec<u8>> = (next..next + 8).map(churn_addr).collect();
        let r = av.insert_sync(&batch, Default::default())?;
        if r.count != batch.len() {
            return Ok(Err(Error::Io));
        }
        if next == first {
            writeln!(out, "churning")?;
            out.flush()?;
        }
        next += 8;
    }
}
