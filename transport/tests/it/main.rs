//! Integration tests of `transport`: real QUIC endpoints on 127.0.0.1 port 0.

mod common;
mod datagrams;
mod frames;
mod limits;
mod messages;
mod pki;
mod refusals;
mod requests;
mod sessions;
