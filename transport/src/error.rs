//! One error type per operation.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use topology::NodeId;

/// Why writing or loading certificate files failed ([`pki`](crate::pki)).
///
/// Every variant of `init_cluster_ca` and `issue_node_cert` leaves the directory as it was:
/// files written by the failed call are removed again.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A file this call would create is already there. Nothing was written.
    #[error(
        "{path} already exists; nothing was written (remove it first or use another --certs-dir)"
    )]
    AlreadyExists {
        /// The existing file.
        path: PathBuf,
    },
    /// A file this call needs does not exist. Nothing was written or loaded.
    #[error("{path} does not exist; {fix}")]
    Missing {
        /// The missing file.
        path: PathBuf,
        /// What creates it, as a command to run.
        fix: String,
    },
    /// A private key file can be read by group or others. Nothing was loaded.
    #[error(
        "private key {path} is readable by group or others (mode {mode:04o}); run: chmod 600 {path}"
    )]
    KeyPermissions {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Reading a file or directory failed. Nothing was written or loaded.
    #[error("could not read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// Creating a directory or file failed. Files written by this call were removed.
    #[error("could not write {path}: {source}; nothing was left written")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// A file is not the PEM certificate or key it should be. Nothing was written or loaded.
    #[error("{path} is not a usable {what}: {reason}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What it should hold, such as "pem certificate".
        what: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A node certificate names another node than the one asked for. Nothing was loaded.
    #[error("{path} is the certificate of {actual}, not of node {expected}")]
    WrongNode {
        /// The certificate file.
        path: PathBuf,
        /// The node asked for.
        expected: NodeId,
        /// Who the certificate names, or why it names no one.
        actual: String,
    },
    /// A certificate was not issued by `ca.crt` of the same directory. Nothing was loaded.
    #[error("{path} was not issued by {ca} (or is not valid for its use now): {reason}")]
    NotIssuedByCa {
        /// The certificate file.
        path: PathBuf,
        /// The CA certificate file.
        ca: PathBuf,
        /// What the verifier said.
        reason: String,
    },
    /// The node id cannot name certificate files (`/`, `.`, `..`, `ca`, `client`). Nothing
    /// was written.
    #[error("node id {node} cannot name certificate files: {reason}")]
    UnusableNodeId {
        /// The node id.
        node: NodeId,
        /// Why not.
        reason: &'static str,
    },
    /// Generating a key or signing a certificate failed. Nothing was written.
    #[error("could not generate a certificate: {0}; nothing was written")]
    Generate(#[from] rcgen::Error),
    /// The certificate and key do not make a TLS configuration (for example, the key does
    /// not belong to the certificate). Nothing was loaded.
    #[error("certificate {cert} with key {key} is not a usable tls identity: {reason}")]
    Tls {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        reason: String,
    },
}

/// Why [`Endpoint::bind`](crate::Endpoint::bind) or
/// [`Endpoint::client`](crate::Endpoint::client) failed. Nothing is listening and no task
/// was started.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Called outside a tokio runtime.
    #[error("no tokio runtime: an endpoint must be created inside a tokio runtime")]
    NoRuntime,
    /// The [`Limits`](crate::Limits) are inconsistent.
    #[error("unusable limits: {0}")]
    Limits(String),
    /// The UDP socket could not be bound.
    #[error("could not bind udp socket {addr}: {source}")]
    Socket {
        /// The address asked for.
        addr: SocketAddr,
        /// The operating system's error.
        source: io::Error,
    },
    /// The TLS configuration cannot be used by QUIC.
    #[error("unusable tls configuration: {0}")]
    Tls(String),
}

/// Why [`Endpoint::send_datagram`](crate::Endpoint::send_datagram) did not send or queue a
/// datagram. In every case nothing was sent and nothing was queued.
#[derive(Debug, thiserror::Error)]
pub enum DatagramError {
    /// The payload does not fit in one datagram on this connection.
    #[error("datagram of {len} bytes exceeds the connection's limit of {max} bytes; not sent")]
    TooLarge {
        /// The payload's length.
        len: usize,
        /// The largest datagram the connection takes now (it depends on the path MTU).
        max: usize,
    },
    /// The peer does not accept datagrams.
    #[error("{addr} does not accept datagrams; not sent")]
    Unsupported {
        /// The peer.
        addr: SocketAddr,
    },
    /// The cached connection to this address is to another node than the one expected.
    #[error("{addr} is node {actual}, not {expected}; not sent")]
    IdentityMismatch {
        /// The peer.
        addr: SocketAddr,
        /// The node the caller expected.
        expected: NodeId,
        /// The node the peer's certificate names.
        actual: NodeId,
    },
    /// [`Endpoint::close`](crate::Endpoint::close) was called.
    #[error("the endpoint is closed; not sent")]
    EndpointClosed,
}

