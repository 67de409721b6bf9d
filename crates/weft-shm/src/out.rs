//! What the send side queues: one operation not yet wholly in its
//! peer's ring (a send, an RMA request or answer), and what a post
//! leaves to do once the peers' lock is released; split from `tx`.

use smallvec::SmallVec;
use weft_core::addr::FiAddr;
use weft_core::completion::OpDone;
use weft_core::provider::Iov;
use weft_core::Result;

use crate::rma::Lead;

/// A send not yet wholly in the ring.
#[derive(Debug)]
pub struct Out {
    /// Flags of its first record (`F_TAGGED`, `F_DATA`).
    pub(crate) flags: u32,
    pub(crate) tag: u64,
    pub(crate) data: u64,
    pub(crate) iov: Iov,
    pub(crate) len: usize,
    /// Bytes in the ring so far.
    pub(crate) off: usize,
    pub(crate) started: bool,
    /// `FI_DELIVERY_COMPLETE`: completes once the receiver consumed its
    /// last record (placed it or buffered it), not when it is written.
    pub(crate) dc: bool,
    /// Went as a CMA record: completes once the receiver, having read
    /// it from our buffers, consumed the record.
    pub(crate) cma: bool,
    /// An RMA request or response: its first record is this one, and
    /// the bytes follow as continuation records. This and the other
    /// RMA-only fields are boxed: every send moves an `Out` several times
    /// on its way to the ring, and with them inline each move copied
    /// about 640 bytes instead of 200 (some 230 instructions of a 64 B
    /// round trip).
    pub(crate) lead: Option<Box<Lead>>,
    /// `None` for what completes nothing here (RMA requests complete by
    /// their response; responses complete nothing).
    pub(crate) done: Option<OpDone>,
    /// `FI_FENCE`, not yet let through: it begins once nothing earlier
    /// to the peer is outstanding.
    pub(crate) fence: bool,
    /// An RMA request's wait for its answer, registered when it begins:
    /// one queued behind a fence is not outstanding before, and must
    /// not hold the fence.
    pub(crate) answer: Option<Box<crate::rma::Pending>>,
    /// `FI_AV_AUTH_KEY`: the AV key handle it travels under (the key of
    /// its destination's entry, or the one an initiator's channel proved).
    pub(crate) proves: Option<FiAddr>,
    /// An RMA request's direct form (`rma::direct_lead`), taken instead
    /// of the lead when it begins on a channel whose owner can reach our
    /// memory.
    pub(crate) direct: Option<Box<Lead>>,
}

impl Out {
    /// `o` with `FI_FENCE` if `on`.
    pub fn fenced(mut self, on: bool) -> Out {
        self.fence = on;
        self
    }

    /// `o` with the direct form `d`, if any.
    pub fn or_direct(mut self, d: Option<Lead>) -> Out {
        self.direct = d.map(Box::new);
        self
    }

    /// `o` under the AV key handle `proves`.
    pub fn proving(mut self, proves: Option<FiAddr>) -> Out {
        self.proves = proves;
        self
    }

    /// Whether it completes only when the receiver consumed it.
    pub(crate) fn waits(&self) -> bool {
        self.dc || self.cma
    }
}

/// A peer's address as a send names it: on the stack (addresses are
/// `fi_shm://` and a name of at most `NAME_MAX` bytes), so that a send
/// allocates nothing for it.
pub type Addr = SmallVec<[u8; 64]>;

/// A send that ended (outside the locks).
pub type Ended = (Option<OpDone>, usize, Result<()>);

/// Sends that ended, kept on the stack: a send that completes as it is
/// written allocates nothing for it.
pub type EndedList = SmallVec<[Ended; 2]>;

/// What `EpShared::enqueue` does once the peers' lock is released.
#[derive(Default)]
pub struct AfterEnqueue {
    /// Operations that ended.
    pub(crate) ended: EndedList,
    /// The peer is gone: forget it.
    pub(crate) forget: bool,
    /// The peer refused our key (reported on the EQ).
    pub(crate) refused: bool,
    /// Something waits in the queue: the driver must look.
    pub(crate) kick: bool,
}
