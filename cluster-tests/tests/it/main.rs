//! Multi-process tests (work in progress).
