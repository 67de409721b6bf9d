//! Command-line arguments of the two roles.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Server,
    Client,
}

#[derive(Debug)]
pub(crate) struct Opts {
    pub(crate) role: Role,
    pub(crate) prov: String,
    pub(crate) domain: Option<String>,
    pub(crate) addr: Option<String>,
    pub(crate) server: Option<SocketAddr>,
    pub(crate) count: Option<u64>,
    pub(crate) size: usize,
    pub(crate) timeout: Duration,
    pub(crate) wait: Duration,
}

#[derive(Debug)]
pub(crate) struct UsageError(pub(crate) String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Error for UsageError {}

pub(crate) fn usage_err<T>(msg: impl Into<String>) -> Res<T> {
    Err(Box::new(UsageError(msg.into())))
}

pub(crate) fn parse_args(argv: &[String]) -> Res<Option<Opts>> {
    let Some((role, rest)) = argv.split_first() else {
        return usage_err("missing role: server or client");
    };
    let role = match role.as_str() {
        "server" => Role::Server,
        "client" => Role::Client,
        "-h" | "--help" | "help" => return Ok(None),
        other => return usage_err(format!("unknown role '{other}': use server or client")),
    };
    let mut o = Opts {
        role,
        prov: "tcp".into(),
        domain: None,
        addr: None,
        server: None,
        count: None,
        size: 64,
        timeout: Duration::from_secs(10),
        wait: Duration::from_secs(10),
    };
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let mut value = || match it.next() {
            Some(v) => Ok(v.clone()),
            None => usage_err(format!("option {arg} needs a value")),
        };
        match arg.as_str() {
            "-p" => o.prov = value()?,
            "-d" => o.domain = Some(value()?),
            "-e" => {
                let v = value()?;
                if !v.eq_ignore_ascii_case("rdm") {
                    return usage_err(format!("-e {v}: this service uses rdm endpoints only"));
                }
            }
            "--addr" => o.addr = Some(value()?),
            "--server" if role == Role::Client => {
                let v = value()?;
                o.server = Some(parse_sock(&v, "--server")?);
            }
            "-n" => {
                let v = value()?;
                match v.parse::<u64>() {
                    Ok(n) if n > 0 => o.count = Some(n),
                    _ => return usage_err(format!("-n {v}: expected a positive integer")),
                }
            }
            "-s" if role == Role::Client => {
                let v = value()?;
                match v.parse::<usize>() {
                    Ok(n) if n <= MAX_PAYLOAD => o.size = n,
                    _ => return usage_err(format!("-s {v}: expected 0 to {MAX_PAYLOAD}")),
                }
            }
            "--timeout" | "--wait" if role == Role::Client => {
                let v = value()?;
                let secs = match v.parse::<u64>() {
                    Ok(s) if s > 0 => Duration::from_secs(s),
                    _ => return usage_err(format!("{arg} {v}: expected a positive integer")),
                };
                if arg == "--timeout" {
                    o.timeout = secs;
                } else {
                    o.wait = secs;
                }
            }
            "-h" | "--help" => return Ok(None),
            other => {
                let who = match role {
                    Role::Server => "server",
                    Role::Client => "client",
                };
                return usage_err(format!("{who}: unexpected argument '{other}'"));
            }
        }
    }
    if role == Role::Client && o.server.is_none() {
        return usage_err("client: --server IP:PORT is required");
    }
    Ok(Some(o))
}

pub(crate) fn parse_sock(s: &str, what: &str) -> Res<SocketAddr> {
    match s.parse::<SocketAddr>() {
        Ok(a) => Ok(a),
        Err(_) => usage_err(format!("{what} {s}: expected IP:PORT")),
    }
}

/// `IP:PORT`, or a bare `IP` with `port`.
pub(crate) fn parse_bind(s: &str, port: u16) -> Res<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    match s.parse::<IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, port)),
        Err(_) => usage_err(format!("--addr {s}: expected IP or IP:PORT")),
    }
}
