//! One-way messages on unidirectional streams.

use std::time::Duration;

use bytes::Bytes;
use transport::{Endpoint, Inbound, Limits, RequestError};

use crate::common::{Certs, PATIENCE, eventually, id, next};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_arrive_with_their_sender_and_nothing_goes_back() {
    let certs = Certs::new();
    let (n0, mut n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());
    // Sent before any connection exists: the message waits for it.
    for body in ["one", "two"] {
        n1.send_message(n0.local_addr(), &id("n0"), Bytes::from(body), PATIENCE)
            .expect("queued");
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        match next(&mut n0_inbound).await {
            Inbound::Message { from, body, .. } => {
                assert_eq!(from, id("n1"));
                got.push(String::from_utf8(body.to_vec()).expect("utf-8"));
            }
            other => panic!("expected a message, got {other:?}"),
        }
    }
    got.sort();
    assert_eq!(got, ["one", "two"]);
    assert_eq!(n1.stats().dropped_messages, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_fails_locally_and_a_wrong_node_is_counted() {
    let certs = Certs::new();
    let limits = Limits {
        max_frame_bytes: 1024,
        ..Limits::default()
    };
    let (n0, _n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, _n1_inbound) = certs.bind("n1", limits);
    let error = n1
        .send_message(
            n0.local_addr(),
            &id("n0"),
            Bytes::from(vec![0; 2048]),
            PATIENCE,
        )
        .expect_err("too large");
    assert!(
        matches!(
            error,
            RequestError::FrameTooLarge {
                len: 2048,
                max: 1024
            }
        ),
        "{error}"
    );
    // The node at that address is n0, not n2: nothing is delivered, the drop is counted.
    n1.send_message(
        n0.local_addr(),
        &id("n2"),
        Bytes::from("x"),
        Duration::from_secs(2),
    )
    .expect("queued");
    eventually("the drop is counted", || n1.stats().dropped_messages == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_from_the_client_identity_is_dropped() {
    let certs = Certs::new();
    let (n0, mut n0_inbound) = certs.bind("n0", Limits::default());
    let client = Endpoint::client(certs.client(), Limits::default()).expect("client");
    client
        .send_message(n0.local_addr(), &id("n0"), Bytes::from("sneaky"), PATIENCE)
        .expect("queued");
    eventually("the client message is dropped", || {
        n0.stats().dropped_messages == 1
    })
    .await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), n0_inbound.recv())
            .await
            .is_err(),
        "nothing reaches the node"
    );
}
