//! WebSocket frame rules (RFC 6455) a session applies beneath the JSON
//! protocol: which close code answers which refused frame, and the assembly
//! of fragmented messages.
//!
//! The frame parser (vendored actix-http, see vendor/README.md) refuses a
//! frame whose header announces more than `--max-frame-bytes` before any of
//! its payload is read; this module bounds a message sent in fragments by
//! the same limit.

use actix_http::ws::Item;
use actix_web_actors::ws::{CloseCode, ProtocolError};
use bytes::BytesMut;

/// The close code and reason that answer a frame the parser refused:
/// 1009 for a frame over the size limit, 1007 for a text frame that is not
/// UTF-8, 1002 for every other protocol violation.
pub fn close_for(err: &ProtocolError, max_frame_bytes: usize) -> (CloseCode, String) {
    match err {
        ProtocolError::Overflow => (
            CloseCode::Size,
            format!("frame larger than {max_frame_bytes} bytes"),
        ),
        // actix-web-actors reports a text frame that is not UTF-8 as an I/O
        // error carrying the UTF-8 error's message (tests/it/edge.rs pins it).
        ProtocolError::Io(e) if e.to_string().contains("utf-8") => {
            (CloseCode::Invalid, "text frame is not valid UTF-8".into())
        }
        other => (CloseCode::Protocol, format!("protocol error: {other}")),
    }
}

/// A message arriving in fragments (a text or binary frame without FIN,
/// then continuation frames up to one with FIN).
#[derive(Debug, Default)]
pub struct Fragments {
    /// The message being assembled, if one is under way (boxed: a session
    /// holds this for life and almost never uses it).
    current: Option<Box<Partial>>,
}

/// One message under assembly.
#[derive(Debug)]
struct Partial {
    /// Text (kept and checked), or binary (only counted: it is refused).
    text: bool,
    /// The text received so far.
    data: BytesMut,
    /// Bytes received so far, binary included.
    len: usize,
    /// A fragment was refused by the rate limit: the message is dropped
    /// when it ends.
    refused: bool,
}

/// What a fragment completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Assembled {
    /// More fragments to come.
    Pending,
    /// A whole text message.
    Text(String),
    /// A whole binary message (refused by the protocol, answered with an error frame).
    Binary,
    /// A whole message one of whose fragments the rate limit refused.
    Dropped,
}

/// Why a fragmented message is refused; the connection closes with the code.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The fragments add up to more than the frame limit (1009).
    TooLarge,
    /// The assembled text is not UTF-8 (1007).
    NotUtf8,
}

impl Refused {
    /// The close code and reason.
    pub fn close(&self, max_frame_bytes: usize) -> (CloseCode, String) {
        match self {
            Refused::TooLarge => (
                CloseCode::Size,
                format!("message larger than {max_frame_bytes} bytes"),
            ),
            Refused::NotUtf8 => (CloseCode::Invalid, "text message is not valid UTF-8".into()),
        }
    }
}

impl Fragments {
    /// Takes one fragment. `admitted` is false when the rate limit refused
    /// it: the message is then dropped at its end (its size still counts).
    /// The parser already refuses a continuation without a start and a new
    /// message inside another, so `item` arrives in a valid order.
    pub fn push(
        &mut self,
        item: Item,
        admitted: bool,
        max_bytes: usize,
    ) -> Result<Assembled, Refused> {
        let (bytes, last) = match item {
            Item::FirstText(b) => {
                self.current = Some(Box::new(Partial::new(true)));
                (b, false)
            }
            Item::FirstBinary(b) => {
                self.current = Some(Box::new(Partial::new(false)));
                (b, false)
            }
            Item::Continue(b) => (b, false),
            Item::Last(b) => (b, true),
        };
        let Some(partial) = self.current.as_mut() else {
            // Unreachable with actix-http's codec; refused like it would be.
            return Ok(Assembled::Dropped);
        };
        partial.len = partial.len.saturating_add(bytes.len());
        if partial.len > max_bytes {
            self.current = None;
            return Err(Refused::TooLarge);
        }
        partial.refused |= !admitted;
        if partial.text && !partial.refused {
            partial.data.extend_from_slice(&bytes);
        }
        if !last {
            return Ok(Assembled::Pending);
        }
        let Some(done) = self.current.take() else {
            return Ok(Assembled::Dropped);
        };
        if done.refused {
            return Ok(Assembled::Dropped);
        }
        if !done.text {
            return Ok(Assembled::Binary);
        }
        String::from_utf8(done.data.to_vec())
            .map(Assembled::Text)
            .map_err(|_| Refused::NotUtf8)
    }
}

impl Partial {
    fn new(text: bool) -> Self {
        Self {
            text,
            data: BytesMut::new(),
            len: 0,
            refused: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    #[test]
    fn assembles_text() {
        let mut f = Fragments::default();
        assert_eq!(
            f.push(Item::FirstText(b(b"{\"ty")), true, 64),
            Ok(Assembled::Pending)
        );
        assert_eq!(
            f.push(Item::Continue(b(b"pe\":")), true, 64),
            Ok(Assembled::Pending)
        );
        assert_eq!(
            f.push(Item::Last(b(b"1}")), true, 64),
            Ok(Assembled::Text("{\"type\":1}".into()))
        );
    }

    #[test]
    fn utf8_may_split_across_fragments() {
        let mut f = Fragments::default();
        let e = "é".as_bytes();
        f.push(Item::FirstText(b(&e[..1])), true, 64).unwrap();
        assert_eq!(
            f.push(Item::Last(b(&e[1..])), true, 64),
            Ok(Assembled::Text("é".into()))
        );
        f.push(Item::FirstText(b(&e[..1])), true, 64).unwrap();
        assert_eq!(f.push(Item::Last(b(b"")), true, 64), Err(Refused::NotUtf8));
    }

    #[test]
    fn bounds_the_whole_message() {
        let mut f = Fragments::default();
        f.push(Item::FirstBinary(b(&[0; 40])), true, 64).unwrap();
        assert_eq!(
            f.push(Item::Continue(b(&[0; 40])), true, 64),
            Err(Refused::TooLarge)
        );
        f.push(Item::FirstText(b(b"ab")), false, 64).unwrap();
        assert_eq!(
            f.push(Item::Last(b(b"c")), true, 64),
            Ok(Assembled::Dropped)
        );
        f.push(Item::FirstBinary(b(b"ab")), true, 64).unwrap();
        assert_eq!(f.push(Item::Last(b(b"c")), true, 64), Ok(Assembled::Binary));
    }
}
