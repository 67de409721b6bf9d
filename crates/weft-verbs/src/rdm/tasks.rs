//! The handles of an RDM endpoint's tasks (connections, the CQ
//! driver), kept for close to stop them.

use tokio::task::AbortHandle;

/// Handles of the endpoint's tasks, for close to stop them. Finished ones
/// are dropped as new ones come (a check of all of them each time their
/// number has doubled), so connections that came and went leave nothing
/// behind.
#[derive(Debug, Default)]
pub(crate) struct Tasks {
    live: Vec<AbortHandle>,
    prune_at: usize,
}

impl Tasks {
    pub(crate) fn push(&mut self, h: AbortHandle) {
        if self.live.len() >= self.prune_at {
            self.live.retain(|t| !t.is_finished());
            self.prune_at = (2 * self.live.len()).max(16);
        }
        self.live.push(h);
    }

    pub(crate) fn take_all(&mut self) -> Vec<AbortHandle> {
        self.prune_at = 0;
        std::mem::take(&mut self.live)
    }
}
