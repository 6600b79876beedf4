//! [`Endpoint`]: one QUIC endpoint per node, its connection cache, and what arrives on it.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::{HandshakeData, QuicClientConfig, QuicServerConfig};
use quinn::{
    AckFrequencyConfig, ConnectionError, IdleTimeout, MtuDiscoveryConfig, ReadError,
    SendDatagramError, TransportConfig, TransportErrorCode, VarInt, WriteError,
};
use rustls_pki_types::CertificateDer;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use topology::NodeId;
use tracing::debug;

use crate::error::{BindError, DatagramError, RequestError, RespondError};
use crate::frame::{
    CODE_BAD_FRAME, CODE_FRAME_TOO_LARGE, CODE_NO_RESPONSE, ReadFrameError, describe_code,
    read_body, read_frame, read_len, write_frame,
};
use crate::identity::{NODE_SERVER_NAME, PeerIdentity, identity_of};
use crate::lane::{self, LANE_MAX_MESSAGE, Lane};
use crate::limits::Limits;
use crate::pki::{ClientTls, NodeTls};
use crate::session::{self, SESSION_MARKER, SESSION_MAX_REQUEST, Session, SessionWay};

/// The ALPN protocol every slotring connection negotiates; it carries the protocol version.
/// A peer offering anything else is refused during the handshake.
pub const ALPN: &[u8] = b"slotring/1";

/// How many [`Inbound`] items wait for the node before incoming datagrams are dropped and
/// incoming requests wait.
const INBOUND_CAPACITY: usize = 1024;
/// How many bytes of received datagrams a connection buffers before dropping the oldest.
const DATAGRAM_RECEIVE_BUFFER: usize = 1024 * 1024;
/// How long one attempt to connect may take before it is given up, so that the next send
/// starts a fresh one. Without it an attempt started while a peer was unreachable (a
/// partition) retransmits with exponential backoff until the idle timeout, and a peer that
/// is back is reached only at the next backoff step, seconds later.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// The round-trip time QUIC assumes before it has measured one. RFC 9002's 333 ms suits the
/// open internet; a cluster's members sit in one network, where it only slows down the
/// retransmission of a lost handshake packet (its first timeout is three times this).
const INITIAL_RTT: Duration = Duration::from_millis(50);

/// How many ack-eliciting packets a peer may take before it must acknowledge (QUIC's ACK
/// frequency extension; without it, every second one). Peers in a cluster send both ways all
/// the time, so an acknowledgement mostly rides on a packet going back anyway; sent on its own
/// it costs a datagram and wakes the other side. Measured on 3 loopback nodes under
/// unpipelined writes: a fifth fewer datagrams per write (1.22 to 0.96, all processes'
/// `sendmsg`s). Below a fresh connection's congestion window (10 packets), so the first
/// flights are acknowledged without waiting for the delay below.
const ACK_ELICITING_THRESHOLD: VarInt = VarInt::from_u32(8);

/// How long a peer may hold an acknowledgement back when fewer than
/// [`ACK_ELICITING_THRESHOLD`] packets came (QUIC's default is 25 ms; quinn asks for no more
/// than the path's RTT or 25 ms, whichever is larger). A lost packet is declared after about
/// this much longer, and a sender short of congestion window waits up to this for it. A
/// bulk stream is not slowed: quinn acknowledges what one receive call brings at once
/// (a 400 KiB answer on loopback drew 11 acknowledgements for 307 datagrams with or without
/// this setting).
const MAX_ACK_DELAY: Duration = Duration::from_millis(5);

/// The largest UDP payload a connection may grow its packets to. QUIC starts at 1,200 bytes
/// and its path MTU discovery probes upward to this bound, keeping the largest size that got
/// through: about 1,450 on an Ethernet path of 1,500, this bound on loopback or jumbo frames.
/// quinn's default bound is 1,452. Above it, a batch of peer messages or a snapshot chunk
/// goes out in fewer packets, each one a send, a receive, a wake-up and a decryption less.
/// Measured on loopback nodes in alternating pairs (BENCHMARKS.md, issue 5 and issue 6,
/// session 47): ×16 writes 5% faster, a node joining 1M keys 13% faster, unpipelined
/// writes unchanged. 6,500 keeps quinn's batch of up to 10 packets per send under Linux's
/// 64 KiB limit for one segmented UDP send.
const MAX_UDP_PAYLOAD: u16 = 6_500;
// quinn refuses a maximum payload outside 1,200..=65,527; checked here, at compile time.
const _: () = assert!(MAX_UDP_PAYLOAD >= 1_200 && MAX_UDP_PAYLOAD <= 65_527);

/// The send priority of a message too long for a lane (a stream of its own): below the
/// lanes' and the requests' default of 0, so quinn writes their frames first whenever both
/// have data queued on one connection.
const LARGE_MESSAGE_PRIORITY: i32 = -1;

/// Connection close code: a normal close (shutdown, forgotten).
const CLOSE_NORMAL: VarInt = VarInt::from_u32(0);
/// Connection close code: the peer's certificate names no one we talk to, or not the node
/// expected.
const CLOSE_IDENTITY: VarInt = VarInt::from_u32(1);

/// Something that arrived on an [`Endpoint`], in the channel returned by [`Endpoint::bind`].
#[derive(Debug)]
pub enum Inbound {
    /// A QUIC datagram from a node (datagrams from the client identity are dropped).
    Datagram {
        /// The sending node, as its certificate names it.
        from: NodeId,
        /// The connection's remote address; for a node's own connections, its listen
        /// address.
        addr: SocketAddr,
        /// The payload, uninterpreted.
        payload: Bytes,
    },
    /// A request frame on a new stream; answer it through `responder`.
    Request {
        /// Who sent it, as its certificate says.
        from: PeerIdentity,
        /// The connection's remote address.
        addr: SocketAddr,
        /// The request body, uninterpreted, at most [`Limits::max_frame_bytes`] long.
        body: Bytes,
        /// Sends the one response; dropping it resets the stream.
        responder: Responder,
    },
    /// A one-way message frame from a node, on a unidirectional stream of its own (see
    /// [`Endpoint::send_message`]); nothing goes back. Messages from the client identity are
    /// refused.
    Message {
        /// The sending node, as its certificate names it.
        from: NodeId,
        /// The connection's remote address.
        addr: SocketAddr,
        /// The message body, uninterpreted, at most [`Limits::max_frame_bytes`] long.
        body: Bytes,
    },
}

/// The way back to one requester. [`Responder::respond`] sends the response; dropping a
/// `Responder` unanswered tells the requester at once (a reset stream, or a refusal through
/// its session) instead of letting it wait for its deadline.
pub struct Responder {
    way: Option<Way>,
    max_frame_bytes: u32,
    runtime: Handle,
    peer: SocketAddr,
}

/// How a response travels: on the request's own stream, or through its session.
#[derive(Debug)]
enum Way {
    Stream(quinn::SendStream),
    Session(SessionWay),
}

