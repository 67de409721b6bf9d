//! Drives a benchmark in whichever role the arguments select, and reports
//! its results: the table, or with `--json` one JSON document.

use std::time::Duration;

use tokio::runtime::Handle;

use crate::args::{ep_name, Api, PerfArgs, Rma};
use crate::control::{self, Listener};
use crate::fail::{Context, Failure, Res};
use crate::link::{self, Fab, Link};
use crate::meter::{Meter, Progress};
use crate::negotiate::{self, Declined, Kind, Limits, Params};
use crate::report::{self, Figures, Sink};
use crate::watch;

async fn one_size(
    kind: Kind,
    client: bool,
    link: &Link,
    p: &Params,
    size: usize,
    api: Api,
    m: &Meter,
) -> Res<Duration> {
    match (kind, client, p.rma) {
        (Kind::Pingpong, true, Some(op)) => crate::rma::client(link, p, size, op, api, m).await,
        (Kind::Pingpong, false, Some(op)) => crate::rma::server(link, p, size, op, api, m).await,
        (Kind::Pingpong, true, None) => crate::pingpong::client(link, p, size, api, m).await,
        (Kind::Pingpong, false, None) => crate::pingpong::server(link, p, size, api, m).await,
        (Kind::Bw, true, _) => crate::bw::client(link, p, size, api, m).await,
        (Kind::Bw, false, _) => crate::bw::server(link, p, size, api, m).await,
    }
}

/// Every size in turn, each result to `sink` as soon as it is measured;
/// a side that shows its results also shows its progress on a terminal.
async fn sizes(
    kind: Kind,
    client: bool,
    link: &Link,
    p: &Params,
    api: Api,
    mut sink: Sink,
) -> Res<()> {
    sink.begin()?;
    let unit = match kind {
        Kind::Pingpong => "iterations",
        Kind::Bw => "messages",
    };
    for &size in &p.sizes {
        let (progress, meter) = Progress::start(!sink.quiet(), size, p.total()?, unit);
        let t = one_size(kind, client, link, p, size, api, &meter).await?;
        progress.end();
        sink.add(Figures::new(size, p.iters, p.xfers_per_iter(), t))?;
    }
    sink.end()
}

/// Where a side that shows its results shows them: the table, or with
/// `--json` one document (`role`: client, server or self).
fn sink(kind: Kind, a: &PerfArgs, p: &Params, role: &'static str) -> Sink {
    if !a.json {
        return Sink::Table;
    }
    let run = report::Run {
        command: kind_name(kind),
        role,
        provider: a.prov.clone(),
        ep_type: ep_name(a.ep_type),
        mode: mode_name(a.mode),
        api: a.api.name(),
        rma: p.rma.map(Rma::name),
        verify: p.verify,
        warmup: p.warmup,
        window: (kind == Kind::Bw).then_some(p.window),
    };
    Sink::Json(Box::new(report::Document {
        run,
        results: Vec::new(),
    }))
}

/// `--mode` as the user spells it.
fn mode_name(m: weft::WaitMode) -> &'static str {
    match m {
        weft::WaitMode::Interrupt => "interrupt",
        weft::WaitMode::BusyPoll => "busy-poll",
        weft::WaitMode::Inline => "inline",
    }
}

async fn client_side(kind: Kind, link: &Link, p: &Params, api: Api, a: &PerfArgs) -> Res<()> {
    negotiate::propose(link, p, a.ctrl_timeout).await?;
    let role = if a.self_test { "self" } else { "client" };
    sizes(kind, true, link, p, api, sink(kind, a, p, role)).await?;
    negotiate::send_done(link).await
}

/// The server's part once the client's parameters `p` are agreed.
async fn server_run(
    kind: Kind,
    link: &Link,
    p: &Params,
    api: Api,
    sink: Sink,
    lim: Limits,
) -> Res<()> {
    sizes(kind, false, link, p, api, sink).await?;
    negotiate::wait_done(link, lim.wait).await
}

