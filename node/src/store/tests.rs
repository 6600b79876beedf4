use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cluster::replica::{BatchId, Member, Op, Persist, SnapshotRead, SnapshotReadReply, StateImage};
use proptest::prelude::*;
use topology::NodeId;

use super::*;

/// The page cache the tests' stores keep: small, so that their reads and writes also go
/// through evictions.
const TEST_CACHE: usize = 1 << 20;

/// A directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "slotring-store-{name}-{}-{unique}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn db(&self) -> PathBuf {
        self.0.join("shards.redb")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn node(name: &str) -> NodeId {
    NodeId::new(name).unwrap()
}

fn ballot(n: u64) -> Ballot {
    Ballot {
        n,
        node: node("n1"),
    }
}

/// Entry `index` of ballot 1, putting `value` at `key`.
fn put_entry(index: u64, key: &[u8], value: &[u8]) -> Entry {
    Entry {
        ballot: ballot(1),
        index,
        op: Op::Put {
            key: key.to_vec(),
            value: value.to_vec(),
        },
        tag: None,
    }
}

fn config(voters: u64) -> Config {
    Config {
        voters: (0..voters)
            .map(|i| Member {
                node: node(&format!("n{i}")),
                storage: StorageId(u128::from(i) * 7),
            })
            .collect(),
        learners: vec![Member {
            node: node("learner"),
            storage: StorageId(99),
        }],
    }
}

fn host_persist(batch: u64, shards: Vec<(u16, Vec<Change>)>) -> HostPersist {
    HostPersist {
        batch: HostBatchId(batch),
        shards: shards
            .into_iter()
            .map(|(shard, changes)| {
                (
                    shard,
                    Persist {
                        batch: BatchId(batch),
                        changes,
                    },
                )
            })
            .collect(),
    }
}

/// The in-memory reference: what each shard's [`Durable`] is after `persists`, with the log
/// compaction a fold does ([`Model::fold`]).
#[derive(Debug, Default)]
struct Model {
    shards: BTreeMap<u16, Durable>,
    /// The shards in a batch since the last fold.
    unfolded: BTreeSet<u16>,
}

impl Model {
    fn apply(&mut self, persist: &HostPersist) {
        for (shard, shard_persist) in &persist.shards {
            let durable = self.shards.entry(*shard).or_insert_with(Durable::empty);
            for change in &shard_persist.changes {
                durable.apply_change(change);
            }
            self.unfolded.insert(*shard);
        }
    }

    /// What a fold does besides applying the changes: each shard it touched has its log
    /// compacted up to its applied index, unless tombstoned or applied is outside the log.
    fn fold(&mut self) {
        for shard in std::mem::take(&mut self.unfolded) {
            let durable = self.shards.get_mut(&shard).unwrap();
            let applied = durable.applied;
            if durable.tombstone.is_some()
                || applied <= durable.base.pos.index
                || applied > durable.last().index
            {
                continue;
            }
            let base = Base {
                pos: durable.pos_at(applied).unwrap(),
                config: durable.config_at(applied).clone(),
            };
            durable.apply_change(&Change::Compact { base });
        }
    }
}

fn reopen(path: &Path) -> Opened {
    Store::open(path, TEST_CACHE).unwrap()
}

// ---- Generating valid change sequences -------------------------------------------------

/// One abstract change: a kind and two numbers, made valid against the model's state.
type Step = (u8, u16, u16);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Append,
    Truncate,
    Apply,
    Compact,
    Install,
    Tombstone,
    DropRetired,
    Promise,
}

/// The kind of change a step makes, weighted towards logs that grow, apply and compact.
fn kind_of(step: Step) -> Kind {
    match step.0 % 16 {
        0..=4 => Kind::Append,
        5 => Kind::Truncate,
        6..=8 => Kind::Apply,
        9 | 10 => Kind::Compact,
        11 => Kind::Install,
        12 => Kind::Tombstone,
        13 => Kind::DropRetired,
        _ => Kind::Promise,
    }
}

/// Turns `step` into changes valid for `durable` (and applies them there): none when the kind
/// does not fit the state (a truncate of an empty log, say).
fn valid_changes(durable: &mut Durable, next_ballot: &mut u64, step: Step) -> Vec<Change> {
    let mut changes = Vec::new();
    // Applying comes in runs, so that compaction has entries to drop.
    let repeat = if kind_of(step) == Kind::Apply {
        1 + step.1 % 6
    } else {
        1
    };
    for _ in 0..repeat {
        match valid_change(durable, next_ballot, step) {
            Some(change) => changes.push(change),
            None => break,
        }
    }
    changes
}

