//! A shard's actual config (voters, learners, leader) as its replicas report it through
//! `shard-info`, and waiting until every shard's config is placement's target; shared by the
//! tests of [`crate::kv`] and [`crate::partition`].

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{Cluster, string_field, wait_until};

/// How long the replica sets may take to reach placement's targets (learners added, caught up
/// and promoted, old voters removed).
pub(crate) const CONFIGS_SETTLE_WITHIN: Duration = Duration::from_secs(60);
/// How often [`wait_configs_match_target`] starts a probe.
pub(crate) const SETTLE_PROBE_EVERY: Duration = Duration::from_millis(500);

/// A shard's actual config as one of its replicas sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// Its leader hint.
    pub(crate) leader: Option<String>,
    /// Voters (roles `leader` and `follower`), sorted.
    pub(crate) voters: Vec<String>,
    /// Learners, sorted.
    pub(crate) learners: Vec<String>,
    /// What placement wants, in placement order.
    pub(crate) target: Vec<String>,
}

/// `shard-info SHARD` asked of node `index`, parsed: its replica's view, or, if it holds no
/// replica of the shard, a target member's that does (the CLI follows).
pub(crate) fn config(cluster: &Cluster, index: usize, shard: u16) -> Result<Config, String> {
    parse_config(&cluster.try_query(index, &["shard-info", &shard.to_string()])?)
}

/// Node `index`'s own replica's view of `shard`; an error if it holds no replica.
pub(crate) fn own_config(cluster: &Cluster, index: usize, shard: u16) -> Result<Config, String> {
    let answer = cluster.try_query(index, &["shard-info", &shard.to_string()])?;
    let asked = cluster.node(index);
    if answer["answered_by"].as_str() != Some(asked.addr.to_string().as_str()) {
        return Err(format!(
            "{} holds no replica of shard {shard}: {answer}",
            asked.id
        ));
    }
    parse_config(&answer)
}

/// A `shard-info -o json` answer as a [`Config`].
fn parse_config(answer: &Value) -> Result<Config, String> {
    let leader = match &answer["leader"] {
        Value::Null => None,
        leader => Some(string_field(leader, "id")?),
    };
    let mut voters = Vec::new();
    let mut learners = Vec::new();
    for replica in answer["replicas"]
        .as_array()
        .ok_or_else(|| format!("no `replicas` in {answer}"))?
    {
        let id = string_field(replica, "id")?;
        match string_field(replica, "role")?.as_str() {
            "leader" | "follower" => voters.push(id),
            "learner" => learners.push(id),
            role => return Err(format!("unknown role {role} in {answer}")),
        }
    }
    voters.sort();
    learners.sort();
    let target = answer["target"]
        .as_array()
        .ok_or_else(|| format!("no `target` in {answer}"))?
        .iter()
        .map(|id| id.as_str().map(str::to_owned).ok_or(format!("{answer}")))
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Config {
        leader,
        voters,
        learners,
        target,
    })
}

/// Shard `shard`'s config, as its leader sees it, if each member of the target placement
/// wants (as node `asker` sees it) reports exactly that target as the voters, no learners and
/// the same target, and one of them reports itself as the leader; else what differs. (The
/// followers' leader hints are not compared: they lag a leader change.)
pub(crate) fn settled_config(
    cluster: &Cluster,
    asker: usize,
    shard: u16,
) -> Result<Config, String> {
    let target = config(cluster, asker, shard)?.target;
    let mut wanted = target.clone();
    wanted.sort();
    let mut leader = None;
    for id in &target {
        let here = own_config(cluster, cluster.index_of(id), shard)?;
        if here.voters != wanted || !here.learners.is_empty() || here.target != target {
            return Err(format!("shard {shard}: {id} reports {here:?}"));
        }
        if here.leader.as_ref() == Some(id) {
            leader = Some(here);
        }
    }
    leader.ok_or(format!(
        "shard {shard}: no member of {target:?} says it leads"
    ))
}

/// Waits until the config of every one of the cluster's `shards` shards is settled
/// ([`settled_config`], asked through the first running node) and returns them, by shard.
///
/// Each probe of a shard runs up to four CLI processes, which compete with the nodes for the
/// two cores; so a shard found settled is not asked again until all are, then all are checked
/// once more, and probes start at most every [`SETTLE_PROBE_EVERY`].
pub(crate) fn wait_configs_match_target(
    cluster: &Cluster,
    shards: u16,
    within: Duration,
) -> Vec<Config> {
    let asker = cluster.running()[0];
    let mut settled: BTreeMap<u16, Config> = BTreeMap::new();
    let mut last_probe: Option<Instant> = None;
    wait_until(within, "every shard's voters are its target", || {
        if let Some(last) = last_probe {
            thread::sleep(SETTLE_PROBE_EVERY.saturating_sub(last.elapsed()));
        }
        last_probe = Some(Instant::now());
        for shard in 0..shards {
            if let std::collections::btree_map::Entry::Vacant(entry) = settled.entry(shard) {
                entry.insert(settled_config(cluster, asker, shard)?);
            }
        }
        let mut configs = Vec::new();
        for shard in 0..shards {
            match settled_config(cluster, asker, shard) {
                Ok(config) => configs.push(config),
                Err(error) => {
                    settled.remove(&shard);
                    return Err(format!("again: {error}"));
                }
            }
        }
        Ok(configs)
    })
}

/// How many of `configs` name node `id` a voter.
pub(crate) fn voter_in(configs: &[Config], id: &str) -> usize {
    configs
        .iter()
        .filter(|config| config.voters.iter().any(|voter| voter == id))
        .count()
}

/// `shard-for KEY` from node `index`: the key's shard.
pub(crate) fn shard_of(cluster: &Cluster, index: usize, key: &str) -> u16 {
    let answer = cluster.query(index, &["shard-for", key]);
    answer["shard"]
        .as_u64()
        .and_then(|shard| u16::try_from(shard).ok())
        .unwrap_or_else(|| panic!("no shard in {answer}"))
}