/// `--self`: the one client is ours, so any refusal is the run's failure.
async fn self_server(kind: Kind, link: &Link, api: Api, lim: Limits) -> Res<()> {
    let p = match negotiate::agree(link, kind, lim).await {
        Ok(p) => p,
        Err(Declined::Stranger(f) | Declined::Refused(f)) => return Err(f),
    };
    server_run(kind, link, &p, api, Sink::Quiet, lim).await
}

/// Across processes: the first client that sets a run up gets it. One
/// that goes silent or speaks no weft on the way is dropped (said so on
/// stderr) and the next awaited; a weft client asking for what this
/// server cannot do ends it, as it always has.
async fn serve(kind: Kind, fab: &Fab, a: &PerfArgs, lim: Limits) -> Res<()> {
    let who = format!("weft {}", kind_name(kind));
    let mut listener = Listener::bind(fab, a, who.clone()).await?;
    loop {
        let mut link = listener.next(fab).await?;
        match negotiate::agree(&link, kind, lim).await {
            Ok(p) => {
                // Pending control connections are closed and later ones
                // refused, rather than left waiting for a run that is not
                // theirs.
                drop(listener);
                let ctrl = link.ctrl.take();
                let run = server_run(kind, &link, &p, a.api, sink(kind, a, &p, "server"), lim);
                return watch::guarded(ctrl, run).await;
            }
            Err(Declined::Stranger(f)) => {
                eprintln!("{who}: dropped a client: {f}; waiting for another client");
            }
            Err(Declined::Refused(f)) => return Err(f),
        }
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Pingpong => "pingpong",
        Kind::Bw => "bw",
    }
}

/// Busy-poll spins one thread per side: the waiter, with the provider's
/// own spinning thread parked beside it. With fewer cores than spinners
/// they preempt each other and latency gets worse than interrupt mode by
/// orders of magnitude, so say so rather than print misleading numbers
/// silently.
fn warn_oversubscribed(kind_name: &str, a: &PerfArgs) {
    if a.mode != weft::WaitMode::BusyPoll {
        return;
    }
    let spinners = if a.self_test { 2 } else { 1 };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < spinners {
        eprintln!(
            "weft {kind_name}: warning: busy-poll spins {spinners} threads on {cpus} CPUs; \
             expect latencies far worse than --mode interrupt"
        );
    }
}

/// The sizes the client runs: every one must fit in a single message of
/// the endpoint (`max_msg_size`; for DGRAM one packet, the MTU),
/// so a size that does not is refused here, before anything runs, rather
/// than failing mid-run. `-S all` skips those that do not fit instead.
fn fit_sizes(kind_name: &str, a: &PerfArgs, info: &weft::Info) -> Res<Vec<usize>> {
    let max = info.ep_attr.max_msg_size;
    let (fit, over): (Vec<usize>, Vec<usize>) = a.sizes.iter().partition(|&&s| s <= max);
    if over.is_empty() {
        return Ok(fit);
    }
    let why = if info.ep_attr.ep_type == weft::EpType::Dgram {
        ": a datagram is one packet, at most the MTU"
    } else {
        ""
    };
    let what = format!(
        "-p {} -e {}{}",
        a.prov,
        ep_name(info.ep_attr.ep_type),
        info.domain_attr
            .name
            .as_deref()
            .map(|d| format!(" on {d}"))
            .unwrap_or_default()
    );
    if a.all_sizes && !fit.is_empty() {
        let skipped: Vec<String> = over.iter().map(|&s| report::size_str(s as u64)).collect();
        eprintln!(
            "weft {kind_name}: -S all: skipping {} (larger than max_msg_size, {max} bytes, \
             of {what}{why})",
            skipped.join(" "),
        );
        return Ok(fit);
    }
    Err(Failure::new(
        format!("-S {}", over[0]),
        format!(
            "larger than the largest message of {what}: max_msg_size is {max} bytes{why}; \
             use -S {max} or less"
        ),
    ))
}

