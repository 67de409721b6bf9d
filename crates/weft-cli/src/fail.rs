//! One failure type for every subcommand, so that all of them report
//! `weft <cmd>: <what failed>: <cause>` and exit 1 the same way.

use std::any::Any;
use std::fmt;

#[derive(Debug)]
pub struct Failure {
    pub what: String,
    pub cause: String,
    /// The library's error code behind the cause, if it was one: the
    /// provider may know more about it than the code says.
    pub code: Option<weft::Error>,
}

impl Failure {
    pub fn new(what: impl Into<String>, cause: impl fmt::Display + 'static) -> Failure {
        let any: &dyn Any = &cause;
        let code = any
            .downcast_ref::<weft::Error>()
            .copied()
            .or_else(|| any.downcast_ref::<weft::CqErrEntry>().map(|e| e.err));
        Failure {
            what: what.into(),
            cause: cause.to_string(),
            code,
        }
    }

    /// The provider's explanation of the error code, if it has one.
    pub fn hint(&self, provider: &str) -> Option<String> {
        weft::error_hint(provider, self.code?)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.cause)
    }
}

pub type Res<T> = Result<T, Failure>;

/// Attaches "what we were doing" to any displayable error.
pub trait Context<T> {
    fn ctx(self, what: &str) -> Res<T>;
    fn with_ctx(self, what: impl FnOnce() -> String) -> Res<T>;
}

impl<T, E: fmt::Display + 'static> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| Failure::new(what, e))
    }

    fn with_ctx(self, what: impl FnOnce() -> String) -> Res<T> {
        self.map_err(|e| Failure::new(what(), e))
    }
}

/// `fut`, or after `limit` a failure of `what` that names the time limit
/// (`--timeout`) as the reason.
pub async fn within<T>(
    limit: std::time::Duration,
    what: &str,
    fut: impl std::future::Future<Output = Res<T>>,
) -> Res<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(timed_out(what, limit)),
    }
}

/// The failure of a step that took longer than `limit`.
pub fn timed_out(what: &str, limit: std::time::Duration) -> Failure {
    Failure::new(
        what,
        format!(
            "nothing within {} s (--timeout): the peer is gone or not a weft peer",
            limit.as_secs_f64()
        ),
    )
}
