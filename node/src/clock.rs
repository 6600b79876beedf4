//! The core's clock.
//!
//! The core takes time as an input; the loop feeds it the time since the node started on
//! `CLOCK_BOOTTIME`. Unlike `Instant` (`CLOCK_MONOTONIC`), that clock keeps counting while the
//! machine is suspended, so a leader that was frozen and woke up does not believe a read lease
//! (PROTOCOL.md R9) it held before is still running. Sleeps still use tokio's timer: a
//! deadline on this clock becomes "that long from now".

use std::time::Duration;

/// Time since the node started, on `CLOCK_BOOTTIME`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BootClock {
    origin: Duration,
}

impl BootClock {
    /// A clock reading zero now.
    pub(crate) fn start() -> Self {
        BootClock { origin: boottime() }
    }

    /// The time since [`start`](Self::start).
    pub(crate) fn now(&self) -> Duration {
        boottime().saturating_sub(self.origin)
    }

    /// The tokio instant at which this clock reads `at` (now, if `at` has passed).
    pub(crate) fn deadline(&self, at: Duration) -> tokio::time::Instant {
        tokio::time::Instant::now() + at.saturating_sub(self.now())
    }
}

fn boottime() -> Duration {
    let spec = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    // Boot time is never negative.
    Duration::new(
        u64::try_from(spec.tv_sec).unwrap_or(0),
        u32::try_from(spec.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_near_zero_and_moves_forward() {
        let clock = BootClock::start();
        let first = clock.now();
        assert!(first < Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(clock.now() >= first + Duration::from_millis(5));
    }
}
