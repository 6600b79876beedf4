//! The command-line client: certificates, and queries to a running node rendered as a table or
//! as versioned JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use cluster::Stats;
use cluster::wire::{
    self, CopyProgress, DigestRole, HeldView, MoveView, NodeRef, Request, Response, ShardInfoView,
    StatusView,
};
use serde_json::{Value, json};
use topology::NodeId;
use transport::{ClientTls, Endpoint, Limits};

use crate::{Output, QueryArgs};

/// Writes to stdout; a closed pipe (`node members | head -1`) is not an error.
pub(crate) fn emit(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

/// `println!` through [`emit`].
macro_rules! say {
    ($($arg:tt)*) => {
        emit(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `node certs init`.
pub(crate) fn certs_init(dir: &Path) -> Result<ExitCode> {
    transport::pki::init_cluster_ca(dir)?;
    say!(
        "wrote the cluster CA and the client certificate to {}",
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `node certs issue NODE_ID`.
pub(crate) fn certs_issue(dir: &Path, node_id: &str) -> Result<ExitCode> {
    let node = NodeId::new(node_id).context("node id")?;
    transport::pki::issue_node_cert(dir, &node)?;
    say!("wrote {0}/{node}.crt and {0}/{node}.key", dir.display());
    Ok(ExitCode::SUCCESS)
}

/// A client endpoint with the CLI's certificate.
pub(crate) fn client(query: &QueryArgs) -> Result<Endpoint> {
    let tls = ClientTls::load(&query.certs_dir)?;
    let endpoint = if query.addr.ip().is_loopback() {
        Endpoint::client(tls, Limits::default())?
    } else {
        let any: SocketAddr = if query.addr.is_ipv4() {
            (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        Endpoint::client_on(any, tls, Limits::default())?
    };
    Ok(endpoint)
}

/// `request` to the node at `addr`, within `--timeout`; a refusal is an error.
pub(crate) async fn ask(
    endpoint: &Endpoint,
    addr: SocketAddr,
    request: &Request,
    query: &QueryArgs,
) -> Result<Response> {
    ask_within(endpoint, addr, request, query.timeout()).await
}

/// [`ask`], within `timeout`.
async fn ask_within(
    endpoint: &Endpoint,
    addr: SocketAddr,
    request: &Request,
    timeout: std::time::Duration,
) -> Result<Response> {
    let body = Bytes::from(wire::encode(request));
    let answer = endpoint
        .request(addr, None, body, timeout)
        .await
        .with_context(|| format!("asking {addr}"))?;
    match wire::decode::<Response>(&answer).with_context(|| format!("decoding {addr}'s answer"))? {
        Response::Refused { reason } => bail!("{addr}: {reason}"),
        response => Ok(response),
    }
}

fn node_json(node: &Option<NodeRef>) -> Value {
    match node {
        Some(node) => json!({"id": node.id.as_str(), "addr": node.addr.map(|a| a.to_string())}),
        None => Value::Null,
    }
}

fn addr_text(node: &NodeRef) -> String {
    node.addr
        .map_or_else(|| "?".to_owned(), |addr| addr.to_string())
}

pub(crate) fn print_json(value: &Value) {
    say!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// Lays out rows with columns padded to the widest cell.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<width$}", width = widths[c]))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// `node shard-info SHARD`: the asked node's view, or, when it holds no replica of the shard
/// (`elsewhere`), the view of the first member of placement's target that holds one; the
/// answer names the node that gave it.
pub(crate) async fn shard_info(shard: u32, query: &QueryArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let (view, answered_by) = shard_info_from_a_holder(&endpoint, shard, query).await?;
    match query.output {
        Output::Json => print_json(&json!({
            "version": 1,
            "answered_by": answered_by.to_string(),
            "shard": view.shard,
            "epoch": view.epoch,
            "commit": view.commit,
            "state": view.state,
            "leader": node_json(&view.leader),
            "replicas": view.replicas.iter().map(|r| json!({
                "id": r.node.id.as_str(),
                "addr": r.node.addr.map(|a| a.to_string()),
                "role": r.role,
                "index": r.index,
                "lag": r.lag,
                "copied": copy_json(r.copied),
                "pausing_writes": r.pausing_writes,
            })).collect::<Vec<_>>(),
            "target": view.target,
            "joining": view.joining,
            "leaving": view.leaving,
            "digest": view.digest,
        })),
        Output::Table => {
            say!(
                "shard {}  state {}  epoch {}  commit {}  (answered by {answered_by}, table {})",
                view.shard,
                view.state,
                view.epoch.as_deref().unwrap_or("-"),
                view.commit
                    .map_or_else(|| "-".to_owned(), |c| c.to_string()),
                &view.digest[..16]
            );
            if view.state == "elsewhere" {
                say!(
                    "no member of the target holds a replica of shard {} yet",
                    view.shard
                );
            }
            let mut rows = vec![vec![
                "ROLE".to_owned(),
                "NODE".to_owned(),
                "ADDRESS".to_owned(),
                "INDEX".to_owned(),
                "LAG".to_owned(),
                "SNAPSHOT COPIED".to_owned(),
            ]];
            for replica in &view.replicas {
                let copied = replica.copied.map_or_else(
                    || "-".to_owned(),
                    |c| {
                        format!(
                            "{}/{} keys, {}/{} bytes",
                            c.keys, c.keys_total, c.bytes, c.bytes_total
                        )
                    },
                );
                rows.push(vec![
                    replica.role.clone(),
                    replica.node.id.to_string(),
                    addr_text(&replica.node),
                    or_dash(replica.index),
                    lag_text(replica.lag, replica.pausing_writes),
                    copied,
                ]);
            }
            emit(&table(&rows));
            say!("target: {}", view.target.join(" "));
            if !view.joining.is_empty() || !view.leaving.is_empty() {
                say!(
                    "moving to: {}; away from: {}",
                    names_or_dash(&view.joining),
                    names_or_dash(&view.leaving),
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Asks `query.addr` about `shard`; if it holds no replica, asks the target's members (their
/// addresses from its membership list) in order, and returns the first answer from a node
/// that holds one, else the first answer.
async fn shard_info_from_a_holder(
    endpoint: &Endpoint,
    shard: u32,
    query: &QueryArgs,
) -> Result<(ShardInfoView, SocketAddr)> {
    let request = Request::ShardInfo { shard };
    let Response::ShardInfo(first) = ask(endpoint, query.addr, &request, query).await? else {
        bail!("unexpected answer from {}", query.addr);
    };
    if first.state != "elsewhere" {
        return Ok((first, query.addr));
    }
    let Response::Members(members) = ask(endpoint, query.addr, &Request::Members, query).await?
    else {
        bail!("unexpected answer from {}", query.addr);
    };
    for id in &first.target {
        let Some(member) = members
            .members
            .iter()
            .find(|member| member.id.as_str() == id && member.addr != query.addr)
        else {
            continue;
        };
        // A member that does not answer is skipped: another may hold the shard.
        if let Ok(Response::ShardInfo(view)) = ask(endpoint, member.addr, &request, query).await
            && view.state != "elsewhere"
        {
            return Ok((view, member.addr));
        }
    }
    Ok((first, query.addr))
}

/// `node shard-for KEY`.
pub(crate) async fn shard_for(key: &str, query: &QueryArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let request = Request::ShardFor {
        key: key.as_bytes().to_vec(),
    };
    let Response::ShardFor(view) = ask(&endpoint, query.addr, &request, query).await? else {
        bail!("unexpected answer from {}", query.addr);
    };
    match query.output {
        Output::Json => print_json(&json!({
            "version": 1,
            "key": key,
            "shard": view.shard,
            "leader": node_json(&view.leader),
        })),
        Output::Table => match &view.leader {
            Some(leader) => say!(
                "key {key:?} -> shard {} (leader {} at {})",
                view.shard,
                leader.id,
                addr_text(leader)
            ),
            None => say!("key {key:?} -> shard {} (no leader)", view.shard),
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// `node members`.
pub(crate) async fn members(query: &QueryArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let Response::Members(view) = ask(&endpoint, query.addr, &Request::Members, query).await?
    else {
        bail!("unexpected answer from {}", query.addr);
    };
    match query.output {
        Output::Json => print_json(&json!({
            "version": 1,
            "node": view.node.as_str(),
            "members": view.members.iter().map(|m| json!({
                "id": m.id.as_str(),
                "addr": m.addr.to_string(),
                "state": m.state,
                "generation": m.generation,
                "incarnation": m.incarnation,
                "draining": m.draining,
            })).collect::<Vec<_>>(),
        })),
        Output::Table => {
            let mut rows = vec![
                ["ID", "ADDRESS", "STATE", "GENERATION"]
                    .map(str::to_owned)
                    .to_vec(),
            ];
            for m in &view.members {
                rows.push(vec![
                    m.id.to_string(),
                    m.addr.to_string(),
                    if m.draining && m.state != "left" {
                        format!("{} (draining)", m.state)
                    } else {
                        m.state.clone()
                    },
                    m.generation.to_string(),
                ]);
            }
            emit(&table(&rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The input a node dropped (`node status`'s `dropped`): peers' bytes that did not decode, came
/// from another identity or spec, or were malformed replication messages.
fn dropped_json(stats: &Stats) -> Value {
    json!({
        "bad_datagrams": stats.bad_datagrams,
        "identity_mismatches": stats.identity_mismatches,
        "foreign_spec": stats.foreign_spec,
        "turn_undead": stats.turn_undead_dropped,
        "unknown_shard_messages": stats.unknown_shard_messages,
        "malformed_replication_messages": stats.malformed_replication_messages,
    })
}

/// All of a node's dropped input, for the table's `DROPPED` column. The counts come from a
/// node's answer, so the sum saturates rather than overflow.
fn dropped_total(stats: &Stats) -> u64 {
    [
        stats.bad_datagrams,
        stats.identity_mismatches,
        stats.foreign_spec,
        stats.turn_undead_dropped,
        stats.unknown_shard_messages,
        stats.malformed_replication_messages,
    ]
    .into_iter()
    .fold(0, u64::saturating_add)
}

fn status_json(view: &StatusView, everywhere: &Everywhere) -> Value {
    json!({
        "version": 1,
        "node": view.node.as_str(),
        "digest": view.digest,
        "cluster": view.spec.cluster_name,
        "shards": view.spec.table.shards.get(),
        "replication_factor": view.spec.table.replication_factor.get(),
        "vnodes": view.spec.vnodes.get(),
        "placement": view.spec.table.placement.to_string(),
        "nodes": view.nodes.iter().map(|n| json!({
            "id": n.member.id.as_str(),
            "addr": n.member.addr.to_string(),
            "state": n.member.state,
            "generation": n.member.generation,
            "leads": n.leads,
            "replicates": n.replicates,
            "held": everywhere.held.get(n.member.id.as_str()).map(|h| json!({"shards": h.shards, "keys": h.keys, "retired": h.retired})),
            "dropped": everywhere.stats.get(n.member.id.as_str()).map(dropped_json),
        })).collect::<Vec<_>>(),
    })
}

/// What every live member reports about itself: the shards moving (each leader reports those
/// it leads; the asked node's answer `view` included), what each stores, and the members that
/// did not answer.
pub(crate) struct Everywhere {
    pub(crate) moves: Vec<MoveView>,
    pub(crate) held: BTreeMap<String, HeldView>,
    pub(crate) stats: BTreeMap<String, Stats>,
    pub(crate) silent: Vec<String>,
}

/// Asks every live member of `view` for its status, all at once.
pub(crate) async fn status_everywhere(
    endpoint: &Endpoint,
    view: &StatusView,
    query: &QueryArgs,
) -> Everywhere {
    let mut everywhere = Everywhere {
        moves: view.moving.clone(),
        held: BTreeMap::from([(view.node.to_string(), view.held)]),
        stats: BTreeMap::from([(view.node.to_string(), view.stats)]),
        silent: Vec::new(),
    };
    // All at once: a member that does not answer costs one `--timeout`, not one each.
    let mut asks = tokio::task::JoinSet::new();
    for node in &view.nodes {
        let live = node.member.state == "alive" || node.member.state == "suspect";
        if !live || node.member.id == view.node {
            continue;
        }
        let (endpoint, addr, timeout) = (endpoint.clone(), node.member.addr, query.timeout());
        let id = node.member.id.to_string();
        asks.spawn(async move {
            let answer = ask_within(&endpoint, addr, &Request::Status, timeout).await;
            (id, answer)
        });
    }
    while let Some(joined) = asks.join_next().await {
        let Ok((id, answer)) = joined else {
            continue; // A task cannot panic here; nothing to report if it did.
        };
        match answer {
            Ok(Response::Status(theirs)) => {
                everywhere.moves.extend(theirs.moving);
                everywhere.held.insert(id.clone(), theirs.held);
                everywhere.stats.insert(id, theirs.stats);
            }
            _ => everywhere.silent.push(id),
        }
    }
    everywhere.silent.sort();
    everywhere.moves.sort_by_key(|moving| moving.shard);
    everywhere
}

pub(crate) fn move_json(moving: &MoveView) -> Value {
    json!({
        "shard": moving.shard,
        "leader": moving.leader.as_str(),
        "joining": moving.joining,
        "leaving": moving.leaving,
        "lag": moving.lag,
        "copied": copy_json(moving.copied),
        "writes_paused": moving.writes_paused,
        "handoff_to": moving.handoff_to,
    })
}

fn copy_json(copied: Option<CopyProgress>) -> Value {
    match copied {
        Some(c) => json!({
            "keys": c.keys,
            "keys_total": c.keys_total,
            "bytes": c.bytes,
            "bytes_total": c.bytes_total,
        }),
        None => Value::Null,
    }
}

/// A value, or `-` for none.
fn or_dash(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

/// Node ids separated by spaces, or `-` for none.
fn names_or_dash(names: &[String]) -> String {
    if names.is_empty() {
        "-".to_owned()
    } else {
        names.join(" ")
    }
}

/// `node status`.
pub(crate) async fn status(query: &QueryArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let Response::Status(view) = ask(&endpoint, query.addr, &Request::Status, query).await? else {
        bail!("unexpected answer from {}", query.addr);
    };
    let everywhere = status_everywhere(&endpoint, &view, query).await;
    match query.output {
        Output::Json => {
            let mut json = status_json(&view, &everywhere);
            json["moving"] = everywhere.moves.iter().map(move_json).collect();
            json["moving_unknown_from"] = json!(everywhere.silent);
            print_json(&json);
        }
        Output::Table => {
            say!("{}", view.spec);
            say!("table {} as seen by {}", view.digest, view.node);
            let mut rows = vec![
                [
                    "ID", "ADDRESS", "STATE", "GEN", "LEADS", "REPLICAS", "HELD", "KEYS",
                    "RETIRED", "DROPPED",
                ]
                .map(str::to_owned)
                .to_vec(),
            ];
            for n in &view.nodes {
                let stored = everywhere.held.get(n.member.id.as_str());
                let stats = everywhere.stats.get(n.member.id.as_str());
                rows.push(vec![
                    n.member.id.to_string(),
                    n.member.addr.to_string(),
                    n.member.state.clone(),
                    n.member.generation.to_string(),
                    n.leads.to_string(),
                    n.replicates.to_string(),
                    or_dash(stored.map(|h| u64::from(h.shards))),
                    or_dash(stored.map(|h| h.keys)),
                    or_dash(stored.map(|h| u64::from(h.retired))),
                    or_dash(stats.map(dropped_total)),
                ]);
            }
            emit(&table(&rows));
            print_moves(&everywhere.moves, &everywhere.silent);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A lag cell: the entries a replica lacks, marked while its leader holds new writes for it
/// to catch up.
fn lag_text(lag: Option<u64>, writes_paused: bool) -> String {
    if writes_paused {
        format!("{} (writes paused)", or_dash(lag))
    } else {
        or_dash(lag)
    }
}

/// The table of moving shards, with totals.
pub(crate) fn print_moves(moves: &[MoveView], silent: &[String]) {
    if moves.is_empty() {
        say!("no shard is moving");
    } else {
        let mut rows = vec![
            [
                "SHARD",
                "LEADER",
                "TO",
                "FROM",
                "LAG",
                "SNAPSHOT COPIED",
                "NEXT LEADER",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for moving in moves {
            rows.push(vec![
                moving.shard.to_string(),
                moving.leader.to_string(),
                names_or_dash(&moving.joining),
                names_or_dash(&moving.leaving),
                lag_text(moving.lag, moving.writes_paused),
                moving.copied.map_or_else(
                    || "-".to_owned(),
                    |c| format!("{}/{} keys", c.keys, c.keys_total),
                ),
                moving.handoff_to.clone().unwrap_or_else(|| "-".to_owned()),
            ]);
        }
        say!("{} shards moving:", moves.len());
        emit(&table(&rows));
        let copied = CopyProgress::total(moves.iter().filter_map(|moving| moving.copied));
        say!(
            "snapshots under way: {}/{} keys, {}/{} bytes copied",
            copied.keys,
            copied.keys_total,
            copied.bytes,
            copied.bytes_total
        );
    }
    if !silent.is_empty() {
        say!("not answering (their moves unknown): {}", silent.join(" "));
    }
}

/// `node ring`.
pub(crate) async fn ring(query: &QueryArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let Response::Ring(view) = ask(&endpoint, query.addr, &Request::Ring, query).await? else {
        bail!("unexpected answer from {}", query.addr);
    };
    match query.output {
        Output::Json => print_json(&json!({
            "version": 1,
            "vnodes": view.vnodes,
            "nodes": view.nodes.iter().map(|n| json!({
                "id": n.id.as_str(),
                "tokens": n.tokens,
                "ownership": n.ownership,
            })).collect::<Vec<_>>(),
        })),
        Output::Table => {
            let mut rows = vec![["ID", "TOKENS", "OWNS"].map(str::to_owned).to_vec()];
            for n in &view.nodes {
                rows.push(vec![
                    n.id.to_string(),
                    n.tokens.to_string(),
                    format!("{:.2}%", n.ownership),
                ]);
            }
            emit(&table(&rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `node check`: asks the given node for the membership, then every live member for its table
/// digest; every shard must be placed and every digest equal.
pub(crate) async fn check(query: &QueryArgs) -> Result<ExitCode> {
    let endpoint = client(query)?;
    let Response::Status(view) = ask(&endpoint, query.addr, &Request::Status, query).await? else {
        bail!("unexpected answer from {}", query.addr);
    };
    let mut checks: Vec<(bool, String)> = Vec::new();
    let live: Vec<_> = view
        .nodes
        .iter()
        .filter(|n| n.member.state == "alive" || n.member.state == "suspect")
        .collect();
    let shards = view.spec.table.shards.get();
    let rf = u32::from(view.spec.table.replication_factor.get())
        .min(u32::try_from(live.len()).unwrap_or(u32::MAX));
    checks.push((
        view.shards_under_replicated == 0,
        format!(
            "{} of {shards} shards are placed on {rf} nodes",
            shards - view.shards_under_replicated
        ),
    ));
    // Every live node is asked at once (a node's pages one after another): the answers take
    // as long as the slowest node, not the sum over the nodes.
    let mut asked = tokio::task::JoinSet::new();
    for (index, node) in live.iter().enumerate() {
        let (endpoint, addr, timeout) = (endpoint.clone(), node.member.addr, query.timeout());
        asked.spawn(async move {
            let status = ask_within(&endpoint, addr, &Request::Status, timeout).await;
            (index, status, node_digests(&endpoint, addr, timeout).await)
        });
    }
    let mut answers = Vec::with_capacity(live.len());
    while let Some(answer) = asked.join_next().await {
        answers.push(answer.context("a check task failed")?);
    }
    answers.sort_by_key(|(index, _, _)| *index);
    let mut agree = 0;
    let moving_check = moves_pending(answers.iter().flat_map(|(_, status, _)| match status {
        Ok(Response::Status(theirs)) => theirs.moving.as_slice(),
        _ => &[],
    }));
    for (node, (_, status, _)) in live.iter().zip(&answers) {
        match status {
            Ok(Response::Status(theirs)) if theirs.digest == view.digest => agree += 1,
            Ok(Response::Status(theirs)) => checks.push((
                false,
                format!(
                    "{} sees table {}, {} sees {}",
                    theirs.node,
                    &theirs.digest[..16],
                    view.node,
                    &view.digest[..16]
                ),
            )),
            Ok(_) => checks.push((false, format!("{} answered status oddly", node.member.id))),
            Err(error) => checks.push((
                false,
                format!("{} is unreachable: {error:#}", node.member.id),
            )),
        }
    }
    checks.push((
        agree == live.len(),
        format!(
            "{agree} of {} live nodes agree on table {}",
            live.len(),
            &view.digest[..16]
        ),
    ));
    // Replica checksums: replicas of a shard at the same applied index must hold the same state.
    let mut replicas: BTreeMap<u16, Vec<(String, u64, [u8; 16])>> = BTreeMap::new();
    // Per shard: whether a live node leads it with an established ballot, and whether a
    // leader reports its voters at placement's replica set.
    let mut led: BTreeMap<u16, bool> = BTreeMap::new();
    for (node, (_, _, digests)) in live.iter().zip(answers) {
        let (digests, failure) = digests;
        if let Some(failure) = failure {
            checks.push((false, format!("{} {failure}", node.member.id)));
        }
        for digest in digests {
            if let DigestRole::Leader { at_target } = digest.role {
                *led.entry(digest.shard).or_default() |= at_target;
            }
            replicas.entry(digest.shard).or_default().push((
                node.member.id.to_string(),
                digest.applied,
                digest.checksum,
            ));
        }
    }
    // What the replicas say, not what placement wants: a shard nobody leads yet (a new
    // cluster's first second, an election under way) or still moving is not covered.
    let in_range = |shard: &u16| u32::from(*shard) < shards;
    let leaders = led.keys().filter(|shard| in_range(shard)).count();
    checks.push((
        leaders == shards as usize,
        format!("{leaders} of {shards} shards have an elected leader"),
    ));
    let settled = led
        .iter()
        .filter(|(shard, at_target)| in_range(shard) && **at_target)
        .count();
    checks.push((
        settled == shards as usize,
        format!("{settled} of {shards} shards have their leader's voters at placement's target"),
    ));
    checks.push(moving_check);
    let (mut compared, mut mismatched) = (0, Vec::new());
    for (shard, copies) in &replicas {
        for (i, (a, applied_a, sum_a)) in copies.iter().enumerate() {
            for (b, applied_b, sum_b) in &copies[i + 1..] {
                if applied_a == applied_b {
                    compared += 1;
                    if sum_a != sum_b {
                        mismatched
                            .push(format!("shard {shard}: {a} and {b} differ at {applied_a}"));
                    }
                }
            }
        }
    }
    if mismatched.is_empty() {
        checks.push((
            true,
            format!(
                "{compared} replica pairs at equal applied index hold equal state ({} shards held)",
                replicas.len()
            ),
        ));
    } else {
        for message in mismatched {
            checks.push((false, message));
        }
    }
    let down: Vec<String> = view
        .nodes
        .iter()
        .filter(|n| n.member.state == "down")
        .map(|n| n.member.id.to_string())
        .collect();
    if !down.is_empty() {
        checks.push((false, format!("down: {}", down.join(", "))));
    }
    let ok = checks.iter().all(|(ok, _)| *ok);
    match query.output {
        Output::Json => print_json(&json!({
            "version": 1,
            "ok": ok,
            "checks": checks.iter().map(|(ok, message)| json!({"ok": ok, "message": message})).collect::<Vec<_>>(),
        })),
        Output::Table => {
            for (ok, message) in &checks {
                say!("[{}] {message}", if *ok { "OK" } else { "ERR" });
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `node check`'s line on moves, from the moves every live leader lists (`Status::moving`):
/// shards with members joining or leaving, and shards only waiting to pass leadership to
/// placement's leader. A cluster is settled only once both are 0: a handoff leaves its
/// shard without an elected leader for a moment.
fn moves_pending<'a>(moving: impl IntoIterator<Item = &'a MoveView>) -> (bool, String) {
    let (mut copying, mut handing_off) = (0usize, 0usize);
    for one in moving {
        if one.joining.is_empty() && one.leaving.is_empty() {
            handing_off += 1;
        } else {
            copying += 1;
        }
    }
    (
        copying == 0 && handing_off == 0,
        format!(
            "{copying} shards are moving and {handing_off} are passing leadership to \
             placement's leader"
        ),
    )
}

/// Every shard digest the node at `addr` reports, a page at a time, and what went wrong if
/// the paging stopped early ("gave no shard digests: ...", after which the digests already
/// received are still returned).
async fn node_digests(
    endpoint: &Endpoint,
    addr: SocketAddr,
    timeout: std::time::Duration,
) -> (Vec<wire::ShardDigest>, Option<String>) {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let request = Request::ShardDigests { after };
        match ask_within(endpoint, addr, &request, timeout).await {
            Ok(Response::ShardDigests { digests, next }) => {
                all.extend(digests);
                match next {
                    Some(next) if after.is_none_or(|after| next > after) => after = Some(next),
                    Some(_) => return (all, Some("paged its digests backwards".to_owned())),
                    None => return (all, None),
                }
            }
            Ok(_) => return (all, Some("answered digests oddly".to_owned())),
            Err(error) => return (all, Some(format!("gave no shard digests: {error:#}"))),
        }
    }
}

/// `node put|get|del KEY [VALUE]`: one operation through the client library, retried within
/// `--timeout` where that is safe.
pub(crate) async fn key_op(op: cluster::replica::ClientOp, query: &QueryArgs) -> Result<ExitCode> {
    use crate::client::KvClient;
    let endpoint = client(query)?;
    let deadline = std::time::Instant::now() + query.timeout();
    let key = match &op {
        cluster::replica::ClientOp::Put { key, .. }
        | cluster::replica::ClientOp::Get { key }
        | cluster::replica::ClientOp::Del { key } => String::from_utf8_lossy(key).into_owned(),
    };
    let read = matches!(op, cluster::replica::ClientOp::Get { .. });
    let attempt = query.timeout().min(std::time::Duration::from_secs(1));
    let kv = KvClient::new(endpoint, query.addr, attempt);
    let outcome = kv.execute(op, deadline).await;
    match (outcome, query.output) {
        (Ok(value), Output::Json) => {
            let mut answer = json!({"version": 1, "key": key, "ok": true});
            if read {
                answer["value"] = value.as_ref().map_or(Value::Null, |v| {
                    Value::String(String::from_utf8_lossy(v).into_owned())
                });
            }
            print_json(&answer);
            Ok(ExitCode::SUCCESS)
        }
        (Ok(value), Output::Table) => {
            if read {
                match value {
                    Some(value) => say!("{}", String::from_utf8_lossy(&value)),
                    None => say!("(nil)"),
                }
            } else {
                say!("OK");
            }
            Ok(ExitCode::SUCCESS)
        }
        (Err(error), Output::Json) => {
            print_json(&json!({"version": 1, "key": key, "ok": false, "error": error.to_string()}));
            Ok(ExitCode::FAILURE)
        }
        (Err(error), Output::Table) => {
            eprintln!("error: {error}");
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::NodeId;

    fn moving(shard: u16, joining: &[&str], handoff_to: Option<&str>) -> MoveView {
        MoveView {
            shard,
            leader: NodeId::new("n0").unwrap(),
            joining: joining.iter().map(|id| (*id).to_owned()).collect(),
            leaving: Vec::new(),
            lag: None,
            copied: None,
            writes_paused: false,
            handoff_to: handoff_to.map(str::to_owned),
        }
    }

    #[test]
    fn a_lag_is_marked_while_the_leader_pauses_writes_for_it() {
        assert_eq!(lag_text(Some(3), false), "3");
        assert_eq!(lag_text(None, false), "-");
        assert_eq!(lag_text(Some(3), true), "3 (writes paused)");
    }

    #[test]
    fn a_check_is_not_settled_while_a_leadership_is_still_to_pass() {
        let (ok, line) = moves_pending(&[]);
        assert!(ok, "{line}");
        let (ok, line) = moves_pending(&[moving(3, &[], Some("n2"))]);
        assert!(!ok, "a pending handoff must fail the check: {line}");
        assert_eq!(
            line,
            "0 shards are moving and 1 are passing leadership to placement's leader"
        );
        let (ok, line) = moves_pending(&[moving(3, &["n3"], Some("n3")), moving(4, &[], None)]);
        assert!(!ok, "{line}");
        assert!(line.starts_with("1 shards are moving and 1 are"), "{line}");
    }

    #[test]
    fn the_dropped_column_sums_a_nodes_counts_and_saturates() {
        let stats = Stats {
            bad_datagrams: 2,
            malformed_replication_messages: 3,
            stalls: 7, // a stall is not dropped input
            ..Stats::default()
        };
        assert_eq!(dropped_total(&stats), 5);
        let huge = Stats {
            bad_datagrams: u64::MAX,
            foreign_spec: 1,
            ..Stats::default()
        };
        assert_eq!(dropped_total(&huge), u64::MAX);
    }
}
