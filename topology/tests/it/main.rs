//! Integration and property tests of the token ring.

mod ring_properties;
