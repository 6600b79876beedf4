//! What a table is built from besides the ring: [`TableSpec`] and its parts.

use std::fmt;
use std::num::NonZeroU8;
use std::str::FromStr;

use crate::error::Error;
use crate::shard::ShardCount;

/// How many members hold each shard: `1..=`[`ReplicationFactor::MAX`], default 3. With fewer
/// members than this, every member holds every shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicationFactor(NonZeroU8);

impl ReplicationFactor {
    /// Three copies: survives the loss of any one.
    pub const DEFAULT: ReplicationFactor = ReplicationFactor(NonZeroU8::new(3).unwrap());
    /// The largest factor accepted. More copies than this buy no safety and cost every write.
    pub const MAX: u8 = 16;

    /// Validates a replication factor.
    pub fn new(copies: u8) -> Result<Self, Error> {
        match NonZeroU8::new(copies) {
            Some(copies) if copies.get() <= Self::MAX => Ok(ReplicationFactor(copies)),
            _ => Err(Error::InvalidReplicationFactor {
                given: copies.to_string(),
                max: Self::MAX,
            }),
        }
    }

    /// The factor as a number.
    pub const fn get(self) -> u8 {
        self.0.get()
    }
}

impl Default for ReplicationFactor {
    fn default() -> Self {
        ReplicationFactor::DEFAULT
    }
}

impl fmt::Display for ReplicationFactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for ReplicationFactor {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = || Error::InvalidReplicationFactor {
            given: text.to_owned(),
            max: Self::MAX,
        };
        let copies: u8 = text.trim().parse().map_err(|_| invalid())?;
        ReplicationFactor::new(copies).map_err(|_| invalid())
    }
}

/// The load slack ε of the bounded placement, kept in per-mille so that every node computes the
/// same caps in integers: a member holds at most `ceil((1 + ε) · mean)` shards.
///
/// Smaller ε balances tighter and moves more shards when membership changes. Default 0.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epsilon(u16);

impl Epsilon {
    /// ε = 0.1: caps at 110% of the mean.
    pub const DEFAULT: Epsilon = Epsilon(100);
    /// The largest ε, 10.0, at which caps no longer bind in practice.
    pub const MAX_PERMILLE: u16 = 10_000;

    /// ε from thousandths: `Epsilon::from_permille(100)` is 0.1.
    pub fn from_permille(permille: u16) -> Result<Self, Error> {
        if permille <= Self::MAX_PERMILLE {
            Ok(Epsilon(permille))
        } else {
            Err(Error::InvalidEpsilon {
                given: format!("{permille}‰"),
            })
        }
    }

    /// ε in thousandths.
    pub const fn permille(self) -> u16 {
        self.0
    }

    /// ε as a fraction, for reports.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }
}

impl Default for Epsilon {
    fn default() -> Self {
        Epsilon::DEFAULT
    }
}

impl fmt::Display for Epsilon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = format!("{}.{:03}", self.0 / 1000, self.0 % 1000);
        f.write_str(text.trim_end_matches('0').trim_end_matches('.'))
    }
}

impl FromStr for Epsilon {
    type Err = Error;

    /// Parses a decimal such as `0.1` or `0.125` exactly, without floating point.
    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = || Error::InvalidEpsilon {
            given: text.to_owned(),
        };
        let text = text.trim();
        let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
        let digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
        if whole.is_empty() && fraction.is_empty()
            || !digits(whole)
            || !digits(fraction)
            || whole.len() > 2
            || fraction.len() > 3
        {
            return Err(invalid());
        }
        let whole: u16 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| invalid())?
        };
        let fraction: u16 = format!("{fraction:0<3}").parse().map_err(|_| invalid())?;
        Epsilon::from_permille(whole * 1000 + fraction).map_err(|_| invalid())
    }
}

/// How replicas are chosen on the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// The plain walk (Dynamo's strategy): a shard's replicas are the first distinct members
    /// clockwise from its position, the first one leads. Minimal movement, poor balance (with
    /// 10 members and 256 vnodes the busiest leads about 20% more than the mean).
    Ring,
    /// The ring walk with bounded loads (the default; after Mirrokni, Thorup and Zadimoghaddam).
    /// Shards are placed in id order; the walk skips members already holding
    /// `ceil((1 + ε) · S · RF / N)` replicas, and the leader is the first chosen member still
    /// under `ceil((1 + ε) · S / N)` leaderships.
    Bounded {
        /// The load slack.
        epsilon: Epsilon,
    },
}

impl Placement {
    /// The name used in configuration and reports: `ring` or `bounded`.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Ring => "ring",
            Placement::Bounded { .. } => "bounded",
        }
    }

    /// ε for the bounded placement, `None` for the plain walk.
    pub fn epsilon(self) -> Option<Epsilon> {
        match self {
            Placement::Ring => None,
            Placement::Bounded { epsilon } => Some(epsilon),
        }
    }
}

