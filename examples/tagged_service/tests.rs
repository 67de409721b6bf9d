//! The example's tests (`cargo test -p weft --example tagged_service`).

use super::*;

#[test]
fn the_least_recently_used_client_goes_first() {
    let mut t: Lru<u32> = Lru::new(2);
    assert_eq!(t.insert(1, 10), None);
    assert_eq!(t.insert(2, 20), None);
    // Hearing from 1 again makes 2 the least recent.
    assert_eq!(t.get(1), Some(10));
    assert_eq!(t.insert(3, 30), Some((2, 20)));
    assert_eq!((t.get(2), t.get(1), t.get(3)), (None, Some(10), Some(30)));
    assert_eq!(t.insert(4, 40), Some((1, 10)));
    assert_eq!(t.len(), 2);
    // A known key takes its new value and hands back the old one.
    assert_eq!(t.insert(4, 41), Some((4, 40)));
    assert_eq!((t.len(), t.get(4)), (2, Some(41)));
    assert_eq!(t.entries.len(), t.by_use.len());
}

#[test]
fn the_client_table_stays_bounded() {
    let mut t: Lru<u64> = Lru::new(MAX_CLIENTS);
    let mut evicted = 0;
    for k in 0..(3 * MAX_CLIENTS as u64) {
        evicted += usize::from(t.insert(k, k).is_some());
    }
    assert_eq!((t.len(), t.by_use.len()), (MAX_CLIENTS, MAX_CLIENTS));
    assert_eq!(evicted, 2 * MAX_CLIENTS);
    assert_eq!(t.get(0), None);
    let last = 3 * MAX_CLIENTS as u64 - 1;
    assert_eq!(t.get(last), Some(last));
}

fn sa(s: &str) -> Vec<u8> {
    weft::encode_sockaddr(&s.parse().unwrap())
}

#[test]
fn reply_addresses_are_validated() {
    let ours = sa("127.0.0.1:47610");
    assert_eq!(check_reply_addr(&sa("127.0.0.1:5000"), &ours), Ok(()));
    assert_eq!(check_reply_addr(&sa("10.1.2.3:1"), &ours), Ok(()));
    assert_eq!(
        check_reply_addr(b"garbage", &ours),
        Err("7 bytes that are not a socket address".into())
    );
    assert_eq!(
        check_reply_addr(&sa("[::1]:5000"), &ours),
        Err("address [::1]:5000 is not of our family (127.0.0.1:47610)".into())
    );
    for bad in [
        "0.0.0.0:5000",
        "127.0.0.1:0",
        "224.0.0.1:5000",
        "255.255.255.255:5000",
    ] {
        assert_eq!(
            check_reply_addr(&sa(bad), &ours),
            Err(format!("address {bad} names no endpoint"))
        );
    }
    // A sockaddr_in with a sockaddr_in6's length is neither.
    let mut long = sa("127.0.0.1:5000");
    long.resize(28, 0);
    assert!(check_reply_addr(&long, &ours).is_err());
    // v6 servers take v6 clients only.
    let ours6 = sa("[::1]:47610");
    assert_eq!(check_reply_addr(&sa("[::1]:5000"), &ours6), Ok(()));
    assert!(check_reply_addr(&sa("127.0.0.1:5000"), &ours6).is_err());
    // Addresses of another format: the length must be ours.
    assert_eq!(check_reply_addr(b"abcd", b"wxyz"), Ok(()));
    assert!(check_reply_addr(b"abc", b"wxyz").is_err());
}

#[test]
fn failed_receives_back_off_up_to_half_a_second() {
    assert_eq!(recv_backoff(0), None);
    assert_eq!(recv_backoff(RECV_FAILURES_BEFORE_BACKOFF), None);
    let first = RECV_FAILURES_BEFORE_BACKOFF + 1;
    assert_eq!(recv_backoff(first), Some(Duration::from_millis(10)));
    assert_eq!(recv_backoff(first + 1), Some(Duration::from_millis(20)));
    assert_eq!(recv_backoff(first + 5), Some(Duration::from_millis(320)));
    assert_eq!(recv_backoff(first + 6), Some(MAX_RECV_BACKOFF));
    assert_eq!(recv_backoff(u32::MAX), Some(MAX_RECV_BACKOFF));
}

#[test]
fn trouble_is_reported_sparingly() {
    let mut t = Tally::default();
    let reported: Vec<u64> = (0..1000).filter_map(|_| t.note()).collect();
    let mut want: Vec<u64> = (1..=16).collect();
    want.extend([32, 64, 128, 256, 512]);
    assert_eq!(reported, want);
}

