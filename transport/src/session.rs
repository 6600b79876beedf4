//! Sessions: many small requests and their responses on one long-lived stream.
//!
//! A stream per request costs a stream's state on both sides, a task on the server, and
//! usually a packet of its own each way. A requester therefore keeps one *session* per
//! cached connection: a bidirectional stream that starts with [`SESSION_MARKER`] where a
//! single request's frame length would be, then carries records both ways.
//!
//! ```text
//! requester → server:  marker: u32 | { len: u32 | id: u64 | body }*
//! server → requester:  { len: u32 | id: u64 | outcome: u8 | body }*
//! ```
//!
//! All integers are little-endian. `outcome` is [`OUTCOME_RESPONSE`] (the body is the
//! response) or one of the stream reset codes of `frame.rs` with an empty body (the request was
//! refused: its response would have been too long, or it was dropped unanswered). Responses
//! come back in the order they are given, not the order of the requests. Records queued
//! together are written together, so concurrent requests share packets.
//!
//! Only requests of at most [`SESSION_MAX_REQUEST`] bytes travel here; a longer one gets a
//! stream of its own, so it never holds up the small ones behind it. A response may be as
//! long as [`Limits::max_frame_bytes`].
//!
//! What a session deliberately does not do: no retry, no reordering guarantee, and no
//! per-request cancellation on the wire (a requester that gives up forgets the id; the
//! response, when it comes, is dropped).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::{BufMut, Bytes, BytesMut};
use quinn::{ConnectionError, ReadError, ReadExactError, VarInt, WriteError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tracing::debug;

use crate::endpoint::{Inbound, Responder, lost_to_request_error};
use crate::error::RequestError;
use crate::frame::{CODE_BAD_FRAME, CODE_FRAME_TOO_LARGE, describe_code};
use crate::identity::PeerIdentity;
use crate::limits::Limits;

/// What a session stream starts with, in place of a single request's frame length. Never a
/// valid length: [`Limits`] keeps `max_frame_bytes` below it.
pub(crate) const SESSION_MARKER: u32 = 0xFFFF_FFFE;
/// The longest request body sent through a session.
pub(crate) const SESSION_MAX_REQUEST: usize = 64 * 1024;
/// A record's `outcome`: the body is the response.
const OUTCOME_RESPONSE: u8 = 0;
/// Bytes before a request record's body: `len` and `id`.
const REQUEST_HEADER: usize = 12;
/// Bytes before a response record's body: `len`, `id` and `outcome`.
const RESPONSE_HEADER: usize = 13;

/// Why a session can carry no more requests. Kept, so every later caller gets the reason.
#[derive(Clone, Debug)]
enum Failure {
    /// The connection was lost.
    Lost(ConnectionError),
    /// The stream failed or the server ended it.
    Stream(String),
}

impl Failure {
    fn to_request_error(&self, addr: SocketAddr) -> RequestError {
        match self {
            Failure::Lost(error) => lost_to_request_error(addr, error),
            Failure::Stream(reason) => RequestError::Stream {
                addr,
                reason: reason.clone(),
            },
        }
    }

    fn of_write(error: WriteError) -> Failure {
        match error {
            WriteError::ConnectionLost(error) => Failure::Lost(error),
            WriteError::Stopped(code) => {
                Failure::Stream(format!("peer stopped reading: {}", describe_code(code)))
            }
            other => Failure::Stream(other.to_string()),
        }
    }

    fn of_read(error: ReadExactError) -> Failure {
        match error {
            ReadExactError::FinishedEarly(_) => {
                Failure::Stream("the peer ended the session".to_owned())
            }
            ReadExactError::ReadError(ReadError::ConnectionLost(error)) => Failure::Lost(error),
            ReadExactError::ReadError(ReadError::Reset(code)) => {
                Failure::Stream(format!("peer {}", describe_code(code)))
            }
            ReadExactError::ReadError(other) => Failure::Stream(other.to_string()),
        }
    }
}

type Answer = Result<Bytes, RequestError>;

/// The requester's table of requests sent and not yet answered.
#[derive(Default)]
struct Waiting {
    next_id: u64,
    answers: HashMap<u64, oneshot::Sender<Answer>>,
    failed: Option<Failure>,
}

/// The requester's end of a session on one connection. Dropping the last handle finishes the
/// stream.
pub(crate) struct Session {
    addr: SocketAddr,
    queue: mpsc::UnboundedSender<(u64, Bytes)>,
    waiting: Arc<Mutex<Waiting>>,
}

impl Session {
    /// Opens a session on `conn` (the stream itself is opened by the task it spawns).
    pub(crate) fn open(
        conn: quinn::Connection,
        max_frame_bytes: u32,
        runtime: &tokio::runtime::Handle,
    ) -> Arc<Session> {
        let (queue, requests) = mpsc::unbounded_channel();
        let waiting = Arc::new(Mutex::new(Waiting::default()));
        let addr = conn.remote_address();
        runtime.spawn(run_requester(
            conn,
            requests,
            waiting.clone(),
            max_frame_bytes,
        ));
        Arc::new(Session {
            addr,
            queue,
            waiting,
        })
    }

    /// Whether the session failed; a new one is then needed.
    pub(crate) fn is_failed(&self) -> bool {
        self.lock().failed.is_some()
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        lock(&self.waiting)
    }

    /// Sends `body` (at most [`SESSION_MAX_REQUEST`] bytes) and waits for its response. The
    /// caller bounds the wait; a cancelled call forgets its id.
    pub(crate) async fn call(&self, body: Bytes) -> Answer {
        let (answer, answered) = oneshot::channel();
        let id = {
            let mut waiting = self.lock();
            if let Some(failure) = &waiting.failed {
                return Err(failure.to_request_error(self.addr));
            }
            let id = waiting.next_id;
            waiting.next_id += 1;
            waiting.answers.insert(id, answer);
            id
        };
        let forget = Forget {
            waiting: &self.waiting,
            id,
        };
        if self.queue.send((id, body)).is_err() {
            // The task ended; it recorded why before dropping the queue.
            drop(forget);
            return Err(self.failure());
        }
        let answer = answered.await;
        drop(forget);
        answer.unwrap_or_else(|_| Err(self.failure()))
    }

    fn failure(&self) -> RequestError {
        let failure = self.lock().failed.clone();
        failure.map_or_else(
            || RequestError::Stream {
                addr: self.addr,
                reason: "the session ended".to_owned(),
            },
            |failure| failure.to_request_error(self.addr),
        )
    }
}

/// Forgets a call's id when the call ends, answered or not (a caller that timed out).
struct Forget<'a> {
    waiting: &'a Mutex<Waiting>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.waiting).answers.remove(&self.id);
    }
}

