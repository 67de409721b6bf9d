//! Hand-written argument parsing. The option letters follow fi_pingpong
//! and fi_info so that muscle memory (and scripts) carry over.

use std::time::Duration;

use weft::{EpType, WaitMode};

/// The OOB / passive-endpoint port fi_pingpong uses by default.
pub const DEFAULT_PORT: u16 = 47592;

/// `--timeout`: how long each step of setting a run up (the address
/// exchange, the parameter agreement, the final goodbye) may take before
/// the peer is taken for a stranger and dropped.
pub const DEFAULT_CTRL_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `--timeout`: past an hour a peer is surely not coming.
pub const MAX_CTRL_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most timed iterations (`-I`). With the warm-up on top and the
/// largest size, the report's byte total still fits in a u64.
pub const MAX_ITERS: usize = 1_000_000_000;

/// The widest bw window (`-W`).
pub const MAX_WINDOW: usize = 1 << 16;

/// What bw may hold in flight at once, `-W` times the largest `-S`: the
/// server posts that many receive buffers, so past this a typo (or a
/// hostile client) would exhaust its memory.
pub const MAX_BW_BYTES: u64 = 1 << 30;

/// The most sizes one run takes (`-S all` is six); what a peer may ask for.
pub const MAX_SIZES: usize = 64;

/// fi_pingpong's `-S all` list.
pub const ALL_SIZES: &[usize] = &[64, 256, 1 << 10, 4 << 10, 64 << 10, 1 << 20];

pub const USAGE: &str = "\
Usage:
  weft info [-p PROV] [-e EP_TYPE] [-v] [--list]
  weft pingpong [OPTIONS] [DEST]   server without DEST, client with it
  weft bw [OPTIONS] [DEST]         streaming bandwidth, same roles
  weft help

info options:
  -p <prov>     provider name (FI_PROVIDER is honoured as well)
  -e <ep_type>  endpoint type: rdm|msg|dgram
  -v            verbose, fi_info -v style
  --list        print provider names only

pingpong / bw options:
  -p <prov>     provider (tcp)
  -e <ep_type>  endpoint type: rdm|msg|dgram (rdm); dgram (verbs only) sends
                untagged datagrams of at most the port MTU (the offer's
                max_msg_size: larger -S sizes are refused, 'all' skips them),
                bw waits for an acknowledgement after every window, and a
                run fails once nothing completes for 10 s (a lost datagram)
  -d <domain>   domain (RDMA device) name, e.g. rxe1 (the provider's first)
  -S <size>     transfer size (64, 4k, 1m) or 'all' (64 256 1k 4k 64k 1m) (64)
  -I <iters>    timed iterations per size, after 10% untimed warm-up,
                1 to 1000000000 (1000)
  -B <port>     server: control / listen port (47592; 0: any free port,
                printed on stderr); client: OOB source port
  -P <port>     client: server's port, 1-65535 (47592)
  -W <window>   bw only: sends in flight, 1 to 65536, and -W times -S at
                most 1g (64)
  --timeout <s> seconds each step of setting a run up may take: connecting
                and the address exchange on the control port, the
                parameter agreement, the final goodbye (10; 0.1 to 3600).
                The server drops a control connection that says nothing
                useful in time and waits for the next client
  --mode <m>    interrupt (reactor wake-ups, no CPU while idle) |
                busy-poll (the waiter polls itself; a provider thread
                spins whenever no waiter does) |
                inline (the waiting task polls the sockets itself until
                WEFT_INLINE_SPIN_US=200 us pass without progress, then
                sleeps) (interrupt)
  --api <a>     post (post_* + CQ stream) | async (awaited tsend/trecv) (post)
  --verify      check every payload byte, pattern varies per iteration
  --rma <op>    pingpong only: RMA on a registered region of each side
                instead of messages (-e msg or rdm with an RMA provider,
                e.g. -p verbs); the regions' keys go over one message
                first. write: the client writes -S bytes with remote CQ
                data (fi_writedata) into the server's region, the server
                writes them back on seeing it (as ib_write_lat); usec/xfer
                is half a round trip. read: the client reads -S bytes of
                the server's region (fi_read), one read in flight (as
                ib_read_lat); usec/xfer is a whole round trip per read
  --self        server and client in this process over 127.0.0.1
  -h, --help    this text

