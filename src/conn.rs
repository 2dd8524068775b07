//! A handle on a client's TCP connection that can cut it from outside the
//! session actor.
//!
//! An actix WebSocket actor runs only while the HTTP layer polls its
//! response body, and the HTTP layer stops polling while the socket cannot
//! take more bytes. A client that stops reading therefore freezes its
//! session: its heartbeat stops, and events for it pile up in its mailbox.
//! The registry bounds that mailbox; when it is full it cuts the
//! connection through this handle, which ends the session (its device is
//! released like after any close) and frees what was queued.

use std::any::Any;
use std::os::fd::{AsRawFd, RawFd};

use actix_web::dev::Extensions;

/// The connection's socket, named by its descriptor and the socket's inode.
///
/// Duplicating the descriptor would be simpler but doubles the descriptors a
/// node holds (one per connection is the real limit of a presence server).
/// A bare descriptor number could be reused by a newer connection once this
/// one closes, so [`ConnHandle::cut`] first checks that the descriptor still
/// names the same socket (socket inodes are not reused while in use).
#[derive(Debug, Clone, Copy)]
pub struct ConnHandle {
    fd: RawFd,
    inode: u64,
}

/// The inode of the socket behind `fd`, if `fd` is open.
fn inode(fd: RawFd) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat only writes into `st`; a closed or foreign fd is an error
    // or another inode, both handled below.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    ((st.st_mode & libc::S_IFMT) == libc::S_IFSOCK).then_some(st.st_ino)
}

impl ConnHandle {
    /// Aborts the connection if it is still the one this handle was made
    /// for: pending writes fail and the session ends.
    pub fn cut(&self) {
        if inode(self.fd) == Some(self.inode) {
            // SAFETY: shutdown on a descriptor checked just above to be the
            // same live socket; it does not close the descriptor.
            unsafe {
                libc::shutdown(self.fd, libc::SHUT_RDWR);
            }
        }
    }
}

impl ConnHandle {
    /// Bytes the kernel still holds unsent on this connection; `None` when
    /// unknown or no longer the same socket. Zero means the client reads
    /// what it is sent: a session that fell behind with an empty send queue
    /// is held up on the server's side (e.g. waiting on Redis), not by its
    /// client.
    pub fn unsent(&self) -> Option<usize> {
        if inode(self.fd) != Some(self.inode) {
            return None;
        }
        let mut n: libc::c_int = 0;
        // SAFETY: TIOCOUTQ writes one int; the descriptor was checked above
        // to be the same live socket.
        let rc = unsafe { libc::ioctl(self.fd, libc::TIOCOUTQ, &mut n) };
        (rc == 0).then(|| usize::try_from(n).unwrap_or(0))
    }

    /// Ends the connection with a WebSocket close frame (`code`, `reason`)
    /// written from outside the session, which cannot run. Only for a
    /// connection whose send queue is empty ([`ConnHandle::unsent`]), so the
    /// frame does not land inside another; if it cannot be written whole,
    /// the connection is cut as by [`ConnHandle::cut`].
    pub fn close(&self, code: u16, reason: &str) {
        if inode(self.fd) != Some(self.inode) {
            return;
        }
        let reason = &reason.as_bytes()[..reason.len().min(123)];
        let mut frame = vec![0x88, (2 + reason.len()) as u8];
        frame.extend_from_slice(&code.to_be_bytes());
        frame.extend_from_slice(reason);
        // SAFETY: a non-blocking send of a local buffer on the socket checked
        // above; MSG_DONTWAIT so the registry never blocks on a client.
        let sent = unsafe {
            libc::send(
                self.fd,
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if sent != frame.len() as isize {
            log::debug!("could not write a close frame on fd {}; cutting", self.fd);
        }
        self.cut();
    }
}

/// `HttpServer::on_connect` hook: keeps a handle on every TCP connection in
/// its extensions, for [`actix_web::HttpRequest::conn_data`].
pub fn on_connect(io: &dyn Any, ext: &mut Extensions) {
    let Some(stream) = io.downcast_ref::<actix_web::rt::net::TcpStream>() else {
        return;
    };
    let fd = stream.as_raw_fd();
    match inode(fd) {
        Some(inode) => {
            ext.insert(ConnHandle { fd, inode });
        }
        None => log::warn!("cannot keep a handle on connection fd {fd}"),
    }
}
