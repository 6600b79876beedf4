//! The QUIC endpoint of a slotring node: mutual TLS against the cluster CA, SWIM datagrams,
//! length-prefixed request/response frames on streams, and a cache of outgoing connections.
//!
//! What it deliberately does not do: no cluster logic (it never interprets a payload or a
//! frame body; the node wraps those in its own versioned envelope), no retry policy (a
//! [`Endpoint::request`] is one attempt within one deadline, a datagram is sent at most once),
//! no message encoding, and no deduplication of the two connections two nodes may open to
//! each other. There is no insecure mode: every connection is mutual TLS against one CA.
//!
//! The parts:
//! - [`pki`]: the certificate files of a cluster (`node certs init|issue`) and loading them
//!   into [`NodeTls`] / [`ClientTls`], refusing private keys that group or others can read.
//! - [`Endpoint`]: one QUIC endpoint per node, both server and client, with the ALPN
//!   [`ALPN`]. Incoming datagrams and requests arrive on the [`Inbound`] channel returned by
//!   [`Endpoint::bind`]; requests are answered through their [`Responder`].
//! - [`Limits`]: frame size, streams, connections, timeouts.
//!
//! Frames on streams are a `u32` little-endian length then that many bytes; the length is
//! checked against [`Limits::max_frame_bytes`] before anything is allocated. Requests of at
//! most 64 KiB share one long-lived *session* stream per connection, with ids to match the
//! answers (`session.rs`); longer ones take a stream each. Bytes from a peer never cause a
//! panic: a bad frame resets its stream (or ends its session) and is counted in [`Stats`].

mod endpoint;
mod error;
mod frame;
mod identity;
mod lane;
mod limits;
pub mod pki;
mod session;

pub use endpoint::{ALPN, Endpoint, Inbound, Responder, Stats};
pub use error::{BindError, DatagramError, PkiError, RequestError, RespondError};
pub use identity::{CLIENT_SERVER_NAME, NODE_SERVER_NAME, PeerIdentity};
pub use limits::Limits;
pub use pki::{ClientTls, NodeTls};
