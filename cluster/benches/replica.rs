//! The replication core alone: three replicas of one shard in one process, persistence
//! acknowledged at once, no network. Each iteration submits a batch of puts to the leader and
//! drives all three replicas until every put is committed and answered, so the figure is the
//! CPU cost per committed write for the three replicas together.
//!
//! `cargo bench -p cluster --bench replica`

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use cluster::replica::{
    ClientOp, ClientReply, ClientRoute, Config, Durable, Member, Outgoing, ReplicaConfig,
    RequestTag, ShardReplica, StorageId, Timer,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use topology::NodeId;

fn member(index: usize) -> Member {
    Member {
        node: NodeId::new(&format!("n{index}")).expect("valid"),
        storage: StorageId(index as u128 + 1),
    }
}

struct Trio {
    replicas: Vec<ShardReplica>,
    queue: VecDeque<(Member, Outgoing)>,
    acknowledged: usize,
}

impl Trio {
    fn new() -> Self {
        let config = Config {
            voters: (0..3).map(member).collect(),
            learners: Vec::new(),
        };
        let replicas = (0..3)
            .map(|i| {
                ShardReplica::new(
                    Duration::ZERO,
                    0,
                    member(i),
                    Durable::bootstrap(config.clone()),
                    ReplicaConfig::default(),
                    i as u64,
                )
            })
            .collect();
        let mut trio = Trio {
            replicas,
            queue: VecDeque::new(),
            acknowledged: 0,
        };
        trio.replicas[0].handle_timeout(Duration::ZERO, Timer::Election);
        trio.settle();
        assert!(trio.replicas[0].established_ballot().is_some());
        trio
    }

    fn collect(&mut self, index: usize) {
        let replica = &mut self.replicas[index];
        while let Some(persist) = replica.poll_persist() {
            black_box(&persist);
            replica.handle_persisted(Duration::ZERO, persist.batch);
        }
        let from = replica.me().clone();
        while let Some(outgoing) = replica.poll_message() {
            self.queue.push_back((from.clone(), outgoing));
        }
        while let Some((_, reply)) = replica.poll_reply() {
            if matches!(reply, ClientReply::Ok { .. }) {
                self.acknowledged += 1;
            }
        }
    }

    fn settle(&mut self) {
        for index in 0..3 {
            self.collect(index);
        }
        while let Some((from, outgoing)) = self.queue.pop_front() {
            let to = outgoing.to.storage.0 as usize - 1;
            self.replicas[to].handle_message(Duration::ZERO, from, outgoing.to, outgoing.message);
            self.collect(to);
        }
    }

    /// Submits `count` puts (the client pipelines them), then drives until all committed.
    fn write(&mut self, count: usize, next_req: &mut u64) {
        let target = self.acknowledged + count;
        for _ in 0..count {
            *next_req += 1;
            let tag = RequestTag {
                client: 1,
                req: *next_req,
                attempt: 0,
            };
            let key = (*next_req % 4096).to_le_bytes().to_vec();
            let op = ClientOp::Put {
                key,
                value: vec![7; 16],
            };
            self.replicas[0].handle_client(Duration::ZERO, tag, op, ClientRoute::Routed);
        }
        self.collect(0);
        self.settle();
        assert_eq!(self.acknowledged, target);
    }
}

fn committed_writes(c: &mut Criterion) {
    let mut group = c.benchmark_group("replica");
    for batch in [1usize, 64, 1024] {
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(format!("commit_batch_{batch}"), |b| {
            b.iter_custom(|iterations| {
                let mut trio = Trio::new();
                let mut next_req = 0;
                let start = Instant::now();
                for _ in 0..iterations {
                    trio.write(batch, &mut next_req);
                }
                start.elapsed()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, committed_writes);
criterion_main!(benches);
