//! The command line, through clap. The option letters follow fi_pingpong
//! and fi_info so that muscle memory (and scripts) carry over, and every
//! value is checked where it is parsed, in the words the hand-written
//! parser before clap used ("-I 0: expected an integer from 1 to
//! 1000000000"), so that a refusal says what would be accepted.

use std::ffi::{OsStr, OsString};
use std::time::Duration;

use clap::builder::{PossibleValue, StringValueParser, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use clap_complete::Shell;
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

/// The largest size accepted: anything bigger is surely a typo, and the
/// provider's own limit is 1 GiB.
pub const MAX_SIZE: usize = 1 << 30;

/// What `weft` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Info(InfoArgs),
    Pingpong(PerfArgs),
    Bw(PerfArgs),
    Completions(Shell),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InfoArgs {
    pub prov: Option<String>,
    pub ep_type: Option<EpType>,
    pub verbose: bool,
    pub list: bool,
    /// `--json`: one JSON document instead of the text.
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Post,
    Async,
    /// Awaited sends and receives of registered pool buffers (not with
    /// `--rma`).
    Pool,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Post => "post",
            Api::Async => "async",
            Api::Pool => "pool",
        }
    }
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
    /// `--json`: the results as one JSON document instead of the table.
    pub json: bool,
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
            json: false,
        }
    }
}

/// fi_info and fi_pingpong for Weft.
#[derive(Debug, Parser)]
#[command(
    name = "weft",
    version,
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Sub,
}

const PINGPONG_NOTES: &str = "The server takes sizes, iterations, --verify and --rma from the \
                              client. Set RUST_LOG (or libfabric's FI_LOG_LEVEL) for diagnostics \
                              on stderr.";
const BW_NOTES: &str = "The server takes sizes, iterations, -W and --verify from the client. Set \
                        RUST_LOG (or libfabric's FI_LOG_LEVEL) for diagnostics on stderr.";

#[derive(Debug, Subcommand)]
enum Sub {
    /// The providers' offers, as fi_info prints them.
    Info(InfoCli),
    /// Latency, as fi_pingpong: a server without DEST, a client with it.
    #[command(after_help = PINGPONG_NOTES)]
    Pingpong(PingpongCli),
    /// Streaming bandwidth, -W sends in flight: a server without DEST, a
    /// client with it.
    #[command(after_help = BW_NOTES)]
    Bw(BwCli),
    /// Prints a shell's completion script for weft on stdout.
    ///
    /// bash: weft completions bash > ~/.local/share/bash-completion/completions/weft
    ///
    /// zsh: weft completions zsh > "${fpath[1]}/_weft"
    ///
    /// fish: weft completions fish > ~/.config/fish/completions/weft.fish
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: Shell,
    },
}

#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct InfoCli {
    /// Provider name (FI_PROVIDER is honoured as well).
    #[arg(short = 'p', value_name = "prov", allow_hyphen_values = true)]
    prov: Option<String>,
    /// Endpoint type: rdm|msg|dgram.
    #[arg(short = 'e', value_name = "ep_type", value_parser = ep_types(), hide_possible_values = true, allow_hyphen_values = true)]
    ep_type: Option<EpType>,
    /// Verbose, fi_info -v style.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Print provider names only.
    #[arg(short = 'l', long)]
    list: bool,
    /// One JSON document on stdout instead of the text.
    #[arg(long)]
    json: bool,
}