The server takes sizes, iterations, window, --verify and --rma from the
client.
";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Help,
    Info(InfoArgs),
    Pingpong(PerfArgs),
    Bw(PerfArgs),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InfoArgs {
    pub prov: Option<String>,
    pub ep_type: Option<EpType>,
    pub verbose: bool,
    pub list: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Post,
    Async,
}

/// `--rma`: which RMA operation the pingpong times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rma {
    /// `fi_writedata` there and back.
    Write,
    /// `fi_read` of the server's region.
    Read,
}

impl Rma {
    pub fn name(self) -> &'static str {
        match self {
            Rma::Write => "write",
            Rma::Read => "read",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfArgs {
    pub prov: String,
    /// `-d`: the domain (device) to use, e.g. `rxe1`.
    pub domain: Option<String>,
    pub ep_type: EpType,
    pub sizes: Vec<usize>,
    /// `-S all`: sizes above the endpoint's largest message are skipped
    /// rather than refused.
    pub all_sizes: bool,
    pub iters: usize,
    pub src_port: Option<u16>,
    pub dst_port: Option<u16>,
    pub window: usize,
    pub dest: Option<String>,
    pub mode: WaitMode,
    pub api: Api,
    pub verify: bool,
    /// `--rma`: RMA instead of messages (pingpong only).
    pub rma: Option<Rma>,
    pub self_test: bool,
    /// `--timeout`: see [`DEFAULT_CTRL_TIMEOUT`].
    pub ctrl_timeout: Duration,
}

impl Default for PerfArgs {
    fn default() -> Self {
        PerfArgs {
            prov: "tcp".into(),
            domain: None,
            ep_type: EpType::Rdm,
            sizes: vec![64],
            all_sizes: false,
            iters: 1000,
            src_port: None,
            dst_port: None,
            window: 64,
            dest: None,
            mode: WaitMode::Interrupt,
            api: Api::Post,
            verify: false,
            rma: None,
            self_test: false,
            ctrl_timeout: DEFAULT_CTRL_TIMEOUT,
        }
    }
}

/// A usage error: the message is printed above the usage text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

type Parsed<T> = Result<T, UsageError>;

fn bad<T>(msg: impl Into<String>) -> Parsed<T> {
    Err(UsageError(msg.into()))
}

/// Parses everything after the program name.
pub fn parse(argv: &[String]) -> Parsed<Command> {
    let Some((cmd, rest)) = argv.split_first() else {
        return bad("missing command");
    };
    match cmd.as_str() {
        "help" | "-h" | "--help" => Ok(Command::Help),
        "info" => parse_info(rest),
        "pingpong" => parse_perf(rest, false).map(|a| a.map_or(Command::Help, Command::Pingpong)),
        "bw" => parse_perf(rest, true).map(|a| a.map_or(Command::Help, Command::Bw)),
        other => bad(format!("unknown command '{other}'")),
    }
}

/// Walks the arguments, handing out option values; keeps the "missing
/// value" error in one place.
struct Cursor<'a> {
    it: std::slice::Iter<'a, String>,
}

impl<'a> Cursor<'a> {
    fn value(&mut self, opt: &str) -> Parsed<&'a str> {
        match self.it.next() {
            Some(v) => Ok(v.as_str()),
            None => bad(format!("option {opt} needs a value")),
        }
    }
}

