//! The one error type of Weft, named after libfabric's errno values.
//!
//! Every variant maps to the positive value libfabric returns negated
//! (`FI_EAGAIN`, `FI_ENOEQ`, ...). Values below 256 are the platform's errno
//! values (Linux), which is what libfabric uses for them as well.

use std::fmt;

/// `Result` with Weft's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

macro_rules! errors {
    ($( $(#[$doc:meta])* $name:ident = $code:expr, $cname:literal, $text:literal; )*) => {
        /// A libfabric error code.
        ///
        /// `#[non_exhaustive]`: more codes may be added as providers grow.
        #[non_exhaustive]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Error {
            $( $(#[$doc])* $name, )*
        }

        impl Error {
            /// Every error variant, in code order (useful for exhaustive tests).
            pub const ALL: &'static [Error] = &[$(Error::$name,)*];

            /// The positive libfabric code (`FI_E*`); functions return it negated.
            pub const fn code(self) -> i32 {
                match self { $( Error::$name => $code, )* }
            }

            /// The libfabric name of the code, e.g. `"FI_EAGAIN"`.
            pub const fn name(self) -> &'static str {
                match self { $( Error::$name => $cname, )* }
            }

            /// Human-readable description, like `fi_strerror`.
            pub const fn description(self) -> &'static str {
                match self { $( Error::$name => $text, )* }
            }

            /// Maps a libfabric code (positive or negated) back to an error.
            /// Returns `None` for 0 and for codes Weft does not know.
            pub fn from_code(code: i32) -> Option<Error> {
                let code = code.checked_abs()?;
                match code { $( c if c == $code => Some(Error::$name), )* _ => None }
            }
        }
    };
}

errors! {
    /// Operation not permitted.
    Perm = 1, "FI_EPERM", "Operation not permitted";
    /// No such file or directory (e.g. a named AV that does not exist).
    NoEnt = 2, "FI_ENOENT", "No such file or directory";
    /// Interrupted.
    Intr = 4, "FI_EINTR", "Interrupted system call";
    /// Input/output error.
    Io = 5, "FI_EIO", "Input/output error";
    /// Argument list too long.
    TooBig = 7, "FI_E2BIG", "Argument list too long";
    /// Bad file descriptor.
    BadF = 9, "FI_EBADF", "Bad file descriptor";
    /// Resource temporarily unavailable: try again (queue full, nothing to read).
    Again = 11, "FI_EAGAIN", "Resource temporarily unavailable";
    /// Cannot allocate memory.
    NoMem = 12, "FI_ENOMEM", "Cannot allocate memory";
    /// Permission denied (e.g. memory region access rights).
    Access = 13, "FI_EACCES", "Permission denied";
    /// Bad address.
    Fault = 14, "FI_EFAULT", "Bad address";
    /// Resource busy (object still referenced, e.g. close with bound endpoints).
    Busy = 16, "FI_EBUSY", "Device or resource busy";
    /// No such device.
    NoDev = 19, "FI_ENODEV", "No such device";
    /// Invalid argument.
    Inval = 22, "FI_EINVAL", "Invalid argument";
    /// Too many open files.
    MFile = 24, "FI_EMFILE", "Too many open files";
    /// No space left.
    NoSpc = 28, "FI_ENOSPC", "No space left on device";
    /// Function not implemented by this provider.
    NoSys = 38, "FI_ENOSYS", "Function not implemented";
    /// No message of desired type (e.g. a peek that matched nothing).
    NoMsg = 42, "FI_ENOMSG", "No message of desired type";
    /// No data available.
    NoData = 61, "FI_ENODATA", "No data available";
    /// Value too large for defined data type.
    Overflow = 75, "FI_EOVERFLOW", "Value too large for defined data type";
    /// Message too long.
    MsgSize = 90, "FI_EMSGSIZE", "Message too long";
    /// Protocol not available / option not supported.
    NoProtoOpt = 92, "FI_ENOPROTOOPT", "Protocol not available";
    /// Operation not supported.
    OpNotSupp = 95, "FI_EOPNOTSUPP", "Operation not supported";
    /// Address already in use.
    AddrInUse = 98, "FI_EADDRINUSE", "Address already in use";
    /// Cannot assign requested address / address not available.
    AddrNotAvail = 99, "FI_EADDRNOTAVAIL", "Cannot assign requested address";
    /// Network is down.
    NetDown = 100, "FI_ENETDOWN", "Network is down";
    /// Network is unreachable.
    NetUnreach = 101, "FI_ENETUNREACH", "Network is unreachable";
    /// Software caused connection abort.
    ConnAborted = 103, "FI_ECONNABORTED", "Software caused connection abort";
    /// Connection reset by peer.
    ConnReset = 104, "FI_ECONNRESET", "Connection reset by peer";
    /// No buffer space available.
    NoBufs = 105, "FI_ENOBUFS", "No buffer space available";
    /// Already connected.
    IsConn = 106, "FI_EISCONN", "Transport endpoint is already connected";
    /// Not connected.
    NotConn = 107, "FI_ENOTCONN", "Transport endpoint is not connected";
    /// Endpoint shut down.
    Shutdown = 108, "FI_ESHUTDOWN", "Cannot send after transport endpoint shutdown";
    /// Timed out.
    TimedOut = 110, "FI_ETIMEDOUT", "Connection timed out";
    /// Connection refused (also: a rejected connection request).
    ConnRefused = 111, "FI_ECONNREFUSED", "Connection refused";
    /// No route to host.
    HostUnreach = 113, "FI_EHOSTUNREACH", "No route to host";
    /// Operation already in progress.
    Already = 114, "FI_EALREADY", "Operation already in progress";
    /// Operation now in progress.
    InProgress = 115, "FI_EINPROGRESS", "Operation now in progress";
    /// Remote I/O error (the peer reported a failure processing the operation).
    RemoteIo = 121, "FI_EREMOTEIO", "Remote I/O error";
    /// Operation canceled.
    Canceled = 125, "FI_ECANCELED", "Operation canceled";
    /// Key was rejected by service (requested MR key not available).
    KeyRejected = 129, "FI_EKEYREJECTED", "Key was rejected by service";
    /// Unspecified error.
    Other = 256, "FI_EOTHER", "Unspecified error";
    /// Provided buffer is too small.
    TooSmall = 257, "FI_ETOOSMALL", "Provided buffer is too small";
    /// Operation not permitted in the current state.
    OpBadState = 258, "FI_EOPBADSTATE", "Operation not permitted in current state";
    /// Error available: read it with the error read call.
    Avail = 259, "FI_EAVAIL", "Error available";
    /// Flags not supported.
    BadFlags = 260, "FI_EBADFLAGS", "Flags not supported";
    /// Missing or unavailable event queue.
    NoEq = 261, "FI_ENOEQ", "Missing or unavailable event queue";
    /// Invalid resource domain.
    Domain = 262, "FI_EDOMAIN", "Invalid resource domain";
    /// Missing or unavailable completion queue.
    NoCq = 263, "FI_ENOCQ", "Missing or unavailable completion queue";
    /// CRC error.
    Crc = 264, "FI_ECRC", "CRC error";
    /// Truncation error: the message was larger than the receive buffer.
    Trunc = 265, "FI_ETRUNC", "Truncation error";
    /// Required key not available (requested MR key already in use).
    NoKey = 266, "FI_ENOKEY", "Required key not available";
    /// Missing or unavailable address vector.
    NoAv = 267, "FI_ENOAV", "Missing or unavailable address vector";
    /// Queue has been overrun.
    Overrun = 268, "FI_EOVERRUN", "Queue has been overrun";
    /// Receiver not ready, no receive buffers available.
    NoRx = 269, "FI_ENORX", "Receiver not ready, no receive buffers available";
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.description(), self.name())
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::from_io(&e)
    }
}