/// One change of [`valid_changes`].
fn valid_change(durable: &mut Durable, next_ballot: &mut u64, step: Step) -> Option<Change> {
    let (_, x, y) = step;
    let (x, y) = (u64::from(x), u64::from(y));
    if durable.tombstone.is_some() {
        // A removed replica never changes again.
        return None;
    }
    let last = durable.last().index;
    let change = match kind_of(step) {
        Kind::Append => {
            if y % 3 == 0 {
                *next_ballot += 1;
            }
            let b = ballot(*next_ballot);
            let entries = (1..=1 + x % 4)
                .map(|offset| Entry {
                    ballot: b.clone(),
                    index: last + offset,
                    op: match (y + offset) % 5 {
                        0 => Op::EpochStart,
                        1 => Op::Config(config(1 + (y + offset) % 4)),
                        2 => Op::Del {
                            key: vec![(x % 7) as u8],
                        },
                        _ => Op::Put {
                            key: vec![((x + offset) % 7) as u8],
                            value: vec![y as u8; (y % 40) as usize],
                        },
                    },
                    tag: (y % 2 == 0).then_some(cluster::replica::RequestTag {
                        client: x,
                        req: y,
                        attempt: 1,
                    }),
                })
                .collect();
            Change::Append(entries)
        }
        Kind::Truncate => {
            // Unapplied entries only.
            let floor = durable.applied.max(durable.base.pos.index);
            if last <= floor {
                return None;
            }
            Change::Truncate {
                from: floor + 1 + x % (last - floor),
            }
        }
        Kind::Apply => {
            let index = durable.applied + 1;
            let entry = durable.entry(index)?;
            if x % 4 == 0 {
                // As a format-2 store's log has it: the write repeated beside the entry.
                let writes = match &entry.op {
                    Op::Put { key, value } => vec![(key.clone(), Some(value.clone()))],
                    Op::Del { key } => vec![(key.clone(), None)],
                    Op::EpochStart | Op::Config(_) => Vec::new(),
                };
                Change::AppliedWrites { index, writes }
            } else {
                Change::Applied { index }
            }
        }
        Kind::Compact => {
            let base = durable.base.pos.index;
            if durable.applied <= base {
                return None;
            }
            let index = base + 1 + x % (durable.applied - base);
            Change::Compact {
                base: Base {
                    pos: durable.pos_at(index)?,
                    config: durable.config_at(index).clone(),
                },
            }
        }
        Kind::Install => {
            *next_ballot += 1;
            let index = last.max(durable.applied) + 1 + x % 5;
            let kv: BTreeMap<Vec<u8>, Vec<u8>> = (0..y % 6)
                .map(|i| (vec![i as u8, x as u8], vec![y as u8; i as usize]))
                .collect();
            let kv = StateImage::from_map(&kv);
            Change::InstallSnapshot {
                base: Base {
                    pos: Pos {
                        ballot: Some(ballot(*next_ballot)),
                        index,
                    },
                    config: config(1 + y % 3),
                },
                kv,
            }
        }
        Kind::Tombstone => {
            if x % 8 != 0 {
                // Rarer: a tombstone ends the shard's story.
                return None;
            }
            Change::Tombstone(Tombstone {
                promised: durable.promised.clone(),
                last: durable.last(),
                config: durable.active_config().clone(),
            })
        }
        Kind::DropRetired => {
            durable.tombstone.as_ref()?;
            Change::DropRetired
        }
        Kind::Promise => {
            *next_ballot += 1 + x % 3;
            Change::Promised(ballot(*next_ballot))
        }
    };
    durable.apply_change(&change);
    Some(change)
}

/// Batches of `(shard, steps)`.
fn plan() -> impl Strategy<Value = Vec<Vec<(u16, Vec<Step>)>>> {
    let step = (any::<u8>(), any::<u16>(), any::<u16>());
    let shard_persist = (0..4u16, proptest::collection::vec(step, 0..5));
    proptest::collection::vec(proptest::collection::vec(shard_persist, 1..4), 1..16)
}

