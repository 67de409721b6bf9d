//! Shared receive contexts (`weft_core::soft_srx`): a bound endpoint
//! places what its channels carry into the context's receive side, and
//! a channel whose next message waits for a receive or for budget waits
//! on the context's (posting to the context looks at it again).

use std::sync::{Arc, Weak};

use weft_core::addr::FiAddr;
use weft_core::provider::RecvReq;
use weft_core::soft_srx::{Queues, SrxEp};
use weft_core::tagmatch::MsgInfo;

use crate::endpoint::EpShared;
use crate::rx::Held;

impl SrxEp for EpShared {
    type Addr = Arc<[u8]>;

    fn this(&self) -> Weak<EpShared> {
        self.this.clone()
    }

    fn rx_queues(&self) -> Queues {
        (self.cfg.rx_cq.clone(), self.cfg.rx_cntr.clone())
    }

    fn shared(&self) -> bool {
        self.srx.is_some()
    }

    fn handle_of(&self, addr: &Arc<[u8]>) -> FiAddr {
        self.resolve_src(addr)
    }

    fn deliver_held(&self, req: RecvReq, info: MsgInfo, held: Held) {
        crate::rx::deliver_held(self, req, info, held);
    }

    fn wake(&self) {
        self.unpark();
    }

    fn parked(&self) -> bool {
        self.parked.load(std::sync::atomic::Ordering::Acquire)
    }
}
