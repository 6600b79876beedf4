//! Lanes: a node's small one-way messages to one peer, in order, on one long-lived stream.
//!
//! [`Endpoint::send_message`](crate::Endpoint::send_message) used to open a unidirectional
//! stream per message: a stream's state on both sides, a task on each, and a packet of its
//! own. A message of at most [`LANE_MAX_MESSAGE`] bytes now goes into the *lane* of its
//! cached connection instead: one unidirectional stream that starts with
//! [`SESSION_MARKER`](crate::session::SESSION_MARKER) and then carries ordinary frames
//! (`u32` length, body). Messages queued together are written together. A longer message
//! keeps a stream of its own, so it never holds up the small ones (a snapshot chunk behind
//! which a heartbeat would wait).
//!
//! What a lane deliberately does not do: no acknowledgement, no retry. When its stream or
//! connection fails, the messages still queued are dropped and counted, as a message lost in
//! flight would be; the next message opens a new lane.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;
use topology::NodeId;
use tracing::debug;

use crate::endpoint::Inbound;
use crate::frame::{CODE_BAD_FRAME, CODE_FRAME_TOO_LARGE, ReadFrameError, read_body, read_len};
use crate::limits::Limits;
use crate::session::SESSION_MARKER;

/// The longest message sent through a lane.
pub(crate) const LANE_MAX_MESSAGE: usize = 64 * 1024;

/// The sending end of a lane. Dropping it finishes the stream once the queue is written.
pub(crate) struct Lane {
    queue: mpsc::UnboundedSender<Bytes>,
    failed: Arc<AtomicBool>,
}

impl Lane {
    /// Opens a lane on `conn` (the stream itself is opened by the task it spawns);
    /// `dropped(n)` counts messages lost with a failed lane.
    pub(crate) fn open(
        conn: quinn::Connection,
        runtime: &tokio::runtime::Handle,
        dropped: impl Fn(u64) + Send + Sync + 'static,
    ) -> Lane {
        let (queue, messages) = mpsc::unbounded_channel();
        let failed = Arc::new(AtomicBool::new(false));
        runtime.spawn(run_lane(conn, messages, failed.clone(), dropped));
        Lane { queue, failed }
    }

    /// Whether the lane failed; a new one is then needed.
    pub(crate) fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Queues `body` (at most [`LANE_MAX_MESSAGE`] bytes); gives it back if the lane is over.
    pub(crate) fn send(&self, body: Bytes) -> Result<(), Bytes> {
        self.queue.send(body).map_err(|error| error.0)
    }
}

async fn run_lane(
    conn: quinn::Connection,
    mut messages: mpsc::UnboundedReceiver<Bytes>,
    failed: Arc<AtomicBool>,
    dropped: impl Fn(u64),
) {
    let addr = conn.remote_address();
    let result = async {
        let mut send = conn.open_uni().await.map_err(|error| error.to_string())?;
        let mut marker = Some(Bytes::copy_from_slice(&SESSION_MARKER.to_le_bytes()));
        while let Some(first) = messages.recv().await {
            // Let the node's loop queue the rest of its burst first, and send it together.
            tokio::task::yield_now().await;
            let mut chunks: Vec<Bytes> = marker.take().into_iter().collect();
            let mut written = 1u64;
            push_frame(&mut chunks, first);
            while let Ok(next) = messages.try_recv() {
                push_frame(&mut chunks, next);
                written += 1;
            }
            if let Err(error) = send.write_all_chunks(&mut chunks).await {
                dropped(written);
                return Err(error.to_string());
            }
        }
        let _ = send.finish();
        Ok(())
    }
    .await;
    if let Err(reason) = result {
        debug!(peer = %addr, %reason, "message lane failed");
    }
    failed.store(true, Ordering::Release);
    messages.close();
    let mut lost = 0u64;
    while messages.try_recv().is_ok() {
        lost += 1;
    }
    if lost > 0 {
        dropped(lost);
    }
}

fn push_frame(chunks: &mut Vec<Bytes>, body: Bytes) {
    // Invariant: callers send at most LANE_MAX_MESSAGE bytes.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    chunks.push(BytesMut::from(&len.to_le_bytes()[..]).freeze());
    chunks.push(body);
}

/// Receives one lane whose marker has been read: hands each frame to the node as a message
/// from `from`, until the sender finishes the lane. Between two frames the stream may idle; a
/// frame once begun must arrive whole within the idle timeout. A frame longer than
/// [`Limits::max_frame_bytes`], cut short or too slow ends the lane (counted by `refused`).
pub(crate) async fn serve(
    mut recv: quinn::RecvStream,
    from: NodeId,
    addr: SocketAddr,
    inbound: mpsc::Sender<Inbound>,
    limits: &Limits,
    refused: impl Fn(),
) {
    let max = limits.max_frame_bytes;
    loop {
        let len = match read_len(&mut recv).await {
            Ok(len) => len,
            Err(ReadFrameError::FinishedEarly) => return, // Finished.
            Err(error) => {
                debug!(peer = %addr, ?error, "message lane ended");
                return;
            }
        };
        let read = tokio::time::timeout(limits.idle_timeout, read_body(&mut recv, len, max));
        let body = match read.await {
            Ok(Ok(body)) => body,
            problem => {
                debug!(peer = %addr, len, ?problem, "message lane refused: bad frame");
                refused();
                let code = if len > max {
                    CODE_FRAME_TOO_LARGE
                } else {
                    CODE_BAD_FRAME
                };
                let _ = recv.stop(code);
                return;
            }
        };
        let message = Inbound::Message {
            from: from.clone(),
            addr,
            body,
        };
        if inbound.send(message).await.is_err() {
            return; // The node is gone.
        }
    }
}
