//! Measures how balanced placements are and how much they move on a join and a leave.
//!
//! ```text
//! cargo run --release -p shardtable --example placement -- \
//!     --nodes 10 --shards 1024 --rf 3 --vnodes 256 --placement ring,bounded --seeds 20 --json
//! ```
//!
//! A seed is a random set of node names (derived from the seed by hashing, so every run with
//! the same arguments prints the same figures). For each seed and placement it builds the table,
//! then the table after one new node joins and after one member leaves, and reports:
//!
//! - `leader_max_over_mean`, `membership_max_over_mean`: the busiest member's leaderships and
//!   memberships over the mean (1.0 is perfect balance);
//! - `join_leader_change_over_min`, `join_replica_change_over_min`: shards whose leader, and
//!   whose replica set, changed on the join, over the theoretical minimum `S/(N+1)` and
//!   `S·RF/(N+1)`;
//! - `leave_replica_change_over_min`: shards whose replica set changed on the leave, over
//!   `S·RF/N`;
//! - `moved_between_old_nodes_on_join`: shard copies that moved between two members that were
//!   both there before the join (the plain walk never does this).
//!
//! Figures are means over seeds; `_worst` fields are the largest value seen.

use std::process::ExitCode;

use clap::Parser;
use shardtable::{Epsilon, Placement, Placer, ReplicationFactor, ShardCount, TableSpec, diff};
use topology::{NodeId, TokenRing, VnodeCount};

/// Measures balance and movement of shard placements over random node sets.
#[derive(Debug, Parser)]
struct Args {
    /// Members before the join or leave.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    nodes: u32,
    /// Number of shards.
    #[arg(long, default_value = "1024")]
    shards: ShardCount,
    /// Replication factor.
    #[arg(long, default_value = "3")]
    rf: ReplicationFactor,
    /// Vnodes per member.
    #[arg(long, default_value = "256")]
    vnodes: VnodeCount,
    /// Placements to compare, comma separated: ring, bounded.
    #[arg(long, value_delimiter = ',', default_value = "ring,bounded")]
    placement: Vec<Placement>,
    /// ε of the bounded placement.
    #[arg(long, default_value = "0.1")]
    epsilon: Epsilon,
    /// Number of random node sets.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    seeds: u32,
    /// Print one JSON object per placement and line instead of a table.
    #[arg(long)]
    json: bool,
}

/// One seed's measurements of one placement.
#[derive(Debug, Clone, Copy)]
struct Sample {
    leader_max_over_mean: f64,
    membership_max_over_mean: f64,
    join_leader_change_over_min: f64,
    join_replica_change_over_min: f64,
    leave_replica_change_over_min: f64,
    moved_between_old_nodes_on_join: f64,
}