impl Error {
    /// Maps an I/O error onto the closest libfabric code.
    pub fn from_io(e: &std::io::Error) -> Error {
        use std::io::ErrorKind as K;
        if let Some(code) = e.raw_os_error() {
            if let Some(err) = Error::from_code(code) {
                return err;
            }
        }
        match e.kind() {
            K::WouldBlock => Error::Again,
            K::ConnectionRefused => Error::ConnRefused,
            K::ConnectionReset => Error::ConnReset,
            K::ConnectionAborted => Error::ConnAborted,
            K::NotConnected => Error::NotConn,
            K::AddrInUse => Error::AddrInUse,
            K::AddrNotAvailable => Error::AddrNotAvail,
            K::BrokenPipe => Error::ConnReset,
            K::InvalidInput | K::InvalidData => Error::Inval,
            K::TimedOut => Error::TimedOut,
            K::UnexpectedEof => Error::ConnReset,
            K::PermissionDenied => Error::Access,
            K::NotFound => Error::NoEnt,
            K::OutOfMemory => Error::NoMem,
            K::Interrupted => Error::Intr,
            _ => Error::Io,
        }
    }

    /// True for [`Error::Again`], which means "retry later", never a failure.
    pub const fn is_again(self) -> bool {
        matches!(self, Error::Again)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &e in Error::ALL {
            assert!(seen.insert(e.code()), "duplicate code {}", e.code());
            assert_eq!(Error::from_code(e.code()), Some(e));
            assert_eq!(Error::from_code(-e.code()), Some(e));
        }
        assert_eq!(Error::from_code(0), None);
        assert_eq!(Error::from_code(9999), None);
        assert_eq!(Error::from_code(i32::MIN), None);
    }

    #[test]
    fn libfabric_values() {
        assert_eq!(Error::Again.code(), 11);
        assert_eq!(Error::Canceled.code(), 125);
        assert_eq!(Error::NoEq.code(), 261);
        assert_eq!(Error::NoCq.code(), 263);
        assert_eq!(Error::OpBadState.code(), 258);
        assert_eq!(Error::NoKey.code(), 266);
        assert_eq!(Error::KeyRejected.code(), 129);
        assert_eq!(Error::NoRx.code(), 269);
        assert_eq!(
            Error::Busy.to_string(),
            "Device or resource busy (FI_EBUSY)"
        );
    }

    #[test]
    fn io_errors_map() {
        let e = std::io::Error::from(std::io::ErrorKind::WouldBlock);
        assert_eq!(Error::from(e), Error::Again);
        let e = std::io::Error::from_raw_os_error(111);
        assert_eq!(Error::from(e), Error::ConnRefused);
    }
}
