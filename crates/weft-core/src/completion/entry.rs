//! What a completion queue holds: the entry formats, a completion and an
//! error entry (`fi_cq_*_entry`, `fi_cq_err_entry`).

use bytes::BytesMut;

use crate::addr::{FiAddr, FI_ADDR_NOTAVAIL};
use crate::error::Error;
use crate::flags::OpFlags;

/// Completion entry format (`enum fi_cq_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CqFormat {
    /// Provider's choice (Weft: `Tagged`, the richest).
    #[default]
    Unspec,
    /// Context only.
    Context,
    /// Context, flags, length.
    Msg,
    /// Msg plus buffer and remote CQ data.
    Data,
    /// Data plus tag.
    Tagged,
}

/// A successful completion. Which fields are meaningful depends on the CQ
/// format; Weft fills all of them and the CQ's reader sees the format it
/// asked for through [`CqEntry::masked`].
#[derive(Debug, Default)]
pub struct CqEntry {
    /// The operation's context.
    pub context: u64,
    /// `FI_SEND`/`FI_RECV` | `FI_MSG`/`FI_TAGGED` | `FI_REMOTE_CQ_DATA` ...
    pub flags: OpFlags,
    /// Bytes transferred (receives: bytes placed).
    pub len: usize,
    /// Receives: the buffer(s), holding `len` bytes in total.
    pub bufs: Vec<BytesMut>,
    /// Remote CQ data (with `FI_REMOTE_CQ_DATA`).
    pub data: u64,
    /// Tag of a tagged receive.
    pub tag: u64,
    /// Source address (`FI_SOURCE`), `FI_ADDR_NOTAVAIL` if unknown.
    pub src: FiAddr,
}

impl CqEntry {
    /// Clears the fields the format does not carry.
    pub fn masked(mut self, format: CqFormat) -> CqEntry {
        self.mask(format);
        self
    }

    /// [`masked`](Self::masked) in place.
    pub(super) fn mask(&mut self, format: CqFormat) {
        match format {
            CqFormat::Context => {
                self.flags = OpFlags::empty();
                self.len = 0;
                self.data = 0;
                self.tag = 0;
            }
            CqFormat::Msg => {
                self.data = 0;
                self.tag = 0;
            }
            CqFormat::Data => self.tag = 0,
            CqFormat::Tagged | CqFormat::Unspec => {}
        }
    }

    /// The received bytes as one contiguous buffer (copies only when the
    /// receive used more than one buffer).
    pub fn into_bytes(mut self) -> BytesMut {
        if self.bufs.len() == 1 {
            return self.bufs.pop().unwrap_or_default();
        }
        let mut out = BytesMut::with_capacity(self.len);
        for b in &self.bufs {
            out.extend_from_slice(b);
        }
        out
    }
}

/// An error completion (`struct fi_cq_err_entry`).
#[derive(Debug)]
pub struct CqErrEntry {
    /// The operation's context.
    pub context: u64,
    /// Operation flags, as in a successful entry.
    pub flags: OpFlags,
    /// Bytes placed before the error.
    pub len: usize,
    /// Receives: the buffers given back (holding `len` bytes).
    pub bufs: Vec<BytesMut>,
    /// Remote CQ data, if any arrived.
    pub data: u64,
    /// Tag of the message, if any.
    pub tag: u64,
    /// Bytes that did not fit (`FI_ETRUNC`).
    pub olen: usize,
    /// The error.
    pub err: Error,
    /// Provider-specific error number (an OS errno for socket providers).
    pub prov_errno: i32,
    /// Source address, `FI_ADDR_NOTAVAIL` if unknown. With
    /// `FI_SOURCE_ERR`, for a sender not in the AV: `FI_ADDR_NOTAVAIL`, or
    /// on an `FI_AV_AUTH_KEY` endpoint the handle (or user id) of the key
    /// the sender proved.
    pub src: FiAddr,
    /// Provider data of the error: with `FI_SOURCE_ERR` and
    /// `FI_EADDRNOTAVAIL`, the sender's address in the domain's format.
    pub err_data: Vec<u8>,
}

impl CqErrEntry {
    /// An error entry with nothing but context, flags and error set.
    pub fn new(context: u64, flags: OpFlags, err: Error) -> CqErrEntry {
        CqErrEntry {
            context,
            flags,
            len: 0,
            bufs: Vec::new(),
            data: 0,
            tag: 0,
            olen: 0,
            err,
            prov_errno: err.code(),
            src: FI_ADDR_NOTAVAIL,
            err_data: Vec::new(),
        }
    }

    /// The entry with the operation's buffers handed back in it.
    pub fn with_bufs(mut self, bufs: Vec<BytesMut>) -> CqErrEntry {
        self.bufs = bufs;
        self
    }
}

impl std::fmt::Display for CqErrEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "operation {:#x} failed: {}", self.context, self.err)
    }
}

impl std::error::Error for CqErrEntry {}

impl From<CqErrEntry> for Error {
    fn from(e: CqErrEntry) -> Error {
        e.err
    }
}

/// One item of a completion queue: a completion or an error entry.
pub type CqItem = std::result::Result<CqEntry, CqErrEntry>;