impl Responder {
    pub(crate) fn through_session(
        way: SessionWay,
        max_frame_bytes: u32,
        runtime: Handle,
        peer: SocketAddr,
    ) -> Responder {
        Responder {
            way: Some(Way::Session(way)),
            max_frame_bytes,
            runtime,
            peer,
        }
    }

    /// Sends `body` as the response (and finishes the request's stream, if it has one).
    ///
    /// Does not wait: the write runs on a task of the endpoint's runtime, so the node's loop
    /// never waits on a slow requester. A failure after this returns (the peer went away) is
    /// logged at debug; the requester sees it as its own error.
    pub fn respond(mut self, body: Bytes) -> Result<(), RespondError> {
        let (max, len) = (self.max_frame_bytes, body.len());
        let fits = u32::try_from(len).is_ok_and(|len| len <= max);
        match self.way.take() {
            Some(Way::Stream(mut send)) if fits => {
                let peer = self.peer;
                self.runtime.spawn(async move {
                    let result = write_frame(&mut send, body).await;
                    match result.map(|()| send.finish()) {
                        Ok(_) => {}
                        Err(error) => debug!(%peer, %error, "response not delivered"),
                    }
                });
            }
            Some(Way::Session(way)) if fits => way.send(Ok(body)),
            // Already reset or finished is fine: the requester is told either way.
            Some(Way::Stream(mut send)) => drop(send.reset(CODE_FRAME_TOO_LARGE)),
            Some(Way::Session(way)) => way.send(Err(CODE_FRAME_TOO_LARGE)),
            None => {}
        }
        if fits {
            Ok(())
        } else {
            Err(RespondError::FrameTooLarge { len, max })
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        match self.way.take() {
            // Already closed is fine: the requester has its answer (an error) already.
            Some(Way::Stream(mut send)) => drop(send.reset(CODE_NO_RESPONSE)),
            Some(Way::Session(way)) => way.send(Err(CODE_NO_RESPONSE)),
            None => {}
        }
    }
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("peer", &self.peer)
            .field("answered", &self.way.is_none())
            .finish_non_exhaustive()
    }
}

/// Counters of what an [`Endpoint`] refused or dropped, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Incoming connections refused at [`Limits::max_connections`].
    pub refused_connections: u64,
    /// Incoming handshakes that failed (other CA, no certificate, other ALPN, timeout) and
    /// connections closed because the certificate named no one.
    pub failed_handshakes: u64,
    /// Incoming request streams reset because of a bad frame: too long, cut short, or too
    /// slow.
    pub refused_frames: u64,
    /// Datagrams dropped: received while the inbound channel was full or from the client,
    /// or queued for a peer that could not be reached or was full.
    pub dropped_datagrams: u64,
    /// Messages ([`Endpoint::send_message`]) not delivered: no connection in time, a lost
    /// connection or a refused stream; and incoming ones from the client identity.
    pub dropped_messages: u64,
}

#[derive(Debug, Default)]
struct Counters {
    incoming_open: AtomicU32,
    refused_connections: AtomicU64,
    failed_handshakes: AtomicU64,
    refused_frames: AtomicU64,
    dropped_datagrams: AtomicU64,
    dropped_messages: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// One QUIC endpoint: a node's (server and client on one UDP port, from [`Endpoint::bind`])
/// or the CLI's (client only, from [`Endpoint::client`]).
///
/// Outgoing connections are cached by remote address and reused by
/// [`send_datagram`](Self::send_datagram) and [`request`](Self::request); incoming
/// connections are served independently, and what they carry arrives as [`Inbound`]. Two
/// nodes that talk both ways thus hold two connections, one each way.
///
/// Cloning is cheap and every clone is the same endpoint. Dropping the last clone closes
/// the endpoint, as [`close`](Self::close) does. Every method that starts work spawns it on
/// the tokio runtime the endpoint was made in; none blocks on a peer, except the `async`
/// ones.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
}

struct Inner {
    quinn: quinn::Endpoint,
    local_addr: SocketAddr,
    limits: Limits,
    runtime: Handle,
    /// `None` on a client-only endpoint: it serves nothing.
    inbound: Option<mpsc::Sender<Inbound>>,
    counters: Arc<Counters>,
    closed: AtomicBool,
    peers: Mutex<Peers>,
}

#[derive(Default)]
struct Peers {
    slots: HashMap<SocketAddr, Slot>,
    next_attempt: u64,
}

enum Slot {
    Connecting(Pending),
    Ready(Ready),
}

/// A connection attempt in flight, and what waits for it.
struct Pending {
    attempt: u64,
    /// Nodes callers of `connect_ahead` expect; `None` is anyone.
    wanted: Vec<NodeId>,
    waiters: Vec<Waiter>,
    /// Datagrams to send once connected, each with the node it is for.
    queue: VecDeque<(NodeId, Bytes)>,
}

struct Waiter {
    expected: Option<NodeId>,
    reply: oneshot::Sender<Result<quinn::Connection, ConnectFailure>>,
}

struct Ready {
    conn: quinn::Connection,
    node: NodeId,
    /// The session small requests share, opened at the first one; replaced when it fails.
    session: Option<Arc<Session>>,
    /// The lane small messages share, opened at the first one; replaced when it fails.
    lane: Option<Lane>,
}

impl Ready {
    fn is_alive(&self) -> bool {
        self.conn.close_reason().is_none()
    }
}

/// Why a connection attempt failed; cloned to every waiter.
#[derive(Clone, Debug)]
enum ConnectFailure {
    Handshake(String),
    Refused,
    Connect(String),
    Mismatch { expected: NodeId, actual: NodeId },
}

impl ConnectFailure {
    fn from_connection_error(error: &ConnectionError) -> Self {
        match classify(error) {
            Lost::Handshake(reason) => ConnectFailure::Handshake(reason),
            Lost::Refused => ConnectFailure::Refused,
            Lost::Other(reason) => ConnectFailure::Connect(reason),
        }
    }

    fn into_request_error(self, addr: SocketAddr) -> RequestError {
        match self {
            ConnectFailure::Handshake(reason) => RequestError::Handshake { addr, reason },
            ConnectFailure::Refused => RequestError::Refused { addr },
            ConnectFailure::Connect(reason) => RequestError::Connect { addr, reason },
            ConnectFailure::Mismatch { expected, actual } => RequestError::IdentityMismatch {
                addr,
                expected,
                actual,
            },
        }
    }
}

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectFailure::Handshake(reason) => write!(f, "tls handshake failed: {reason}"),
            ConnectFailure::Refused => f.write_str("connection refused"),
            ConnectFailure::Connect(reason) => f.write_str(reason),
            ConnectFailure::Mismatch { expected, actual } => {
                write!(f, "peer is node {actual}, not {expected}")
            }
        }
    }
}

