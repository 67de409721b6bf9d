//! A group of N peers that find each other by name: each inserts the same
//! `insert_sym` range (`weft-0`, `weft-1`, ... on one port) into its AV,
//! binds its RDM endpoint to the address its own name resolved to, and
//! trades a hello with every other peer. Kubernetes runs one per pod of the
//! StatefulSet in `docker/k8s/`, where a process that exits is restarted,
//! so after the report it stays and answers peers that come back. `--me`
//! (default: the host name) must be one of the expanded names.
//! ```text
//! peer_group [--first weft-0] [-n 2] [--port 47620] [--me NAME] [-p tcp|verbs]
//!            [-d DOMAIN] [--wait SECS]
//! ```

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;
use tokio::time::sleep;
use weft::{AvAttr, AvFlags, BindFlags, CqAttr, Endpoint, EpType, FiAddr, Info};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const OPTIONS: [&str; 7] = ["--first", "-n", "--port", "--me", "-p", "-d", "--wait"];

/// The value after `opt` on the command line, if it is there.
fn arg(args: &[String], opt: &str) -> Option<String> {
    let pair = args.chunks(2).find(|p| p[0] == opt)?;
    pair.get(1).cloned()
}

/// Sends a hello, retrying while the peer is not up yet.
async fn hello(ep: Endpoint, to: FiAddr, text: String, until: Instant) -> Res<()> {
    loop {
        match ep.send(to, Bytes::from(text.clone())).await {
            Ok(_) => return Ok(()),
            Err(_) if Instant::now() < until => sleep(Duration::from_millis(500)).await,
            Err(e) => return Err(e.into()),
        }
    }
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let known = |a: &&String| OPTIONS.contains(&a.as_str());
    if let Some(bad) = args.iter().step_by(2).find(|a| !known(a)) {
        return Err(format!("unknown option {bad}; options: {}", OPTIONS.join(" ")).into());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let first = arg(&args, "--first").unwrap_or_else(|| "weft-0".into());
    let count: usize = arg(&args, "-n").map_or(Ok(2), |v| v.parse())?;
    let port = arg(&args, "--port").unwrap_or_else(|| "47620".into());
    let me_name = arg(&args, "--me").unwrap_or_else(|| host.trim().into());
    let prov = arg(&args, "-p").unwrap_or_else(|| "tcp".into());
    let wait = Duration::from_secs(arg(&args, "--wait").map_or(Ok(300), |v| v.parse())?);
    let pairs = weft::expand_insertsym(&first, count, &port, 1)?;
    let names: Vec<String> = pairs.into_iter().map(|(node, _)| node).collect();
    let me = (names.iter().position(|n| *n == me_name))
        .ok_or_else(|| format!("--me {me_name} is not one of {}", names.join(" ")))?;
    let mut hints = Info::default();
    hints.fabric_attr.prov_name = Some(prov.clone());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.name = arg(&args, "-d");
    let info = (weft::getinfo(Some(&hints))?.into_iter().next())
        .ok_or(format!("no RDM endpoint from provider {prov}"))?;
    let fabric = weft::Fabric::open(&info)?;
    let domain = fabric.domain(&info)?;
    let av = domain.av(AvAttr::default())?;
    let until = Instant::now() + wait;
    // Peers' names appear in DNS only once their pods exist: try again
    // until all resolve, taking back the partial result each time.
    let addrs = loop {
        let r = (av.insert_sym(&first, count, &port, 1, AvFlags::empty(), 0)?).await;
        if r.count == count {
            break r.fi_addrs;
        }
        if Instant::now() >= until {
            return Err(format!("{} of {} names resolved", r.count, count).into());
        }
        let inserted: Vec<FiAddr> = r.results.iter().flatten().copied().collect();
        av.remove(&inserted)?;
        sleep(Duration::from_secs(1)).await;
    };
    let cq = domain.cq(CqAttr::default())?;
    let ep = domain.endpoint(&info)?;
    ep.bind_av(&av)?;
    ep.bind_cq(&cq, BindFlags::TRANSMIT | BindFlags::RECV)?;
    let mine = av.lookup(addrs[me])?;
    ep.set_src_addr(mine.clone())?;
    ep.enable()
        .map_err(|e| format!("enable at {}: {e}", av.straddr(&mine)))?;
    let who = format!("{me_name} (rank {me} of {count})");
    let dom = info.domain_attr.name.as_deref().unwrap_or("?");
    println!("{who}: {} over {prov} on {dom}", av.straddr(&mine));
    let greeting = format!("weft-hello {me} {count} {first}");
    let (heard_all, all_heard) = oneshot::channel();
    // Takes hellos in for as long as the process lives.
    let listen = async {
        let mut heard_all = Some(heard_all);
        let mut heard = vec![false; count];
        heard[me] = true;
        loop {
            if heard.iter().all(|&h| h) {
                heard_all.take().map(|tx| tx.send(()));
            }
            let got = ep.recv(BytesMut::zeroed(256)).await?;
            let text = String::from_utf8_lossy(&got.into_bytes()).into_owned();
            let peer = match text.split(' ').collect::<Vec<_>>()[..] {
                ["weft-hello", p, n, f] if *n == count.to_string() && f == first => {
                    p.parse().ok().filter(|&p: &usize| p < count && p != me)
                }
                _ => None,
            };
            let Some(peer) = peer else {
                eprintln!("{who}: ignored a message that is no hello of this group: {text:?}");
                continue;
            };
            if heard[peer] {
                // It started again, perhaps at a new address: look its name
                // up afresh and answer, as our hello went to its old self.
                println!("{who}: {} is back, answering", names[peer]);
                let r = (av.insert_sym(&names[peer], 1, &port, 1, AvFlags::empty(), 0)?).await;
                if let Some(&Ok(to)) = r.results.first() {
                    let until = Instant::now() + wait;
                    tokio::spawn(hello(ep.clone(), to, greeting.clone(), until));
                }
                continue;
            }
            heard[peer] = true;
            let at = av.straddr(&av.lookup(addrs[peer])?);
            println!("{who}: hello from {} at {at}", names[peer]);
        }
    };
    let exchange = async {
        let sends = (addrs.iter().enumerate().filter(|&(p, _)| p != me))
            .map(|(_, &to)| hello(ep.clone(), to, greeting.clone(), until));
        futures::future::try_join_all(sends).await?;
        all_heard.await.map_err(|_| "stopped listening")?;
        Res::Ok(())
    };
    tokio::pin!(listen);
    tokio::select! {
        done = tokio::time::timeout_at(until.into(), exchange) => {
            let late = format!("{who}: no exchange with every peer within {wait:?}");
            done.map_err(|_| late)??;
        }
        ended = &mut listen => return ended,
    }
    println!("{who}: exchanged hellos with all {} peers", count - 1);
    listen.await
}
