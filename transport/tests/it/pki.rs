//! Certificate files: modes, refusals, and what loading checks.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use transport::{ClientTls, NodeTls, PkiError, pki};

use crate::common::{Certs, id};

fn mode(path: &std::path::Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

#[test]
fn keys_are_written_private_and_certificates_readable() {
    let certs = Certs::new();
    for key in ["ca.key", "client.key", "n0.key"] {
        assert_eq!(mode(&certs.path().join(key)), 0o600, "{key}");
    }
    for cert in ["ca.crt", "client.crt", "n0.crt"] {
        assert_eq!(mode(&certs.path().join(cert)) & 0o600, 0o600, "{cert}");
    }
}

#[test]
fn init_creates_the_directory_and_refuses_a_second_ca() {
    let certs = Certs::new();
    let nested = certs.path().join("a/b");
    pki::init_cluster_ca(&nested).expect("creates the directory");
    let before = fs::read(nested.join("ca.crt")).expect("ca.crt");
    let error = pki::init_cluster_ca(&nested).expect_err("second ca");
    assert!(matches!(error, PkiError::AlreadyExists { .. }), "{error}");
    assert_eq!(fs::read(nested.join("ca.crt")).expect("ca.crt"), before);
}

#[test]
fn issuing_twice_is_refused() {
    let certs = Certs::new();
    let error = pki::issue_node_cert(certs.path(), &id("n0")).expect_err("second issue");
    assert!(matches!(error, PkiError::AlreadyExists { .. }), "{error}");
    NodeTls::load(certs.path(), &id("n0")).expect("the first is intact");

    let error = pki::issue_node_cert(certs.path(), &id("a/b")).expect_err("path");
    assert!(matches!(error, PkiError::UnusableNodeId { .. }), "{error}");
    let error = pki::issue_node_cert(certs.path(), &id("ca")).expect_err("reserved");
    assert!(matches!(error, PkiError::UnusableNodeId { .. }), "{error}");
}

#[test]
fn issuing_without_a_ca_names_the_fix() {
    let certs = Certs::new();
    let empty = certs.path().join("empty");
    fs::create_dir(&empty).expect("dir");
    let error = pki::issue_node_cert(&empty, &id("n0")).expect_err("no ca");
    assert!(matches!(error, PkiError::Missing { .. }), "{error}");
    assert!(
        error.to_string().contains("node certs init --certs-dir"),
        "{error}"
    );
    assert!(!empty.join("n0.key").exists(), "nothing written");
}

#[test]
fn a_key_readable_by_others_is_refused() {
    let certs = Certs::new();
    let key = certs.path().join("n0.key");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("chmod");
    let error = NodeTls::load(certs.path(), &id("n0")).expect_err("refused");
    let message = error.to_string();
    assert!(
        matches!(error, PkiError::KeyPermissions { mode: 0o644, .. }),
        "{message}"
    );
    assert!(message.contains("(mode 0644)"), "{message}");
    assert!(
        message.contains(&format!("chmod 600 {}", key.display())),
        "{message}"
    );

    let client_key = certs.path().join("client.key");
    fs::set_permissions(&client_key, fs::Permissions::from_mode(0o640)).expect("chmod");
    let error = ClientTls::load(certs.path()).expect_err("refused");
    assert!(error.to_string().contains("chmod 600"), "{error}");
}

#[test]
fn missing_files_name_the_command_that_makes_them() {
    let certs = Certs::new();
    let error = NodeTls::load(certs.path(), &id("n5")).expect_err("missing");
    assert!(matches!(error, PkiError::Missing { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("n5.crt"), "{message}");
    assert!(
        message.contains(&format!(
            "node certs issue n5 --certs-dir {}",
            certs.path().display()
        )),
        "{message}"
    );
}

#[test]
fn a_certificate_of_another_node_is_refused() {
    let certs = Certs::new();
    fs::copy(certs.path().join("n0.crt"), certs.path().join("n9.crt")).expect("copy");
    fs::copy(certs.path().join("n0.key"), certs.path().join("n9.key")).expect("copy");
    let error = NodeTls::load(certs.path(), &id("n9")).expect_err("wrong node");
    assert!(matches!(error, PkiError::WrongNode { .. }), "{error}");
    assert!(error.to_string().contains("node n0"), "{error}");
}

#[test]
fn a_certificate_of_another_ca_is_refused() {
    let ours = Certs::new();
    let theirs = Certs::new();
    pki::issue_node_cert(theirs.path(), &id("n9")).expect("issue");
    fs::copy(theirs.path().join("n9.crt"), ours.path().join("n9.crt")).expect("copy");
    fs::copy(theirs.path().join("n9.key"), ours.path().join("n9.key")).expect("copy");
    let error = NodeTls::load(ours.path(), &id("n9")).expect_err("other ca");
    assert!(matches!(error, PkiError::NotIssuedByCa { .. }), "{error}");
}

#[test]
fn the_ca_fingerprint_tells_clusters_apart() {
    let ours = Certs::new();
    let theirs = Certs::new();
    let n0 = ours.node("n0");
    assert_eq!(n0.node(), &id("n0"));
    assert_eq!(n0.ca_fingerprint(), ours.node("n1").ca_fingerprint());
    assert_eq!(n0.ca_fingerprint(), ours.client().ca_fingerprint());
    assert_ne!(n0.ca_fingerprint(), theirs.node("n0").ca_fingerprint());
}
