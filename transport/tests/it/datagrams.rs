//! Datagrams: queued while connecting, delivered with the sender's identity.

use bytes::Bytes;
use transport::{DatagramError, Inbound, Limits};

use crate::common::{Certs, eventually, id, next};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_sent_before_the_connection_are_delivered() {
    let certs = Certs::new();
    let (n0, _n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, mut n1_inbound) = certs.bind("n1", Limits::default());

    let n1_id = id("n1");
    assert_eq!(n0.connected_peers(), 0);
    for payload in ["one", "two", "three"] {
        n0.send_datagram(n1.local_addr(), &n1_id, Bytes::from(payload))
            .expect("queued");
    }
    for expected in ["one", "two", "three"] {
        match next(&mut n1_inbound).await {
            Inbound::Datagram {
                from,
                addr,
                payload,
            } => {
                assert_eq!(from, id("n0"));
                assert_eq!(addr, n0.local_addr());
                assert_eq!(payload.as_ref(), expected.as_bytes());
            }
            other => panic!("expected a datagram, got {other:?}"),
        }
    }
    assert_eq!(n0.connected_peers(), 1);

    // Established now: sent at once.
    n0.send_datagram(n1.local_addr(), &n1_id, Bytes::from("four"))
        .expect("sent");
    assert!(
        matches!(next(&mut n1_inbound).await, Inbound::Datagram { payload, .. } if payload.as_ref() == b"four")
    );

    // Too large for one datagram: refused locally.
    let error = n0
        .send_datagram(n1.local_addr(), &n1_id, Bytes::from(vec![0u8; 64 * 1024]))
        .expect_err("too large");
    assert!(
        matches!(error, DatagramError::TooLarge { len: 65536, .. }),
        "{error}"
    );

    // To the wrong node: refused locally.
    let error = n0
        .send_datagram(n1.local_addr(), &id("n2"), Bytes::from("x"))
        .expect_err("mismatch");
    assert!(
        matches!(error, DatagramError::IdentityMismatch { .. }),
        "{error}"
    );

    n0.forget(n1.local_addr());
    assert_eq!(n0.connected_peers(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_ahead_then_send_at_once() {
    let certs = Certs::new();
    let (n0, _n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, mut n1_inbound) = certs.bind("n1", Limits::default());

    n0.connect_ahead(n1.local_addr(), id("n1"));
    eventually("n0 connects ahead", || n0.connected_peers() == 1).await;
    n0.send_datagram(n1.local_addr(), &id("n1"), Bytes::from("probe"))
        .expect("sent");
    match next(&mut n1_inbound).await {
        Inbound::Datagram { from, payload, .. } => {
            assert_eq!(from, id("n0"));
            assert_eq!(payload.as_ref(), b"probe");
        }
        other => panic!("expected a datagram, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_for_another_node_are_dropped() {
    let certs = Certs::new();
    let (n0, _n0_inbound) = certs.bind("n0", Limits::default());
    let (n1, mut n1_inbound) = certs.bind("n1", Limits::default());

    // n1 is not n2: the queued datagram is dropped and the connection closed.
    n0.send_datagram(n1.local_addr(), &id("n2"), Bytes::from("lost"))
        .expect("queued");
    eventually("the datagram is dropped", || {
        n0.stats().dropped_datagrams == 1
    })
    .await;
    assert_eq!(n0.connected_peers(), 0);
    assert!(n1_inbound.try_recv().is_err());
}
