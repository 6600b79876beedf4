//! Who a certificate names: a node or the CLI client.

use std::fmt;

use topology::NodeId;

/// The DNS name in every node certificate's subject alternative names, and the TLS server
/// name every connection to a node asks for. The node's own name is the subject common name.
pub const NODE_SERVER_NAME: &str = "node.slotring";

/// The DNS name in the client certificate's subject alternative names (the CLI's identity).
pub const CLIENT_SERVER_NAME: &str = "client.slotring";

/// Who is on the other end of an authenticated connection, as its certificate says.
///
/// The certificate has already been verified against the cluster CA when this is known.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerIdentity {
    /// A node: the certificate carries [`NODE_SERVER_NAME`] and this name as common name.
    Node(NodeId),
    /// The command-line client: the certificate carries [`CLIENT_SERVER_NAME`].
    Client,
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerIdentity::Node(node) => write!(f, "node {node}"),
            PeerIdentity::Client => f.write_str("the client"),
        }
    }
}

/// Reads the identity out of a DER certificate. The error says why it names no one.
pub(crate) fn identity_of(der: &[u8]) -> Result<PeerIdentity, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|error| format!("unparsable certificate: {error}"))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|error| format!("bad subject alternative names: {error}"))?
        .ok_or_else(|| "certificate has no subject alternative names".to_owned())?;
    let dns_names: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some(*dns),
            _ => None,
        })
        .collect();
    if dns_names.contains(&NODE_SERVER_NAME) {
        let mut common_names = cert.subject().iter_common_name();
        let common_name = common_names
            .next()
            .ok_or_else(|| "node certificate has no common name".to_owned())?;
        if common_names.next().is_some() {
            return Err("node certificate has more than one common name".to_owned());
        }
        let name = common_name
            .as_str()
            .map_err(|error| format!("node certificate common name is not a string: {error}"))?;
        let node = NodeId::new(name)
            .map_err(|error| format!("node certificate common name is no node id: {error}"))?;
        Ok(PeerIdentity::Node(node))
    } else if dns_names.contains(&CLIENT_SERVER_NAME) {
        Ok(PeerIdentity::Client)
    } else {
        Err(format!(
            "certificate names neither {NODE_SERVER_NAME} nor {CLIENT_SERVER_NAME}"
        ))
    }
}