/// What pingpong and bw share. An option takes the next word whatever it
/// is (`allow_hyphen_values`), as fi_pingpong's getopt does: `-I -5` is
/// refused for its value, not taken for an unknown option `-5`.
#[derive(Debug, Args)]
struct PerfCli {
    /// Provider.
    #[arg(
        short = 'p',
        value_name = "prov",
        default_value = "tcp",
        allow_hyphen_values = true
    )]
    prov: String,
    /// Endpoint type: rdm|msg|dgram.
    ///
    /// dgram (-p verbs or -p udp) sends untagged datagrams of at most one
    /// packet (the offer's max_msg_size: the port's or interface's MTU
    /// less headers; larger -S sizes are refused, 'all' skips them), bw
    /// waits for an acknowledgement after every window, and a run fails
    /// once nothing completes for 10 s (a lost datagram).
    #[arg(short = 'e', value_name = "ep_type", value_parser = ep_types(), default_value = "rdm", hide_possible_values = true, allow_hyphen_values = true)]
    ep_type: EpType,
    /// Domain name: an RDMA device (rxe1) or, for udp, an interface (lo);
    /// the provider's first by default.
    #[arg(short = 'd', value_name = "domain", allow_hyphen_values = true)]
    domain: Option<String>,
    /// Transfer size (64, 4k, 1m) or 'all' (64 256 1k 4k 64k 1m).
    #[arg(short = 'S', value_name = "size", value_parser = size_arg, default_value = "64", allow_hyphen_values = true)]
    sizes: Sizes,
    /// Timed iterations per size, after 10% untimed warm-up, 1 to
    /// 1000000000.
    #[arg(short = 'I', value_name = "iters", value_parser = iters_arg, default_value = "1000", allow_hyphen_values = true)]
    iters: usize,
    /// Server: control / listen port (0: any free port, printed on
    /// stderr); client: OOB source port [default: 47592]
    #[arg(short = 'B', value_name = "port", value_parser = src_port_arg, allow_hyphen_values = true)]
    src_port: Option<u16>,
    /// Client: the server's port, 1-65535 [default: 47592]
    #[arg(short = 'P', value_name = "port", value_parser = dst_port_arg, allow_hyphen_values = true)]
    dst_port: Option<u16>,
    /// Seconds each step of setting a run up may take (0.1 to 3600).
    ///
    /// The steps are connecting and the address exchange on the control
    /// port, the parameter agreement, and the final goodbye. The server
    /// drops a control connection that says nothing useful in time and
    /// waits for the next client.
    #[arg(long, value_name = "s", value_parser = timeout_arg, default_value = "10", allow_hyphen_values = true)]
    timeout: Duration,
    /// How a waiter waits for completions.
    ///
    /// interrupt: reactor wake-ups, no CPU while idle. busy-poll: the
    /// waiter polls itself; a provider thread spins whenever no waiter
    /// does. inline: the waiting task polls the sockets itself until
    /// its budget passes without progress, then sleeps (a CQ reader's
    /// budget: 8x its usual wait, 200 us to 2 ms; WEFT_INLINE_SPIN_US
    /// fixes it).
    #[arg(long, value_name = "m", value_parser = modes(), default_value = "interrupt", allow_hyphen_values = true)]
    mode: WaitMode,
    /// post: post_* and a CQ stream; async: awaited tsend/trecv; pool:
    /// awaited sends and receives of buffers from a pool registered once
    /// (Domain::buffer_pool; bw: -W buffers of the size, pingpong: 4, the
    /// server echoing the buffer a message arrived in): no registration
    /// or bounce copy per message. pingpong: messages only, not RMA (a
    /// server given pool serves a client's RMA run as async). Each
    /// side's own: give it to both.
    #[arg(long, value_name = "a", value_parser = apis(), default_value = "post", allow_hyphen_values = true)]
    api: Api,
    /// Check every payload byte; the pattern varies per iteration.
    #[arg(long, short = 'c')]
    verify: bool,
    /// Server and client in this process over 127.0.0.1.
    #[arg(long = "self")]
    self_test: bool,
    /// The results as one JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// The server's address: a client with it, a server without.
    #[arg(value_name = "DEST")]
    dest: Option<String>,
}

