//! The certificate files of a cluster, and loading them into TLS configurations.
//!
//! A certificates directory holds (see `docs/operator.md`):
//!
//! | file | written by | is |
//! |---|---|---|
//! | `ca.crt`, `ca.key` | [`init_cluster_ca`] | the cluster CA (CN `slotring cluster CA`) |
//! | `client.crt`, `client.key` | [`init_cluster_ca`] | the CLI's certificate (SAN `client.slotring`, client auth only) |
//! | `<node>.crt`, `<node>.key` | [`issue_node_cert`] | a node's certificate (CN = node id, SAN `node.slotring`, server and client auth) |
//!
//! Certificates are PEM, keys PEM PKCS#8 (ECDSA P-256), created with mode 0600 from the
//! start. Loading refuses a key that group or others may read.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use topology::NodeId;

use crate::error::PkiError;
use crate::identity::{CLIENT_SERVER_NAME, NODE_SERVER_NAME, PeerIdentity, identity_of};

/// The CA certificate's file name.
pub const CA_CERT_FILE: &str = "ca.crt";
/// The CA private key's file name.
pub const CA_KEY_FILE: &str = "ca.key";
/// The client certificate's file name.
pub const CLIENT_CERT_FILE: &str = "client.crt";
/// The client private key's file name.
pub const CLIENT_KEY_FILE: &str = "client.key";

/// The CA certificate's subject common name.
const CA_COMMON_NAME: &str = "slotring cluster CA";
/// The client certificate's subject common name.
const CLIENT_COMMON_NAME: &str = "slotring-client";
/// How many years certificates are valid, from the start of the current year.
const VALID_YEARS: i32 = 10;

/// Creates a cluster CA and the client certificate in `dir`: `ca.crt`, `ca.key`,
/// `client.crt`, `client.key`. Creates `dir` if it is missing.
///
/// Refuses, writing nothing, if any of the four files exists: a second CA would split the
/// cluster.
pub fn init_cluster_ca(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(|source| PkiError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let paths = [CA_CERT_FILE, CA_KEY_FILE, CLIENT_CERT_FILE, CLIENT_KEY_FILE].map(|f| dir.join(f));
    refuse_existing(&paths)?;

    let ca_key = KeyPair::generate()?;
    let ca_params = ca_params()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::from_params(&ca_params, &ca_key);

    let client_key = KeyPair::generate()?;
    let client_cert = leaf_params(
        CLIENT_COMMON_NAME,
        CLIENT_SERVER_NAME,
        &[ExtendedKeyUsagePurpose::ClientAuth],
    )?
    .signed_by(&client_key, &issuer)?;

    let [ca_crt, ca_key_path, client_crt, client_key_path] = paths;
    write_all_or_none(&[
        (ca_key_path, ca_key.serialize_pem(), FileKind::Key),
        (ca_crt, ca_cert.pem(), FileKind::Cert),
        (client_key_path, client_key.serialize_pem(), FileKind::Key),
        (client_crt, client_cert.pem(), FileKind::Cert),
    ])
}

/// Issues a certificate for `node`, signed by `ca.crt` / `ca.key` of `dir`, as
/// `<node>.crt` and `<node>.key` in `dir`.
///
/// Refuses, writing nothing, if either file exists, if the CA is missing, or if the node id
/// cannot be a file name (contains `/`, is `.` or `..`, or is `ca` or `client`).
pub fn issue_node_cert(dir: &Path, node: &NodeId) -> Result<(), PkiError> {
    check_file_name(node)?;
    let (cert_path, key_path) = node_paths(dir, node);
    refuse_existing(&[cert_path.clone(), key_path.clone()])?;

    let init = init_command(dir);
    let ca_pem = read_text(&dir.join(CA_CERT_FILE), &init)?;
    let ca_key_path = dir.join(CA_KEY_FILE);
    let ca_key_pem = read_text(
        &ca_key_path,
        &format!(
            "copy this cluster's {CA_KEY_FILE} there, or create a new cluster CA with: {init}"
        ),
    )?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|error| PkiError::BadFile {
        path: ca_key_path,
        what: "pem private key",
        reason: error.to_string(),
    })?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, &ca_key).map_err(|error| PkiError::BadFile {
        path: dir.join(CA_CERT_FILE),
        what: "pem ca certificate",
        reason: error.to_string(),
    })?;

    let node_key = KeyPair::generate()?;
    let node_cert = leaf_params(
        node.as_str(),
        NODE_SERVER_NAME,
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )?
    .signed_by(&node_key, &issuer)?;

    write_all_or_none(&[
        (key_path, node_key.serialize_pem(), FileKind::Key),
        (cert_path, node_cert.pem(), FileKind::Cert),
    ])
}

