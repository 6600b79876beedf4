//! Connection limits and limit validation.

use std::time::Duration;

use bytes::Bytes;
use transport::{BindError, Endpoint, Limits, RequestError};

use crate::common::{Certs, PATIENCE, loopback};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused() {
    let certs = Certs::new();
    let n0 = certs.echo(
        "n0",
        Limits {
            max_connections: 1,
            ..Limits::default()
        },
    );
    let first = Endpoint::client(certs.client(), Limits::default()).expect("client");
    let second = Endpoint::client(certs.client(), Limits::default()).expect("client");

    first
        .request(n0.local_addr(), None, Bytes::from("a"), PATIENCE)
        .await
        .expect("first is served");
    let error = second
        .request(n0.local_addr(), None, Bytes::from("b"), PATIENCE)
        .await
        .expect_err("second is refused");
    assert!(matches!(error, RequestError::Refused { .. }), "{error}");
    assert_eq!(n0.stats().refused_connections, 1);

    // The first one's connection is still served.
    first
        .request(n0.local_addr(), None, Bytes::from("c"), PATIENCE)
        .await
        .expect("first is still served");
}

#[tokio::test]
async fn inconsistent_limits_are_refused() {
    let certs = Certs::new();
    let limits = Limits {
        keep_alive: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(5),
        ..Limits::default()
    };
    let error = Endpoint::bind(loopback(), certs.node("n0"), limits).expect_err("refused");
    assert!(matches!(error, BindError::Limits(_)), "{error}");
}

#[tokio::test]
async fn a_frame_limit_above_one_gib_is_refused() {
    let certs = Certs::new();
    let limits = Limits {
        max_frame_bytes: (1 << 30) + 1,
        ..Limits::default()
    };
    let error = Endpoint::bind(loopback(), certs.node("n0"), limits).expect_err("refused");
    assert!(error.to_string().contains("1 GiB"), "{error}");
}
