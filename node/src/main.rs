//! `node`: the slotring daemon and its command-line client, in one binary.
//!
//! Without a subcommand it runs the daemon (`node --listen ADDR [--join ADDR,...]`); with one it
//! makes certificates (`certs`), asks a running node (`shard-info`, `members`, ...), loads it
//! (`bench`) or watches its writes (`probe`). See `docs/operator.md`.

mod bench;
mod cli;
mod client;
mod clock;
mod daemon;
mod datadir;
mod moves;
mod probe;
mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// mimalloc: the node allocates and frees many small buffers per request (messages, entries,
/// keys); glibc's malloc spent ~15% of a loaded node's CPU on them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The index of `mi_option_purge_delay` in mimalloc 3's C enum `mi_option_e` (the Rust
/// binding names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// mimalloc 3's default purge delay, by which [`MI_OPTION_PURGE_DELAY`] is recognised.
const MI_DEFAULT_PURGE_DELAY_MS: std::ffi::c_long = 1_000;
/// How long the daemon's freed memory stays with mimalloc before it goes back to the system:
/// jemalloc's default decay time.
const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// Makes mimalloc keep freed memory for [`PURGE_DELAY_MS`] instead of a second before giving
/// it back to the system. The write path's memory comes and goes in waves longer than a
/// second (a fold frees the batches it wrote, the logs grow until they are compacted): with
/// the default, a loaded node kept touching fresh pages, about one page fault per replicated
/// write on 3 nodes, 8% of an event loop's CPU zeroing pages in the kernel; with 10 s, 0.13,
/// and 7-20% less CPU per write (BENCHMARKS.md, issue 5, session 18). The cost: up to 10 s
/// more of memory held after a burst.
///
/// Changes nothing, and returns false, when the option does not hold mimalloc 3's default:
/// `MIMALLOC_PURGE_DELAY` set by the operator, or a mimalloc whose options are laid out
/// differently.
#[allow(unsafe_code)]
fn keep_freed_memory_longer() -> bool {
    // SAFETY: `mi_version`, `mi_option_get` and `mi_option_set` only read mimalloc's version and
    // read or write one entry of its option table, which any index below `_mi_option_last`
    // (47 in mimalloc 3) names; they are safe to call from any thread at any time.
    unsafe {
        if libmimalloc_sys::mi_version() / 10_000 != 3
            || libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) != MI_DEFAULT_PURGE_DELAY_MS
        {
            return false;
        }
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
    }
    true
}

/// Backs the daemon's memory with 4 KiB pages only: transparent huge pages off for this
/// process (`PR_SET_THP_DISABLE`; mimalloc asks for them with `MADV_HUGEPAGE`, which this
/// machine's kernel honours in its default `madvise` mode). A node keeps taking fresh memory
/// (batches, logs, snapshot chunks), and the kernel zeroed each fresh 2 MiB page in one go on
/// the thread that touched it: a third of a joining node's event loop and a sixth of its
/// storage threads. With small pages, on 3 nodes: write p99 8.4 ms instead of 11.1 ms at the
/// same ~18k writes/s, ×16 pipelined throughput unchanged, 20% less resident memory; during a
/// join (medians of six), idle p99 6.4 ms instead of 8.5 ms and during the join 22.2 ms instead
/// of 26.4 ms; the joiner's peak 232-247 MB instead of 252-268 MB
/// (BENCHMARKS.md, issues 5 and 6, sessions 38-39).
///
/// Returns whether huge pages are off afterwards (false on a kernel without the call, which
/// then runs the node as before).
fn use_small_pages() -> bool {
    rustix::thread::disable_transparent_huge_pages(true).is_ok()
        && rustix::thread::transparent_huge_pages_are_disabled().unwrap_or(false)
}

/// The slotring node: run the daemon, or ask a running one.
#[derive(Debug, Parser)]
#[command(name = "node", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    daemon: DaemonArgs,
}

