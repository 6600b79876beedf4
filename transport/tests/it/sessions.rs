//! Sessions: small requests share one long-lived stream per connection; long ones get their
//! own; a session's answers find their callers in any order, and a bad record stops only that
//! session.

use std::time::Duration;

use bytes::Bytes;
use transport::{Endpoint, Inbound, Limits, RequestError};

use crate::common::{Certs, PATIENCE, eventually, frame, next, raw_client_connection, raw_request};

/// The marker a session stream starts with (`session.rs`), written by hand here.
const SESSION_MARKER: u32 = 0xFFFF_FFFE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_requests_each_get_their_own_answer() {
    let certs = Certs::new();
    let n0 = certs.echo("n0", Limits::default());
    let client = Endpoint::client(certs.client(), Limits::default()).expect("client");
    let to = n0.local_addr();

    let mut calls = tokio::task::JoinSet::new();
    for i in 0..500u32 {
        let client = client.clone();
        calls.spawn(async move {
            let body = Bytes::from(format!("request {i}"));
            let answer = client.request(to, None, body, PATIENCE).await;
            (i, answer)
        });
    }
    while let Some(joined) = calls.join_next().await {
        let (i, answer) = joined.expect("task");
        assert_eq!(
            answer.expect("answered").as_ref(),
            format!("client:request {i}").as_bytes()
        );
    }
    assert_eq!(
        client.connected_peers(),
        1,
        "one connection carried them all"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_given_out_of_order_reach_the_right_callers() {
    let certs = Certs::new();
    let (n0, mut inbound) = certs.bind("n0", Limits::default());
    let client = Endpoint::client(certs.client(), Limits::default()).expect("client");
    let to = n0.local_addr();

    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.request(to, None, Bytes::from("a"), PATIENCE).await })
    };
    let (a_body, a) = match next(&mut inbound).await {
        Inbound::Request {
            body, responder, ..
        } => (body, responder),
        other => panic!("expected a request, got {other:?}"),
    };
    let second = {
        let client = client.clone();
        tokio::spawn(async move { client.request(to, None, Bytes::from("b"), PATIENCE).await })
    };
    let (b_body, b) = match next(&mut inbound).await {
        Inbound::Request {
            body, responder, ..
        } => (body, responder),
        other => panic!("expected a request, got {other:?}"),
    };
    assert_eq!((a_body.as_ref(), b_body.as_ref()), (&b"a"[..], &b"b"[..]));
    b.respond(Bytes::from("for b")).expect("respond b");
    let answer = second.await.expect("task").expect("b answered");
    assert_eq!(answer.as_ref(), b"for b", "b did not wait for a");
    a.respond(Bytes::from("for a")).expect("respond a");
    let answer = first.await.expect("task").expect("a answered");
    assert_eq!(answer.as_ref(), b"for a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gave_up_leaves_the_session_working() {
    let certs = Certs::new();
    let (n0, mut inbound) = certs.bind("n0", Limits::default());
    let client = Endpoint::client(certs.client(), Limits::default()).expect("client");
    let to = n0.local_addr();

    let error = client
        .request(to, None, Bytes::from("slow"), Duration::from_millis(200))
        .await
        .expect_err("nobody answered in time");
    assert!(matches!(error, RequestError::Timeout { .. }), "{error}");
    // Answered late: the answer has no caller any more and is dropped.
    let late = match next(&mut inbound).await {
        Inbound::Request { responder, .. } => responder,
        other => panic!("expected a request, got {other:?}"),
    };
    late.respond(Bytes::from("too late")).expect("respond");

    let next_call = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .request(to, None, Bytes::from("next"), PATIENCE)
                .await
        })
    };
    match next(&mut inbound).await {
        Inbound::Request {
            body, responder, ..
        } => {
            assert_eq!(body.as_ref(), b"next");
            responder.respond(Bytes::from("on time")).expect("respond");
        }
        other => panic!("expected a request, got {other:?}"),
    }
    let answer = next_call.await.expect("task").expect("answered");
    assert_eq!(answer.as_ref(), b"on time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_request_gets_a_stream_of_its_own() {
    let certs = Certs::new();
    let n0 = certs.echo("n0", Limits::default());
    let client = Endpoint::client(certs.client(), Limits::default()).expect("client");
    let to = n0.local_addr();

    let long = Bytes::from(vec![b'x'; 1024 * 1024]);
    let (long_answer, short_answer) = tokio::join!(
        client.request(to, None, long, PATIENCE),
        client.request(to, None, Bytes::from("short"), PATIENCE),
    );
    let long_answer = long_answer.expect("long answered");
    assert_eq!(long_answer.len(), "client:".len() + 1024 * 1024);
    assert_eq!(
        short_answer.expect("short answered").as_ref(),
        b"client:short"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_record_too_long_stops_that_session_only() {
    let certs = Certs::new();
    let n0 = certs.echo(
        "n0",
        Limits {
            max_frame_bytes: 1024,
            ..Limits::default()
        },
    );
    let conn = raw_client_connection(certs.path(), n0.local_addr()).await;

    // A session whose first record is served, and whose second announces 4 GiB.
    let (mut send, mut recv) = conn.open_bi().await.expect("open");
    let mut bytes = SESSION_MARKER.to_le_bytes().to_vec();
    bytes.extend_from_slice(&2u32.to_le_bytes());
    bytes.extend_from_slice(&7u64.to_le_bytes());
    bytes.extend_from_slice(b"hi");
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    bytes.extend_from_slice(&8u64.to_le_bytes());
    send.write_all(&bytes).await.expect("write");
    let answers = recv
        .read_to_end(1 << 16)
        .await
        .expect("answers, then the end");
    let mut expected = 9u32.to_le_bytes().to_vec();
    expected.extend_from_slice(&7u64.to_le_bytes());
    expected.push(0); // a response
    expected.extend_from_slice(b"client:hi");
    assert_eq!(
        answers, expected,
        "the first record answered, then the session ended"
    );
    eventually("the refusal is counted", || n0.stats().refused_frames == 1).await;

    // Same connection, a single request: served.
    let response = raw_request(&conn, &frame(b"again")).await.expect("served");
    assert_eq!(response, frame(b"client:again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_server_restart_the_next_request_gets_a_new_connection_and_session() {
    let certs = Certs::new();
    let (n0, mut inbound) = certs.bind("n0", Limits::default());
    let client = Endpoint::client(certs.client(), Limits::default()).expect("client");
    let to = n0.local_addr();

    // The server goes away and comes back on the same address: the session (and the
    // connection) of the first request is gone.
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.request(to, None, Bytes::from("one"), PATIENCE).await })
    };
    match next(&mut inbound).await {
        Inbound::Request { responder, .. } => responder.respond(Bytes::from("1")).expect("respond"),
        other => panic!("expected a request, got {other:?}"),
    }
    assert_eq!(first.await.expect("task").expect("answered").as_ref(), b"1");
    n0.close();
    n0.wait_idle().await;
    drop((n0, inbound));
    // The old socket is released once its driver task has ended: retry the bind until then.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let again = loop {
        match Endpoint::bind(to, certs.node("n0"), Limits::default()) {
            Ok((endpoint, inbound)) => {
                tokio::spawn(crate::common::echo(inbound));
                break endpoint;
            }
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never rebound: {error}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };

    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match client
            .request(again.local_addr(), None, Bytes::from("two"), PATIENCE)
            .await
        {
            Ok(answer) => {
                assert_eq!(answer.as_ref(), b"client:two");
                break;
            }
            Err(error) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "never served again: {error}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
