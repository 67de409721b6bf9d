//! What TLS costs on tcp, measured with the `weft` CLI the other tcp
//! figures come from: `weft pingpong --self` (64 B, µs per transfer,
//! half a round trip as fi_pingpong reports it) and `weft bw --self`
//! (1 MiB, MB/s with a window of sends), each run plain and with TLS
//! (the `FI_TCP_TLS_*` variables naming throw-away certificates made at
//! start), alternated within each round so that load changes on a shared
//! machine hit both alike.
//!
//! usage: `tls-cost [ROUNDS] [MODES] [WEFT]` (defaults 5,
//! `interrupt,busy-poll,inline`, and the `weft` binary beside this one)
//!
//! Prints every run, then per mode the medians and the TLS / plain ratio
//! of each round (median, lowest and highest).

use std::path::PathBuf;
use std::process::Command;

use weft_integration::tls::TestPki;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const PING: [&str; 6] = ["pingpong", "--self", "-S", "64", "-I", "20000"];
const BW: [&str; 6] = ["bw", "--self", "-S", "1m", "-I", "2000"];
const VARS: [&str; 3] = ["FI_TCP_TLS_CERT", "FI_TCP_TLS_KEY", "FI_TCP_TLS_CA"];

/// The number after `"field":` in `weft`'s JSON report.
fn field(json: &str, name: &str) -> Res<f64> {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .ok_or_else(|| format!("no {name} in {json}"))?
        + key.len();
    let rest = json[at..].trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-'))
        .unwrap_or(rest.len());
    Ok(rest[..end].parse()?)
}

/// One run of `weft` with `args` and `--mode mode`, with `tls` as the
/// variables (or none of them): the value of `name` it reports.
fn run(
    weft: &PathBuf,
    args: &[&str],
    mode: &str,
    tls: Option<&[PathBuf; 3]>,
    name: &str,
) -> Res<f64> {
    let mut c = Command::new(weft);
    c.args(args).args(["--mode", mode, "--json"]);
    for (i, v) in VARS.iter().enumerate() {
        match tls {
            Some(f) => c.env(v, &f[i]),
            None => c.env_remove(v),
        };
    }
    let out = c.output()?;
    if !out.status.success() {
        return Err(format!(
            "weft {args:?} --mode {mode} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    field(&String::from_utf8_lossy(&out.stdout), name)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let modes = args
        .get(1)
        .map_or("interrupt,busy-poll,inline", String::as_str);
    let weft = match args.get(2) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()?
            .parent()
            .ok_or("no directory")?
            .join("weft"),
    };
    let pki = TestPki::new();
    let f = pki.issue("bench");
    let files = [f.cert, f.key, f.ca];
    println!(
        "weft {} --mode M --json and weft {} --mode M --json, {rounds} rounds, \
         plain then TLS in each",
        PING.join(" "),
        BW.join(" ")
    );
    let mut rows = Vec::new();
    for mode in modes.split(',') {
        let (mut lat, mut bw) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        for round in 0..rounds {
            for (k, tls) in [None, Some(&files)].into_iter().enumerate() {
                let l = run(&weft, &PING, mode, tls, "usec_per_xfer")?;
                let b = run(&weft, &BW, mode, tls, "mb_per_sec")?;
                let kind = ["plain", "tls"][k];
                println!(
                    "{mode:9} round {round} {kind:5}: 64 B {l:6.2} us/xfer, 1 MiB {b:6.0} MB/s"
                );
                lat[k].push(l);
                bw[k].push(b);
            }
        }
        let lr: Vec<f64> = lat[1].iter().zip(&lat[0]).map(|(t, p)| t / p).collect();
        let br: Vec<f64> = bw[1].iter().zip(&bw[0]).map(|(t, p)| t / p).collect();
        rows.push(format!(
            "| {mode} | {:.2} | {:.2} | {:.2} ({:.2}–{:.2}) | {:.0} | {:.0} | {:.2} ({:.2}–{:.2}) |",
            median(&lat[0]),
            median(&lat[1]),
            median(&lr),
            spread(&lr).0,
            spread(&lr).1,
            median(&bw[0]),
            median(&bw[1]),
            median(&br),
            spread(&br).0,
            spread(&br).1,
        ));
    }
    println!();
    println!(
        "| mode | 64 B plain µs | 64 B TLS µs | TLS / plain, latency (spread) \
         | 1 MiB plain MB/s | 1 MiB TLS MB/s | TLS / plain, bandwidth (spread) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}