/// Why [`Endpoint::request`](crate::Endpoint::request) returned no response. Each variant
/// says whether the peer may have received the request.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The request body is longer than [`Limits::max_frame_bytes`](crate::Limits). Nothing
    /// was sent.
    #[error("request of {len} bytes exceeds the frame limit of {max} bytes; nothing was sent")]
    FrameTooLarge {
        /// The body's length.
        len: usize,
        /// The limit.
        max: u32,
    },
    /// The TLS handshake was refused, by either side: a certificate from another CA, no
    /// client certificate, another ALPN, or a certificate that names no node. Nothing was
    /// sent.
    #[error("tls handshake with {addr} failed: {reason}; nothing was sent")]
    Handshake {
        /// The peer.
        addr: SocketAddr,
        /// What the refusing side said.
        reason: String,
    },
    /// The peer refused the connection: it holds [`Limits::max_connections`](crate::Limits)
    /// already, or it is shutting down. Nothing was sent.
    #[error(
        "{addr} refused the connection (at its connection limit, or shutting down); nothing was sent"
    )]
    Refused {
        /// The peer.
        addr: SocketAddr,
    },
    /// No connection could be made for another reason (unreachable, no answer, cancelled by
    /// [`Endpoint::forget`](crate::Endpoint::forget)). Nothing was sent.
    #[error("could not connect to {addr}: {reason}; nothing was sent")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The peer's certificate names another node than the one expected. The connection was
    /// not used (and closed, if no one else wanted that node); nothing was sent.
    #[error("{addr} is node {actual}, not {expected}; nothing was sent")]
    IdentityMismatch {
        /// The peer.
        addr: SocketAddr,
        /// The node the caller expected.
        expected: NodeId,
        /// The node the peer's certificate names.
        actual: NodeId,
    },
    /// No response within the deadline. The peer may or may not have received and
    /// processed the request.
    #[error("request to {addr} timed out after {after:?}; the peer may have processed it")]
    Timeout {
        /// The peer.
        addr: SocketAddr,
        /// The deadline given.
        after: Duration,
    },
    /// The connection closed before the response arrived. The peer may or may not have
    /// processed the request.
    #[error(
        "connection to {addr} closed before the response: {reason}; the peer may have processed the request"
    )]
    Closed {
        /// The peer.
        addr: SocketAddr,
        /// Why it closed.
        reason: String,
    },
    /// The response announced a frame longer than
    /// [`Limits::max_frame_bytes`](crate::Limits); it was discarded unread. The peer
    /// processed the request.
    #[error(
        "response from {addr} of {len} bytes exceeds the frame limit of {max} bytes; the peer processed the request, its response was discarded"
    )]
    ResponseTooLarge {
        /// The peer.
        addr: SocketAddr,
        /// The announced length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The stream failed: the peer reset it (for example, it refused the frame as too long,
    /// or dropped the request unanswered) or ended it early. The peer may or may not have
    /// processed the request.
    #[error("request stream to {addr} failed: {reason}; the peer may have processed the request")]
    Stream {
        /// The peer.
        addr: SocketAddr,
        /// What happened.
        reason: String,
    },
    /// [`Endpoint::close`](crate::Endpoint::close) was called. Nothing was sent.
    #[error("the endpoint is closed; nothing was sent")]
    EndpointClosed,
}

impl RequestError {
    /// Whether the request certainly never reached the peer (so retrying it is always safe).
    pub fn nothing_sent(&self) -> bool {
        matches!(
            self,
            RequestError::FrameTooLarge { .. }
                | RequestError::Handshake { .. }
                | RequestError::Refused { .. }
                | RequestError::Connect { .. }
                | RequestError::IdentityMismatch { .. }
                | RequestError::EndpointClosed
        )
    }
}

/// Why [`Responder::respond`](crate::Responder::respond) did not send a response.
#[derive(Debug, thiserror::Error)]
pub enum RespondError {
    /// The response body is longer than [`Limits::max_frame_bytes`](crate::Limits). Nothing
    /// was sent; the stream was reset, so the requester gets an error rather than waiting.
    #[error("response of {len} bytes exceeds the frame limit of {max} bytes; the stream was reset")]
    FrameTooLarge {
        /// The body's length.
        len: usize,
        /// The limit.
        max: u32,
    },
}