#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct PingpongCli {
    #[command(flatten)]
    perf: PerfCli,
    /// RMA on a registered region of each side instead of messages.
    ///
    /// For -e msg or rdm with an RMA provider, e.g. -p verbs; the regions'
    /// keys go over one message first. write: the client writes -S bytes
    /// with remote CQ data (fi_writedata) into the server's region, the
    /// server writes them back on seeing it (as ib_write_lat); usec/xfer
    /// is half a round trip. read: the client reads -S bytes of the
    /// server's region (fi_read), one read in flight (as ib_read_lat);
    /// usec/xfer is a whole round trip per read. Not with --api pool.
    #[arg(long, value_name = "op", value_parser = rmas(), allow_hyphen_values = true)]
    rma: Option<Rma>,
}

#[derive(Debug, Args)]
#[command(args_override_self = true)]
struct BwCli {
    #[command(flatten)]
    perf: PerfCli,
    /// Sends in flight, 1 to 65536, and -W times -S at most 1g.
    #[arg(short = 'W', value_name = "window", value_parser = window_arg, default_value = "64", allow_hyphen_values = true)]
    window: usize,
}

/// Why `weft` stops before running anything: help or the version was
/// asked for (exit 0), or the command line is wrong (exit 2).
#[derive(Debug)]
pub struct Stop {
    /// A usage error in its own words ("-I 0: expected ..."); for help,
    /// the help text. The binary prints `err`, which holds the same words
    /// with the usage line; this is what the tests check.
    #[cfg_attr(not(test), allow(dead_code))]
    pub msg: String,
    err: clap::Error,
}

impl Stop {
    /// Help or the version, not a mistake.
    #[cfg(test)]
    pub fn is_help(&self) -> bool {
        self.err.exit_code() == 0
    }

    /// Prints the message or help where clap puts it (help on stdout,
    /// errors on stderr with the usage line), and says how to exit.
    pub fn exit(&self) -> std::process::ExitCode {
        let _ = self.err.print();
        let code = u8::try_from(self.err.exit_code()).unwrap_or(2);
        std::process::ExitCode::from(code)
    }

    /// Clap's own refusal, reworded where the old parser had words of its
    /// own: a value check says only what its checker said, a missing
    /// value is "option -I needs a value", and one benchmark's option
    /// given to the other says whose it is.
    fn from_clap(cmd: &mut clap::Command, sub: Option<&str>, e: clap::Error) -> Stop {
        let ours = match e.kind() {
            ErrorKind::ValueValidation => std::error::Error::source(&e).map(|s| s.to_string()),
            ErrorKind::UnknownArgument => {
                context(&e, ContextKind::InvalidArg).and_then(|a| misplaced(sub?, a))
            }
            ErrorKind::InvalidValue if is_missing_value(&e) => context(&e, ContextKind::InvalidArg)
                .map(|arg| {
                    let opt = arg.split(' ').next().unwrap_or(arg);
                    format!("option {opt} needs a value")
                }),
            _ => None,
        };
        match ours {
            Some(msg) => Stop::ours(cmd, sub, e.kind(), msg),
            None => Stop {
                msg: e.render().to_string(),
                err: e,
            },
        }
    }

    /// A usage error in our words, shown with `sub`'s usage line.
    fn ours(cmd: &mut clap::Command, sub: Option<&str>, kind: ErrorKind, msg: String) -> Stop {
        cmd.build();
        let err = match sub.and_then(|s| cmd.find_subcommand_mut(s)) {
            Some(sc) => sc.error(kind, &msg),
            None => cmd.error(kind, &msg),
        };
        Stop { msg, err }
    }
}

fn context(e: &clap::Error, kind: ContextKind) -> Option<&str> {
    match e.get(kind)? {
        ContextValue::String(s) => Some(s),
        _ => None,
    }
}

/// One benchmark's option given to the other: said so, rather than
/// clap's "unexpected argument".
fn misplaced(sub: &str, arg: &str) -> Option<String> {
    let opt = arg.split('=').next().unwrap_or(arg);
    match (sub, opt) {
        ("bw", "--rma") => Some("--rma: a pingpong option (bw streams messages)".into()),
        ("pingpong", w) if w.starts_with("-W") => {
            Some("-W: a bw option (pingpong has one message in flight)".into())
        }
        _ => None,
    }
}

