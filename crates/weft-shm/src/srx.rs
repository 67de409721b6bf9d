//! Shared receive contexts (`weft_core::soft_srx`): a bound endpoint
//! places what its channels carry into the context's receive side, and
//! a channel whose next message waits for a receive or for budget waits
//! on the context's (posting to the context looks at it again).

use std::sync::Arc;

use weft_core::addr::FiAddr;
use weft_core::provider::RecvReq;
use weft_core::soft_srx::{report_to, Queues, SrxEp};
use weft_core::tagmatch::MsgInfo;

use crate::endpoint::{EpShared, Src};
use crate::rx::Held;

impl EpShared {
    /// A held message's sender `from`, as the matcher keeps it.
    pub fn src(&self, from: Arc<[u8]>) -> Src {
        Src {
            addr: from,
            at: self.this.clone(),
        }
    }

    /// Points a receive that a message arriving here takes at this
    /// endpoint's queues, when it is a shared context's (which has
    /// none); a lone endpoint's receives carry them already.
    pub fn report_here(&self, req: &mut RecvReq) {
        if self.srx.is_some() {
            report_to(req, self.rx_queues());
        }
    }
}

impl SrxEp for EpShared {
    type Held = Held;
    type Src = Src;

    fn resolve(src: &Src) -> FiAddr {
        src.resolve()
    }

    fn arrived_at(held: &Held) -> Option<Arc<EpShared>> {
        held.at.upgrade()
    }

    fn held_bytes(held: &Held) -> &[u8] {
        &held.data
    }

    fn deliver_held(&self, req: RecvReq, info: MsgInfo, held: Held) {
        crate::rx::deliver_held(self, req, info, held);
    }

    fn rx_queues(&self) -> Queues {
        (self.cfg.rx_cq.clone(), self.cfg.rx_cntr.clone())
    }

    fn wake(&self) {
        self.unpark();
    }

    fn parked(&self) -> bool {
        self.parked.load(std::sync::atomic::Ordering::Acquire)
    }
}