fn lock(waiting: &Mutex<Waiting>) -> MutexGuard<'_, Waiting> {
    // Every change is one insert, remove or assignment: consistent across a panic elsewhere.
    waiting.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs a requester's session: opens the stream, writes queued requests in batches and hands
/// responses to their callers, until the queue's last sender is dropped or the stream fails.
/// On failure every waiting caller is told why, and so is every later one.
async fn run_requester(
    conn: quinn::Connection,
    mut requests: mpsc::UnboundedReceiver<(u64, Bytes)>,
    waiting: Arc<Mutex<Waiting>>,
    max_frame_bytes: u32,
) {
    let addr = conn.remote_address();
    let result = async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(Failure::Lost)?;
        let writer = async {
            let mut marker = Some(Bytes::copy_from_slice(&SESSION_MARKER.to_le_bytes()));
            while let Some(first) = requests.recv().await {
                // Let the other callers that are ready queue theirs, and send them together.
                tokio::task::yield_now().await;
                let mut chunks: Vec<Bytes> = marker.take().into_iter().collect();
                push_request(&mut chunks, first);
                while let Ok(next) = requests.try_recv() {
                    push_request(&mut chunks, next);
                }
                send.write_all_chunks(&mut chunks)
                    .await
                    .map_err(Failure::of_write)?;
            }
            // Every handle is gone: nobody waits for anything.
            let _ = send.finish();
            Ok::<(), Failure>(())
        };
        let reader = async {
            loop {
                let mut header = [0u8; RESPONSE_HEADER];
                recv.read_exact(&mut header)
                    .await
                    .map_err(Failure::of_read)?;
                let (len, id, outcome) = parse_response_header(&header);
                if len > max_frame_bytes {
                    let _ = recv.stop(CODE_FRAME_TOO_LARGE);
                    return Err(Failure::Stream(format!(
                        "a response of {len} bytes exceeds the frame limit of {max_frame_bytes} bytes"
                    )));
                }
                let answer = if outcome == OUTCOME_RESPONSE {
                    let mut body = vec![0u8; len as usize];
                    recv.read_exact(&mut body)
                        .await
                        .map_err(Failure::of_read)?;
                    Ok(Bytes::from(body))
                } else {
                    Err(RequestError::Stream {
                        addr,
                        reason: format!("peer {}", describe_code(VarInt::from(outcome))),
                    })
                };
                // A caller that gave up has forgotten its id: the answer is dropped.
                if let Some(caller) = lock(&waiting).answers.remove(&id) {
                    let _ = caller.send(answer);
                }
            }
        };
        tokio::select! {
            written = writer => written,
            read = reader => read,
        }
    }
    .await;
    let failure = match result {
        Ok(()) => Failure::Stream("the session ended".to_owned()),
        Err(failure) => failure,
    };
    debug!(peer = %addr, ?failure, "session over");
    let mut waiting = lock(&waiting);
    for (_, caller) in waiting.answers.drain() {
        let _ = caller.send(Err(failure.to_request_error(addr)));
    }
    waiting.failed = Some(failure);
}

fn push_request(chunks: &mut Vec<Bytes>, (id, body): (u64, Bytes)) {
    let mut header = BytesMut::with_capacity(REQUEST_HEADER);
    // Invariant: callers send at most SESSION_MAX_REQUEST bytes.
    header.put_u32_le(u32::try_from(body.len()).unwrap_or(u32::MAX));
    header.put_u64_le(id);
    chunks.push(header.freeze());
    chunks.push(body);
}