/// Makes `plan` into host persists, valid against the model as it goes.
fn build(plan: Vec<Vec<(u16, Vec<Step>)>>) -> Vec<HostPersist> {
    let mut state: BTreeMap<u16, Durable> = BTreeMap::new();
    let mut ballots: BTreeMap<u16, u64> = BTreeMap::new();
    (0u64..)
        .zip(plan)
        .map(|(batch, shards)| {
            let shards = shards
                .into_iter()
                .map(|(shard, steps)| {
                    let durable = state.entry(shard).or_insert_with(Durable::empty);
                    let next_ballot = ballots.entry(shard).or_insert(0);
                    let changes = steps
                        .into_iter()
                        .flat_map(|step| valid_changes(durable, next_ballot, step))
                        .collect();
                    (shard, changes)
                })
                .collect();
            host_persist(batch, shards)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Committed batches, reloaded, give exactly the shards `Durable::apply_change` builds,
    /// whether they were folded every few commits (`fold_every`) or are all write-ahead rows.
    #[test]
    fn reopen_gives_what_apply_change_builds(
        plan in plan(),
        fold_every in prop::option::of(1usize..4),
    ) {
        let dir = TempDir::new("prop");
        let persists = build(plan);
        let mut model = Model::default();
        let Opened { mut store, storage_id, .. } = Store::open(&dir.db(), TEST_CACHE).unwrap();
        store.set_fold_policy(FoldPolicy {
            batches: fold_every.unwrap_or(usize::MAX),
            bytes: usize::MAX,
            ..FoldPolicy::default()
        });
        for persist in &persists {
            store.commit(persist).unwrap();
            store.fold_if_due().unwrap();
            model.apply(persist);
            if store.folder.unfolded.is_empty() {
                model.fold();
            }
        }
        drop(store);
        let opened = reopen(&dir.db());
        model.fold();
        prop_assert_eq!(opened.storage_id, storage_id);
        prop_assert_eq!(&opened.shards, &model.shards);
        // Commits after a reopen continue from the loaded state.
        let mut store = opened.store;
        let more = host_persist(
            persists.len() as u64,
            model.shards.keys().map(|&shard| (shard, vec![Change::Promised(ballot(1000))])).collect(),
        );
        store.commit(&more).unwrap();
        model.apply(&more);
        drop(store);
        let reopened = reopen(&dir.db()).shards;
        model.fold();
        prop_assert_eq!(&reopened, &model.shards);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Folds split into a part per shard or so, one of them stopped after `after_parts` parts
    /// as a crash would stop it: a reopen gives exactly what `Durable::apply_change` builds
    /// from every committed batch (the shards an earlier part folded get nothing twice).
    #[test]
    fn a_fold_stopped_between_parts_loses_nothing_and_applies_nothing_twice(
        plan in plan(),
        fold_every in 1usize..4,
        stopped_fold in 0usize..4,
        after_parts in 1usize..6,
    ) {
        let dir = TempDir::new("parts");
        let persists = build(plan);
        let mut model = Model::default();
        let Opened { mut store, .. } = Store::open(&dir.db(), TEST_CACHE).unwrap();
        store.set_fold_policy(FoldPolicy {
            batches: fold_every,
            bytes: usize::MAX,
            ..FoldPolicy::default()
        });
        store.split_folds(1, None);
        let mut folds = 0;
        for persist in &persists {
            store.commit(persist).unwrap();
            model.apply(persist);
            if !store.folder.is_due() {
                continue;
            }
            if folds == stopped_fold {
                store.split_folds(1, Some(after_parts));
            }
            folds += 1;
            if store.fold_if_due().is_err() {
                break;
            }
            store.split_folds(1, None);
            model.fold();
        }
        drop(store);
        let reopened = reopen(&dir.db()).shards;
        model.fold();
        prop_assert_eq!(&reopened, &model.shards);
    }
}

/// A tombstone keeps the shard's key-value rows on the disk as its retired copy (a reopen does
/// not load them: the replica's state is empty), and `DropRetired` deletes them; the other
/// shards' rows are untouched.
#[test]
fn a_retired_copy_stays_on_the_disk_until_dropped() {
    let put = |index: u64, key: &[u8]| put_entry(index, key, b"v");
    let applied = |index: u64| Change::Applied { index };
    let rows = |store: &Store, shard: u16| {
        let txn = store.folder.db.begin_read().unwrap();
        let kv = txn.open_table(KV).unwrap();
        kv.range::<(u16, &[u8])>(kv_range(shard)).unwrap().count()
    };
    let dir = TempDir::new("retired");
    let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    for shard in [1, 2] {
        let changes = vec![
            Change::Append(vec![put(1, b"a"), put(2, b"b")]),
            applied(1),
            applied(2),
        ];
        store
            .commit(&host_persist(u64::from(shard), vec![(shard, changes)]))
            .unwrap();
    }
    let tombstone = Change::Tombstone(Tombstone {
        promised: None,
        last: Pos {
            ballot: Some(ballot(1)),
            index: 2,
        },
        config: config(2),
    });
    store
        .commit(&host_persist(3, vec![(1, vec![tombstone])]))
        .unwrap();
    store.fold().unwrap();
    assert_eq!(
        (rows(&store, 1), rows(&store, 2)),
        (2, 2),
        "kept as the retired copy"
    );
    drop(store);
    let opened = reopen(&dir.db());
    assert!(opened.shards[&1].tombstone.is_some());
    assert!(
        opened.shards[&1].kv.is_empty(),
        "not loaded into the replica's state"
    );
    assert_eq!(opened.shards[&2].kv.len(), 2);
    let mut store = opened.store;
    store
        .commit(&host_persist(4, vec![(1, vec![Change::DropRetired])]))
        .unwrap();
    store.fold().unwrap();
    assert_eq!((rows(&store, 1), rows(&store, 2)), (0, 2), "dropped");
}

/// Clearing a shard's kv rows deletes all of them, over several of `clear_kv`'s batches, and
/// none of the shards beside it.
#[test]
fn clearing_a_shard_larger_than_a_batch_leaves_its_neighbours() {
    let keys = CLEAR_KV_BATCH * 2 + 3;
    let dir = TempDir::new("clear-kv");
    let store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    let rows = |shard: u16| {
        let txn = store.folder.db.begin_read().unwrap();
        let kv = txn.open_table(KV).unwrap();
        kv.range::<(u16, &[u8])>(kv_range(shard)).unwrap().count()
    };
    let txn = store.folder.begin_write().unwrap();
    {
        let mut tables = Tables::open(&txn).unwrap();
        for shard in [1, 2, 3] {
            for key in 0..keys {
                let key = format!("key:{key}");
                tables
                    .kv
                    .insert((shard, key.as_bytes()), &b"v"[..])
                    .unwrap();
            }
        }
        tables.clear_kv(2).unwrap();
    }
    txn.commit().unwrap();
    assert_eq!((rows(1), rows(2), rows(3)), (keys, 0, keys));
}

/// Changes the protocol never makes still follow `apply_change` exactly: truncating below the
/// base or past the end, compacting backwards or past the end, appending after a tombstone, and
/// one shard twice in a batch.
#[test]
fn odd_changes_follow_apply_change() {
    let entry = |index: u64| Entry {
        ballot: ballot(1),
        index,
        op: Op::Put {
            key: vec![index as u8],
            value: vec![1; 3],
        },
        tag: None,
    };
    let base = |index: u64| Base {
        pos: Pos {
            ballot: Some(ballot(1)),
            index,
        },
        config: config(2),
    };
    let appends = |from: u64, to: u64| Change::Append((from..=to).map(entry).collect());
    let batches = vec![
        vec![(1, vec![appends(1, 6), Change::Truncate { from: 9 }])],
        vec![(1, vec![Change::Compact { base: base(3) }])],
        vec![(1, vec![Change::Truncate { from: 0 }, appends(4, 8)])],
        vec![(1, vec![Change::Truncate { from: 2 }, appends(4, 8)])],
        // Backwards: changes nothing.
        vec![(1, vec![Change::Compact { base: base(1) }])],
        vec![
            (1, vec![Change::Truncate { from: 4 }]),
            (1, vec![appends(20, 21)]),
        ],
        // Past the end.
        vec![(1, vec![Change::Compact { base: base(50) }, appends(51, 52)])],
        vec![(1, vec![Change::Applied { index: 51 }]), (2, vec![])],
        vec![(
            1,
            vec![
                Change::Tombstone(Tombstone {
                    promised: None,
                    last: Pos::ORIGIN,
                    config: Config::default(),
                }),
                appends(60, 61),
            ],
        )],
    ];
    let dir = TempDir::new("odd");
    let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    let mut model = Model::default();
    for (batch, shards) in (0..).zip(batches) {
        let persist = host_persist(batch, shards);
        store.commit(&persist).unwrap();
        model.apply(&persist);
        store.fold().unwrap();
        model.fold();
        assert_eq!(
            load(&store.folder.db).unwrap(),
            model.shards,
            "after batch {batch}"
        );
    }
}

/// A bootstrap's whole state, written with `create_shards`, survives a reopen and later
/// commits apply on top of it.
#[test]
fn created_shards_survive_reopen() {
    let dir = TempDir::new("create");
    let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    let mut model = Model::default();
    for shard in [0u16, 7, u16::MAX] {
        model.shards.insert(shard, Durable::bootstrap(config(3)));
    }
    store
        .create_shards(
            model
                .shards
                .iter()
                .map(|(shard, durable)| (*shard, durable)),
        )
        .unwrap();
    let persist = host_persist(
        0,
        vec![(
            u16::MAX,
            vec![Change::AppliedWrites {
                index: 0,
                writes: vec![(vec![0xff], Some(vec![1]))],
            }],
        )],
    );
    store.commit(&persist).unwrap();
    model.apply(&persist);
    drop(store);
    let reopened = reopen(&dir.db()).shards;
    model.fold();
    assert_eq!(reopened, model.shards);
}

#[test]
fn storage_id_survives_reopen_and_a_new_database_gets_a_new_one() {
    let dir = TempDir::new("id");
    let first = Store::open(&dir.db(), TEST_CACHE).unwrap();
    assert!(first.shards.is_empty());
    let id = first.storage_id;
    drop(first);
    assert_eq!(reopen(&dir.db()).storage_id, id);
    std::fs::remove_file(dir.db()).unwrap();
    let recreated = reopen(&dir.db()).storage_id;
    assert_ne!(recreated, id);
    let other = TempDir::new("id-other");
    assert_ne!(reopen(&other.db()).storage_id, recreated);
}

/// Records `version` as the format of the store at `path` (closed).
fn set_format_version(path: &Path, version: u32) {
    let db = Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(META)
        .unwrap()
        .insert(FORMAT_KEY, &version.to_le_bytes()[..])
        .unwrap();
    txn.commit().unwrap();
}

/// The format version the store at `path` (closed) records.
fn format_version(path: &Path) -> u32 {
    let db = Database::create(path).unwrap();
    let txn = db.begin_read().unwrap();
    let format = txn
        .open_table(META)
        .unwrap()
        .get(FORMAT_KEY)
        .unwrap()
        .unwrap();
    u32::from_le_bytes(format.value().try_into().unwrap())
}

#[test]
fn an_unknown_format_version_is_refused() {
    let dir = TempDir::new("version");
    drop(Store::open(&dir.db(), TEST_CACHE).unwrap());
    set_format_version(&dir.db(), 7);
    let error = format!("{:#}", Store::open(&dir.db(), TEST_CACHE).unwrap_err());
    assert!(
        error.contains("unknown shard store format version 7 (this build reads versions 1 to 3)"),
        "{error}"
    );
    assert!(error.contains("shards.redb"), "{error}");
}

/// A version-1 store (no write-ahead table) opens, keeps its shards, and is recorded as
/// the current version.
#[test]
fn a_version_1_store_is_upgraded() {
    let dir = TempDir::new("upgrade");
    let shards = {
        let Opened { mut store, .. } = Store::open(&dir.db(), TEST_CACHE).unwrap();
        let durable = Durable::bootstrap(config(3));
        store.create_shards([(5, &durable)]).unwrap();
        drop(store);
        set_format_version(&dir.db(), 1);
        BTreeMap::from([(5, durable)])
    };
    let Opened { mut store, .. } = Store::open(&dir.db(), TEST_CACHE).unwrap();
    let persist = host_persist(0, vec![(5, vec![Change::Promised(ballot(9))])]);
    store.commit(&persist).unwrap();
    drop(store);
    let mut model = Model {
        shards,
        ..Model::default()
    };
    model.apply(&persist);
    let reopened = reopen(&dir.db()).shards;
    model.fold();
    assert_eq!(reopened, model.shards);
    assert_eq!(format_version(&dir.db()), FORMAT_VERSION);
}

/// `Change::Applied` names its entry: applied in the batch that appends it, in a later fold
/// than the append (the entry is then read from the log table), and on reopen from the
/// write-ahead log alone, the state holds the entry's write.
#[test]
fn an_applied_entry_is_found_in_the_batch_the_log_table_or_the_write_ahead_log() {
    let put = put_entry;
    let dir = TempDir::new("applied");
    let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    let mut model = Model::default();
    let batches = [
        vec![
            Change::Append(vec![put(1, b"a", b"1"), put(2, b"b", b"2")]),
            Change::Applied { index: 1 },
        ],
        // Entry 2 is in the log table now; entry 3 comes in this batch.
        vec![
            Change::Append(vec![put(3, b"a", b"3")]),
            Change::Applied { index: 2 },
            Change::Applied { index: 3 },
        ],
        vec![Change::Append(vec![Entry {
            ballot: ballot(1),
            index: 4,
            op: Op::Del { key: b"b".to_vec() },
            tag: None,
        }])],
        vec![Change::Applied { index: 4 }],
    ];
    for (batch, changes) in batches.into_iter().enumerate() {
        let persist = host_persist(batch as u64, vec![(3, changes)]);
        store.commit(&persist).unwrap();
        model.apply(&persist);
        if batch < 2 {
            store.fold().unwrap();
            model.fold();
        }
    }
    // The last two batches only in the write-ahead log.
    drop(store);
    let shards = reopen(&dir.db()).shards;
    model.fold();
    assert_eq!(shards, model.shards);
    let kv = &shards[&3].kv;
    assert_eq!(kv.get(&b"a"[..]), Some(&b"3"[..]));
    assert_eq!(kv.get(&b"b"[..]), None);
    assert_eq!(shards[&3].applied, 4);
}

/// A store of format 2, whose write-ahead log repeats each applied write
/// (`Change::AppliedWrites`), opens with what that log holds and is recorded as the current
/// version.
#[test]
fn a_version_2_store_and_its_log_are_read() {
    let dir = TempDir::new("upgrade-2");
    let entry = put_entry(1, b"k", b"v");
    let persist = host_persist(
        0,
        vec![(
            4,
            vec![
                Change::Append(vec![entry]),
                Change::AppliedWrites {
                    index: 1,
                    writes: vec![(b"k".to_vec(), Some(b"v".to_vec()))],
                },
            ],
        )],
    );
    {
        let Opened { mut store, .. } = Store::open(&dir.db(), TEST_CACHE).unwrap();
        store.commit(&persist).unwrap();
        // Closed without a fold: the batch is only in the log.
        drop(store);
        set_format_version(&dir.db(), 2);
    }
    let mut model = Model::default();
    model.apply(&persist);
    model.fold();
    assert_eq!(reopen(&dir.db()).shards, model.shards);
    assert_eq!(format_version(&dir.db()), FORMAT_VERSION);
}

#[test]
fn a_file_that_is_not_a_shard_store_is_refused() {
    let dir = TempDir::new("corrupt");
    std::fs::write(dir.db(), vec![0x5a; 64 * 1024]).unwrap();
    let error = format!("{:#}", Store::open(&dir.db(), TEST_CACHE).unwrap_err());
    assert!(error.contains("opening the shard store"), "{error}");

    let foreign = TempDir::new("foreign");
    {
        let db = Database::create(foreign.db()).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(SHARDS)
            .unwrap()
            .insert(1, &b"x"[..])
            .unwrap();
        txn.commit().unwrap();
    }
    let error = format!("{:#}", Store::open(&foreign.db(), TEST_CACHE).unwrap_err());
    assert!(
        error.contains("without a slotring format version"),
        "{error}"
    );
}

#[test]
fn a_view_is_one_shards_applied_state_at_one_position() {
    let dir = TempDir::new("snapshot");
    let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    // Entry `index` of ballot 1 appended and applied, writing `keys`.
    let apply = |shard: u16, index: u64, keys: std::ops::Range<u8>| {
        let entry = Entry {
            ballot: ballot(1),
            index,
            op: Op::EpochStart,
            tag: None,
        };
        (
            shard,
            vec![
                Change::Append(vec![entry]),
                Change::AppliedWrites {
                    index,
                    writes: keys.map(|k| (vec![k], Some(vec![k; 10]))).collect(),
                },
            ],
        )
    };
    let at = |index: u64| Pos {
        ballot: Some(ballot(1)),
        index,
    };
    store
        .commit(&host_persist(
            0,
            vec![
                apply(1, 1, 0..5),
                apply(2, 1, 0..5),
                apply(u16::MAX, 1, 9..12),
            ],
        ))
        .unwrap();
    // A view reads the shard tables: what the last fold wrote.
    assert!(store.view(1).unwrap().is_none());
    store.fold().unwrap();
    let view = store.view(1).unwrap().unwrap();
    assert_eq!(view.base().pos, at(1));
    assert_eq!(view.size().unwrap(), (5, 55));
    store
        .commit(&host_persist(1, vec![apply(1, 2, 5..9)]))
        .unwrap();
    store.fold().unwrap();
    let (all, last) = view.chunk(None, usize::MAX).unwrap();
    assert!(last);
    assert_eq!(
        all,
        (0..5).map(|k| (vec![k], vec![k; 10])).collect::<Vec<_>>()
    );
    // Chunks of about 25 bytes: two pairs each, at least one; the last says so.
    assert_eq!(view.chunk(None, 25).unwrap(), (all[..2].to_vec(), false));
    assert_eq!(
        view.chunk(Some(&[1][..]), 25).unwrap(),
        (all[2..4].to_vec(), false)
    );
    assert_eq!(
        view.chunk(Some(&[3][..]), 1).unwrap(),
        (all[4..].to_vec(), true)
    );
    assert_eq!(view.chunk(Some(&[4][..]), 25).unwrap(), (Vec::new(), true));
    let later = store.view(1).unwrap().unwrap();
    assert_eq!(later.base().pos, at(2));
    assert_eq!(later.size().unwrap(), (9, 99));
    assert_eq!(store.view(u16::MAX).unwrap().unwrap().size().unwrap().0, 3);
    assert!(store.view(3).unwrap().is_none());
}

/// A leader asks for a view at or past its log's base; one the last fold left older is
/// refused, and the fold it needs happens now, not when the fold policy says (an hour here).
#[tokio::test]
async fn a_view_older_than_asked_brings_the_fold_forward() {
    let dir = TempDir::new("fold-soon");
    let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    store.set_fold_policy(FoldPolicy {
        batches: usize::MAX,
        bytes: usize::MAX,
        delay: Duration::from_secs(3600),
    });
    let mut handle = StoreWorker::spawn(store).unwrap();
    let mut reader = handle.snapshot_reader().unwrap();
    let entry = put_entry(1, b"k", b"v");
    let changes = vec![Change::Append(vec![entry]), Change::Applied { index: 1 }];
    handle.submit(host_persist(0, vec![(7, changes)])).unwrap();
    assert_eq!(handle.durable().await.unwrap(), HostBatchId(0));
    let deadline = Instant::now() + Duration::from_secs(10);
    for view in 0.. {
        assert!(Instant::now() < deadline, "no view at index 1 after 10 s");
        reader
            .ask(7, SnapshotRead::Open { view, at_least: 1 })
            .unwrap();
        match reader.answer().await.unwrap() {
            (7, SnapshotReadReply::Opened { base, keys, .. }) => {
                assert_eq!((base.pos.index, keys), (1, 1));
                break;
            }
            (7, SnapshotReadReply::Failed { .. }) => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("{other:?}"),
        }
    }
}

/// This process's threads named `name`, each with its scheduling policy (the 41st field of
/// `/proc/self/task/TID/stat`: 0 `SCHED_OTHER`, 5 `SCHED_IDLE`).
fn threads_named(name: &str) -> Vec<(u32, u32)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue; // the thread ended meanwhile
        };
        // The fields after the name's closing parenthesis start at the 3rd.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let policy = after_name.split(' ').nth(41 - 3).unwrap().parse().unwrap();
        let tid = task.file_name().to_str().unwrap().parse().unwrap();
        found.push((tid, policy));
    }
    found
}

