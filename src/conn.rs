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
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;

use actix_web::dev::Extensions;

/// A duplicate of the connection's socket; shutting it down aborts the
/// connection whatever state the HTTP layer is in.
#[derive(Debug, Clone)]
pub struct ConnHandle(Arc<TcpStream>);

impl ConnHandle {
    /// Aborts the connection: pending writes fail and the session ends.
    pub fn cut(&self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

/// `HttpServer::on_connect` hook: keeps a handle on every TCP connection in
/// its extensions, for [`actix_web::HttpRequest::conn_data`].
pub fn on_connect(io: &dyn Any, ext: &mut Extensions) {
    let Some(stream) = io.downcast_ref::<actix_web::rt::net::TcpStream>() else {
        return;
    };
    match stream.as_fd().try_clone_to_owned() {
        Ok(fd) => {
            ext.insert(ConnHandle(Arc::new(TcpStream::from(fd))));
        }
        Err(e) => log::warn!("cannot keep a handle on a connection: {e}"),
    }
}
