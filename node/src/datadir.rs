//! The data directory: node id, generation, cluster spec, and the lock that keeps two processes
//! from sharing it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cluster::ClusterSpec;
use serde::{Deserialize, Serialize};
use topology::NodeId;

/// An open, locked data directory. The lock is released when this is dropped (or the process
/// dies).
#[derive(Debug)]
pub(crate) struct DataDir {
    path: PathBuf,
    _lock: File,
}

#[derive(Debug, Serialize, Deserialize)]
struct NodeFile {
    node_id: String,
    generation: u64,
}

impl DataDir {
    /// Creates the directory if needed and takes its exclusive lock.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        fs::create_dir_all(path)
            .with_context(|| format!("creating the data dir {}", path.display()))?;
        let lock_path = path.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => bail!(
                "the data dir {} is in use by another node process (its LOCK is held)",
                path.display()
            ),
            Err(fs::TryLockError::Error(error)) => {
                return Err(error).with_context(|| format!("locking {}", lock_path.display()));
            }
        }
        Ok(DataDir {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    /// The node id stored here, if any.
    pub(crate) fn node_id(&self) -> Result<Option<(NodeId, u64)>> {
        let Some(file) = self.read_json::<NodeFile>("node.json")? else {
            return Ok(None);
        };
        let id = NodeId::new(&file.node_id)
            .with_context(|| format!("{} holds an invalid node id", self.file("node.json")))?;
        Ok(Some((id, file.generation)))
    }

    /// Records the node id and generation.
    pub(crate) fn store_node(&self, node_id: &NodeId, generation: u64) -> Result<()> {
        self.write_json(
            "node.json",
            &NodeFile {
                node_id: node_id.to_string(),
                generation,
            },
        )
    }

    /// The cluster spec stored here, if any.
    pub(crate) fn spec(&self) -> Result<Option<ClusterSpec>> {
        self.read_json("spec.json")
    }

    /// Records the cluster spec.
    pub(crate) fn store_spec(&self, spec: &ClusterSpec) -> Result<()> {
        self.write_json("spec.json", spec)
    }

    /// The peers this node last saw alive, if any.
    pub(crate) fn peers(&self) -> Result<Vec<std::net::SocketAddr>> {
        Ok(self.read_json("peers.json")?.unwrap_or_default())
    }

    /// Records the peers this node sees alive.
    pub(crate) fn store_peers(&self, peers: &[std::net::SocketAddr]) -> Result<()> {
        self.write_json("peers.json", &peers)
    }

    fn file(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    fn read_json<T: for<'de> Deserialize<'de>>(&self, name: &str) -> Result<Option<T>> {
        let path = self.path.join(name);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is corrupt", path.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes atomically: a temporary file, fsync, rename.
    fn write_json<T: Serialize>(&self, name: &str, value: &T) -> Result<()> {
        let path = self.path.join(name);
        let temporary = self.path.join(format!("{name}.tmp"));
        let bytes = serde_json::to_vec_pretty(value).context("encoding JSON")?;
        let mut file = File::create(&temporary)
            .with_context(|| format!("creating {}", temporary.display()))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", temporary.display()))?;
        fs::rename(&temporary, &path)
            .with_context(|| format!("renaming {} to {}", temporary.display(), path.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("slotring-datadir-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_second_open_is_refused_while_the_first_holds_the_lock() {
        let dir = temp_dir("lock");
        let first = DataDir::open(&dir).unwrap();
        let error = DataDir::open(&dir).unwrap_err().to_string();
        assert!(error.contains("in use by another node process"), "{error}");
        drop(first);
        DataDir::open(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn node_and_spec_roundtrip_and_corruption_is_an_error() {
        let dir = temp_dir("roundtrip");
        let data = DataDir::open(&dir).unwrap();
        assert!(data.node_id().unwrap().is_none());
        assert!(data.spec().unwrap().is_none());
        let id = NodeId::new("n7").unwrap();
        data.store_node(&id, 3).unwrap();
        assert_eq!(data.node_id().unwrap(), Some((id, 3)));
        let spec = ClusterSpec::new("c", 9, Default::default(), Default::default()).unwrap();
        data.store_spec(&spec).unwrap();
        assert_eq!(data.spec().unwrap(), Some(spec));
        fs::write(dir.join("spec.json"), b"{\"shards\": 0").unwrap();
        assert!(data.spec().unwrap_err().to_string().contains("corrupt"));
        fs::write(
            dir.join("node.json"),
            br#"{"node_id": "bad id", "generation": 1}"#,
        )
        .unwrap();
        assert!(
            data.node_id()
                .unwrap_err()
                .to_string()
                .contains("invalid node id")
        );
        drop(data);
        fs::remove_dir_all(&dir).unwrap();
    }
}