/// The fold runs on CPU the other threads leave idle, in every scheduling group: its thread
/// is `SCHED_IDLE`; the log thread, which commits what clients wait for, is not.
#[tokio::test]
async fn the_fold_thread_runs_under_sched_idle_and_the_log_thread_does_not() {
    const SCHED_OTHER: u32 = 0;
    const SCHED_IDLE: u32 = 5;
    // Other tests of this process start workers too: only threads new since now are checked.
    let older: BTreeSet<u32> = threads_named("slotring-fold")
        .into_iter()
        .chain(threads_named("slotring-wal"))
        .map(|(tid, _)| tid)
        .collect();
    let dir = TempDir::new("fold-policy");
    let store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    let handle = StoreWorker::spawn(store).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let folds: Vec<(u32, u32)> = threads_named("slotring-fold")
            .into_iter()
            .filter(|(tid, _)| !older.contains(tid))
            .collect();
        // The thread sets its policy as it starts.
        if !folds.is_empty() && folds.iter().all(|(_, policy)| *policy == SCHED_IDLE) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "fold threads (tid, policy) still {folds:?} after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let logs: Vec<(u32, u32)> = threads_named("slotring-wal")
        .into_iter()
        .filter(|(tid, _)| !older.contains(tid))
        .collect();
    assert!(!logs.is_empty());
    assert!(
        logs.iter().all(|(_, policy)| *policy == SCHED_OTHER),
        "{logs:?}"
    );
    drop(handle);
}

