//! A request/reply service in two processes over one RDM endpoint each,
//! with tagged messages. It uses only the public `weft` API and no
//! provider-specific code: the same binary runs over tcp and (built with
//! `--features verbs`) over an RDMA device.
//!
//! ```text
//! tagged_service server [-p PROV] [-d DOMAIN] [--addr IP:PORT] [-n REQUESTS]
//! tagged_service client --server IP:PORT [-p PROV] [-d DOMAIN] [--addr IP[:PORT]]
//!                       [-n COUNT] [-s SIZE] [--timeout SECS] [--wait SECS]
//! ```
//!
//! The server binds its endpoint to a fixed address and prints it. The
//! client inserts that address into its AV and sends COUNT requests tagged
//! [`REQUEST_TAG`]; the first one carries the client's own endpoint address
//! so that the server can insert it and answer with [`REPLY_TAG`]. Every
//! reply must echo the request's sequence number and a transformation of its
//! payload; the client exits 0 only when every reply was checked.
//!
//! The server answers whoever reaches it, so it is built to survive
//! peers that fail or lie: a failed receive is reported and the loop goes
//! on (backing off while failures persist); an address a request names
//! must be a socket address of the server's own family; each reply is
//! sent by a task of its own with a deadline ([`REPLY_DEADLINE`]), at most
//! [`MAX_REPLIES_IN_FLIGHT`] at once and [`MAX_REPLIES_PER_CLIENT`] to one
//! client, so a client whose address never answers stalls nobody else; and
//! it remembers at most [`MAX_CLIENTS`] clients, forgetting (and removing
//! from its AV) the one heard from least recently.
//!
//! Over loopback:
//!
//! ```text
//! cargo run --example tagged_service -- server --addr 127.0.0.1:47610 &
//! cargo run --example tagged_service -- client --server 127.0.0.1:47610 -n 100
//! ```

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use tokio::task::{Id, JoinError, JoinSet};
use weft::{
    AddressVector, AvAttr, BindFlags, CompletionQueue, CqAttr, CqEntry, CqErrEntry, Domain,
    Endpoint, EpType, Fabric, FiAddr, Info, FI_ADDR_UNSPEC,
};

/// Tag of requests (client to server).
pub const REQUEST_TAG: u64 = 0x5754_5351_0000_0001;
/// Tag of replies (server to client).
pub const REPLY_TAG: u64 = 0x5754_5352_0000_0002;
/// The server's port when `--addr` does not name one.
pub const DEFAULT_PORT: u16 = 47610;
/// Largest request payload (`-s`).
pub const MAX_PAYLOAD: usize = 64 << 10;
/// Room for the header and an endpoint address in front of the payload.
const HEADER_ROOM: usize = 512;

const REQUEST_MAGIC: &[u8; 4] = b"WTSQ";
const REPLY_MAGIC: &[u8; 4] = b"WTSR";
/// Replies carry the request's payload with every byte XORed with this,
/// so a reply proves the server read the request.
const REPLY_XOR: u8 = 0x5a;
/// Clients the server remembers. Any peer can claim to be a new client,
/// so past this the one heard from least recently is forgotten and its
/// AV entry removed; it is taken back if it introduces itself again.
pub const MAX_CLIENTS: usize = 1024;
/// How long a reply may take to be delivered before it is dropped.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(5);
/// Replies on their way at once; a request past this is dropped unanswered.
pub const MAX_REPLIES_IN_FLIGHT: usize = 256;
/// Replies on their way to one client: one whose address never answers
/// holds no more than these of [`MAX_REPLIES_IN_FLIGHT`].
pub const MAX_REPLIES_PER_CLIENT: usize = 8;
/// Failed receives in a row that took no message in (a sign the endpoint
/// itself is failing) retried at full speed; past them the server pauses
/// between receives, doubling up to [`MAX_RECV_BACKOFF`], so an error that
/// persists does not spin.
const RECV_FAILURES_BEFORE_BACKOFF: u32 = 3;
const FIRST_RECV_BACKOFF: Duration = Duration::from_millis(10);
const MAX_RECV_BACKOFF: Duration = Duration::from_millis(500);
/// Occurrences of one kind of trouble reported one by one; past these
/// only at powers of two, so a peer that provokes it on every message
/// cannot flood the log.
const REPORT_EACH: u64 = 16;

const USAGE: &str = "\
Usage:
  tagged_service server [-p PROV] [-d DOMAIN] [--addr IP:PORT] [-n REQUESTS]
  tagged_service client --server IP:PORT [-p PROV] [-d DOMAIN] [--addr IP[:PORT]]
                        [-n COUNT] [-s SIZE] [--timeout SECS] [--wait SECS]

  -p PROV          provider: tcp (default) or verbs
  -d DOMAIN        domain (RDMA device, e.g. rxe1); default: the provider's first
  -e rdm           endpoint type; only rdm (accepted for symmetry with `weft`)
  --addr           server: the address to bind (default: the domain's IP, or
                   127.0.0.1, port 47610); client: its own bind address
                   (default: the domain's IP, or the one routed to the server)
  -n N             server: exit after serving N requests (default: run until
                   killed); client: requests to send (default 10)
  -s SIZE          client: payload bytes per request, 0..=65536 (default 64)
  --server IP:PORT client: the server's address (required)
  --timeout SECS   client: wait this long for each reply (default 10)
  --wait SECS      client: keep retrying the first request this long while
                   the server is not reachable yet (default 10)
";

type Res<T> = Result<T, Box<dyn Error>>;

mod args;
mod client;
mod lru;
mod server;
mod side;
mod wire;

use args::*;
use client::*;
use lru::*;
use server::*;
use side::*;
use wire::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&argv) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("tagged_service: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match opts.role {
        Role::Server => server(&opts).await,
        Role::Client => client(&opts).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let role = match opts.role {
                Role::Server => "server",
                Role::Client => "client",
            };
            eprintln!("tagged_service {role}: error: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests;