/// Clap reports an option given last, without its value, as an invalid
/// empty value.
fn is_missing_value(e: &clap::Error) -> bool {
    context(e, ContextKind::InvalidValue).is_some_and(str::is_empty)
}

/// Parses everything after the program name.
pub fn parse<I, T>(argv: I) -> Result<Command, Stop>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let argv: Vec<OsString> = std::iter::once(OsString::from("weft"))
        .chain(argv.into_iter().map(Into::into))
        .collect();
    // The subcommand, for the usage line under an error of ours: weft
    // itself takes no option with a value, so it is the first argument.
    let sub = argv.get(1).and_then(|s| s.to_str()).map(str::to_owned);
    let mut cmd = Cli::command();
    let cli = cmd
        .try_get_matches_from_mut(argv)
        .and_then(|m| Cli::from_arg_matches(&m))
        .map_err(|e| Stop::from_clap(&mut cmd, sub.as_deref(), e))?;
    cli.cmd
        .into_command()
        .map_err(|(kind, msg)| Stop::ours(&mut cmd, sub.as_deref(), kind, msg))
}

/// `weft completions <shell>`: the script, for `out`.
pub fn completions(shell: Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut Cli::command(), "weft", out);
}

impl Sub {
    /// The checks that take more than one option: the error's kind and
    /// message if they fail.
    fn into_command(self) -> Result<Command, (ErrorKind, String)> {
        match self {
            Sub::Info(i) => Ok(Command::Info(InfoArgs {
                prov: i.prov,
                ep_type: i.ep_type,
                verbose: i.verbose,
                list: i.list,
                json: i.json,
            })),
            Sub::Pingpong(p) => p
                .perf
                .into_args(PerfArgs::default().window, p.rma)
                .and_then(|a| {
                    if a.api == Api::Pool && a.rma.is_some() {
                        Err((
                            ErrorKind::ArgumentConflict,
                            "--api pool: messages only (--rma writes and reads its own \
                             registered regions; use --api post or async)"
                                .into(),
                        ))
                    } else {
                        Ok(a)
                    }
                })
                .map(Command::Pingpong),
            Sub::Bw(b) => {
                let a = b.perf.into_args(b.window, None)?;
                bw_in_flight(a.window, &a.sizes).map_err(|m| (ErrorKind::ValueValidation, m))?;
                Ok(Command::Bw(a))
            }
            Sub::Completions { shell } => Ok(Command::Completions(shell)),
        }
    }
}

impl PerfCli {
    fn into_args(self, window: usize, rma: Option<Rma>) -> Result<PerfArgs, (ErrorKind, String)> {
        if self.self_test && self.dest.is_some() {
            return Err((
                ErrorKind::ArgumentConflict,
                "--self runs both sides locally: give no destination".into(),
            ));
        }
        Ok(PerfArgs {
            prov: self.prov,
            domain: self.domain,
            ep_type: self.ep_type,
            sizes: self.sizes.list,
            all_sizes: self.sizes.all,
            iters: self.iters,
            src_port: self.src_port,
            dst_port: self.dst_port,
            window,
            dest: self.dest,
            mode: self.mode,
            api: self.api,
            verify: self.verify,
            rma,
            self_test: self.self_test,
            ctrl_timeout: self.timeout,
            json: self.json,
        })
    }
}

/// A value from a short list of names: listed in `--help` and the shell
/// completions, refused in `parse`'s own words.
#[derive(Clone)]
struct Choice<T> {
    names: &'static [&'static str],
    parse: fn(&str) -> Result<T, String>,
}

impl<T: Clone + Send + Sync + 'static> TypedValueParser for Choice<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let parse = self.parse;
        // try_map keeps the checker's message as the error's source,
        // which is what `Stop` shows.
        StringValueParser::new()
            .try_map(move |s| parse(&s))
            .parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(self.names.iter().map(|&n| PossibleValue::new(n))))
    }
}

