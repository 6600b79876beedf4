//! Request/response roundtrips.

use std::time::Duration;

use bytes::Bytes;
use transport::{Endpoint, Inbound, Limits, PeerIdentity, RequestError};

use crate::common::{Certs, PATIENCE, echo, eventually, id, next};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_to_node_roundtrip_reuses_the_connection() {
    let certs = Certs::new();
    let n0 = certs.echo("n0", Limits::default());
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());

    let n0_id = id("n0");
    let response = n1
        .request(n0.local_addr(), Some(&n0_id), Bytes::from("ping"), PATIENCE)
        .await
        .expect("request");
    assert_eq!(response.as_ref(), b"n1:ping");
    // Unknown identity (a seed address) is fine too, and reuses the cached connection.
    let response = n1
        .request(n0.local_addr(), None, Bytes::new(), PATIENCE)
        .await
        .expect("request");
    assert_eq!(response.as_ref(), b"n1:");
    assert_eq!(n1.connected_peers(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_to_node_is_seen_as_the_client() {
    let certs = Certs::new();
    let (n0, mut inbound) = certs.bind("n0", Limits::default());
    let client = Endpoint::client(certs.client(), Limits::default()).expect("client");

    let to = n0.local_addr();
    let request = tokio::spawn(async move {
        client
            .request(to, None, Bytes::from("status"), PATIENCE)
            .await
    });
    match next(&mut inbound).await {
        Inbound::Request {
            from,
            body,
            responder,
            ..
        } => {
            assert_eq!(from, PeerIdentity::Client);
            assert_eq!(body.as_ref(), b"status");
            responder.respond(Bytes::from("ok")).expect("respond");
        }
        other => panic!("expected a request, got {other:?}"),
    }
    let response = request.await.expect("task").expect("request");
    assert_eq!(response.as_ref(), b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_responder_fails_the_request_at_once() {
    let certs = Certs::new();
    let n0 = certs.echo("n0", Limits::default());
    let (n1, _inbound) = certs.bind("n1", Limits::default());

    let error = n1
        .request(n0.local_addr(), None, Bytes::from("drop"), PATIENCE)
        .await
        .expect_err("dropped");
    assert!(matches!(error, RequestError::Stream { .. }), "{error}");
    assert!(error.to_string().contains("without answering"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_node_mismatch_is_refused() {
    let certs = Certs::new();
    let n0 = certs.echo("n0", Limits::default());
    let (n1, _inbound) = certs.bind("n1", Limits::default());

    let error = n1
        .request(n0.local_addr(), Some(&id("n2")), Bytes::from("x"), PATIENCE)
        .await
        .expect_err("mismatch");
    match &error {
        RequestError::IdentityMismatch {
            expected, actual, ..
        } => {
            assert_eq!(*expected, id("n2"));
            assert_eq!(*actual, id("n0"));
        }
        other => panic!("expected IdentityMismatch, got {other}"),
    }
    assert_eq!(
        n1.connected_peers(),
        0,
        "the mismatched connection is not cached"
    );

    // Once a connection to n0 is cached, a mismatching caller still gets the error.
    n1.request(n0.local_addr(), Some(&id("n0")), Bytes::from("x"), PATIENCE)
        .await
        .expect("right node");
    let error = n1
        .request(n0.local_addr(), Some(&id("n2")), Bytes::from("x"), PATIENCE)
        .await
        .expect_err("mismatch");
    assert!(
        matches!(error, RequestError::IdentityMismatch { .. }),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_tells_peers_and_refuses_new_work() {
    let certs = Certs::new();
    let (n0, inbound) = certs.bind("n0", Limits::default());
    tokio::spawn(echo(inbound));
    let (n1, _inbound) = certs.bind("n1", Limits::default());

    n1.request(n0.local_addr(), None, Bytes::from("x"), PATIENCE)
        .await
        .expect("request");
    assert_eq!(n1.connected_peers(), 1);
    n0.close();
    tokio::time::timeout(PATIENCE, n0.wait_idle())
        .await
        .expect("idle");
    // n1 hears the close and drops its cached connection.
    eventually("n1 forgets the closed connection", || {
        n1.connected_peers() == 0
    })
    .await;

    let error = n0
        .request(n1.local_addr(), None, Bytes::from("x"), PATIENCE)
        .await
        .expect_err("closed");
    assert!(matches!(error, RequestError::EndpointClosed), "{error}");
    let error = n1
        .request(
            n0.local_addr(),
            None,
            Bytes::from("x"),
            Duration::from_millis(300),
        )
        .await
        .expect_err("n0 is gone");
    assert!(
        matches!(
            error,
            RequestError::Refused { .. }
                | RequestError::Timeout { .. }
                | RequestError::Connect { .. }
        ),
        "{error}"
    );
}

/// A peer that never answers the handshake (a bound UDP socket that reads nothing): the
/// deadline passes while connecting, so the error says nothing was sent (safe to retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_while_connecting_means_nothing_was_sent() {
    let certs = Certs::new();
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("a silent socket");
    let error = n1
        .request(
            silent.local_addr().expect("an address"),
            None,
            Bytes::from("x"),
            Duration::from_millis(300),
        )
        .await
        .expect_err("nobody answers");
    assert!(matches!(error, RequestError::Connect { .. }), "{error}");
    assert!(error.nothing_sent(), "{error}");
}

/// A connection attempt to an address where nothing answers (a peer cut off by a partition)
/// is given up after a second, not at the request's deadline or the idle timeout, so the
/// next request starts a fresh attempt; once a node listens there, that attempt reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_handshake_is_given_up_and_the_next_request_starts_afresh() {
    let certs = Certs::new();
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());
    // Takes packets and never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let to = silent.local_addr().expect("addr");
    let started = std::time::Instant::now();
    let error = n1
        .request(to, None, Bytes::from("ping"), Duration::from_secs(8))
        .await
        .expect_err("nothing answers");
    let took = started.elapsed();
    assert!(
        matches!(&error, RequestError::Connect { reason, .. } if reason.contains("no handshake")),
        "{error}"
    );
    assert!(
        took < Duration::from_secs(4),
        "gave up after {took:?}, not within about a second"
    );
    assert!(error.nothing_sent());
    // A node now listens at that address: the next request connects afresh and is answered.
    drop(silent);
    let n0 = certs.echo_at("n0", Limits::default(), to);
    let response = n1
        .request(n0.local_addr(), None, Bytes::from("ping"), PATIENCE)
        .await
        .expect("a fresh attempt reaches the node");
    assert_eq!(response.as_ref(), b"n1:ping");
}