#[tokio::test]
async fn the_worker_reports_batches_in_order_then_stops_on_drop() {
    let dir = TempDir::new("worker");
    let mut model = Model::default();
    let mut handle_store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    // Folds after every 3 commits: the reopen below finds folded and unfolded batches.
    handle_store.set_fold_policy(FoldPolicy {
        batches: 3,
        bytes: usize::MAX,
        ..FoldPolicy::default()
    });
    let mut handle = StoreWorker::spawn(handle_store).unwrap();
    let persists = crash_batches(0..20);
    for persist in &persists {
        handle.submit(persist.clone()).unwrap();
        model.apply(persist);
    }
    for expected in 0..20 {
        assert_eq!(handle.durable().await.unwrap(), HostBatchId(expected));
    }
    // Dropping the handle joins the thread, which closes the database: it opens again here.
    drop(handle);
    let reopened = reopen(&dir.db()).shards;
    model.fold();
    assert_eq!(reopened, model.shards);
}

#[tokio::test]
async fn a_failed_fold_is_reported_and_stops_the_worker() {
    let dir = TempDir::new("worker-error");
    let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
    store.set_fold_policy(FoldPolicy {
        batches: 1,
        bytes: usize::MAX,
        ..FoldPolicy::default()
    });
    let mut handle = StoreWorker::spawn(store).unwrap();
    let base = Base {
        pos: Pos {
            ballot: Some(ballot(1)),
            index: u64::MAX,
        },
        config: Config::default(),
    };
    handle
        .submit(host_persist(
            0,
            vec![(1, vec![Change::Promised(ballot(1))])],
        ))
        .unwrap();
    // An append past index u64::MAX cannot be stored.
    handle
        .submit(host_persist(
            1,
            vec![(
                1,
                vec![
                    Change::InstallSnapshot {
                        base,
                        kv: StateImage::default(),
                    },
                    crash_append(1, 1),
                ],
            )],
        ))
        .unwrap();
    // Batch 1 reaches the write-ahead log; folding it into the shard tables fails.
    assert_eq!(handle.durable().await.unwrap(), HostBatchId(0));
    assert_eq!(handle.durable().await.unwrap(), HostBatchId(1));
    let error = format!("{:#}", handle.durable().await.unwrap_err());
    assert!(error.contains("shard 1"), "{error}");
    assert!(error.contains("u64::MAX"), "{error}");
    let stopped = format!("{:#}", handle.durable().await.unwrap_err());
    assert!(stopped.contains("stopped"), "{stopped}");
    let refused = handle.submit(host_persist(2, vec![])).unwrap_err();
    assert!(format!("{refused:#}").contains("stopped"));
    drop(handle);
    // The fold's transaction left nothing behind, and the store refuses to open with a row it
    // cannot fold rather than drop an acknowledged batch.
    let error = format!("{:#}", Store::open(&dir.db(), TEST_CACHE).unwrap_err());
    assert!(error.contains("folding the write-ahead log"), "{error}");
    assert!(error.contains("u64::MAX"), "{error}");
}

