//! Frame limits: refused locally when sending, refused before allocating when receiving.

use bytes::Bytes;
use transport::{Endpoint, Inbound, Limits, RequestError, RespondError};

use crate::common::{Certs, PATIENCE, eventually, frame, next, raw_client_connection, raw_request};

fn small() -> Limits {
    Limits {
        max_frame_bytes: 1024,
        ..Limits::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_fails_locally() {
    let certs = Certs::new();
    let n0 = certs.echo("n0", small());
    let (n1, _inbound) = certs.bind("n1", small());

    let error = n1
        .request(
            n0.local_addr(),
            None,
            Bytes::from(vec![7u8; 1025]),
            PATIENCE,
        )
        .await
        .expect_err("too large");
    assert!(
        matches!(
            error,
            RequestError::FrameTooLarge {
                len: 1025,
                max: 1024
            }
        ),
        "{error}"
    );
    assert_eq!(n1.connected_peers(), 0, "nothing was sent");
    let response = n1
        .request(
            n0.local_addr(),
            None,
            Bytes::from(vec![7u8; 1021]),
            PATIENCE,
        )
        .await
        .expect("at the limit");
    assert_eq!(response.len(), 1024, "n1: and the body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_announced_frame_is_refused_and_the_server_goes_on() {
    let certs = Certs::new();
    let n0 = certs.echo("n0", Limits::default());
    let conn = raw_client_connection(certs.path(), n0.local_addr()).await;

    // 4 GiB announced: refused from the header alone.
    let error = raw_request(&conn, &u32::MAX.to_le_bytes())
        .await
        .expect_err("refused");
    assert!(error.contains("reset by peer: error 1"), "{error}");
    // Announced 10, sent 3, finished: cut short.
    let mut short = 10u32.to_le_bytes().to_vec();
    short.extend_from_slice(b"abc");
    let error = raw_request(&conn, &short).await.expect_err("refused");
    assert!(error.contains("reset by peer: error 3"), "{error}");

    // Same connection, next request: served.
    let response = raw_request(&conn, &frame(b"hi")).await.expect("served");
    assert_eq!(response, frame(b"client:hi"));
    eventually("server counts the refusals", || {
        n0.stats().refused_frames == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_response_is_refused_and_the_requester_told() {
    let certs = Certs::new();
    let (n0, mut inbound) = certs.bind("n0", small());
    let client = Endpoint::client(certs.client(), small()).expect("client");

    let to = n0.local_addr();
    let request =
        tokio::spawn(async move { client.request(to, None, Bytes::from("big"), PATIENCE).await });
    match next(&mut inbound).await {
        Inbound::Request { responder, .. } => {
            let error = responder
                .respond(Bytes::from(vec![0u8; 2000]))
                .expect_err("too large");
            assert!(
                matches!(
                    error,
                    RespondError::FrameTooLarge {
                        len: 2000,
                        max: 1024
                    }
                ),
                "{error}"
            );
        }
        other => panic!("expected a request, got {other:?}"),
    }
    let error = request.await.expect("task").expect_err("no response");
    assert!(matches!(error, RequestError::Stream { .. }), "{error}");
}
