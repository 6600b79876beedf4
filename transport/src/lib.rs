//! The QUIC endpoint of a slotring node (work in progress).