fn parse_response_header(header: &[u8; RESPONSE_HEADER]) -> (u32, u64, u8) {
    let mut len = [0u8; 4];
    let mut id = [0u8; 8];
    len.copy_from_slice(&header[..4]);
    id.copy_from_slice(&header[4..12]);
    (u32::from_le_bytes(len), u64::from_le_bytes(id), header[12])
}

/// What a server's [`Responder`] sends back through its session.
#[derive(Debug)]
pub(crate) struct Reply {
    id: u64,
    /// `Ok(body)`, or the code of a refusal.
    outcome: Result<Bytes, VarInt>,
}

/// A server's way back to one request of a session; holds one of the session's permits
/// until answered or dropped.
#[derive(Debug)]
pub(crate) struct SessionWay {
    id: u64,
    replies: mpsc::UnboundedSender<Reply>,
    _permit: OwnedSemaphorePermit,
}

impl SessionWay {
    /// Queues the response (or a refusal with `code`) for the session's writer; a session
    /// whose stream is gone drops it.
    pub(crate) fn send(self, outcome: Result<Bytes, VarInt>) {
        let _ = self.replies.send(Reply {
            id: self.id,
            outcome,
        });
    }
}

/// Serves one session stream whose marker has been read: hands each request to the node
/// with a [`Responder`] that answers through the session, and writes the answers back in
/// batches. At most [`Limits::max_concurrent_bidi_streams`] requests are unanswered at once;
/// beyond that the session stops reading, and QUIC's flow control holds the requester back.
/// A record longer than [`Limits::max_frame_bytes`], or one cut short or too slow, stops the
/// session's reading (counted by `refused`); what was already read is still answered.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    from: PeerIdentity,
    addr: SocketAddr,
    inbound: mpsc::Sender<Inbound>,
    limits: Limits,
    refused: impl Fn(),
    runtime: tokio::runtime::Handle,
) {
    let (replies, mut answers) = mpsc::unbounded_channel::<Reply>();
    let max = limits.max_frame_bytes;
    let reader = async move {
        let permits = Arc::new(Semaphore::new(limits.max_concurrent_bidi_streams as usize));
        loop {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return; // Never closed.
            };
            let mut header = [0u8; REQUEST_HEADER];
            match recv.read_exact(&mut header).await {
                Ok(()) => {}
                // The requester finished its side, or the stream or connection failed.
                Err(error) => {
                    debug!(peer = %addr, %error, "session read ended");
                    return;
                }
            }
            let mut len = [0u8; 4];
            let mut id = [0u8; 8];
            len.copy_from_slice(&header[..4]);
            id.copy_from_slice(&header[4..]);
            let (len, id) = (u32::from_le_bytes(len), u64::from_le_bytes(id));
            if len > max {
                debug!(peer = %addr, len, max, "session record refused: too long");
                refused();
                let _ = recv.stop(CODE_FRAME_TOO_LARGE);
                return;
            }
            let mut body = vec![0u8; len as usize];
            let read = tokio::time::timeout(limits.idle_timeout, recv.read_exact(&mut body)).await;
            if !matches!(read, Ok(Ok(()))) {
                debug!(peer = %addr, "session record refused: cut short or too slow");
                refused();
                let _ = recv.stop(CODE_BAD_FRAME);
                return;
            }
            let way = SessionWay {
                id,
                replies: replies.clone(),
                _permit: permit,
            };
            let item = Inbound::Request {
                from: from.clone(),
                addr,
                body: Bytes::from(body),
                responder: Responder::through_session(way, max, runtime.clone(), addr),
            };
            if inbound.send(item).await.is_err() {
                return; // The node is gone.
            }
        }
    };
    let writer = async move {
        // Ends once the reader and every responder are done.
        while let Some(first) = answers.recv().await {
            tokio::task::yield_now().await;
            let mut chunks = Vec::new();
            push_reply(&mut chunks, first);
            while let Ok(next) = answers.try_recv() {
                push_reply(&mut chunks, next);
            }
            if let Err(error) = send.write_all_chunks(&mut chunks).await {
                debug!(peer = %addr, %error, "session answers not delivered");
                return;
            }
        }
        let _ = send.finish();
    };
    tokio::join!(reader, writer);
}

fn push_reply(chunks: &mut Vec<Bytes>, reply: Reply) {
    let mut header = BytesMut::with_capacity(RESPONSE_HEADER);
    let (len, outcome, body) = match reply.outcome {
        // Invariant: the responder checked the length against max_frame_bytes (a u32).
        Ok(body) => (
            u32::try_from(body.len()).unwrap_or(u32::MAX),
            OUTCOME_RESPONSE,
            Some(body),
        ),
        Err(code) => (0, u8::try_from(code.into_inner()).unwrap_or(u8::MAX), None),
    };
    header.put_u32_le(len);
    header.put_u64_le(reply.id);
    header.put_u8(outcome);
    chunks.push(header.freeze());
    chunks.extend(body);
}
