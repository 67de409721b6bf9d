//! An initiator restarted under its name (issue #21) is answered though
//! no sweep of ours saw its predecessor die: the look at its claim
//! (`rx::lifecycle::forget_if_gone`), or failing that the answer's own
//! look at the record (`EpShared::enqueue_renewed`), makes our record for
//! the name anew. In a binary of its own: the sweep period is lengthened
//! for the whole process (`weft_shm::set_sweep_every`), which makes the
//! test deterministic — in `shm_restart.rs` a sweep may get there first.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

mod shm_common;
mod shm_restart_common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_restarted_under_its_name_is_answered_with_no_sweep() {
    weft_shm::set_sweep_every(Duration::from_secs(3600));
    shm_restart_common::restarted_initiator_is_answered(false).await;
}