/// `server_rt`: with `--self`, the runtime the server side runs on.
pub async fn run(kind: Kind, a: &PerfArgs, server_rt: Option<Handle>) -> Res<()> {
    let kind_name = kind_name(kind);
    warn_oversubscribed(kind_name, a);
    let fab = Fab::open(a, Handle::current())?;
    let lim = Limits {
        max: fab.info.ep_attr.max_msg_size,
        rma: link::has_rma(&fab.info),
        wait: a.ctrl_timeout,
    };
    // The server takes its sizes from the client (and checks them then).
    let fitted;
    let a = if a.self_test || a.dest.is_some() {
        fitted = PerfArgs {
            sizes: fit_sizes(kind_name, a, &fab.info)?,
            ..a.clone()
        };
        &fitted
    } else {
        a
    };
    let api = a.api;
    if a.self_test {
        let params = Params::from_args(kind, a);
        // Each side on its own fabric, and for bw on its own runtime: when
        // a socket is full, weft-tcp's writer task spins without yielding
        // its worker, and were the other side's reader queued behind it on
        // the same runtime, nothing would ever drain the socket (a
        // deadlock). Pingpong never has more than one message in flight
        // and keeps the shared runtime, which is faster on small machines.
        let srt = server_rt.unwrap_or_else(Handle::current);
        let sfab = Fab::open(a, srt.clone())?;
        let (s, c) = link::self_pair(&sfab, &fab, a.ctrl_timeout).await?;
        let mut server = srt.spawn(async move { self_server(kind, &s, api, lim).await });
        let client = client_side(kind, &c, &params, api, a);
        tokio::pin!(client);
        // Whichever side fails first decides: the other would wait forever.
        tokio::select! {
            r = &mut client => {
                if let Err(e) = r {
                    server.abort();
                    return Err(e);
                }
                server.await.ctx("server task")?
            }
            r = &mut server => {
                r.ctx("server task")??;
                client.await
            }
        }
    } else if let Some(dest) = &a.dest {
        let mut link = control::dial(&fab, a, dest).await?;
        let ctrl = link.ctrl.take();
        let params = Params::from_args(kind, a);
        watch::guarded(ctrl, client_side(kind, &link, &params, api, a)).await
    } else {
        serve(kind, &fab, a, lim).await
    }
}

/// Failures carry the library's error; task join errors are wrapped here.
impl From<tokio::task::JoinError> for Failure {
    fn from(e: tokio::task::JoinError) -> Failure {
        Failure::new("server task", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dgram_info(max: usize) -> weft::Info {
        let mut i = weft::Info::default();
        i.ep_attr.ep_type = weft::EpType::Dgram;
        i.ep_attr.max_msg_size = max;
        i.domain_attr.name = Some("rxe2".into());
        i
    }

    fn args(sizes: &str) -> PerfArgs {
        PerfArgs {
            prov: "verbs".into(),
            ep_type: weft::EpType::Dgram,
            sizes: crate::args::parse_sizes(sizes).unwrap_or_default(),
            all_sizes: sizes == "all",
            ..PerfArgs::default()
        }
    }

    #[test]
    fn sizes_must_fit_in_one_message() {
        let info = dgram_info(1024);
        assert_eq!(
            fit_sizes("pingpong", &args("1k"), &info).ok(),
            Some(vec![1024])
        );
        let e = fit_sizes("pingpong", &args("1025"), &info)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            e,
            "-S 1025: larger than the largest message of -p verbs -e dgram on rxe2: \
             max_msg_size is 1024 bytes: a datagram is one packet, at most the MTU; \
             use -S 1024 or less"
        );
        // `all` keeps what fits.
        assert_eq!(
            fit_sizes("bw", &args("all"), &info).ok(),
            Some(vec![64, 256, 1024])
        );
        // Other endpoint types only refuse what exceeds their own limit.
        let mut rdm = dgram_info(1 << 30);
        rdm.ep_attr.ep_type = weft::EpType::Rdm;
        assert_eq!(fit_sizes("bw", &args("1m"), &rdm).ok(), Some(vec![1 << 20]));
    }
}