// ---- Crash recovery ----------------------------------------------------------------------

const CRASH_DIR_ENV: &str = "SLOTRING_STORE_CRASH_DIR";
const CRASH_SHARDS: u16 = 8;

fn crash_append(batch: u64, shard: u16) -> Change {
    Change::Append(vec![Entry {
        ballot: ballot(1),
        index: batch + 1,
        op: Op::Put {
            key: format!("key-{shard}-{batch}").into_bytes(),
            value: vec![shard as u8; 100],
        },
        tag: None,
    }])
}

/// Batch `batch` appends entry `batch + 1` to every shard and applies it: even batches by
/// naming it, odd ones as a format-2 store did, with 16 writes beside it. So a torn batch
/// would show as shards of different lengths or a log and state that disagree.
fn crash_batch(batch: u64) -> HostPersist {
    let shards = (0..CRASH_SHARDS)
        .map(|shard| {
            let writes = (0..16u8)
                .map(|k| (vec![shard as u8, k], Some(batch.to_le_bytes().repeat(12))))
                .collect();
            (
                shard,
                vec![
                    crash_append(batch, shard),
                    // Odd batches as a format-2 store wrote them.
                    if batch.is_multiple_of(2) {
                        Change::Applied { index: batch + 1 }
                    } else {
                        Change::AppliedWrites {
                            index: batch + 1,
                            writes,
                        }
                    },
                ],
            )
        })
        .collect();
    host_persist(batch, shards)
}

