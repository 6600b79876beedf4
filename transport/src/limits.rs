//! [`Limits`]: the resource bounds of an [`Endpoint`](crate::Endpoint).

use std::time::Duration;

/// Resource bounds of one [`Endpoint`](crate::Endpoint). Build with `Limits::default()` and
/// change fields: `Limits { max_connections: 64, ..Limits::default() }`.
///
/// Both ends of a connection should use the same values; a frame one side may send and the
/// other refuses fails with a stream error, not silently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest frame body, in bytes, that is sent or accepted on a stream.
    ///
    /// Default 4 MiB, at most 1 GiB. A peer announcing a longer frame has its stream reset before anything
    /// is allocated; sending a longer one fails locally. Raise it only together with the
    /// largest message the node sends (snapshot chunks): every accepted frame is held in
    /// memory whole, up to `2 * max_frame_bytes * max_concurrent_bidi_streams` per connection
    /// (request and message streams).
    pub max_frame_bytes: u32,
    /// How many request streams one peer may have open to this endpoint at once, per
    /// connection; also how many message streams ([`Endpoint::send_message`]).
    ///
    /// Default 256. Enforced by QUIC flow control: a peer beyond it waits for a stream, it
    /// is not refused. A stream counts until its [`Responder`](crate::Responder) answers or
    /// is dropped (a message stream: until its frame is read), so this also bounds
    /// unanswered requests per peer.
    ///
    /// [`Endpoint::send_message`]: crate::Endpoint::send_message
    pub max_concurrent_bidi_streams: u32,
    /// How many incoming connections, handshaking or established, this endpoint holds at
    /// once.
    ///
    /// Default 1024. One more is refused at once (QUIC `CONNECTION_REFUSED`), which the
    /// other side reports as [`RequestError::Refused`](crate::RequestError::Refused). Each
    /// node holds about one incoming connection per other node plus one per CLI call in
    /// flight, so keep it above the cluster size with room to spare. Outgoing connections do
    /// not count.
    pub max_connections: u32,
    /// How long a connection may hear nothing from its peer before it is closed; also the
    /// handshake deadline of a new connection and the deadline to receive a whole request
    /// frame on an incoming stream.
    ///
    /// Default 10 s. Must be longer than `keep_alive`. Keep-alives keep a live connection
    /// open, so this is how long a vanished peer's connection lingers; SWIM notices a dead
    /// member sooner by itself.
    pub idle_timeout: Duration,
    /// How often an otherwise idle connection sends a keep-alive packet.
    ///
    /// Default 2 s. `Duration::ZERO` disables keep-alives, and idle connections then close
    /// after `idle_timeout`. Keep it a few times shorter than `idle_timeout` so one or two
    /// lost packets do not close a healthy connection.
    pub keep_alive: Duration,
    /// How many datagrams [`Endpoint::send_datagram`](crate::Endpoint::send_datagram) holds
    /// per peer while the connection to it is being made.
    ///
    /// Default 16. Beyond it the oldest is dropped; 0 drops every datagram sent before the
    /// connection is up. SWIM sends few messages per peer per round, so a small queue covers
    /// a handshake; a larger one only delivers staler messages.
    pub datagram_queue: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 4 * 1024 * 1024,
            max_concurrent_bidi_streams: 256,
            max_connections: 1024,
            idle_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(2),
            datagram_queue: 16,
        }
    }
}

/// The largest `max_frame_bytes` allowed: 1 GiB. Every frame is held whole in memory, and a
/// length above it is free to mark a session stream.
const MAX_FRAME_BYTES_CEILING: u32 = 1 << 30;

impl Limits {
    /// Why these limits cannot be used, if they cannot.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.max_frame_bytes > MAX_FRAME_BYTES_CEILING {
            return Err(format!(
                "max_frame_bytes ({}) must be at most {MAX_FRAME_BYTES_CEILING} (1 GiB)",
                self.max_frame_bytes
            ));
        }
        if self.idle_timeout.is_zero() {
            return Err("idle_timeout must be longer than zero".to_owned());
        }
        if !self.keep_alive.is_zero() && self.keep_alive >= self.idle_timeout {
            return Err(format!(
                "keep_alive ({:?}) must be shorter than idle_timeout ({:?})",
                self.keep_alive, self.idle_timeout
            ));
        }
        Ok(())
    }
}