fn parse_ep_type(s: &str) -> Parsed<EpType> {
    match s.to_ascii_lowercase().as_str() {
        "rdm" => Ok(EpType::Rdm),
        "msg" => Ok(EpType::Msg),
        "dgram" => Ok(EpType::Dgram),
        _ => bad(format!("-e {s}: endpoint type must be rdm, msg or dgram")),
    }
}

fn parse_info(rest: &[String]) -> Parsed<Command> {
    let mut a = InfoArgs::default();
    let mut c = Cursor { it: rest.iter() };
    while let Some(arg) = c.it.next() {
        match arg.as_str() {
            "-p" => a.prov = Some(c.value("-p")?.to_string()),
            "-e" => a.ep_type = Some(parse_ep_type(c.value("-e")?)?),
            "-v" | "--verbose" => a.verbose = true,
            "-l" | "--list" => a.list = true,
            "-h" | "--help" => return Ok(Command::Help),
            other => return bad(format!("info: unexpected argument '{other}'")),
        }
    }
    Ok(Command::Info(a))
}

/// `None` means help was asked for.
fn parse_perf(rest: &[String], bw: bool) -> Parsed<Option<PerfArgs>> {
    let mut a = PerfArgs::default();
    let mut c = Cursor { it: rest.iter() };
    while let Some(arg) = c.it.next() {
        match arg.as_str() {
            "-p" => a.prov = c.value("-p")?.to_string(),
            "-d" => a.domain = Some(c.value("-d")?.to_string()),
            "-e" => a.ep_type = parse_ep_type(c.value("-e")?)?,
            "-S" => {
                let v = c.value("-S")?;
                a.sizes = parse_sizes(v)?;
                a.all_sizes = v.eq_ignore_ascii_case("all");
            }
            "-I" => a.iters = parse_count("-I", c.value("-I")?, MAX_ITERS)?,
            "-B" => a.src_port = Some(parse_port("-B", c.value("-B")?, 0)?),
            "-P" => a.dst_port = Some(parse_port("-P", c.value("-P")?, 1)?),
            "-W" if bw => a.window = parse_count("-W", c.value("-W")?, MAX_WINDOW)?,
            "--timeout" => a.ctrl_timeout = parse_timeout(c.value("--timeout")?)?,
            "--mode" => {
                let v = c.value("--mode")?;
                a.mode = match WaitMode::parse(v) {
                    Some(m) => m,
                    None => return bad(format!("--mode {v}: use interrupt, busy-poll or inline")),
                };
            }
            "--api" => {
                a.api = match c.value("--api")? {
                    "post" => Api::Post,
                    "async" => Api::Async,
                    v => return bad(format!("--api {v}: use post or async")),
                }
            }
            "--verify" | "-c" => a.verify = true,
            "--rma" if !bw => {
                a.rma = match c.value("--rma")? {
                    "write" => Some(Rma::Write),
                    "read" => Some(Rma::Read),
                    v => return bad(format!("--rma {v}: use write or read")),
                }
            }
            "--rma" => return bad("--rma: a pingpong option (bw streams messages)"),
            "--self" => a.self_test = true,
            "-h" | "--help" => return Ok(None),
            s if s.starts_with('-') && s.len() > 1 => {
                return bad(format!("unknown option '{s}'"));
            }
            dest => {
                if a.dest.is_some() {
                    return bad(format!("unexpected argument '{dest}'"));
                }
                a.dest = Some(dest.to_string());
            }
        }
    }
    if a.self_test && a.dest.is_some() {
        return bad("--self runs both sides locally: give no destination");
    }
    if bw {
        bw_in_flight(a.window, &a.sizes).or_else(bad)?;
    }
    Ok(Some(a))
}

/// A count from 1 to `max`.
fn parse_count(opt: &str, s: &str, max: usize) -> Parsed<usize> {
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => bad(format!("{opt} {s}: expected an integer from 1 to {max}")),
    }
}