fn ep_types() -> Choice<EpType> {
    Choice {
        names: &["rdm", "msg", "dgram"],
        parse: parse_ep_type,
    }
}

fn modes() -> Choice<WaitMode> {
    Choice {
        names: &["interrupt", "busy-poll", "inline"],
        parse: |v| {
            WaitMode::parse(v)
                .ok_or_else(|| format!("--mode {v}: use interrupt, busy-poll or inline"))
        },
    }
}

fn apis() -> Choice<Api> {
    Choice {
        names: &["post", "async", "pool"],
        parse: |v| match v {
            "post" => Ok(Api::Post),
            "async" => Ok(Api::Async),
            "pool" => Ok(Api::Pool),
            _ => Err(format!("--api {v}: use post, async or pool")),
        },
    }
}

fn rmas() -> Choice<Rma> {
    Choice {
        names: &["write", "read"],
        parse: |v| match v {
            "write" => Ok(Rma::Write),
            "read" => Ok(Rma::Read),
            _ => Err(format!("--rma {v}: use write or read")),
        },
    }
}

fn parse_ep_type(s: &str) -> Result<EpType, String> {
    match s.to_ascii_lowercase().as_str() {
        "rdm" => Ok(EpType::Rdm),
        "msg" => Ok(EpType::Msg),
        "dgram" => Ok(EpType::Dgram),
        _ => Err(format!("-e {s}: endpoint type must be rdm, msg or dgram")),
    }
}

/// `-e` as the user spells it: `dgram` for `FI_EP_DGRAM`.
pub fn ep_name(t: EpType) -> String {
    t.fi_name()
        .trim_start_matches("FI_EP_")
        .to_ascii_lowercase()
}

/// `-S`: the sizes, and whether they were `all`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sizes {
    list: Vec<usize>,
    all: bool,
}

fn size_arg(s: &str) -> Result<Sizes, String> {
    Ok(Sizes {
        list: parse_sizes(s)?,
        all: s.eq_ignore_ascii_case("all"),
    })
}

fn iters_arg(s: &str) -> Result<usize, String> {
    parse_count("-I", s, MAX_ITERS)
}

fn window_arg(s: &str) -> Result<usize, String> {
    parse_count("-W", s, MAX_WINDOW)
}

fn src_port_arg(s: &str) -> Result<u16, String> {
    parse_port("-B", s, 0)
}

fn dst_port_arg(s: &str) -> Result<u16, String> {
    parse_port("-P", s, 1)
}

fn timeout_arg(s: &str) -> Result<Duration, String> {
    parse_timeout(s)
}

/// A count from 1 to `max`.
fn parse_count(opt: &str, s: &str, max: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("{opt} {s}: expected an integer from 1 to {max}")),
    }
}

/// A port from `min` to 65535.
fn parse_port(opt: &str, s: &str, min: u16) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p >= min => Ok(p),
        _ => Err(format!(
            "{opt} {s}: expected a port number from {min} to 65535"
        )),
    }
}

/// Seconds, fractions allowed, from 0.1 to [`MAX_CTRL_TIMEOUT`].
fn parse_timeout(s: &str) -> Result<Duration, String> {
    let max = MAX_CTRL_TIMEOUT.as_secs();
    match s.parse::<f64>().ok().map(Duration::try_from_secs_f64) {
        Some(Ok(d)) if d >= Duration::from_millis(100) && d <= MAX_CTRL_TIMEOUT => Ok(d),
        _ => Err(format!(
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

/// `all`, or one size with an optional k/m/g (binary) suffix, as
/// fi_pingpong accepts.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
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
        _ => Err(format!(
            "-S {s}: expected 'all' or a size from 1 to 1g (e.g. 64, 4k, 1m)"
        )),
    }
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