#[tokio::test]
async fn replies_in_flight_are_bounded() {
    let mut r = Replies::default();
    let stuck = || std::future::pending::<Result<(), String>>();
    for seq in 0..MAX_REPLIES_PER_CLIENT as u64 {
        assert_eq!(r.room(7), Ok(()));
        r.spawn(7, seq, stuck());
    }
    assert_eq!(
        r.room(7),
        Err(format!(
            "{MAX_REPLIES_PER_CLIENT} replies to it already on their way"
        ))
    );
    // Others still get through, up to the overall bound.
    let mut client = 100;
    while r.room(client).is_ok() {
        r.spawn(client, 0, stuck());
        client += 1;
    }
    assert_eq!(r.tasks.len(), MAX_REPLIES_IN_FLIGHT);
    assert_eq!(
        r.room(client),
        Err(format!(
            "{MAX_REPLIES_IN_FLIGHT} replies already on their way"
        ))
    );
    r.tasks.abort_all();
    let mut failed = 0;
    while let Some(d) = r.next().await {
        assert!(d.outcome.is_err());
        failed += 1;
    }
    assert_eq!(failed, MAX_REPLIES_IN_FLIGHT);
    assert!(r.per_client.is_empty() && r.owner.is_empty());
    r.spawn(7, 99, async { Ok(()) });
    let d = r.next().await.unwrap();
    assert_eq!((d.client, d.seq, d.outcome), (7, 99, Ok(())));
    assert_eq!(r.room(7), Ok(()));
}

fn opts(args: &str) -> Opts {
    let argv: Vec<String> = args.split_whitespace().map(String::from).collect();
    parse_args(&argv).unwrap().unwrap()
}

/// A server on loopback, on a port of the kernel's choosing.
fn loopback_side() -> Side {
    let o = opts("server --addr 127.0.0.1:0");
    open_side(find_info(&o).unwrap(), "127.0.0.1:0".parse().unwrap()).unwrap()
}

fn addr_of(side: &Side) -> SocketAddr {
    weft::decode_sockaddr(&side.ep.local_addr().unwrap()).unwrap()
}

/// Starts `serve` on a loopback side; returns its address.
fn start_server() -> (SocketAddr, tokio::task::JoinHandle<Result<(), String>>) {
    let side = loopback_side();
    let addr = addr_of(&side);
    let task = tokio::spawn(async move { serve(&side, None).await.map_err(|e| e.to_string()) });
    (addr, task)
}

fn request(seq: u64, client: u64, addr: &[u8], payload: &[u8]) -> Bytes {
    encode_request(seq, client, addr, payload).unwrap()
}

/// A client whose address accepts connections and never answers (a
/// tarpit) floods the server; a real client is still answered at once,
/// not after the tarpit's replies run out of time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tarpit_client_does_not_stall_others() {
    let tarpit = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pit = tarpit.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = tarpit.accept().await {
            held.push(s);
        }
    });
    let (server, task) = start_server();
    let liar = loopback_side();
    let to = liar.insert(&weft::encode_sockaddr(&server)).unwrap();
    for seq in 0..40 {
        let addr = if seq == 0 {
            weft::encode_sockaddr(&pit)
        } else {
            Vec::new()
        };
        let req = request(seq, 0xbad, &addr, b"x");
        liar.ep.tsend(to, req, REQUEST_TAG).await.unwrap();
    }
    let t = Instant::now();
    let o = opts(&format!("client --server {server} -n 5 --timeout 3"));
    client(&o).await.unwrap();
    assert!(t.elapsed() < REPLY_DEADLINE, "took {:?}", t.elapsed());
    assert!(!task.is_finished());
    task.abort();
    hold.abort();
}

/// More failed receives in a row than the server used to tolerate
/// (messages too large for its buffer), and messages that are no
/// requests: the server logs them and goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_receives_do_not_end_the_server() {
    let (server, task) = start_server();
    let peer = loopback_side();
    let to = peer.insert(&weft::encode_sockaddr(&server)).unwrap();
    let huge = Bytes::from(vec![0u8; HEADER_ROOM + MAX_PAYLOAD + 1]);
    for _ in 0..25 {
        let _ = peer.ep.tsend(to, huge.clone(), REQUEST_TAG).await;
    }
    for junk in [&b"WTSQ"[..], b"nonsense", b""] {
        peer.ep
            .tsend(to, Bytes::from_static(junk), REQUEST_TAG)
            .await
            .unwrap();
    }
    // An unknown client without an address, and one with a bad address.
    peer.ep
        .tsend(to, request(0, 1, &[], b"x"), REQUEST_TAG)
        .await
        .unwrap();
    peer.ep
        .tsend(to, request(0, 2, b"bogus", b"x"), REQUEST_TAG)
        .await
        .unwrap();
    let t = Instant::now();
    let o = opts(&format!("client --server {server} -n 3 --timeout 5"));
    client(&o).await.unwrap();
    // No pause for failures that were the peer's doing.
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    assert!(!task.is_finished());
    task.abort();
}

/// A client pushed out of a full table loses its AV entry too.
#[tokio::test]
async fn evicted_clients_leave_the_av() {
    let side = loopback_side();
    let mut svc = Service::new(&side, 2).unwrap();
    for (client, port) in [(1, 5001), (2, 5002), (3, 5003)] {
        let addr = sa(&format!("127.0.0.1:{port}"));
        let req = Request {
            seq: 0,
            client,
            addr,
            payload: Bytes::new(),
        };
        assert!(svc.admit(&req).is_some());
    }
    assert_eq!((svc.clients.len(), side.av.len()), (2, 2));
    assert_eq!(svc.clients.get(1), None);
    // A lie about the address admits nobody.
    let bad = Request {
        seq: 0,
        client: 4,
        addr: b"bogus".to_vec(),
        payload: Bytes::new(),
    };
    assert_eq!(svc.admit(&bad), None);
    assert_eq!((svc.clients.len(), side.av.len()), (2, 2));
    assert_eq!(svc.trouble.bad_addr.0, 1);
}