/// What a lost connection means to a caller.
enum Lost {
    /// The TLS handshake was refused by either side (a QUIC crypto error, 0x100..=0x1ff).
    Handshake(String),
    /// The server refused the connection (QUIC `CONNECTION_REFUSED`).
    Refused,
    /// Anything else.
    Other(String),
}

fn classify(error: &ConnectionError) -> Lost {
    let is_crypto = |code: TransportErrorCode| (0x100..=0x1ff).contains(&u64::from(code));
    match error {
        ConnectionError::TransportError(error) if is_crypto(error.code) => {
            let hint = if error.reason.contains("UnknownIssuer")
                || error.reason.contains("BadSignature")
            {
                " (the peer's certificate was not issued by this cluster's ca: is it a node of another cluster?)"
            } else {
                ""
            };
            Lost::Handshake(format!("{}{hint} ({})", error.reason, error.code))
        }
        ConnectionError::ConnectionClosed(close) if is_crypto(close.error_code) => {
            let reason = String::from_utf8_lossy(&close.reason);
            let hint = if reason.contains("UnknownIssuer") || reason.contains("BadSignature") {
                " (our certificate was not issued by the peer's ca: is it a node of another cluster?)"
            } else {
                ""
            };
            Lost::Handshake(format!(
                "refused by peer: {reason}{hint} ({})",
                close.error_code
            ))
        }
        ConnectionError::ConnectionClosed(close)
            if close.error_code == TransportErrorCode::CONNECTION_REFUSED =>
        {
            Lost::Refused
        }
        ConnectionError::ApplicationClosed(close) if close.error_code == CLOSE_IDENTITY => {
            Lost::Handshake(format!(
                "peer closed the connection: {}",
                String::from_utf8_lossy(&close.reason)
            ))
        }
        other => Lost::Other(other.to_string()),
    }
}

pub(crate) fn lost_to_request_error(addr: SocketAddr, error: &ConnectionError) -> RequestError {
    match classify(error) {
        Lost::Handshake(reason) => RequestError::Handshake { addr, reason },
        Lost::Refused => RequestError::Refused { addr },
        Lost::Other(reason) => RequestError::Closed { addr, reason },
    }
}

impl Endpoint {
    /// Binds a node's endpoint at `addr`, serving and connecting with `tls`, and starts
    /// accepting connections on the current tokio runtime.
    ///
    /// Everything peers send arrives on the returned channel. Dropping the receiver stops
    /// accepting and closes the endpoint; a full channel drops incoming datagrams and makes
    /// incoming requests wait.
    pub fn bind(
        addr: SocketAddr,
        tls: NodeTls,
        limits: Limits,
    ) -> Result<(Endpoint, mpsc::Receiver<Inbound>), BindError> {
        let runtime = Handle::try_current().map_err(|_| BindError::NoRuntime)?;
        let transport = transport_config(&limits)?;
        let server_crypto = QuicServerConfig::try_from(tls.server.clone())
            .map_err(|error| BindError::Tls(error.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
        server.transport_config(transport.clone());
        let client = client_config(tls.client.clone(), transport)?;
        let socket = bind_udp(addr).map_err(|source| BindError::Socket { addr, source })?;
        let mut quinn = quinn::Endpoint::new(
            endpoint_config(),
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|source| BindError::Socket { addr, source })?;
        quinn.set_default_client_config(client);
        let local_addr = quinn
            .local_addr()
            .map_err(|source| BindError::Socket { addr, source })?;

        let (sender, receiver) = mpsc::channel(INBOUND_CAPACITY);
        let counters = Arc::new(Counters::default());
        let inner = Arc::new(Inner {
            quinn: quinn.clone(),
            local_addr,
            limits: limits.clone(),
            runtime: runtime.clone(),
            inbound: Some(sender.clone()),
            counters: counters.clone(),
            closed: AtomicBool::new(false),
            peers: Mutex::new(Peers::default()),
        });
        runtime.spawn(accept_loop(quinn, sender, limits, counters));
        debug!(%local_addr, node = %tls.node(), "endpoint bound");
        Ok((Endpoint { inner }, receiver))
    }

    /// A client-only endpoint on `127.0.0.1:0`, presenting the client certificate; it
    /// never accepts connections. It reaches loopback addresses only: for other targets use
    /// [`Endpoint::client_on`] with `0.0.0.0:0` or `[::]:0`.
    pub fn client(tls: ClientTls, limits: Limits) -> Result<Endpoint, BindError> {
        Endpoint::client_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), tls, limits)
    }

    /// A client-only endpoint bound to `local` (for example `0.0.0.0:0` to reach other
    /// hosts over IPv4), presenting the client certificate; it never accepts connections.
    pub fn client_on(
        local: SocketAddr,
        tls: ClientTls,
        limits: Limits,
    ) -> Result<Endpoint, BindError> {
        let runtime = Handle::try_current().map_err(|_| BindError::NoRuntime)?;
        let transport = transport_config(&limits)?;
        let client = client_config(tls.client.clone(), transport)?;
        let socket = bind_udp(local).map_err(|source| BindError::Socket {
            addr: local,
            source,
        })?;
        let mut quinn = quinn::Endpoint::new(
            endpoint_config(),
            None,
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|source| BindError::Socket {
            addr: local,
            source,
        })?;
        quinn.set_default_client_config(client);
        let local_addr = quinn.local_addr().map_err(|source| BindError::Socket {
            addr: local,
            source,
        })?;
        Ok(Endpoint {
            inner: Arc::new(Inner {
                quinn,
                local_addr,
                limits,
                runtime,
                inbound: None,
                counters: Arc::new(Counters::default()),
                closed: AtomicBool::new(false),
                peers: Mutex::new(Peers::default()),
            }),
        })
    }