/// A reported measure: its JSON key and how to read it from a sample.
type Field = (&'static str, fn(&Sample) -> f64);

impl Sample {
    const FIELDS: [Field; 6] = [
        ("leader_max_over_mean", |s| s.leader_max_over_mean),
        ("membership_max_over_mean", |s| s.membership_max_over_mean),
        ("join_leader_change_over_min", |s| {
            s.join_leader_change_over_min
        }),
        ("join_replica_change_over_min", |s| {
            s.join_replica_change_over_min
        }),
        ("leave_replica_change_over_min", |s| {
            s.leave_replica_change_over_min
        }),
        ("moved_between_old_nodes_on_join", |s| {
            s.moved_between_old_nodes_on_join
        }),
    ];
}

fn main() -> ExitCode {
    let args = Args::parse();
    for &placement in &args.placement {
        let placement = match placement {
            Placement::Ring => Placement::Ring,
            Placement::Bounded { .. } => Placement::Bounded {
                epsilon: args.epsilon,
            },
        };
        let spec = TableSpec {
            shards: args.shards,
            replication_factor: args.rf,
            placement,
        };
        let placer = Placer::new(spec);
        let samples: Vec<Sample> = (0..args.seeds)
            .map(|seed| measure(&placer, &args, seed))
            .collect();
        report(&args, placement, &samples);
    }
    ExitCode::SUCCESS
}

/// Builds the tables of one random node set, with one node more and one less.
fn measure(placer: &Placer, args: &Args, seed: u32) -> Sample {
    let members: Vec<NodeId> = (0..args.nodes).map(|i| node_name(seed, i)).collect();
    let ring = TokenRing::from_members(args.vnodes, members.iter().cloned());
    let table = placer.place(&ring);

    let mut joined = ring.clone();
    joined.insert(node_name(seed, args.nodes));
    let after_join = placer.place(&joined);

    let mut left = ring.clone();
    let leaver = &members[pick(seed, members.len())];
    left.remove(leaver);
    let after_leave = placer.place(&left);

    let shards = f64::from(args.shards.get());
    let nodes = f64::from(args.nodes);
    let width = |members: u32| f64::from(u32::from(args.rf.get()).min(members));
    let join = diff(&table, &after_join).expect("same spec");
    let leave = diff(&table, &after_leave).expect("same spec");
    Sample {
        leader_max_over_mean: max_over_mean(&table.leader_counts(), shards / nodes),
        membership_max_over_mean: max_over_mean(
            &table.membership_counts(),
            shards * width(args.nodes) / nodes,
        ),
        join_leader_change_over_min: join.leaders_changed() as f64 / (shards / (nodes + 1.0)),
        join_replica_change_over_min: join.replica_sets_changed() as f64
            / (shards * width(args.nodes + 1) / (nodes + 1.0)),
        leave_replica_change_over_min: if args.nodes > 1 {
            leave.replica_sets_changed() as f64 / (shards * width(args.nodes) / nodes)
        } else {
            1.0
        },
        moved_between_old_nodes_on_join: join.copies_moved_between_old_members() as f64,
    }
}

fn max_over_mean(counts: &[u32], mean: f64) -> f64 {
    f64::from(counts.iter().copied().max().unwrap_or(0)) / mean
}

/// A random-looking but reproducible node name: `node-` and 8 hex digits of
/// `blake3("placement example" ‖ seed ‖ index)`.
fn node_name(seed: u32, index: u32) -> NodeId {
    let mut input = b"placement example".to_vec();
    input.extend_from_slice(&seed.to_le_bytes());
    input.extend_from_slice(&index.to_le_bytes());
    let hash = blake3::hash(&input);
    let hex: String = hash.as_bytes()[..4]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    NodeId::new(&format!("node-{hex}")).expect("valid name")
}

/// Which member leaves in seed `seed`.
fn pick(seed: u32, members: usize) -> usize {
    let hash = blake3::hash(&[b"leaver".as_slice(), &seed.to_le_bytes()].concat());
    (u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("8 bytes")) % members as u64)
        as usize
}

fn report(args: &Args, placement: Placement, samples: &[Sample]) {
    let mean =
        |field: fn(&Sample) -> f64| samples.iter().map(field).sum::<f64>() / samples.len() as f64;
    let worst = |field: fn(&Sample) -> f64| samples.iter().map(field).fold(f64::MIN, f64::max);
    let epsilon = placement.epsilon().map(Epsilon::as_f64);
    if args.json {
        let mut object = serde_json::Map::new();
        object.insert("placement".into(), placement.name().into());
        object.insert("nodes".into(), args.nodes.into());
        object.insert("shards".into(), args.shards.get().into());
        object.insert("rf".into(), args.rf.get().into());
        object.insert("vnodes".into(), args.vnodes.get().into());
        object.insert("epsilon".into(), epsilon.into());
        object.insert("seeds".into(), args.seeds.into());
        for (name, field) in Sample::FIELDS {
            object.insert(name.into(), rounded(mean(field)).into());
            object.insert(format!("{name}_worst"), rounded(worst(field)).into());
        }
        println!("{}", serde_json::Value::Object(object));
    } else {
        println!(
            "placement {} (ε = {}), {} nodes, {} shards, RF {}, {} vnodes, {} seeds",
            placement.name(),
            epsilon.map_or("-".into(), |e| e.to_string()),
            args.nodes,
            args.shards,
            args.rf,
            args.vnodes,
            args.seeds
        );
        println!("  {:<34} {:>8} {:>8}", "measure", "mean", "worst");
        for (name, field) in Sample::FIELDS {
            println!("  {name:<34} {:>8.3} {:>8.3}", mean(field), worst(field));
        }
        println!();
    }
}

/// Four decimals are plenty for ratios and keep the JSON readable.
fn rounded(value: f64) -> f64 {
    (value * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_names_the_same_nodes() {
        assert_eq!(node_name(3, 7), node_name(3, 7));
        assert_ne!(node_name(3, 7), node_name(4, 7));
    }
}
