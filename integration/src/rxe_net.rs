//! Staging a silent peer in the rxe VM (`integration/run-rxe`): a host
//! or link gone, without a disconnect reaching the other side.

/// While held, packets from rxe2 (veth1, 10.66.0.2) to rxe1 (veth0,
/// 10.66.0.1) are lost: veth1's neighbour entry for 10.66.0.1 is a MAC
/// nobody has, so veth0 drops the frames (a route cannot do it: rxe
/// names the interface, and the kernel then sends on the link whatever
/// the routes say). Restored on drop, a failing test included.
///
/// The changed entry is news to rxe2's side only: the kernel's rdma_cm
/// reports rxe2's connections to 10.66.0.1 unreachable at once (an
/// error event, `TimedOut`), and whatever those endpoints send on
/// their way out (a disconnect request included) is lost. rxe1's side
/// hears nothing: to it the peer has gone silent, which is what the
/// tests of silent peers look at.
#[derive(Debug)]
pub struct Partition(());

impl Partition {
    fn ip(args: &str) {
        let st = std::process::Command::new("ip")
            .args(args.split(' '))
            .status()
            .unwrap();
        assert!(st.success(), "ip {args}: {st}");
    }

    /// Packets from rxe2 to rxe1 are lost from now on.
    pub fn rxe2_to_rxe1() -> Partition {
        assert_eq!(
            std::env::var("RXE_VM").as_deref(),
            Ok("1"),
            "changes the rxe VM's neighbour table: run it with integration/run-rxe"
        );
        Partition::ip("neigh replace 10.66.0.1 lladdr 02:00:00:00:00:01 dev veth1 nud permanent");
        Partition(())
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        Partition::ip("neigh del 10.66.0.1 dev veth1");
    }
}
