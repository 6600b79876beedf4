//! The slotring node (work in progress).

fn main() {}