/// A port from `min` to 65535.
fn parse_port(opt: &str, s: &str, min: u16) -> Parsed<u16> {
    match s.parse::<u16>() {
        Ok(p) if p >= min => Ok(p),
        _ => bad(format!(
            "{opt} {s}: expected a port number from {min} to 65535"
        )),
    }
}

/// Seconds, fractions allowed, from 0.1 to [`MAX_CTRL_TIMEOUT`].
fn parse_timeout(s: &str) -> Parsed<Duration> {
    let max = MAX_CTRL_TIMEOUT.as_secs();
    match s.parse::<f64>().ok().map(Duration::try_from_secs_f64) {
        Some(Ok(d)) if d >= Duration::from_millis(100) && d <= MAX_CTRL_TIMEOUT => Ok(d),
        _ => bad(format!(
            "--timeout {s}: expected seconds from 0.1 to {max} (e.g. 10, 2.5)"
        )),
    }
}

/// bw keeps up to `window` messages of each size in flight: the bytes
/// that takes must stay within [`MAX_BW_BYTES`]. The message says what
/// would fit; the server judges a client's parameters by it too.
pub fn bw_in_flight(window: usize, sizes: &[usize]) -> Result<(), String> {
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let bytes = (window as u64).checked_mul(largest as u64);
    if bytes.is_some_and(|b| b <= MAX_BW_BYTES) {
        return Ok(());
    }
    let fits = MAX_BW_BYTES / (largest as u64).max(1);
    Err(format!(
        "-W {window} with -S {largest}: bw would keep more than 1g in flight; \
         use -W {fits} or less at that size"
    ))
}

/// The largest size accepted: anything bigger is surely a typo, and the
/// provider's own limit is 1 GiB.
pub const MAX_SIZE: usize = 1 << 30;

