//! Frames on streams: a `u32` little-endian length, then that many bytes of body.

use bytes::Bytes;
use quinn::{ReadExactError, RecvStream, SendStream, VarInt, WriteError};

/// Stream reset code: the announced frame is longer than the receiver's limit.
pub(crate) const CODE_FRAME_TOO_LARGE: VarInt = VarInt::from_u32(1);
/// Stream reset code: the request was dropped without an answer.
pub(crate) const CODE_NO_RESPONSE: VarInt = VarInt::from_u32(2);
/// Stream reset code: the frame was cut short, or did not arrive in time.
pub(crate) const CODE_BAD_FRAME: VarInt = VarInt::from_u32(3);

/// What a stream reset code means, for error messages.
pub(crate) fn describe_code(code: VarInt) -> String {
    let meaning = match code.into_inner() {
        1 => "the frame exceeds the receiver's frame limit",
        2 => "the peer dropped the request without answering",
        3 => "the frame was cut short or too slow",
        _ => "unknown reason",
    };
    format!("reset with code {code} ({meaning})")
}

/// Why no frame was read.
#[derive(Debug)]
pub(crate) enum ReadFrameError {
    /// The announced length exceeds the limit; nothing was allocated.
    TooLarge {
        /// The announced length.
        len: u32,
    },
    /// The stream ended before the header or the body was complete.
    FinishedEarly,
    /// The stream failed.
    Read(quinn::ReadError),
}

impl From<ReadExactError> for ReadFrameError {
    fn from(error: ReadExactError) -> Self {
        match error {
            ReadExactError::FinishedEarly(_) => ReadFrameError::FinishedEarly,
            ReadExactError::ReadError(error) => ReadFrameError::Read(error),
        }
    }
}

/// Writes one frame. The caller has checked `body.len()` against its limit, which is at most
/// `u32::MAX`.
pub(crate) async fn write_frame(send: &mut SendStream, body: Bytes) -> Result<(), WriteError> {
    // Invariant: callers refuse bodies longer than `max_frame_bytes: u32`, so this never
    // saturates; saturating keeps a future caller's mistake a peer-side error, not a panic.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut chunks = [Bytes::copy_from_slice(&len.to_le_bytes()), body];
    send.write_all_chunks(&mut chunks).await
}

/// Reads one frame of at most `max` bytes, checking the length before allocating.
pub(crate) async fn read_frame(recv: &mut RecvStream, max: u32) -> Result<Bytes, ReadFrameError> {
    let len = read_len(recv).await?;
    read_body(recv, len, max).await
}

/// Reads a frame's length (or whatever else a stream starts with in its place).
pub(crate) async fn read_len(recv: &mut RecvStream) -> Result<u32, ReadFrameError> {
    let mut header = [0u8; 4];
    recv.read_exact(&mut header).await?;
    Ok(u32::from_le_bytes(header))
}

/// Reads a frame's body of `len` bytes, refusing it unallocated if `len` exceeds `max`.
pub(crate) async fn read_body(
    recv: &mut RecvStream,
    len: u32,
    max: u32,
) -> Result<Bytes, ReadFrameError> {
    if len > max {
        return Err(ReadFrameError::TooLarge { len });
    }
    let len = usize::try_from(len).map_err(|_| ReadFrameError::TooLarge { len })?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    Ok(Bytes::from(body))
}
