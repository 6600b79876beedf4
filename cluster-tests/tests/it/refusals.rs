//! Joiners the cluster must refuse, leaving it unchanged: another CA, another shard count.

use std::time::Duration;

use crate::harness::{Cluster, Member, digest, members};

/// How long a refused joiner may take to give up.
const REFUSED_WITHIN: Duration = Duration::from_secs(15);

/// Every running node's members and digest.
fn snapshot(cluster: &Cluster) -> Vec<(Vec<Member>, String)> {
    cluster
        .running()
        .into_iter()
        .map(|index| {
            (
                members(&cluster.query(index, &["members"])).unwrap(),
                digest(&cluster.query(index, &["status"])).unwrap(),
            )
        })
        .collect()
}

/// A node whose certificate another CA signed cannot join: it exits non-zero naming the
/// handshake or certificate, and no member or digest changes.
#[test]
fn foreign_ca_is_refused() {
    let mut cluster = Cluster::launch("foreign-ca", 3);
    let before = snapshot(&cluster);

    let foreign = cluster.foreign_certs("foreign-certs", &["n3"]);
    let stranger = cluster.add_node("n3", Some(foreign), &[]);
    cluster.start_joining(stranger, 0);
    let status = cluster.wait_exit(stranger, REFUSED_WITHIN);
    assert!(
        !status.success(),
        "a node of another CA exited with {status}"
    );
    let log = cluster.log(stranger).to_lowercase();
    assert!(
        log.contains("handshake") || log.contains("certificate"),
        "the refused node does not say why (handshake, certificate): {log}"
    );

    assert_eq!(snapshot(&cluster), before, "the cluster changed");
}

/// A fresh node started with `--shards 512` cannot join a cluster of another shard count: it
/// exits 1 naming the shard count, and no member or digest changes.
#[test]
fn other_shard_count_is_refused() {
    let mut cluster = Cluster::launch("shards", 3);
    let before = snapshot(&cluster);

    let odd = cluster.add_node("n3", None, &["--shards", "512"]);
    cluster.start_joining(odd, 0);
    let status = cluster.wait_exit(odd, REFUSED_WITHIN);
    assert_eq!(
        status.code(),
        Some(1),
        "a 512-shard joiner exited with {status}"
    );
    let log = cluster.log(odd).to_lowercase();
    assert!(
        log.contains("shard") && log.contains("512"),
        "the refused node does not name the shard count: {log}"
    );

    assert_eq!(snapshot(&cluster), before, "the cluster changed");
}