/// The daemon's flags.
#[derive(Debug, Args)]
pub(crate) struct DaemonArgs {
    /// The UDP address to listen on for QUIC (peers and clients).
    #[arg(long, env = "SLOTRING_LISTEN")]
    pub(crate) listen: Option<SocketAddr>,
    /// Seeds to join through, comma separated; without it this node bootstraps a new cluster
    /// (or restarts alone from its data dir).
    #[arg(long, env = "SLOTRING_JOIN", value_delimiter = ',')]
    pub(crate) join: Vec<SocketAddr>,
    /// This node's id; defaults to the one stored in the data dir.
    #[arg(long, env = "SLOTRING_NODE_ID")]
    pub(crate) node_id: Option<String>,
    /// Where the node keeps its id, generation, cluster spec and lock.
    #[arg(long, env = "SLOTRING_DATA_DIR", default_value = "./data")]
    pub(crate) data_dir: PathBuf,
    /// Where the cluster CA and this node's certificate live.
    #[arg(long, env = "SLOTRING_CERTS_DIR", default_value = "./certs")]
    pub(crate) certs_dir: PathBuf,
    /// Bootstrap only: the cluster's name.
    #[arg(long, env = "SLOTRING_CLUSTER_NAME")]
    pub(crate) cluster_name: Option<String>,
    /// Bootstrap only (default 1024): how many shards the key space is cut into, forever.
    #[arg(long, env = "SLOTRING_SHARDS")]
    pub(crate) shards: Option<u32>,
    /// Bootstrap only (default 3): copies of each shard.
    #[arg(long, env = "SLOTRING_REPLICATION_FACTOR")]
    pub(crate) replication_factor: Option<u8>,
    /// Bootstrap only (default 256): vnodes per member on the ring.
    #[arg(long, env = "SLOTRING_VNODES")]
    pub(crate) vnodes: Option<u32>,
    /// Bootstrap only (default bounded): `bounded` (balanced) or `ring` (plain walk).
    #[arg(long, env = "SLOTRING_PLACEMENT")]
    pub(crate) placement: Option<shardtable::Placement>,
    /// How long to keep trying the seeds before giving up, in seconds.
    #[arg(long, env = "SLOTRING_JOIN_TIMEOUT", default_value_t = 30)]
    pub(crate) join_timeout: u64,
    /// The most shards this node's leaders move at once (a join or leave queues the rest), so
    /// that foreground latency holds during moves.
    #[arg(long, env = "SLOTRING_MAX_MOVES", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) max_moves: u32,
    /// The most MiB of snapshot data per second this node's leaders send for moves, all
    /// together; 0 (the default) is no limit.
    #[arg(long, env = "SLOTRING_MAX_MOVE_RATE", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    pub(crate) max_move_rate: u32,
    /// Answer reads under leases (PROTOCOL.md R9) instead of a heartbeat round each: a GET
    /// costs no network round, but is linearizable only while the nodes' clocks run at rates
    /// within 1% of each other; failover waits for the dead leader's lease (t_elect) too.
    #[arg(long, env = "SLOTRING_DANGER_LEASE_READS")]
    pub(crate) danger_lease_reads: bool,
    /// How many seconds a copy of a shard this node no longer holds (after a move) stays on
    /// its disk before it is deleted; 0 deletes it at once.
    #[arg(long, env = "SLOTRING_RETIRED_GRACE", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    pub(crate) retired_grace: u64,
    /// The MiB of database pages the shard store keeps in memory (redb's page cache). Reads
    /// are served from each shard's in-memory map, so the cache serves only the store's own
    /// writes and snapshot reads: a small one is enough, and a large one grows towards a
    /// second copy of the data.
    #[arg(long, env = "SLOTRING_STORE_CACHE", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) store_cache: u32,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Make the cluster CA or a node certificate.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Where a shard lives: leader, replicas, target.
    ShardInfo {
        /// The shard id.
        shard: u32,
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Which shard a key maps to, and its leader.
    ShardFor {
        /// The key (UTF-8 as typed).
        key: String,
        #[command(flatten)]
        query: QueryArgs,
    },
    /// The membership list as the node sees it.
    Members {
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Each node with the shards it leads and replicates.
    Status {
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Each node's share of the token ring.
    Ring {
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Checks every shard is placed and every node agrees on the table; exit 1 if not.
    Check {
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Writes KEY := VALUE (acknowledged once a majority of the shard's replicas hold it).
    Put {
        /// The key (UTF-8 as typed, at most 1 KiB).
        key: String,
        /// The value (UTF-8 as typed, at most 1 MiB).
        value: String,
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Reads KEY (linearizable: from the shard's leader after a heartbeat round).
    Get {
        /// The key.
        key: String,
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Deletes KEY.
    Del {
        /// The key.
        key: String,
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Decommissions the node: every replica it holds moves to the other members, then it
    /// leaves the cluster and exits 0 (refused while the others would be fewer than the
    /// replication factor).
    Leave {
        #[command(flatten)]
        query: QueryArgs,
        #[command(flatten)]
        wait: moves::WaitArgs,
    },
    /// The shards moving to their placement target (after a join, leave or failure they move
    /// by themselves); with --wait, follows them until none is left.
    Rebalance {
        #[command(flatten)]
        query: QueryArgs,
        #[command(flatten)]
        wait: moves::WaitArgs,
    },
    /// Load generator: many concurrent put/get loops on random keys; prints ops/s, latency
    /// percentiles and error counts.
    Bench(Box<bench::BenchArgs>),
    /// Write canary: writes one key (and optionally one of another shard) every few ms and
    /// prints, with unix-ms timestamps, when writes start failing and when they succeed again.
    Probe(Box<probe::ProbeArgs>),
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Create the cluster CA and the CLI's client certificate.
    Init {
        /// Where to write them.
        #[arg(long, env = "SLOTRING_CERTS_DIR", default_value = "./certs")]
        certs_dir: PathBuf,
    },
    /// Issue a node certificate signed by the cluster CA.
    Issue {
        /// The node id the certificate names.
        node_id: String,
        /// Where the CA is and the certificate goes.
        #[arg(long, env = "SLOTRING_CERTS_DIR", default_value = "./certs")]
        certs_dir: PathBuf,
    },
}

/// Flags shared by every query.
#[derive(Debug, Args)]
pub(crate) struct QueryArgs {
    /// The node to ask.
    #[arg(
        short = 'a',
        long = "addr",
        env = "SLOTRING_ADDR",
        default_value = "127.0.0.1:7000"
    )]
    pub(crate) addr: SocketAddr,
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "SLOTRING_OUTPUT",
        default_value = "table"
    )]
    pub(crate) output: Output,
    /// Where the cluster CA and the client certificate live.
    #[arg(long, env = "SLOTRING_CERTS_DIR", default_value = "./certs")]
    pub(crate) certs_dir: PathBuf,
    /// How long to wait for the answer, in seconds.
    #[arg(long, env = "SLOTRING_TIMEOUT", default_value_t = 5)]
    pub(crate) timeout: u64,
}

impl QueryArgs {
    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout.max(1))
    }
}

/// How a query prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Aligned text for people.
    Table,
    /// One JSON object with `"version": 1`.
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.command.is_none() {
        keep_freed_memory_longer();
        use_small_pages();
    }
    // The daemon runs on one thread: its loop owns the core and most work is the loop's, so a
    // second worker mostly adds cross-thread wake-ups (storage has its own thread). `bench`
    // runs on `--threads` (default one, for the same reason); other clients spread over two.
    let builder = match &cli.command {
        None => tokio::runtime::Builder::new_current_thread(),
        Some(Command::Bench(args)) if args.threads == 1 => {
            tokio::runtime::Builder::new_current_thread()
        }
        Some(Command::Bench(args)) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(usize::from(args.threads));
            builder
        }
        Some(_) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(2);
            builder
        }
    };
    let runtime = match { builder }.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        None => runtime.block_on(daemon::run(cli.daemon)),
        Some(Command::Certs(CertsCommand::Init { certs_dir })) => cli::certs_init(&certs_dir),
        Some(Command::Certs(CertsCommand::Issue { node_id, certs_dir })) => {
            cli::certs_issue(&certs_dir, &node_id)
        }
        Some(Command::ShardInfo { shard, query }) => {
            runtime.block_on(cli::shard_info(shard, &query))
        }
        Some(Command::ShardFor { key, query }) => runtime.block_on(cli::shard_for(&key, &query)),
        Some(Command::Members { query }) => runtime.block_on(cli::members(&query)),
        Some(Command::Status { query }) => runtime.block_on(cli::status(&query)),
        Some(Command::Ring { query }) => runtime.block_on(cli::ring(&query)),
        Some(Command::Check { query }) => runtime.block_on(cli::check(&query)),
        Some(Command::Put { key, value, query }) => runtime.block_on(cli::key_op(
            cluster::replica::ClientOp::Put {
                key: key.into_bytes(),
                value: value.into_bytes(),
            },
            &query,
        )),
        Some(Command::Get { key, query }) => runtime.block_on(cli::key_op(
            cluster::replica::ClientOp::Get {
                key: key.into_bytes(),
            },
            &query,
        )),
        Some(Command::Leave { query, wait }) => runtime.block_on(moves::leave(&query, &wait)),
        Some(Command::Rebalance { query, wait }) => {
            runtime.block_on(moves::rebalance(&query, &wait))
        }
        Some(Command::Bench(args)) => runtime.block_on(bench::run(&args)),
        Some(Command::Probe(args)) => runtime.block_on(probe::run(&args)),
        Some(Command::Del { key, query }) => runtime.block_on(cli::key_op(
            cluster::replica::ClientOp::Del {
                key: key.into_bytes(),
            },
            &query,
        )),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option index is mimalloc 3's purge delay (its default is there, unless the
    /// environment set it), and setting it takes.
    #[test]
    fn the_purge_delay_is_found_and_set() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        #[allow(unsafe_code)]
        // SAFETY: reads one entry of mimalloc's option table (see `keep_freed_memory_longer`).
        let read = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(read(), MI_DEFAULT_PURGE_DELAY_MS);
        assert!(keep_freed_memory_longer());
        assert_eq!(read(), PURGE_DELAY_MS);
        assert!(!keep_freed_memory_longer(), "only the default is replaced");
    }

    /// The daemon's switch to small pages takes on this kernel.
    #[test]
    fn huge_pages_can_be_turned_off() {
        assert!(use_small_pages());
    }
}
