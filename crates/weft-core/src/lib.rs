//! Weft's sans-IO core: the semantics of the libfabric object model with no
//! runtime, no sockets and no `unsafe`.
//!
//! Everything here is deterministic and driven by its caller: address vector
//! tables, tag matching, completion, event and counter rules, attributes and
//! `getinfo` matching, the provider boundary, and the wire codec of the
//! software providers. The providers (`weft-tcp`, ...) and the async API
//! (`weft`) build on it.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod addr;
pub mod atomic;
pub mod attr;
pub mod auth;
pub mod av;
pub mod completion;
pub mod counter;
pub mod credits;
pub mod dgram_auth;
pub mod error;
pub mod eventq;
pub mod flags;
pub mod getinfo;
pub mod hash;
pub mod limits;
pub mod multi_recv;
pub mod pool;
pub mod progress;
pub mod provider;
pub mod recv_completion;
pub mod soft_rx;
pub mod soft_srx;
pub mod spin_hint;
pub mod spin_hold;
pub mod sync;
pub mod tagmatch;
pub mod tclass;
pub mod tls;
pub mod wire;

pub use error::{Error, Result};