    /// The bound UDP address (with the port chosen when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr
    }

    /// The limits this endpoint was made with.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// Sends `payload` as one QUIC datagram to the node `expected` at `to`. Never waits.
    ///
    /// With an established cached connection the datagram is handed to QUIC now. Otherwise a
    /// connection is started in the background and the payload queued (at most
    /// [`Limits::datagram_queue`] per peer, dropping the oldest); the queue is sent once the
    /// handshake completes, or dropped (logged at debug) if it fails or the peer is another
    /// node. Delivery is never guaranteed: datagrams may be lost, as SWIM expects.
    pub fn send_datagram(
        &self,
        to: SocketAddr,
        expected: &NodeId,
        payload: Bytes,
    ) -> Result<(), DatagramError> {
        let inner = &self.inner;
        if inner.is_closed() {
            return Err(DatagramError::EndpointClosed);
        }
        let mut peers = inner.lock_peers();
        let payload = match peers.slots.get_mut(&to) {
            Some(Slot::Ready(ready)) if ready.is_alive() => {
                if ready.node != *expected {
                    return Err(DatagramError::IdentityMismatch {
                        addr: to,
                        expected: expected.clone(),
                        actual: ready.node.clone(),
                    });
                }
                let len = payload.len();
                match ready.conn.send_datagram(payload.clone()) {
                    Ok(()) => return Ok(()),
                    Err(SendDatagramError::TooLarge) => {
                        return Err(DatagramError::TooLarge {
                            len,
                            max: ready.conn.max_datagram_size().unwrap_or(0),
                        });
                    }
                    Err(SendDatagramError::UnsupportedByPeer | SendDatagramError::Disabled) => {
                        return Err(DatagramError::Unsupported { addr: to });
                    }
                    // Lost just now: reconnect below and queue it.
                    Err(SendDatagramError::ConnectionLost(_)) => payload,
                }
            }
            Some(Slot::Connecting(pending)) => {
                let dropped = enqueue(pending, inner.limits.datagram_queue, expected, payload);
                Counters::add(&inner.counters.dropped_datagrams, dropped);
                return Ok(());
            }
            Some(Slot::Ready(_)) | None => payload,
        };
        let pending = inner.start_connect(&mut peers, to);
        let dropped = enqueue(pending, inner.limits.datagram_queue, expected, payload);
        Counters::add(&inner.counters.dropped_datagrams, dropped);
        Ok(())
    }

    /// Starts connecting to the node `expected` at `to` now, so a first datagram or request
    /// does not wait for a handshake. Does nothing if a connection is cached or being made,
    /// or the endpoint is closed. Never waits.
    pub fn connect_ahead(&self, to: SocketAddr, expected: NodeId) {
        let inner = &self.inner;
        if inner.is_closed() {
            return;
        }
        let mut peers = inner.lock_peers();
        match peers.slots.get_mut(&to) {
            Some(Slot::Ready(ready)) if ready.is_alive() => {}
            Some(Slot::Connecting(pending)) => {
                if !pending.wanted.contains(&expected) {
                    pending.wanted.push(expected);
                }
            }
            Some(Slot::Ready(_)) | None => {
                inner.start_connect(&mut peers, to).wanted.push(expected);
            }
        }
    }

    /// Closes and forgets the cached connection to `to` (the member went down or left), or
    /// cancels the attempt to make one: its queued datagrams are dropped and requests
    /// waiting for it fail with [`RequestError::Connect`]. Incoming connections from `to`
    /// are not touched.
    pub fn forget(&self, to: SocketAddr) {
        let slot = self.inner.lock_peers().slots.remove(&to);
        match slot {
            Some(Slot::Ready(ready)) => {
                ready.conn.close(CLOSE_NORMAL, b"forgotten");
                debug!(peer = %to, node = %ready.node, "connection forgotten");
            }
            Some(Slot::Connecting(pending)) => {
                Counters::add(
                    &self.inner.counters.dropped_datagrams,
                    len_u64(pending.queue.len()),
                );
                debug!(peer = %to, "connection attempt forgotten");
            }
            None => {}
        }
    }

    /// Makes sure a connection to `to` is ready (cached), within `timeout`: the cached one, or
    /// a new one. `expected` as for [`Self::request`]. A caller that then waits long for an
    /// answer learns first, and soon, whether the peer can be reached at all; a failure here
    /// means nothing was sent.
    pub async fn connect(
        &self,
        to: SocketAddr,
        expected: Option<&NodeId>,
        timeout: Duration,
    ) -> Result<(), RequestError> {
        match tokio::time::timeout(timeout, self.connection(to, expected)).await {
            Ok(conn) => conn.map(drop),
            Err(_) => Err(RequestError::Connect {
                addr: to,
                reason: format!("no connection within {timeout:?}"),
            }),
        }
    }

    /// Sends one request to `to` and returns its response, all within `timeout`.
    ///
    /// Uses the cached connection to `to`, or makes one (and caches it). `expected` is the
    /// node that must be at `to`; `None` accepts any node of this cluster's CA (the CLI, and
    /// a joiner that knows only a seed's address). A request of at most 64 KiB travels
    /// through the connection's session, shared with the other small requests to `to`
    /// (`session.rs`); a longer one is one frame on a stream of its own, the response one
    /// frame back. There is no retry.
    pub async fn request(
        &self,
        to: SocketAddr,
        expected: Option<&NodeId>,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Bytes, RequestError> {
        self.check_outgoing(&body)?;
        let deadline = tokio::time::Instant::now() + timeout;
        // A deadline that passes while connecting means nothing was sent.
        let conn = match tokio::time::timeout_at(deadline, self.connection(to, expected)).await {
            Ok(conn) => conn?,
            Err(_) => {
                return Err(RequestError::Connect {
                    addr: to,
                    reason: format!("no connection within {timeout:?}"),
                });
            }
        };
        let exchanged = async {
            if body.len() <= SESSION_MAX_REQUEST {
                self.session(to, &conn).call(body).await
            } else {
                exchange(&conn, to, body, self.inner.limits.max_frame_bytes).await
            }
        };
        match tokio::time::timeout_at(deadline, exchanged).await {
            Ok(result) => result,
            Err(_) => Err(RequestError::Timeout {
                addr: to,
                after: timeout,
            }),
        }
    }

    /// The session of the cached connection `conn` to `to`, opened now if it has none or its
    /// last one failed. A connection no longer cached (replaced meanwhile) gets a session of
    /// its own for this one request.
    fn session(&self, to: SocketAddr, conn: &quinn::Connection) -> Arc<Session> {
        let inner = &self.inner;
        let open = || Session::open(conn.clone(), inner.limits.max_frame_bytes, &inner.runtime);
        let mut peers = inner.lock_peers();
        match peers.slots.get_mut(&to) {
            Some(Slot::Ready(ready)) if ready.conn.stable_id() == conn.stable_id() => {
                match &ready.session {
                    Some(session) if !session.is_failed() => session.clone(),
                    _ => ready.session.insert(open()).clone(),
                }
            }
            _ => open(),
        }
    }

    /// Sends `body` to the node `expected` at `to` as one frame and returns at once. A body of
    /// at most 64 KiB goes into the connection's lane (`lane.rs`: one unidirectional stream
    /// that small messages share, in order); a longer one gets a unidirectional stream of its
    /// own. Connecting, opening and writing run on tasks of the endpoint's runtime. Nothing
    /// comes back, not even an acknowledgement of delivery; a failure (no connection within
    /// `timeout`, a lost connection, a refused stream or lane) is logged at debug and counted
    /// in [`Stats::dropped_messages`]. Unlike a datagram a message may be as long as
    /// [`Limits::max_frame_bytes`] and is retransmitted by QUIC until delivered or the
    /// connection is lost; unlike a request it costs no response. Two messages may arrive in
    /// either order (small ones sent while connected arrive in the order sent).
    pub fn send_message(
        &self,
        to: SocketAddr,
        expected: &NodeId,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(), RequestError> {
        self.check_outgoing(&body)?;
        let small = body.len() <= LANE_MAX_MESSAGE;
        let body = if small {
            match self.send_in_lane(to, expected, body) {
                Ok(()) => return Ok(()),
                Err(body) => body,
            }
        } else {
            body
        };
        let endpoint = self.clone();
        let expected = expected.clone();
        self.inner.runtime.spawn(async move {
            let sent = tokio::time::timeout(timeout, async {
                let conn = endpoint.connection(to, Some(&expected)).await?;
                if small {
                    return endpoint.send_in_lane(to, &expected, body).map_err(|_| {
                        RequestError::Stream {
                            addr: to,
                            reason: "the connection was replaced meanwhile".to_owned(),
                        }
                    });
                }
                let mut send = conn
                    .open_uni()
                    .await
                    .map_err(|error| lost_to_request_error(to, &error))?;
                // Below the lane: a snapshot chunk's packets go out after the small messages
                // queued on the same connection (a follower's `Append`, its acknowledgement),
                // not in turns with them. A stream already closed fails its write below.
                let _ = send.set_priority(LARGE_MESSAGE_PRIORITY);
                write_frame(&mut send, body)
                    .await
                    .map_err(|error| RequestError::Stream {
                        addr: to,
                        reason: error.to_string(),
                    })?;
                // Finishing a stream the peer already stopped fails; nothing to report then.
                let _ = send.finish();
                Ok::<(), RequestError>(())
            })
            .await;
            let failure = match sent {
                Ok(Ok(())) => return,
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("not sent within {timeout:?}"),
            };
            debug!(peer = %to, node = %expected, %failure, "message not delivered");
            Counters::add(&endpoint.inner.counters.dropped_messages, 1);
        });
        Ok(())
    }

    /// Queues a small message in the lane of the established connection to `expected` at
    /// `to`, opening the lane if it has none or its last one failed. Gives the body back when
    /// there is no such connection (yet).
    fn send_in_lane(&self, to: SocketAddr, expected: &NodeId, body: Bytes) -> Result<(), Bytes> {
        let inner = &self.inner;
        let mut peers = inner.lock_peers();
        let Some(Slot::Ready(ready)) = peers.slots.get_mut(&to) else {
            return Err(body);
        };
        if !ready.is_alive() || ready.node != *expected {
            return Err(body);
        }
        let open = || {
            let counters = inner.counters.clone();
            let dropped = move |n| Counters::add(&counters.dropped_messages, n);
            Lane::open(ready.conn.clone(), &inner.runtime, dropped)
        };
        let body = match &ready.lane {
            Some(lane) if !lane.is_failed() => match lane.send(body) {
                Ok(()) => return Ok(()),
                Err(body) => body,
            },
            _ => body,
        };
        let lane = open();
        let sent = lane.send(body);
        ready.lane = Some(lane);
        sent
    }

    /// Refuses a frame longer than [`Limits::max_frame_bytes`], or any frame once the endpoint
    /// is closed, before anything is sent.
    fn check_outgoing(&self, body: &Bytes) -> Result<(), RequestError> {
        let max = self.inner.limits.max_frame_bytes;
        if u32::try_from(body.len()).map_or(true, |len| len > max) {
            return Err(RequestError::FrameTooLarge {
                len: body.len(),
                max,
            });
        }
        if self.inner.is_closed() {
            return Err(RequestError::EndpointClosed);
        }
        Ok(())
    }

    /// How many cached outgoing connections are established and open.
    pub fn connected_peers(&self) -> usize {
        self.inner
            .lock_peers()
            .slots
            .values()
            .filter(|slot| matches!(slot, Slot::Ready(ready) if ready.is_alive()))
            .count()
    }

    /// The largest UDP payload the cached connection to `to` sends now, as its path MTU
    /// discovery found it (up to [`MAX_UDP_PAYLOAD`]); `None` without an open connection.
    /// A diagnostic: sends never need it.
    pub fn path_mtu(&self, to: SocketAddr) -> Option<u16> {
        match self.inner.lock_peers().slots.get(&to) {
            Some(Slot::Ready(ready)) if ready.is_alive() => {
                Some(ready.conn.stats().path.current_mtu)
            }
            _ => None,
        }
    }

    /// What this endpoint refused or dropped so far.
    pub fn stats(&self) -> Stats {
        let counters = &self.inner.counters;
        Stats {
            refused_connections: counters.refused_connections.load(Ordering::Relaxed),
            failed_handshakes: counters.failed_handshakes.load(Ordering::Relaxed),
            refused_frames: counters.refused_frames.load(Ordering::Relaxed),
            dropped_datagrams: counters.dropped_datagrams.load(Ordering::Relaxed),
            dropped_messages: counters.dropped_messages.load(Ordering::Relaxed),
        }
    }

    /// Closes every connection, incoming and outgoing, with application code 0 and reason
    /// `shutdown`, and stops accepting. Later sends and requests fail with
    /// `EndpointClosed`. Does not wait: see [`wait_idle`](Self::wait_idle).
    pub fn close(&self) {
        self.inner.close();
    }

    /// Waits until every connection is fully closed, so peers have been told. Call after
    /// [`close`](Self::close).
    pub async fn wait_idle(&self) {
        self.inner.quinn.wait_idle().await;
    }

    /// The cached connection to `to`, or a new one, checked against `expected`.
    async fn connection(
        &self,
        to: SocketAddr,
        expected: Option<&NodeId>,
    ) -> Result<quinn::Connection, RequestError> {
        let inner = &self.inner;
        let reply = {
            let mut peers = inner.lock_peers();
            let (reply_tx, reply) = oneshot::channel();
            let waiter = Waiter {
                expected: expected.cloned(),
                reply: reply_tx,
            };
            match peers.slots.get_mut(&to) {
                Some(Slot::Ready(ready)) if ready.is_alive() => {
                    return match expected {
                        Some(expected) if *expected != ready.node => {
                            Err(RequestError::IdentityMismatch {
                                addr: to,
                                expected: expected.clone(),
                                actual: ready.node.clone(),
                            })
                        }
                        _ => Ok(ready.conn.clone()),
                    };
                }
                Some(Slot::Connecting(pending)) => pending.waiters.push(waiter),
                Some(Slot::Ready(_)) | None => {
                    inner.start_connect(&mut peers, to).waiters.push(waiter);
                }
            }
            reply
        };
        match reply.await {
            Ok(result) => result.map_err(|failure| failure.into_request_error(to)),
            Err(_) => Err(if inner.is_closed() {
                RequestError::EndpointClosed
            } else {
                RequestError::Connect {
                    addr: to,
                    reason: "the connection attempt was cancelled (forgotten)".to_owned(),
                }
            }),
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("local_addr", &self.inner.local_addr)
            .field("serves", &self.inner.inbound.is_some())
            .field("closed", &self.inner.is_closed())
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn lock_peers(&self) -> MutexGuard<'_, Peers> {
        // The map stays consistent across a panic elsewhere (every change is one insert or
        // remove), so a poisoned lock is still usable.
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Replaces whatever is at `to` with a new attempt and spawns it.
    fn start_connect<'a>(
        self: &Arc<Self>,
        peers: &'a mut Peers,
        to: SocketAddr,
    ) -> &'a mut Pending {
        let attempt = peers.next_attempt;
        peers.next_attempt += 1;
        self.runtime.spawn(connect_task(
            Arc::downgrade(self),
            self.quinn.clone(),
            to,
            attempt,
        ));
        let slot = Slot::Connecting(Pending {
            attempt,
            wanted: Vec::new(),
            waiters: Vec::new(),
            queue: VecDeque::new(),
        });
        peers.slots.insert(to, slot);
        match peers.slots.get_mut(&to) {
            Some(Slot::Connecting(pending)) => pending,
            // Invariant: inserted just above under the same lock.
            _ => unreachable!("slot inserted above"),
        }
    }

    /// Settles attempt `attempt` to `to` with its outcome.
    fn finish_connect(
        self: &Arc<Self>,
        to: SocketAddr,
        attempt: u64,
        result: Result<(quinn::Connection, NodeId), ConnectFailure>,
    ) {
        let mut peers = self.lock_peers();
        let current = matches!(
            peers.slots.get(&to),
            Some(Slot::Connecting(pending)) if pending.attempt == attempt
        );
        let pending = match peers.slots.remove(&to) {
            Some(Slot::Connecting(pending)) if current => pending,
            other => {
                // Forgotten or replaced meanwhile: put back what was there, drop ours.
                if let Some(slot) = other {
                    peers.slots.insert(to, slot);
                }
                if let Ok((conn, _)) = result {
                    conn.close(CLOSE_NORMAL, b"forgotten");
                }
                return;
            }
        };
        let (conn, node) = match result {
            Ok(ok) => ok,
            Err(failure) => {
                debug!(peer = %to, %failure, dropped = pending.queue.len(), "connect failed");
                Counters::add(
                    &self.counters.dropped_datagrams,
                    len_u64(pending.queue.len()),
                );
                for waiter in pending.waiters {
                    let _ = waiter.reply.send(Err(failure.clone()));
                }
                return;
            }
        };
        let accepts = |expected: Option<&NodeId>| expected.is_none_or(|e| *e == node);
        let keep = pending.wanted.iter().any(|e| accepts(Some(e)))
            || pending.waiters.iter().any(|w| accepts(w.expected.as_ref()))
            || pending.queue.iter().any(|(e, _)| *e == node);
        for waiter in pending.waiters {
            let reply = match waiter.expected {
                Some(expected) if expected != node => Err(ConnectFailure::Mismatch {
                    expected,
                    actual: node.clone(),
                }),
                _ => Ok(conn.clone()),
            };
            // A waiter that gave up (timed out) is fine to skip.
            let _ = waiter.reply.send(reply);
        }
        if !keep {
            debug!(peer = %to, %node, "connected to an unexpected node; closing");
            Counters::add(
                &self.counters.dropped_datagrams,
                len_u64(pending.queue.len()),
            );
            conn.close(CLOSE_IDENTITY, b"not the node expected at this address");
            return;
        }
        for (expected, payload) in pending.queue {
            let sent = if expected == node {
                conn.send_datagram(payload)
                    .map_err(|error| error.to_string())
            } else {
                Err(format!("queued for node {expected}"))
            };
            if let Err(error) = sent {
                debug!(peer = %to, %node, %error, "queued datagram dropped");
                Counters::add(&self.counters.dropped_datagrams, 1);
            }
        }
        debug!(peer = %to, %node, "connected");
        peers.slots.insert(
            to,
            Slot::Ready(Ready {
                conn: conn.clone(),
                node: node.clone(),
                session: None,
                lane: None,
            }),
        );
        drop(peers);
        self.runtime
            .spawn(outgoing_task(Arc::downgrade(self), conn, node, to));
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let slots = std::mem::take(&mut self.lock_peers().slots);
        for slot in slots.into_values() {
            if let Slot::Ready(ready) = slot {
                ready.conn.close(CLOSE_NORMAL, b"shutdown");
            }
        }
        self.quinn.close(CLOSE_NORMAL, b"shutdown");
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}

/// Queues one datagram for a pending connection; returns how many were dropped (0 or 1).
fn enqueue(pending: &mut Pending, capacity: usize, expected: &NodeId, payload: Bytes) -> u64 {
    if capacity == 0 {
        return 1;
    }
    let mut dropped = 0;
    while pending.queue.len() >= capacity {
        pending.queue.pop_front();
        dropped += 1;
    }
    pending.queue.push_back((expected.clone(), payload));
    dropped
}

fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// Bytes asked of the kernel for each endpoint socket's receive and send buffers. QUIC rides
/// on UDP: a datagram that arrives while its socket's buffer is full is dropped, and each loss
/// costs the sender a retransmission and half its congestion window. A node reads its socket
/// between other work on its event loop while several peers send at once (a snapshot chunk is
/// about 90 packets): with Linux's default buffer (208 KiB) a 1M-key join here dropped ~900
/// datagrams (`RcvbufErrors` in `/proc/net/snmp`), and none with this. The kernel caps the
/// request at `net.core.rmem_max` / `wmem_max`.
const SOCKET_BUFFER_BYTES: usize = 8 << 20;

/// A UDP socket bound to `addr`, with buffers of up to [`SOCKET_BUFFER_BYTES`] (best effort:
/// a smaller buffer still works, with more losses under bursts).
fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let socket = std::net::UdpSocket::bind(addr)?;
    let sock = socket2::SockRef::from(&socket);
    if let Err(error) = sock.set_recv_buffer_size(SOCKET_BUFFER_BYTES) {
        debug!(%addr, %error, "socket receive buffer left at its default");
    }
    if let Err(error) = sock.set_send_buffer_size(SOCKET_BUFFER_BYTES) {
        debug!(%addr, %error, "socket send buffer left at its default");
    }
    Ok(socket)
}

fn transport_config(limits: &Limits) -> Result<Arc<TransportConfig>, BindError> {
    limits.check().map_err(BindError::Limits)?;
    let idle = IdleTimeout::try_from(limits.idle_timeout)
        .map_err(|_| BindError::Limits("idle_timeout is too long for quic".to_owned()))?;
    let mut transport = TransportConfig::default();
    transport
        .max_idle_timeout(Some(idle))
        .initial_rtt(INITIAL_RTT)
        .keep_alive_interval((!limits.keep_alive.is_zero()).then_some(limits.keep_alive))
        .max_concurrent_bidi_streams(VarInt::from_u32(limits.max_concurrent_bidi_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(limits.max_concurrent_bidi_streams))
        .datagram_receive_buffer_size(Some(DATAGRAM_RECEIVE_BUFFER));
    let mut mtu = MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    transport.mtu_discovery_config(Some(mtu));
    let mut acks = AckFrequencyConfig::default();
    acks.ack_eliciting_threshold(ACK_ELICITING_THRESHOLD)
        .max_ack_delay(Some(MAX_ACK_DELAY));
    transport.ack_frequency_config(Some(acks));
    Ok(Arc::new(transport))
}

/// The endpoint's settings: packets received up to [`MAX_UDP_PAYLOAD`].
fn endpoint_config() -> quinn::EndpointConfig {
    let mut config = quinn::EndpointConfig::default();
    // In quinn's range (asserted beside the constant), so never refused.
    let _ = config.max_udp_payload_size(MAX_UDP_PAYLOAD);
    config
}

fn client_config(
    tls: Arc<rustls::ClientConfig>,
    transport: Arc<TransportConfig>,
) -> Result<quinn::ClientConfig, BindError> {
    let crypto =
        QuicClientConfig::try_from(tls).map_err(|error| BindError::Tls(error.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(transport);
    Ok(client)
}

/// Who the peer of an established connection is, from its verified certificate, after
/// checking that it negotiated [`ALPN`].
fn peer_identity(conn: &quinn::Connection) -> Result<PeerIdentity, String> {
    let alpn = conn
        .handshake_data()
        .and_then(|data| data.downcast::<HandshakeData>().ok())
        .and_then(|data| data.protocol);
    if alpn.as_deref() != Some(ALPN) {
        return Err("the peer did not negotiate alpn slotring/1".to_owned());
    }
    let certs = conn
        .peer_identity()
        .and_then(|any| any.downcast::<Vec<CertificateDer<'static>>>().ok())
        .ok_or_else(|| "the peer presented no certificate".to_owned())?;
    let leaf = certs
        .first()
        .ok_or_else(|| "the peer presented no certificate".to_owned())?;
    identity_of(leaf)
}

/// Makes one outgoing connection and settles its attempt.
async fn connect_task(inner: Weak<Inner>, quinn: quinn::Endpoint, to: SocketAddr, attempt: u64) {
    let result = async {
        let connecting = quinn
            .connect(to, NODE_SERVER_NAME)
            .map_err(|error| ConnectFailure::Connect(error.to_string()))?;
        let conn = tokio::time::timeout(HANDSHAKE_TIMEOUT, connecting)
            .await
            .map_err(|_| {
                ConnectFailure::Connect(format!("no handshake within {HANDSHAKE_TIMEOUT:?}"))
            })?
            .map_err(|error| ConnectFailure::from_connection_error(&error))?;
        match peer_identity(&conn) {
            Ok(PeerIdentity::Node(node)) => Ok((conn, node)),
            Ok(PeerIdentity::Client) => {
                conn.close(CLOSE_IDENTITY, b"a client certificate cannot serve");
                Err(ConnectFailure::Handshake(
                    "the peer presented the client certificate, not a node's".to_owned(),
                ))
            }
            Err(reason) => {
                conn.close(CLOSE_IDENTITY, reason.as_bytes());
                Err(ConnectFailure::Handshake(reason))
            }
        }
    }
    .await;
    match inner.upgrade() {
        Some(inner) => inner.finish_connect(to, attempt, result),
        None => {
            if let Ok((conn, _)) = result {
                conn.close(CLOSE_NORMAL, b"shutdown");
            }
        }
    }
}

/// Serves a cached outgoing connection (a node's peer may send on it too) until it closes,
/// then removes it from the cache.
async fn outgoing_task(inner: Weak<Inner>, conn: quinn::Connection, node: NodeId, to: SocketAddr) {
    let serving = inner.upgrade().and_then(|inner| {
        inner.inbound.clone().map(|inbound| {
            (
                inbound,
                inner.limits.clone(),
                inner.counters.clone(),
                inner.runtime.clone(),
            )
        })
    });
    match serving {
        Some((inbound, limits, counters, runtime)) => {
            serve(
                conn.clone(),
                PeerIdentity::Node(node.clone()),
                inbound,
                limits,
                counters,
                runtime,
            )
            .await;
        }
        None => {
            conn.closed().await;
        }
    }
    let reason = conn.closed().await;
    debug!(peer = %to, %node, %reason, "outgoing connection closed");
    if let Some(inner) = inner.upgrade() {
        let mut peers = inner.lock_peers();
        let ours = matches!(
            peers.slots.get(&to),
            Some(Slot::Ready(ready)) if ready.conn.stable_id() == conn.stable_id()
        );
        if ours {
            peers.slots.remove(&to);
        }
    }
}

/// Accepts incoming connections until the endpoint closes or the receiver is dropped.
async fn accept_loop(
    quinn: quinn::Endpoint,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    counters: Arc<Counters>,
) {
    let runtime = Handle::current();
    loop {
        let incoming = tokio::select! {
            incoming = quinn.accept() => match incoming {
                Some(incoming) => incoming,
                None => break,
            },
            () = inbound.closed() => {
                debug!("inbound receiver dropped; closing the endpoint");
                quinn.close(CLOSE_NORMAL, b"shutdown");
                break;
            }
        };
        if counters.incoming_open.load(Ordering::Relaxed) >= limits.max_connections {
            debug!(peer = %incoming.remote_address(), "connection refused: at max_connections");
            Counters::add(&counters.refused_connections, 1);
            incoming.refuse();
            continue;
        }
        counters.incoming_open.fetch_add(1, Ordering::Relaxed);
        let guard = OpenGuard(counters.clone());
        runtime.spawn(incoming_task(
            incoming,
            inbound.clone(),
            limits.clone(),
            counters.clone(),
            runtime.clone(),
            guard,
        ));
    }
}

/// Decrements the open incoming connection count when the connection's task ends.
struct OpenGuard(Arc<Counters>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.incoming_open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn incoming_task(
    incoming: quinn::Incoming,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    counters: Arc<Counters>,
    runtime: Handle,
    _guard: OpenGuard,
) {
    let addr = incoming.remote_address();
    let handshake = match incoming.accept() {
        Ok(connecting) => connecting.await,
        Err(error) => Err(error),
    };
    let conn = match handshake {
        Ok(conn) => conn,
        Err(error) => {
            debug!(peer = %addr, %error, "incoming handshake failed");
            Counters::add(&counters.failed_handshakes, 1);
            return;
        }
    };
    let identity = match peer_identity(&conn) {
        Ok(identity) => identity,
        Err(reason) => {
            debug!(peer = %addr, %reason, "incoming connection names no one; closing");
            Counters::add(&counters.failed_handshakes, 1);
            conn.close(CLOSE_IDENTITY, reason.as_bytes());
            return;
        }
    };
    debug!(peer = %addr, %identity, "incoming connection");
    serve(conn.clone(), identity, inbound, limits, counters, runtime).await;
    let reason = conn.closed().await;
    debug!(peer = %addr, %reason, "incoming connection closed");
}

/// Delivers a connection's datagrams and requests to `inbound` until it closes.
async fn serve(
    conn: quinn::Connection,
    identity: PeerIdentity,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    counters: Arc<Counters>,
    runtime: Handle,
) {
    let addr = conn.remote_address();
    let datagrams = async {
        while let Ok(payload) = conn.read_datagram().await {
            let PeerIdentity::Node(from) = &identity else {
                Counters::add(&counters.dropped_datagrams, 1);
                continue;
            };
            let item = Inbound::Datagram {
                from: from.clone(),
                addr,
                payload,
            };
            if inbound.try_send(item).is_err() {
                Counters::add(&counters.dropped_datagrams, 1);
            }
        }
    };
    let streams = async {
        while let Ok((send, recv)) = conn.accept_bi().await {
            runtime.spawn(request_task(
                send,
                recv,
                identity.clone(),
                addr,
                inbound.clone(),
                limits.clone(),
                counters.clone(),
                runtime.clone(),
            ));
        }
    };
    let messages = async {
        while let Ok(recv) = conn.accept_uni().await {
            runtime.spawn(message_task(
                recv,
                identity.clone(),
                addr,
                inbound.clone(),
                limits.clone(),
                counters.clone(),
            ));
        }
    };
    tokio::join!(datagrams, streams, messages);
}

/// Reads one message frame from a unidirectional stream, or every frame of a lane
/// (`lane.rs`), and hands them to the node.
async fn message_task(
    mut recv: quinn::RecvStream,
    from: PeerIdentity,
    addr: SocketAddr,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    counters: Arc<Counters>,
) {
    let PeerIdentity::Node(from) = from else {
        // Only nodes send messages; a client has no business here.
        Counters::add(&counters.dropped_messages, 1);
        let _ = recv.stop(CODE_BAD_FRAME);
        return;
    };
    match read_opening(&mut recv, true, &limits, addr, &counters).await {
        Ok(Opening::Frame(body)) => {
            // If the node is gone, the message goes with it, as it would have in flight.
            let _ = inbound.send(Inbound::Message { from, addr, body }).await;
        }
        Ok(Opening::Session) => {
            let refused = || Counters::add(&counters.refused_frames, 1);
            lane::serve(recv, from, addr, inbound, &limits, refused).await;
        }
        Err(_) => {}
    }
}

/// What an incoming stream starts with.
enum Opening {
    /// One whole frame: a message, or a single request.
    Frame(Bytes),
    /// [`SESSION_MARKER`]: a session (request streams) or a lane (message streams) follows.
    Session,
}

/// Reads the one frame of an incoming stream (or, where `sessions` are allowed, the marker of
/// a session), within the idle timeout. A frame that is too long, cut short or too slow is
/// refused: counted, logged at debug, the stream stopped, and the reason's code returned, for
/// a request's response stream to be reset with it. A stream the peer reset, or a lost
/// connection, has nothing to refuse (`Err(None)`).
async fn read_opening(
    recv: &mut quinn::RecvStream,
    sessions: bool,
    limits: &Limits,
    addr: SocketAddr,
    counters: &Counters,
) -> Result<Opening, Option<VarInt>> {
    let max = limits.max_frame_bytes;
    let read = tokio::time::timeout(limits.idle_timeout, async {
        let len = read_len(recv).await?;
        if sessions && len == SESSION_MARKER {
            return Ok(Opening::Session);
        }
        read_body(recv, len, max).await.map(Opening::Frame)
    })
    .await;
    let (code, problem) = match read {
        Ok(Ok(opening)) => return Ok(opening),
        Ok(Err(ReadFrameError::TooLarge { len })) => (
            CODE_FRAME_TOO_LARGE,
            format!("frame of {len} bytes exceeds the limit of {max} bytes"),
        ),
        Ok(Err(ReadFrameError::FinishedEarly)) => {
            (CODE_BAD_FRAME, "stream ended inside a frame".to_owned())
        }
        Ok(Err(ReadFrameError::Read(error))) => {
            debug!(peer = %addr, %error, "incoming stream failed");
            return Err(None);
        }
        Err(_) => (
            CODE_BAD_FRAME,
            format!("no whole frame within {:?}", limits.idle_timeout),
        ),
    };
    debug!(peer = %addr, %problem, "frame refused");
    Counters::add(&counters.refused_frames, 1);
    // Already closed is fine: the peer gave up on the stream itself.
    let _ = recv.stop(code);
    Err(Some(code))
}

#[allow(clippy::too_many_arguments)]
async fn request_task(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    from: PeerIdentity,
    addr: SocketAddr,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    counters: Arc<Counters>,
    runtime: Handle,
) {
    let body = match read_opening(&mut recv, true, &limits, addr, &counters).await {
        Ok(Opening::Frame(body)) => body,
        Ok(Opening::Session) => {
            let refused = || Counters::add(&counters.refused_frames, 1);
            session::serve(send, recv, from, addr, inbound, limits, refused, runtime).await;
            return;
        }
        Err(refused) => {
            if let Some(code) = refused {
                // Already closed is fine: the peer gave up on the stream itself.
                let _ = send.reset(code);
            }
            return;
        }
    };
    let responder = Responder {
        way: Some(Way::Stream(send)),
        max_frame_bytes: limits.max_frame_bytes,
        runtime,
        peer: addr,
    };
    let item = Inbound::Request {
        from,
        addr,
        body,
        responder,
    };
    // If the node is gone, the responder is dropped with the item: the stream is reset and
    // the requester told.
    let _ = inbound.send(item).await;
}

/// Writes the request and reads the response on a new stream of `conn`.
async fn exchange(
    conn: &quinn::Connection,
    addr: SocketAddr,
    body: Bytes,
    max: u32,
) -> Result<Bytes, RequestError> {
    let (mut send, mut recv) = conn
        .open_bi()
        .await
        .map_err(|error| lost_to_request_error(addr, &error))?;
    let write_error = |error: WriteError| match error {
        WriteError::ConnectionLost(error) => lost_to_request_error(addr, &error),
        WriteError::Stopped(code) => RequestError::Stream {
            addr,
            reason: format!("peer stopped reading: {}", describe_code(code)),
        },
        other => RequestError::Stream {
            addr,
            reason: other.to_string(),
        },
    };
    write_frame(&mut send, body).await.map_err(write_error)?;
    // Finishing a stream the peer already stopped fails; the read below reports why.
    let _ = send.finish();
    match read_frame(&mut recv, max).await {
        Ok(response) => Ok(response),
        Err(ReadFrameError::TooLarge { len }) => {
            let _ = recv.stop(CODE_FRAME_TOO_LARGE);
            Err(RequestError::ResponseTooLarge { addr, len, max })
        }
        Err(ReadFrameError::FinishedEarly) => Err(RequestError::Stream {
            addr,
            reason: "the response stream ended inside a frame".to_owned(),
        }),
        Err(ReadFrameError::Read(ReadError::Reset(code))) => Err(RequestError::Stream {
            addr,
            reason: format!("peer {}", describe_code(code)),
        }),
        Err(ReadFrameError::Read(ReadError::ConnectionLost(error))) => {
            Err(lost_to_request_error(addr, &error))
        }
        Err(ReadFrameError::Read(other)) => Err(RequestError::Stream {
            addr,
            reason: other.to_string(),
        }),
    }
}
