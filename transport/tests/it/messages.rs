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

/// Waits for the next message at `inbound` and returns its body as text.
async fn next_message(inbound: &mut tokio::sync::mpsc::Receiver<Inbound>) -> String {
    match next(inbound).await {
        Inbound::Message { body, .. } => String::from_utf8(body.to_vec()).expect("utf-8"),
        other => panic!("expected a message, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_messages_on_an_established_connection_arrive_in_order() {
    let certs = Certs::new();
    let (n0, mut n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());
    n1.send_message(n0.local_addr(), &id("n0"), Bytes::from("hello"), PATIENCE)
        .expect("queued");
    assert_eq!(next_message(&mut n0_inbound).await, "hello");

    // The connection is up: every small message goes into its lane, one stream, in order.
    for i in 0..2000 {
        n1.send_message(
            n0.local_addr(),
            &id("n0"),
            Bytes::from(format!("m{i}")),
            PATIENCE,
        )
        .expect("queued");
    }
    for i in 0..2000 {
        assert_eq!(next_message(&mut n0_inbound).await, format!("m{i}"));
    }
    assert_eq!(n1.stats().dropped_messages, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_message_travels_beside_the_lane() {
    let certs = Certs::new();
    let (n0, mut n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());
    n1.send_message(n0.local_addr(), &id("n0"), Bytes::from("hello"), PATIENCE)
        .expect("queued");
    assert_eq!(next_message(&mut n0_inbound).await, "hello");

    let long = "x".repeat(1024 * 1024);
    n1.send_message(
        n0.local_addr(),
        &id("n0"),
        Bytes::from(long.clone()),
        PATIENCE,
    )
    .expect("queued");
    n1.send_message(n0.local_addr(), &id("n0"), Bytes::from("short"), PATIENCE)
        .expect("queued");
    let mut got = vec![
        next_message(&mut n0_inbound).await,
        next_message(&mut n0_inbound).await,
    ];
    got.sort_by_key(String::len);
    assert_eq!(got, ["short".to_owned(), long]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packets_between_nodes_grow_past_quics_default_on_loopback() {
    let certs = Certs::new();
    let (n0, mut n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());
    let to = n0.local_addr();
    n1.send_message(to, &id("n0"), Bytes::from("hello"), PATIENCE)
        .expect("queued");
    assert_eq!(next_message(&mut n0_inbound).await, "hello");
    // quinn starts at 1,200 bytes and, left to its default bound, stops discovering at 1,452.
    // Loopback carries 64 KiB, so discovery reaches the endpoint's own bound.
    eventually("the path MTU grows past 1,452", || {
        n1.path_mtu(to).is_some_and(|mtu| mtu > 1_452)
    })
    .await;
    assert!(n1.path_mtu(to).is_some_and(|mtu| mtu <= 6_500));
    assert_eq!(n1.path_mtu(n1.local_addr()), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_in_a_lane_ends_that_lane_and_is_counted() {
    let certs = Certs::new();
    let (n0, mut n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, _n1_inbound) = certs.bind("n1", Limits::default());
    // n1 is a node: open a lane to n0 by hand, one good frame, then one announcing 4 GiB.
    let conn = crate::common::raw_node_connection(certs.path(), "n1", n0.local_addr()).await;
    let mut send = conn.open_uni().await.expect("open");
    let mut bytes = 0xFFFF_FFFEu32.to_le_bytes().to_vec();
    bytes.extend_from_slice(&crate::common::frame(b"good"));
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    send.write_all(&bytes).await.expect("write");
    assert_eq!(next_message(&mut n0_inbound).await, "good");
    eventually("the bad frame is counted", || {
        n0.stats().refused_frames == 1
    })
    .await;

    // Messages from n1's own endpoint still arrive.
    n1.send_message(n0.local_addr(), &id("n0"), Bytes::from("after"), PATIENCE)
        .expect("queued");
    assert_eq!(next_message(&mut n0_inbound).await, "after");
}
