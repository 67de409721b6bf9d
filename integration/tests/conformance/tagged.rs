//! RDM messaging: message and tagged sends and receives in both API forms,
//! matching (tag/ignore, directed, unexpected, PEEK/CLAIM/DISCARD),
//! completion contents and error paths (spec/fi_endpoint.3.md,
//! fi_tagged(3), fi_msg(3); fabtests rdm_tagged_peek, unexpected_msg,
//! recv_cancel).

use bytes::{Bytes, BytesMut};
use weft::{CqEntry, FiAddr, OpFlags, RecvMsg, SendMsg, FI_ADDR_UNSPEC};
use weft_integration::{next_cq, within, RdmEp};

mod completions;
mod contents;
mod forms;
mod matching;
mod peek;
mod sizes_and_faults;

use completions::{
    delivery_complete, inject_no_completion_counter_counts, selective_completion,
    selective_completion_on_receive, send_error_counts_on_counter,
};
use contents::{
    iov_send_and_recv, late_inserted_sender_reported_as_source, map_av_messaging, remote_cq_data,
    source_address_in_completions,
};
use forms::{
    both_forms_on_one_endpoint, cq_stream_yields_in_order, send_recv_async_form,
    send_recv_post_form,
};
use matching::{
    directed_receive, tag_and_ignore_matching, tagged_and_untagged_do_not_cross,
    three_senders_in_order, unexpected_from_late_inserted_sender,
    unexpected_messages_matched_later,
};
use peek::{
    claim_discard, peek_claim_then_claim, peek_discard, peek_leaves_message,
    peek_without_match_is_nomsg,
};
use sizes_and_faults::{
    dropped_recv_future_withdraws, large_messages_racing_receives, oversize_send_is_msgsize,
    peer_closed_sends_fail, truncation, truncation_of_unexpected_and_large, zero_length_message,
};

/// A tagged send with `DELIVERY_COMPLETE`: once it resolves the target has
/// the message (matched or buffered as unexpected).
async fn send_delivered(ep: &RdmEp, dest: FiAddr, data: Bytes, tag: Option<u64>) {
    let msg = SendMsg {
        dest,
        iov: vec![data],
        tag,
        ..SendMsg::default()
    };
    within(
        "delivery-complete send",
        ep.ep.sendmsg(msg, OpFlags::DELIVERY_COMPLETE),
    )
    .await
    .unwrap();
}

fn tagged_recv(ctx: u64, tag: u64, ignore: u64, cap: usize) -> RecvMsg {
    RecvMsg {
        src: FI_ADDR_UNSPEC,
        bufs: vec![BytesMut::zeroed(cap)],
        tagged: true,
        tag,
        ignore,
        context: ctx,
    }
}

fn post(ep: &RdmEp, msg: RecvMsg, flags: OpFlags) {
    ep.ep.post_recvmsg(msg, flags).map_err(|(e, _)| e).unwrap();
}

async fn recv_ok(ep: &RdmEp) -> CqEntry {
    match next_cq(&ep.cq).await {
        Ok(e) => e,
        Err(e) => panic!("expected a completion, got error entry {e:?}"),
    }
}

provider_tests! {
    truncation_of_unexpected_and_large,
    large_messages_racing_receives,
    selective_completion_on_receive,
    send_error_counts_on_counter,
    cq_stream_yields_in_order,
    late_inserted_sender_reported_as_source,
    send_recv_post_form,
    send_recv_async_form,
    both_forms_on_one_endpoint,
    tag_and_ignore_matching,
    tagged_and_untagged_do_not_cross,
    directed_receive,
    unexpected_messages_matched_later,
    unexpected_from_late_inserted_sender,
    peek_leaves_message,
    peek_without_match_is_nomsg,
    peek_claim_then_claim,
    peek_discard,
    claim_discard,
    remote_cq_data,
    source_address_in_completions,
    map_av_messaging,
    iov_send_and_recv,
    inject_no_completion_counter_counts,
    selective_completion,
    truncation,
    oversize_send_is_msgsize,
    zero_length_message,
    three_senders_in_order,
    delivery_complete,
    peer_closed_sends_fail,
    dropped_recv_future_withdraws,
}

// The cases that apply to udp's FI_EP_DGRAM endpoints. The others stay
// out because they take something a datagram cannot give: a send that
// waits until the target has the message (`FI_DELIVERY_COMPLETE`, which
// the peek, claim, ordering and late-sender cases use to know a message
// is buffered), a send to a dead address that fails (a datagram to
// nobody is lost, not failed), a peer's end seen by its sender, or
// messages larger than one datagram. `integration/tests/udp.rs` covers
// the same ground for udp without them.
udp_tests! {
    selective_completion_on_receive,
    cq_stream_yields_in_order,
    send_recv_post_form,
    send_recv_async_form,
    both_forms_on_one_endpoint,
    peek_without_match_is_nomsg,
    remote_cq_data,
    source_address_in_completions,
    map_av_messaging,
    iov_send_and_recv,
    inject_no_completion_counter_counts,
    truncation,
    oversize_send_is_msgsize,
    zero_length_message,
    dropped_recv_future_withdraws,
}

// The cases that apply to shm. The others send to an address where
// no endpoint is (an shm insert of such a name waits for it to appear,
// then fails after the resolve timeout): `selective_completion` and
// `send_error_counts_on_counter`; the sends to a killed peer are in
// `shm_faults.rs`.
shm_tests! {
    truncation_of_unexpected_and_large,
    large_messages_racing_receives,
    selective_completion_on_receive,
    cq_stream_yields_in_order,
    late_inserted_sender_reported_as_source,
    send_recv_post_form,
    send_recv_async_form,
    both_forms_on_one_endpoint,
    tag_and_ignore_matching,
    tagged_and_untagged_do_not_cross,
    directed_receive,
    unexpected_messages_matched_later,
    unexpected_from_late_inserted_sender,
    peek_leaves_message,
    peek_without_match_is_nomsg,
    peek_claim_then_claim,
    peek_discard,
    claim_discard,
    remote_cq_data,
    source_address_in_completions,
    map_av_messaging,
    iov_send_and_recv,
    inject_no_completion_counter_counts,
    truncation,
    oversize_send_is_msgsize,
    zero_length_message,
    three_senders_in_order,
    delivery_complete,
    peer_closed_sends_fail,
    dropped_recv_future_withdraws,
}
