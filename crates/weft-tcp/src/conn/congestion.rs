//! Congestion control of a connection. Where the system's algorithm paces
//! its sends (BBR), a connection between two sockets of one host (loopback,
//! or a local address to itself) is switched to one that does not: such a
//! connection shares no network, and BBR's pacing there held 1 MiB
//! ping-pongs to half the bandwidth the same sockets make without it
//! (`docs/design.md`, "tcp: congestion control on one host").
//! `FI_TCP_CONGESTION` overrides: `system` leaves every connection alone,
//! an algorithm's name (`cubic`, `reno`, ...) is set on every connection.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// What `FI_TCP_CONGESTION` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Choice {
    /// Host-local connections under a pacing algorithm get [`UNPACED`].
    Auto,
    /// Every connection keeps the system's algorithm.
    System,
    /// Every connection gets this algorithm.
    Named(String),
}

/// What a host-local connection is switched to, in order of preference:
/// `reno` is built into every kernel and allowed to every user.
const UNPACED: [&str; 2] = ["cubic", "reno"];

fn parse(v: Option<&str>) -> Choice {
    match v.map(str::trim) {
        None | Some("") | Some("auto") => Choice::Auto,
        Some("system") => Choice::System,
        Some(name) => Choice::Named(name.to_string()),
    }
}

fn choice() -> &'static Choice {
    static CHOICE: OnceLock<Choice> = OnceLock::new();
    CHOICE.get_or_init(|| parse(std::env::var("FI_TCP_CONGESTION").ok().as_deref()))
}

/// BBR (each of its versions) paces every send; the others send what the
/// window allows.
fn paces(name: &str) -> bool {
    name.starts_with("bbr")
}

/// Both ends on this host: the peer is a loopback address or this
/// socket's own address.
fn host_local(local: SocketAddr, peer: SocketAddr) -> bool {
    let canon = |ip: IpAddr| ip.to_canonical();
    let peer_ip = canon(peer.ip());
    peer_ip.is_loopback() || peer_ip == canon(local.ip())
}

/// The algorithms to try on a connection, best first; empty: leave it.
fn wanted<'a>(choice: &'a Choice, current: &str, local: bool) -> Vec<&'a str> {
    match choice {
        Choice::System => Vec::new(),
        Choice::Named(n) if n == current => Vec::new(),
        Choice::Named(n) => vec![n.as_str()],
        Choice::Auto if local && paces(current) => UNPACED.to_vec(),
        Choice::Auto => Vec::new(),
    }
}

/// The algorithm a socket runs, as the kernel names it.
fn current(s: &socket2::SockRef<'_>) -> std::io::Result<String> {
    let raw = s.tcp_congestion()?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Ok(String::from_utf8_lossy(&raw[..end]).into_owned())
}

/// Applies [`choice`] to an established connection to `peer` (the
/// caller has it already). Failing leaves the system's algorithm, never
/// the connection: a kernel without the algorithm, or one that refuses
/// it to this user, costs bandwidth only (said once, in the log).
pub fn choose(stream: &tokio::net::TcpStream, peer: SocketAddr) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    apply(
        &socket2::SockRef::from(stream),
        choice(),
        host_local(local, peer),
    );
}

fn apply(s: &socket2::SockRef<'_>, choice: &Choice, local: bool) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let Ok(now) = current(s) else { return };
    let mut last = None;
    for name in wanted(choice, &now, local) {
        match s.set_tcp_congestion(name.as_bytes()) {
            Ok(()) => return,
            Err(e) => last = Some((name, e)),
        }
    }
    if let Some((name, e)) = last {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(algorithm = name, system = %now, error = %e,
                "tcp congestion control not set; connections keep the system's");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    async fn pair() -> (tokio::net::TcpStream, tokio::net::TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    fn algo(s: &tokio::net::TcpStream) -> String {
        current(&socket2::SockRef::from(s)).unwrap()
    }

    #[test]
    fn the_variable_reads_as_a_choice() {
        assert_eq!(parse(None), Choice::Auto);
        assert_eq!(parse(Some(" auto ")), Choice::Auto);
        assert_eq!(parse(Some("")), Choice::Auto);
        assert_eq!(parse(Some("system")), Choice::System);
        assert_eq!(parse(Some("reno")), Choice::Named("reno".into()));
    }

    #[test]
    fn only_host_local_pacing_connections_change_by_default() {
        assert_eq!(wanted(&Choice::Auto, "bbr", true), UNPACED.to_vec());
        assert!(
            wanted(&Choice::Auto, "bbr", false).is_empty(),
            "a network path keeps BBR"
        );
        assert!(wanted(&Choice::Auto, "cubic", true).is_empty());
        assert!(wanted(&Choice::System, "bbr", true).is_empty());
        let reno = Choice::Named("reno".into());
        assert_eq!(wanted(&reno, "bbr", false), vec!["reno"]);
        assert!(wanted(&reno, "reno", true).is_empty());
    }

    #[test]
    fn host_local_means_loopback_or_the_same_address() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(host_local(sa("127.0.0.1:1"), sa("127.0.0.1:2")));
        assert!(host_local(sa("192.0.2.2:1"), sa("192.0.2.2:2")));
        assert!(host_local(sa("[::1]:1"), sa("[::1]:2")));
        assert!(host_local(sa("[::ffff:192.0.2.2]:1"), sa("192.0.2.2:2")));
        assert!(!host_local(sa("192.0.2.2:1"), sa("192.0.2.3:2")));
    }

    #[tokio::test]
    async fn a_loopback_connection_does_not_pace() {
        let (a, b) = pair().await;
        for s in [&a, &b] {
            // BBR where this kernel has it, so the switch is exercised;
            // where it has not, the connection must stay as it is.
            let bbr = socket2::SockRef::from(s).set_tcp_congestion(b"bbr").is_ok();
            apply(&socket2::SockRef::from(s), &Choice::Auto, true);
            let now = algo(s);
            assert!(!paces(&now), "still {now}");
            if bbr {
                assert!(UNPACED.contains(&now.as_str()), "switched to {now}");
            }
        }
    }

    #[tokio::test]
    async fn a_named_algorithm_is_set_and_system_leaves_it() {
        let (a, _b) = pair().await;
        let before = algo(&a);
        apply(&socket2::SockRef::from(&a), &Choice::System, true);
        assert_eq!(algo(&a), before);
        apply(
            &socket2::SockRef::from(&a),
            &Choice::Named("reno".into()),
            false,
        );
        assert_eq!(algo(&a), "reno");
        // An algorithm the kernel lacks leaves the connection as it was.
        apply(
            &socket2::SockRef::from(&a),
            &Choice::Named("no-such-cc".into()),
            false,
        );
        assert_eq!(algo(&a), "reno");
    }
}