/// A node's TLS identity, loaded from a certificates directory: the cluster CA, the node's
/// certificate and key, made into the server and client configurations of an
/// [`Endpoint`](crate::Endpoint).
///
/// Both configurations speak only TLS 1.3 with ALPN [`ALPN`](crate::ALPN), trust only the
/// cluster CA, and use the `ring` crypto provider (never a process default). The server
/// requires a client certificate issued by the CA.
#[derive(Clone)]
pub struct NodeTls {
    node: NodeId,
    ca_fingerprint: [u8; 32],
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) client: Arc<ClientConfig>,
}

impl NodeTls {
    /// Loads `ca.crt`, `<node>.crt` and `<node>.key` from `certs_dir`.
    ///
    /// Refuses a key file that group or others may read, a certificate that names another
    /// node, and a certificate not issued by `ca.crt`. Missing files are reported with the
    /// command that creates them.
    pub fn load(certs_dir: &Path, node: &NodeId) -> Result<NodeTls, PkiError> {
        check_file_name(node)?;
        let (cert_path, key_path) = node_paths(certs_dir, node);
        let issue = format!(
            "create it with: node certs issue {node} --certs-dir {}",
            certs_dir.display()
        );
        let material = Material::load(certs_dir, &cert_path, &key_path, &issue)?;
        match identity_of(&material.cert) {
            Ok(PeerIdentity::Node(actual)) if actual == *node => {}
            Ok(PeerIdentity::Node(actual)) => {
                return Err(PkiError::WrongNode {
                    path: cert_path,
                    expected: node.clone(),
                    actual: format!("node {actual}"),
                });
            }
            Ok(PeerIdentity::Client) => {
                return Err(PkiError::WrongNode {
                    path: cert_path,
                    expected: node.clone(),
                    actual: "the client".to_owned(),
                });
            }
            Err(reason) => {
                return Err(PkiError::WrongNode {
                    path: cert_path,
                    expected: node.clone(),
                    actual: format!("no one ({reason})"),
                });
            }
        }
        let verifier = material.client_verifier()?;
        material.check_issued(&verifier, &cert_path)?;

        let tls_error = |error: rustls::Error| PkiError::Tls {
            cert: cert_path.clone(),
            key: key_path.clone(),
            reason: error.to_string(),
        };
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![material.cert.clone()], material.key.clone_key())
            .map_err(tls_error)?;
        server.alpn_protocols = vec![crate::ALPN.to_vec()];
        // Every connection is a full handshake, so every peer identity comes from a
        // certificate verified just now.
        server.send_tls13_tickets = 0;
        let client = material.client_config().map_err(tls_error)?;
        Ok(NodeTls {
            node: node.clone(),
            ca_fingerprint: material.ca_fingerprint(),
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }

    /// The node this identity belongs to.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// The blake3 hash of the CA certificate (DER): equal on every node of one cluster,
    /// different between clusters.
    pub fn ca_fingerprint(&self) -> [u8; 32] {
        self.ca_fingerprint
    }
}

impl fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTls")
            .field("node", &self.node)
            .field("ca_fingerprint", &Hex(&self.ca_fingerprint))
            .finish_non_exhaustive()
    }
}

/// The CLI's TLS identity: the cluster CA and `client.crt` / `client.key`, made into a
/// client configuration (TLS 1.3, ALPN [`ALPN`](crate::ALPN), trusting only the CA).
#[derive(Clone)]
pub struct ClientTls {
    ca_fingerprint: [u8; 32],
    pub(crate) client: Arc<ClientConfig>,
}

