//! Certificates in temporary directories, endpoints on loopback, raw quinn peers.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quinn::crypto::rustls::QuicClientConfig;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tempfile::TempDir;
use tokio::sync::mpsc;
use topology::NodeId;
use transport::{Endpoint, Inbound, Limits, NodeTls, PeerIdentity, pki};

/// How long a test waits for something that should happen at once.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);

pub(crate) fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

pub(crate) fn id(name: &str) -> NodeId {
    NodeId::new(name).expect("valid node id")
}

/// A certificates directory with a CA, the client certificate and nodes n0, n1, n2.
pub(crate) struct Certs {
    pub(crate) dir: TempDir,
}

impl Certs {
    pub(crate) fn new() -> Certs {
        let dir = tempfile::Builder::new()
            .prefix("slotring-transport-")
            .tempdir()
            .expect("temp dir");
        pki::init_cluster_ca(dir.path()).expect("init ca");
        for node in ["n0", "n1", "n2"] {
            pki::issue_node_cert(dir.path(), &id(node)).expect("issue");
        }
        Certs { dir }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn node(&self, name: &str) -> NodeTls {
        NodeTls::load(self.path(), &id(name)).expect("load node tls")
    }

    pub(crate) fn client(&self) -> transport::ClientTls {
        transport::ClientTls::load(self.path()).expect("load client tls")
    }

    /// Binds node `name` on loopback with `limits`.
    pub(crate) fn bind(&self, name: &str, limits: Limits) -> (Endpoint, mpsc::Receiver<Inbound>) {
        Endpoint::bind(loopback(), self.node(name), limits).expect("bind")
    }

    /// Binds node `name` and answers every request with `"<from>:<body>"`; a body of
    /// `drop` is dropped unanswered.
    pub(crate) fn echo(&self, name: &str, limits: Limits) -> Endpoint {
        self.echo_at(name, limits, loopback())
    }

    /// [`echo`](Self::echo), listening on `addr`.
    pub(crate) fn echo_at(&self, name: &str, limits: Limits, addr: SocketAddr) -> Endpoint {
        let (endpoint, inbound) = Endpoint::bind(addr, self.node(name), limits).expect("bind");
        tokio::spawn(echo(inbound));
        endpoint
    }
}

/// Answers requests as [`Certs::echo`] says, ignores datagrams.
pub(crate) async fn echo(mut inbound: mpsc::Receiver<Inbound>) {
    while let Some(item) = inbound.recv().await {
        if let Inbound::Request {
            from,
            body,
            responder,
            ..
        } = item
        {
            if body.as_ref() == b"drop" {
                drop(responder);
                continue;
            }
            let who = match from {
                PeerIdentity::Node(node) => node.to_string(),
                PeerIdentity::Client => "client".to_owned(),
            };
            let mut answer = format!("{who}:").into_bytes();
            answer.extend_from_slice(&body);
            responder.respond(Bytes::from(answer)).expect("respond");
        }
    }
}

/// The next inbound item, or a panic after [`PATIENCE`].
pub(crate) async fn next(inbound: &mut mpsc::Receiver<Inbound>) -> Inbound {
    tokio::time::timeout(PATIENCE, inbound.recv())
        .await
        .expect("inbound item in time")
        .expect("inbound channel open")
}

/// A quinn client outside `transport`, to misbehave: chosen ALPN, optional client
/// certificate (`<name>.crt` / `<name>.key` of `identity_dir`), trusting `ca_dir`'s CA.
/// A raw quinn connection to a node with the cluster's own client certificate and ALPN:
/// everything right, so a test can then misbehave at the stream level.
pub(crate) async fn raw_client_connection(certs: &Path, node: SocketAddr) -> quinn::Connection {
    let raw = raw_client(certs, transport::ALPN, Some((certs, "client")));
    raw.connect(node, transport::NODE_SERVER_NAME)
        .expect("connect")
        .await
        .expect("handshake")
}

/// A raw quinn connection to a node presenting node `name`'s certificate.
pub(crate) async fn raw_node_connection(
    certs: &Path,
    name: &str,
    node: SocketAddr,
) -> quinn::Connection {
    let raw = raw_client(certs, transport::ALPN, Some((certs, name)));
    raw.connect(node, transport::NODE_SERVER_NAME)
        .expect("connect")
        .await
        .expect("handshake")
}

pub(crate) fn raw_client(
    ca_dir: &Path,
    alpn: &[u8],
    identity: Option<(&Path, &str)>,
) -> quinn::Endpoint {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca_dir.join("ca.crt")).expect("ca.crt"))
        .expect("root");
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("tls13")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((dir, name)) => {
            let cert = CertificateDer::from_pem_file(dir.join(format!("{name}.crt"))).expect("crt");
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).expect("key");
            builder
                .with_client_auth_cert(vec![cert], key)
                .expect("client auth")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let crypto = QuicClientConfig::try_from(Arc::new(config)).expect("quic config");
    let mut endpoint = quinn::Endpoint::client(loopback()).expect("raw client");
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    endpoint
}

/// Writes one raw frame on a new stream of `conn` and reads the raw response frame.
pub(crate) async fn raw_request(conn: &quinn::Connection, frame: &[u8]) -> Result<Vec<u8>, String> {
    let (mut send, mut recv) = conn.open_bi().await.map_err(|e| format!("open: {e}"))?;
    send.write_all(frame)
        .await
        .map_err(|e| format!("write: {e}"))?;
    send.finish().map_err(|e| format!("finish: {e}"))?;
    recv.read_to_end(1 << 20)
        .await
        .map_err(|e| format!("read: {e}"))
}

/// `body` with its `u32` little-endian length in front.
pub(crate) fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(body.len())
        .expect("short")
        .to_le_bytes()
        .to_vec();
    out.extend_from_slice(body);
    out
}

/// Polls `condition` until it holds or [`PATIENCE`] passes.
pub(crate) async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