fn crash_batches(range: std::ops::Range<u64>) -> Vec<HostPersist> {
    range.map(crash_batch).collect()
}

/// Not a test on its own: the child of `a_killed_writer_leaves_a_prefix_of_its_batches`. With
/// the env var set, commits batches until killed, printing `durable N` after each.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CRASH_DIR_ENV) else {
        return;
    };
    let mut store = Store::open(&Path::new(&dir).join("shards.redb"), TEST_CACHE)
        .unwrap()
        .store;
    // Folds (without an fsync) every 4 commits, so kills also land in and after folds.
    store.set_fold_policy(FoldPolicy {
        batches: 4,
        bytes: usize::MAX,
        ..FoldPolicy::default()
    });
    let mut out = std::io::stdout();
    for batch in 0.. {
        let persist = crash_batch(batch);
        store.commit(&persist).unwrap();
        store.fold_if_due().unwrap();
        writeln!(out, "durable {}", persist.batch.0).unwrap();
        out.flush().unwrap();
    }
}

/// Kills a child process that commits in a loop (SIGKILL, by its pid) at a few points; each
/// reopen holds exactly the first `k` batches, `k` at least every batch the child reported.
#[test]
fn a_killed_writer_leaves_a_prefix_of_its_batches() {
    for kill_after in [1u64, 7, 30] {
        let dir = TempDir::new("crash");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "store::tests::crash_child", "--test-threads=1"])
            .env(CRASH_DIR_ENV, &dir.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // A reader thread, so a stuck child fails the test instead of hanging it.
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (lines, reports) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut reported = None;
        while reported.is_none_or(|done| done + 1 < kill_after) {
            let wait = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = reports.recv_timeout(wait) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the child exited or stalled after reporting {reported:?}");
            };
            if let Some(batch) = line.strip_prefix("durable ") {
                reported = Some(batch.parse::<u64>().unwrap());
            }
        }
        // `Child::kill` sends SIGKILL to this child's pid only.
        child.kill().unwrap();
        child.wait().unwrap();
        let reported = reported.unwrap();

        let shards = reopen(&dir.db()).shards;
        let committed = shards.get(&0).map_or(0, |durable| durable.last().index);
        assert!(
            committed > reported,
            "batch {reported} was reported durable but is gone"
        );
        let mut model = Model::default();
        for persist in crash_batches(0..committed) {
            model.apply(&persist);
        }
        // Every batch applies what it appends, so where the child folded does not matter.
        model.fold();
        assert_eq!(shards, model.shards, "not a prefix of {committed} batches");
    }
}