impl ClientTls {
    /// Loads `ca.crt`, `client.crt` and `client.key` from `certs_dir`.
    ///
    /// Refuses a key file that group or others may read and a certificate not issued by
    /// `ca.crt`. Missing files are reported with the command that creates them.
    pub fn load(certs_dir: &Path) -> Result<ClientTls, PkiError> {
        let cert_path = certs_dir.join(CLIENT_CERT_FILE);
        let key_path = certs_dir.join(CLIENT_KEY_FILE);
        let init = format!("create it with: {}", init_command(certs_dir));
        let material = Material::load(certs_dir, &cert_path, &key_path, &init)?;
        let verifier = material.client_verifier()?;
        material.check_issued(&verifier, &cert_path)?;
        let client = material.client_config().map_err(|error| PkiError::Tls {
            cert: cert_path.clone(),
            key: key_path.clone(),
            reason: error.to_string(),
        })?;
        Ok(ClientTls {
            ca_fingerprint: material.ca_fingerprint(),
            client: Arc::new(client),
        })
    }

    /// The blake3 hash of the CA certificate (DER), as [`NodeTls::ca_fingerprint`].
    pub fn ca_fingerprint(&self) -> [u8; 32] {
        self.ca_fingerprint
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_fingerprint", &Hex(&self.ca_fingerprint))
            .finish_non_exhaustive()
    }
}

/// The `ring` crypto provider, explicitly: never a process-wide default.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The files of one identity, read and parsed.
struct Material {
    ca_path: PathBuf,
    ca: CertificateDer<'static>,
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

impl Material {
    /// Reads `ca.crt` of `dir` and the certificate and key at the given paths; `fix` says
    /// how to create a missing certificate or key.
    fn load(dir: &Path, cert_path: &Path, key_path: &Path, fix: &str) -> Result<Self, PkiError> {
        let ca_path = dir.join(CA_CERT_FILE);
        let ca = read_cert(&ca_path, &format!("create it with: {}", init_command(dir)))?;
        let cert = read_cert(cert_path, fix)?;
        check_key_mode(key_path, fix)?;
        let key = PrivateKeyDer::from_pem_slice(&read_bytes(key_path, fix)?).map_err(|error| {
            PkiError::BadFile {
                path: key_path.to_owned(),
                what: "pem private key",
                reason: error.to_string(),
            }
        })?;
        Ok(Material {
            ca_path,
            ca,
            cert,
            key,
        })
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, PkiError> {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.ca.clone())
            .map_err(|error| PkiError::BadFile {
                path: self.ca_path.clone(),
                what: "ca certificate",
                reason: error.to_string(),
            })?;
        Ok(Arc::new(roots))
    }

    fn client_verifier(
        &self,
    ) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, PkiError> {
        WebPkiClientVerifier::builder_with_provider(self.roots()?, provider())
            .build()
            .map_err(|error| PkiError::BadFile {
                path: self.ca_path.clone(),
                what: "ca certificate",
                reason: error.to_string(),
            })
    }

    /// Checks that the certificate chains to the CA (and is valid for client auth now), so a
    /// mixed-up directory fails at load time, not at every handshake.
    fn check_issued(
        &self,
        verifier: &Arc<dyn rustls::server::danger::ClientCertVerifier>,
        cert_path: &Path,
    ) -> Result<(), PkiError> {
        verifier
            .verify_client_cert(&self.cert, &[], UnixTime::now())
            .map(|_| ())
            .map_err(|error| PkiError::NotIssuedByCa {
                path: cert_path.to_owned(),
                ca: self.ca_path.clone(),
                reason: error.to_string(),
            })
    }

    fn client_config(&self) -> Result<ClientConfig, rustls::Error> {
        let roots = self
            .roots()
            .map_err(|error| rustls::Error::General(error.to_string()))?;
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![self.cert.clone()], self.key.clone_key())?;
        client.alpn_protocols = vec![crate::ALPN.to_vec()];
        client.resumption = rustls::client::Resumption::disabled();
        Ok(client)
    }

    fn ca_fingerprint(&self) -> [u8; 32] {
        *blake3::hash(&self.ca).as_bytes()
    }
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_COMMON_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut params);
    Ok(params)
}

fn leaf_params(
    common_name: &str,
    dns_name: &str,
    usages: &[ExtendedKeyUsagePurpose],
) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(vec![dns_name.to_owned()])?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = usages.to_vec();
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params);
    Ok(params)
}

/// Valid from the start of last year (tolerates skewed clocks) for [`VALID_YEARS`] years.
fn set_validity(params: &mut CertificateParams) {
    let year = current_year();
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + VALID_YEARS, 1, 1);
}