impl Default for Placement {
    fn default() -> Self {
        Placement::Bounded {
            epsilon: Epsilon::DEFAULT,
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Placement {
    type Err = Error;

    /// `ring`, or `bounded` with the default ε.
    fn from_str(text: &str) -> Result<Self, Error> {
        match text.trim() {
            "ring" => Ok(Placement::Ring),
            "bounded" => Ok(Placement::default()),
            _ => Err(Error::UnknownPlacement {
                given: text.to_owned(),
            }),
        }
    }
}

/// The most shards one member may hold and lead under the bounded placement; see
/// [`TableSpec::load_caps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadCaps {
    /// The most shards a member holds, leading or not.
    pub memberships: u32,
    /// The most shards a member leads.
    pub leaderships: u32,
}

/// Everything a [`ShardTable`](crate::ShardTable) is computed from, besides the ring: part of
/// the cluster spec, fixed when the cluster is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TableSpec {
    /// How many shards exist.
    pub shards: ShardCount,
    /// How many members hold each shard.
    pub replication_factor: ReplicationFactor,
    /// How replicas are chosen.
    pub placement: Placement,
}

impl TableSpec {
    /// The load caps of the bounded placement with `members` members; `None` for the plain walk,
    /// which has none, or with no members.
    ///
    /// `cap = max(ceil((1000 + ε‰) · total / (1000 · N)), ceil(total / N))` in integers, where
    /// `total` is `S · min(RF, N)` for memberships and `S` for leaderships.
    pub fn load_caps(&self, members: usize) -> Option<LoadCaps> {
        let epsilon = self.placement.epsilon()?;
        if members == 0 {
            return None;
        }
        let shards = self.shards.len();
        let width = usize::from(self.replication_factor.get()).min(members);
        Some(LoadCaps {
            memberships: load_cap(shards * width, members, epsilon),
            leaderships: load_cap(shards, members, epsilon),
        })
    }
}

/// The most of `total` units one of `members` (at least one) may hold:
/// `max(ceil((1000 + ε‰) · total / (1000 · members)), ceil(total / members))`, in integers so
/// every node and language computes the same cap.
pub(crate) fn load_cap(total: usize, members: usize, epsilon: Epsilon) -> u32 {
    let (total, members) = (total as u64, members as u64);
    let slack = (1000 + u64::from(epsilon.permille())) * total;
    let cap = slack.div_ceil(1000 * members).max(total.div_ceil(members));
    // total ≤ 2^16 shards × 16 copies, so the cap fits in u32.
    cap as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_match_design_md_at_ten_members() {
        let spec = TableSpec::default();
        let caps = |members| spec.load_caps(members).unwrap();
        assert_eq!(
            caps(10),
            LoadCaps {
                memberships: 338,
                leaderships: 113
            }
        );
        assert_eq!(caps(100).memberships, 34);
        // With fewer members than copies, every member holds every shard.
        assert_eq!(
            caps(2),
            LoadCaps {
                memberships: 1127,
                leaderships: 564
            }
        );
        let tight = TableSpec {
            placement: Placement::Bounded {
                epsilon: Epsilon::from_permille(0).unwrap(),
            },
            ..spec
        };
        assert_eq!(tight.load_caps(10).unwrap().leaderships, 103);
        assert_eq!(
            TableSpec {
                placement: Placement::Ring,
                ..spec
            }
            .load_caps(10),
            None
        );
        assert_eq!(spec.load_caps(0), None);
    }

    #[test]
    fn epsilon_parses_exact_decimals() {
        for (text, permille) in [
            ("0.1", 100),
            (".25", 250),
            ("1", 1000),
            ("0.125", 125),
            ("0", 0),
            ("10", 10_000),
        ] {
            assert_eq!(
                text.parse::<Epsilon>().unwrap().permille(),
                permille,
                "{text}"
            );
        }
        for text in ["", ".", "-0.1", "0.1234", "1e-1", "10.001", "abc", "0,1"] {
            assert!(text.parse::<Epsilon>().is_err(), "{text}");
        }
        assert_eq!(Epsilon::DEFAULT.to_string(), "0.1");
        assert_eq!(Epsilon::from_permille(1250).unwrap().to_string(), "1.25");
        assert_eq!(Epsilon::from_permille(0).unwrap().to_string(), "0");
    }

    #[test]
    fn placement_and_replication_factor_parse() {
        assert_eq!("ring".parse::<Placement>().unwrap(), Placement::Ring);
        assert_eq!(
            "bounded".parse::<Placement>().unwrap(),
            Placement::default()
        );
        assert!("random".parse::<Placement>().is_err());
        assert_eq!(
            "3".parse::<ReplicationFactor>().unwrap(),
            ReplicationFactor::DEFAULT
        );
        assert!("0".parse::<ReplicationFactor>().is_err());
        assert!("17".parse::<ReplicationFactor>().is_err());
        assert!("300".parse::<ReplicationFactor>().is_err());
    }
}
