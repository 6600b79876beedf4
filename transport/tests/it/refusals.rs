//! Handshakes that must fail: another CA, no client certificate, another ALPN.

use std::net::SocketAddr;

use bytes::Bytes;
use transport::{Endpoint, Limits, NODE_SERVER_NAME, RequestError};

use crate::common::{Certs, PATIENCE, eventually, raw_client, raw_client_connection};

/// Connects with a raw endpoint and returns how the connection ended; panics if it stays up.
async fn refused(endpoint: &quinn::Endpoint, to: SocketAddr) -> quinn::ConnectionError {
    let connecting = endpoint.connect(to, NODE_SERVER_NAME).expect("connect");
    match tokio::time::timeout(PATIENCE, connecting)
        .await
        .expect("handshake in time")
    {
        Err(error) => error,
        // The client finishes its side first; the server then refuses it.
        Ok(conn) => tokio::time::timeout(PATIENCE, conn.closed())
            .await
            .expect("the server closes the connection"),
    }
}

fn assert_crypto_refusal(error: &quinn::ConnectionError) {
    let code = match error {
        quinn::ConnectionError::ConnectionClosed(close) => u64::from(close.error_code),
        quinn::ConnectionError::TransportError(error) => u64::from(error.code),
        other => panic!("expected a tls refusal, got {other}"),
    };
    assert!(
        (0x100..0x200).contains(&code),
        "not a crypto error: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_another_ca_is_refused() {
    let ours = Certs::new();
    let theirs = Certs::new();
    let (n0, _inbound) = ours.bind("n0", Limits::default());
    let foreign = theirs.echo("n1", Limits::default());

    let error = n0
        .request(foreign.local_addr(), None, Bytes::from("x"), PATIENCE)
        .await
        .expect_err("foreign server");
    match &error {
        RequestError::Handshake { reason, .. } => {
            // Both CAs have the same name, so webpki finds "the" issuer and its signature fails.
            assert!(reason.contains("invalid peer certificate"), "{reason}");
            assert!(reason.contains("another cluster"), "{reason}");
        }
        other => panic!("expected Handshake, got {other}"),
    }
    assert_eq!(n0.connected_peers(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_another_ca_is_refused() {
    let ours = Certs::new();
    let theirs = Certs::new();
    let (n0, mut inbound) = ours.bind("n0", Limits::default());

    // Through the API: the foreign client does not trust our server either.
    let client = Endpoint::client(theirs.client(), Limits::default()).expect("client");
    let error = client
        .request(n0.local_addr(), None, Bytes::from("x"), PATIENCE)
        .await
        .expect_err("foreign client");
    assert!(matches!(error, RequestError::Handshake { .. }), "{error}");

    // A client that trusts our CA but presents a foreign certificate: our server refuses.
    let raw = raw_client(
        ours.path(),
        transport::ALPN,
        Some((theirs.path(), "client")),
    );
    assert_crypto_refusal(&refused(&raw, n0.local_addr()).await);
    let raw = raw_client(ours.path(), transport::ALPN, Some((theirs.path(), "n0")));
    assert_crypto_refusal(&refused(&raw, n0.local_addr()).await);
    eventually("server counts the refusals", || {
        n0.stats().failed_handshakes >= 2
    })
    .await;
    assert!(inbound.try_recv().is_err(), "nothing reaches the node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_certificate_is_refused() {
    let certs = Certs::new();
    let (n0, mut inbound) = certs.bind("n0", Limits::default());

    let raw = raw_client(certs.path(), transport::ALPN, None);
    let error = refused(&raw, n0.local_addr()).await;
    assert_crypto_refusal(&error);
    eventually("server counts the refusal", || {
        n0.stats().failed_handshakes == 1
    })
    .await;
    assert!(inbound.try_recv().is_err(), "nothing reaches the node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_alpn_is_refused() {
    let certs = Certs::new();
    let (n0, mut inbound) = certs.bind("n0", Limits::default());

    let raw = raw_client(certs.path(), b"slotring/2", Some((certs.path(), "client")));
    let error = refused(&raw, n0.local_addr()).await;
    assert_crypto_refusal(&error);
    assert!(
        error.to_string().contains("120"),
        "no_application_protocol: {error}"
    );
    eventually("server counts the refusal", || {
        n0.stats().failed_handshakes == 1
    })
    .await;
    assert!(inbound.try_recv().is_err(), "nothing reaches the node");

    // The same client with the right ALPN is served: the refusal was the ALPN.
    let conn = raw_client_connection(certs.path(), n0.local_addr()).await;
    drop(conn);
}