/// The current UTC year, from the system clock (1970 if the clock is before it).
fn current_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    // Howard Hinnant's civil_from_days, year part only.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let year = year_of_era + era * 400 + i64::from(month_index >= 10);
    i32::try_from(year).unwrap_or(1970)
}

fn node_paths(dir: &Path, node: &NodeId) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{node}.crt")),
        dir.join(format!("{node}.key")),
    )
}

fn init_command(dir: &Path) -> String {
    format!("node certs init --certs-dir {}", dir.display())
}

fn check_file_name(node: &NodeId) -> Result<(), PkiError> {
    let name = node.as_str();
    let reason = if name.contains('/') || name.contains('\\') {
        "it contains a path separator"
    } else if name == "." || name == ".." {
        "it is a directory name"
    } else if name == "ca" || name == "client" {
        "its files would be the cluster ca's or the client's"
    } else {
        return Ok(());
    };
    Err(PkiError::UnusableNodeId {
        node: node.clone(),
        reason,
    })
}

fn refuse_existing(paths: &[PathBuf]) -> Result<(), PkiError> {
    for path in paths {
        match fs::symlink_metadata(path) {
            Ok(_) => return Err(PkiError::AlreadyExists { path: path.clone() }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(PkiError::Read {
                    path: path.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum FileKind {
    Cert,
    Key,
}

/// Writes every file with `create_new`; on the first failure removes the ones written.
fn write_all_or_none(files: &[(PathBuf, String, FileKind)]) -> Result<(), PkiError> {
    for (done, (path, contents, kind)) in files.iter().enumerate() {
        if let Err(error) = write_new(path, contents, *kind) {
            for (written, _, _) in &files[..done] {
                // Best effort: the error below is what matters to the operator.
                let _ = fs::remove_file(written);
            }
            return Err(error);
        }
    }
    Ok(())
}

fn write_new(path: &Path, contents: &str, kind: FileKind) -> Result<(), PkiError> {
    let mode = match kind {
        FileKind::Cert => 0o644,
        FileKind::Key => 0o600,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                PkiError::AlreadyExists {
                    path: path.to_owned(),
                }
            } else {
                PkiError::Write {
                    path: path.to_owned(),
                    source,
                }
            }
        })?;
    let written = file
        .write_all(contents.as_bytes())
        .and_then(|()| file.sync_all());
    if let Err(source) = written {
        // Best effort: a half-written file must not stay behind.
        let _ = fs::remove_file(path);
        return Err(PkiError::Write {
            path: path.to_owned(),
            source,
        });
    }
    Ok(())
}

/// A failed read of `path`: `Missing` (naming the command that creates it) or `Read`.
fn read_error(path: &Path, fix: &str, source: io::Error) -> PkiError {
    if source.kind() == io::ErrorKind::NotFound {
        PkiError::Missing {
            path: path.to_owned(),
            fix: fix.to_owned(),
        }
    } else {
        PkiError::Read {
            path: path.to_owned(),
            source,
        }
    }
}

fn read_bytes(path: &Path, fix: &str) -> Result<Vec<u8>, PkiError> {
    fs::read(path).map_err(|source| read_error(path, fix, source))
}

fn read_text(path: &Path, fix: &str) -> Result<String, PkiError> {
    String::from_utf8(read_bytes(path, fix)?).map_err(|_| PkiError::BadFile {
        path: path.to_owned(),
        what: "pem file",
        reason: "it is not utf-8 text".to_owned(),
    })
}

fn read_cert(path: &Path, fix: &str) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::from_pem_slice(&read_bytes(path, fix)?).map_err(|error| PkiError::BadFile {
        path: path.to_owned(),
        what: "pem certificate",
        reason: error.to_string(),
    })
}

fn check_key_mode(path: &Path, fix: &str) -> Result<(), PkiError> {
    let metadata = fs::metadata(path).map_err(|source| read_error(path, fix, source))?;
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(PkiError::KeyPermissions {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// Lowercase hex for `Debug`.
struct Hex<'a>(&'a [u8]);

impl fmt::Debug for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_year_is_plausible() {
        let year = current_year();
        assert!((2024..2200).contains(&year), "{year}");
    }
}
