//! `weft`: fi_info and fi_pingpong for Weft.

mod args;
mod bw;
mod control;
mod fail;
mod info;
mod info_json;
mod link;
mod logging;
mod meter;
mod negotiate;
mod pingpong;
mod report;
mod rma;
mod run;
mod watch;

use std::process::ExitCode;

use args::Command;
use negotiate::Kind;

fn main() -> ExitCode {
    logging::init();

    let cmd = match args::parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(stop) => return stop.exit(),
    };
    let prov = match &cmd {
        Command::Pingpong(a) | Command::Bw(a) => Some(a.prov.clone()),
        _ => None,
    };
    let (name, result) = match &cmd {
        Command::Completions(shell) => {
            args::completions(*shell, &mut std::io::stdout().lock());
            return ExitCode::SUCCESS;
        }
        Command::Info(a) => ("info", info::run(a)),
        Command::Pingpong(a) => ("pingpong", bench(Kind::Pingpong, a)),
        Command::Bw(a) => ("bw", bench(Kind::Bw, a)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weft {name}: {e}");
            if let Some(h) = prov.and_then(|p| e.hint(&p)) {
                eprintln!("weft {name}: likely cause: {h}");
            }
            ExitCode::from(1)
        }
    }
}

/// Scheduler ticks between looks at the I/O driver while tasks are
/// ready (see `bench`).
const EVENT_INTERVAL: u32 = 256;

fn bench(kind: Kind, a: &args::PerfArgs) -> fail::Res<()> {
    // One thread per side: the waiting task's thread is the only one.
    // A second worker would sit in epoll_wait and be woken by every
    // arriving message the spinner has already read, taking a core from
    // the spinner or the peer. Interrupt mode gains the same way: the
    // thread that waits in epoll_wait runs the woken task, with no
    // hand-over between workers (64 B over tcp: 1.14x the blocking raw
    // socket instead of 1.46x, docs/benchmarks.md). Busy-poll's spinning
    // thread is the provider's own, not a runtime worker.
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            // A spinning waiter yields to the scheduler between its
            // passes, and every `event_interval` such polls the runtime
            // looks at its I/O driver (an `epoll_wait`): 61 by default,
            // a system call every 25 or so shm round trips. What the
            // driver serves here (the control connection, the DGRAM
            // give-up timer) can wait the few hundred microseconds more.
            .event_interval(EVENT_INTERVAL)
            .build()
            .map_err(|e| fail::Failure::new("start runtime", e))
    };
    let rt = runtime()?;
    // bw --self gives the server side a runtime of its own, as it would
    // have in its own process (see run::run for why).
    let server_rt = if a.self_test && kind == Kind::Bw {
        Some(runtime()?)
    } else {
        None
    };
    let server_handle = server_rt.as_ref().map(|r| r.handle().clone());
    // A current-thread runtime runs its tasks only while some thread
    // blocks on it: the server side's gets a thread of its own, as it
    // would be a process of its own, for as long as the run lasts.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let driver = server_rt.map(|srt| {
        std::thread::spawn(move || {
            srt.block_on(async {
                let _ = stopped.await;
            });
        })
    });
    // The run is a spawned task, not `block_on`'s own future: a wake-up of
    // that future makes the scheduler poll the driver (`epoll_wait` with a
    // zero timeout) before polling it again, which a spinning waiter paid
    // on about every other pass and interrupt mode on every message.
    let args = a.clone();
    let res = rt.block_on(async move {
        tokio::spawn(async move { run::run(kind, &args, server_handle).await })
            .await
            .unwrap_or_else(|e| Err(fail::Failure::new("run", e)))
    });
    let _ = stop.send(());
    if let Some(d) = driver {
        let _ = d.join();
    }
    res
}