/// `all`, or one size with an optional k/m/g (binary) suffix, as
/// fi_pingpong accepts.
pub fn parse_sizes(s: &str) -> Parsed<Vec<usize>> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(ALL_SIZES.to_vec());
    }
    let lower = s.to_ascii_lowercase();
    let (num, shift) = match lower.as_bytes().last() {
        Some(b'k') => (&lower[..lower.len() - 1], 10),
        Some(b'm') => (&lower[..lower.len() - 1], 20),
        Some(b'g') => (&lower[..lower.len() - 1], 30),
        _ => (lower.as_str(), 0),
    };
    let n = num
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1usize << shift));
    match n {
        Some(n) if (1..=MAX_SIZE).contains(&n) => Ok(vec![n]),
        _ => bad(format!(
            "-S {s}: expected 'all' or a size from 1 to 1g (e.g. 64, 4k, 1m)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_sizes("64").unwrap(), vec![64]);
        assert_eq!(parse_sizes("4k").unwrap(), vec![4096]);
        assert_eq!(parse_sizes("1M").unwrap(), vec![1 << 20]);
        assert_eq!(parse_sizes("all").unwrap(), ALL_SIZES.to_vec());
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("2g").is_err());
        assert!(parse_sizes("x").is_err());
    }

    #[test]
    fn pingpong_options() {
        let c = parse(&argv(
            "pingpong -e msg -S 1k -I 5 -P 9000 --mode busy-poll --api async --verify 10.0.0.1",
        ))
        .unwrap();
        let Command::Pingpong(a) = c else {
            unreachable!()
        };
        assert_eq!(a.ep_type, EpType::Msg);
        assert_eq!(a.sizes, vec![1024]);
        assert_eq!(a.iters, 5);
        assert_eq!(a.dst_port, Some(9000));
        assert_eq!(a.mode, WaitMode::BusyPoll);
        assert_eq!(a.api, Api::Async);
        assert!(a.verify);
        assert_eq!(a.dest.as_deref(), Some("10.0.0.1"));
    }

    #[test]
    fn dgram() {
        let Command::Pingpong(a) =
            parse(&argv("pingpong -p verbs -e dgram -S 1k 10.66.0.1")).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(a.ep_type, EpType::Dgram);
        assert_eq!((a.sizes.clone(), a.all_sizes), (vec![1024], false));
        let Command::Bw(a) = parse(&argv("bw -e DGRAM -S all -W 8")).unwrap() else {
            unreachable!()
        };
        assert_eq!((a.ep_type, a.all_sizes, a.window), (EpType::Dgram, true, 8));
        let Command::Info(i) = parse(&argv("info -p verbs -e dgram")).unwrap() else {
            unreachable!()
        };
        assert_eq!(i.ep_type, Some(EpType::Dgram));
        assert_eq!(i.prov.as_deref(), Some("verbs"));
        let e = parse(&argv("pingpong -e sock_dgram")).unwrap_err();
        assert!(e.0.contains("rdm, msg or dgram"), "{e:?}");
        assert!(USAGE.contains("rdm|msg|dgram"));
    }

    #[test]
    fn rma() {
        let Command::Pingpong(a) =
            parse(&argv("pingpong -p verbs -e msg --rma write 10.66.0.1")).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(a.rma, Some(Rma::Write));
        let Command::Pingpong(a) = parse(&argv("pingpong --rma read")).unwrap() else {
            unreachable!()
        };
        assert_eq!(a.rma, Some(Rma::Read));
        assert_eq!(PerfArgs::default().rma, None);
        let e = parse(&argv("pingpong --rma atomic")).unwrap_err();
        assert!(e.0.contains("write or read"), "{e:?}");
        assert!(parse(&argv("pingpong --rma")).is_err());
        let e = parse(&argv("bw --rma write")).unwrap_err();
        assert!(e.0.contains("pingpong option"), "{e:?}");
    }

    #[test]
    fn errors() {
        assert!(parse(&argv("")).is_err());
        assert!(parse(&argv("frob")).is_err());
        assert!(parse(&argv("pingpong -I")).is_err());
        assert!(parse(&argv("pingpong -I 0")).is_err());
        assert!(parse(&argv("pingpong -W 4")).is_err());
        assert!(parse(&argv("pingpong --self 1.2.3.4")).is_err());
        assert!(parse(&argv("info -x")).is_err());
        assert!(matches!(parse(&argv("bw -W 4")), Ok(Command::Bw(a)) if a.window == 4));
        assert_eq!(parse(&argv("pingpong -h")), Ok(Command::Help));
    }

    /// The message of the usage error `line` gives.
    fn err(line: &str) -> String {
        match parse(&argv(line)) {
            Err(UsageError(m)) => m,
            Ok(c) => unreachable!("{line}: accepted as {c:?}"),
        }
    }

    fn perf(line: &str) -> PerfArgs {
        match parse(&argv(line)) {
            Ok(Command::Pingpong(a) | Command::Bw(a)) => a,
            other => unreachable!("{line}: {other:?}"),
        }
    }

    #[test]
    fn iteration_counts_are_bounded() {
        assert_eq!(
            err("pingpong -I 18446744073709551615"),
            "-I 18446744073709551615: expected an integer from 1 to 1000000000"
        );
        assert_eq!(
            err("pingpong -I 1000000001"),
            "-I 1000000001: expected an integer from 1 to 1000000000"
        );
        assert_eq!(
            err("pingpong -I 0"),
            "-I 0: expected an integer from 1 to 1000000000"
        );
        assert_eq!(
            err("pingpong -I -5"),
            "-I -5: expected an integer from 1 to 1000000000"
        );
        assert_eq!(
            err("pingpong -I 1e3"),
            "-I 1e3: expected an integer from 1 to 1000000000"
        );
        assert_eq!(perf("pingpong -I 1000000000").iters, MAX_ITERS);
        // The largest count still leaves room for the warm-up on top.
        let p = crate::proto::Params::from_args(
            crate::proto::Kind::Pingpong,
            &perf("pingpong -I 1000000000"),
        );
        assert_eq!(p.total().ok(), Some(1_100_000_000));
    }

    #[test]
    fn ports_are_checked() {
        assert_eq!(
            err("pingpong -P 0 host"),
            "-P 0: expected a port number from 1 to 65535"
        );
        assert_eq!(
            err("pingpong -P 65536 host"),
            "-P 65536: expected a port number from 1 to 65535"
        );
        assert_eq!(
            err("pingpong -B 99999"),
            "-B 99999: expected a port number from 0 to 65535"
        );
        assert_eq!(
            err("bw -B http"),
            "-B http: expected a port number from 0 to 65535"
        );
        assert_eq!(
            err("pingpong -P -1 host"),
            "-P -1: expected a port number from 1 to 65535"
        );
        assert_eq!(perf("pingpong -B 0").src_port, Some(0));
        assert_eq!(perf("pingpong -P 65535 h").dst_port, Some(65535));
    }

    #[test]
    fn sizes_are_checked() {
        assert_eq!(
            err("pingpong -S 0"),
            "-S 0: expected 'all' or a size from 1 to 1g (e.g. 64, 4k, 1m)"
        );
        for bad in ["18446744073709551615g", "1025m", "2g", "k", "-1", "4kk"] {
            assert!(err(&format!("pingpong -S {bad}")).starts_with(&format!("-S {bad}: ")));
        }
        assert_eq!(perf("pingpong -S 1g").sizes, vec![MAX_SIZE]);
    }

    #[test]
    fn bw_windows_are_bounded() {
        assert_eq!(err("bw -W 0"), "-W 0: expected an integer from 1 to 65536");
        assert_eq!(
            err("bw -W 65537"),
            "-W 65537: expected an integer from 1 to 65536"
        );
        // 64 x 1 GiB receive buffers would be 64 GiB on the server.
        assert_eq!(
            err("bw -S 1g"),
            "-W 64 with -S 1073741824: bw would keep more than 1g in flight; \
             use -W 1 or less at that size"
        );
        assert_eq!(
            err("bw -S 1m -W 1025"),
            "-W 1025 with -S 1048576: bw would keep more than 1g in flight; \
             use -W 1024 or less at that size"
        );
        assert_eq!(perf("bw -S 1m -W 1024").window, 1024);
        assert_eq!(perf("bw -S 16m").window, 64);
        assert_eq!(perf("bw -S 1g -W 1").sizes, vec![MAX_SIZE]);
        // The window is bw's alone: a pingpong of 1 GiB is fine.
        assert_eq!(perf("pingpong -S 1g").sizes, vec![MAX_SIZE]);
        assert_eq!(bw_in_flight(1024, &[1 << 20]), Ok(()));
        assert_eq!(
            bw_in_flight(MAX_WINDOW, &[MAX_SIZE]),
            Err(
                "-W 65536 with -S 1073741824: bw would keep more than 1g in flight; \
                 use -W 1 or less at that size"
                    .into()
            )
        );
    }

    #[test]
    fn timeouts_are_checked() {
        assert_eq!(PerfArgs::default().ctrl_timeout, Duration::from_secs(10));
        assert_eq!(
            perf("pingpong --timeout 2.5").ctrl_timeout,
            Duration::from_millis(2500)
        );
        assert_eq!(
            perf("bw --timeout 0.1 h").ctrl_timeout,
            Duration::from_millis(100)
        );
        assert_eq!(perf("bw --timeout 3600").ctrl_timeout, MAX_CTRL_TIMEOUT);
        for bad in ["0", "0.05", "-1", "3601", "nan", "inf", "1e400", "ten", ""] {
            assert_eq!(
                err(&format!("pingpong --timeout {bad}")),
                if bad.is_empty() {
                    "option --timeout needs a value".to_string()
                } else {
                    format!("--timeout {bad}: expected seconds from 0.1 to 3600 (e.g. 10, 2.5)")
                }
            );
        }
        assert!(USAGE.contains("--timeout <s>"));
    }
}
