//! Integration tests of the shard table: reference vectors, properties, and the dependency rule.

mod dependency_rule;
mod properties;
mod reference;