/// One key's new value, as in `Change::AppliedWrites`.
type KeyWrite = (Vec<u8>, Option<Vec<u8>>);

// ---- Measurement --------------------------------------------------------------------------

/// Prints commits/s and writes/s for batches of 1, 64 and 1024 puts (16-byte keys, 100-byte
/// values, each appended and applied) spread over 1,024 shards, folding as the worker does. A measurement, not a check: run it with
/// `cargo test -p node --release -- --ignored --nocapture measure_commit_throughput`.
#[test]
#[ignore = "a measurement: run by hand"]
fn measure_commit_throughput() {
    // On the data dir's kind of disk, not a tmpfs: set SLOTRING_STORE_BENCH_DIR to choose.
    let parent = std::env::var("SLOTRING_STORE_BENCH_DIR").map(PathBuf::from);
    for puts in [1usize, 64, 1024] {
        let dir = match &parent {
            Ok(parent) => {
                let dir = parent.join(format!("slotring-store-bench-{puts}"));
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).unwrap();
                TempDir(dir)
            }
            Err(_) => TempDir::new("bench"),
        };
        let mut store = Store::open(&dir.db(), TEST_CACHE).unwrap().store;
        let mut key_counter = 0u64;
        let mut batches = 0u64;
        let mut last_index: BTreeMap<u16, u64> = BTreeMap::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3) || batches < 5 {
            let mut shards: BTreeMap<u16, Vec<KeyWrite>> = BTreeMap::new();
            for _ in 0..puts {
                key_counter += 1;
                let key = key_counter
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .to_be_bytes()
                    .repeat(2);
                shards
                    .entry((key_counter % 1024) as u16)
                    .or_default()
                    .push((key, Some(vec![0xab; 100])));
            }
            let shards = shards
                .into_iter()
                .map(|(shard, writes)| {
                    // As a replica writes them: the entries, then each applied.
                    let last = last_index.entry(shard).or_insert(0);
                    let first = *last + 1;
                    *last += writes.len() as u64;
                    let entries = writes
                        .iter()
                        .enumerate()
                        .map(|(i, (key, value))| Entry {
                            ballot: ballot(1),
                            index: first + i as u64,
                            op: Op::Put {
                                key: key.clone(),
                                value: value.clone().unwrap_or_default(),
                            },
                            tag: None,
                        })
                        .collect();
                    let applied =
                        (first..first + writes.len() as u64).map(|index| Change::Applied { index });
                    let mut changes = vec![Change::Append(entries)];
                    changes.extend(applied);
                    (shard, changes)
                })
                .collect();
            store.commit(&host_persist(batches, shards)).unwrap();
            store.fold_if_due().unwrap();
            batches += 1;
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "batches of {puts:>4} puts: {:>8.1} commits/s, {:>10.0} writes/s",
            batches as f64 / seconds,
            (batches as usize * puts) as f64 / seconds
        );
    }
}
