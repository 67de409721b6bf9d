//! The receive side's reads from the socket: through the `std` handle or
//! the reactor's, and through the TLS session when there is one.

use std::io;

use super::Conn;
use crate::tls::Session;

impl Conn {
    /// Non-blocking read through the `std` handle (busy-poll thread).
    pub fn read_direct(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        let r = match &self.tls {
            None => (&self.std).read(buf),
            Some(t) => self.read_tls(t, buf, &mut &self.std),
        };
        if let Ok(n) = r {
            self.touch_rx(n);
        }
        r
    }

    /// Non-blocking read through the reactor's handle (interrupt mode).
    pub fn read_reactor(&self, buf: &mut [u8]) -> io::Result<usize> {
        let r = match &self.tls {
            None => self.tio.try_read(buf),
            Some(t) => self.read_tls(t, buf, &mut crate::tls::ReactorRead(&self.tio)),
        };
        if let Ok(n) = r {
            self.touch_rx(n);
        }
        r
    }

    /// Plaintext through the session. Records it sealed that the socket
    /// did not take are the writer's to send.
    fn read_tls(&self, t: &Session, buf: &mut [u8], sock: &mut dyn io::Read) -> io::Result<usize> {
        let r = t.read(buf, sock, &self.std);
        if t.take_out_pending() {
            self.kick_writer();
        }
        r
    }

    /// Lets go of the TLS session's read buffer while the connection is
    /// quiet (the sweeper's call, beside `RxMachine::shrink`).
    pub fn shrink_tls(&self) {
        if let Some(t) = &self.tls {
            t.shrink();
        }
    }
}
