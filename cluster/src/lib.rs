//! One node's sans-IO cluster state (work in progress).
