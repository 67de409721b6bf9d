//! One failure type for every subcommand, so that all of them report
//! `weft <cmd>: <what failed>: <cause>` and exit 1 the same way.

use std::fmt;

#[derive(Debug)]
pub struct Failure {
    pub what: String,
    pub cause: String,
}

impl Failure {
    pub fn new(what: impl Into<String>, cause: impl fmt::Display) -> Failure {
        Failure {
            what: what.into(),
            cause: cause.to_string(),
        }
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

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Res<T> {
        self.map_err(|e| Failure::new(what, e))
    }

    fn with_ctx(self, what: impl FnOnce() -> String) -> Res<T> {
        self.map_err(|e| Failure::new(what(), e))
    }
}
