//! Multi-process tests of the `node` binary; the tests live in `tests/it`.
