//! Ticker: advances the engines' epoch every tick while guest code may run.
//!
//! The epoch is what interrupts a guest: at each tick a running guest yields
//! to the async runtime (so a spinning one cannot starve other calls, and its
//! wall-clock deadline can end it) or, where the deadline is counted in
//! ticks, traps. An idle host has nothing to interrupt, so after
//! [`PARK_AFTER`] without a guest the ticker thread parks instead of waking
//! 200 times a second.
//!
//! Invariant: it must never be parked while guest code runs. Every guest is
//! instantiated under a [`Running`] hold ([`Ticker::hold`]), taken before
//! instantiation, which wakes a parked ticker; the ticker parks only when it
//! has seen no hold for `PARK_AFTER` and re-checks after announcing it will
//! park (both sides sequentially consistent, so one of them always sees the
//! other).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::thread::Thread;
use std::time::Duration;

use wasmtime::EngineWeak;

/// How long the ticker goes on without a guest before it parks: long enough
/// that back-to-back calls of one client never wait for it to wake.
pub const PARK_AFTER: Duration = Duration::from_secs(1);

/// The epoch thread of an executor; stopped when dropped.
pub struct Ticker {
    shared: Arc<Shared>,
    thread: Thread,
}

struct Shared {
    /// Guests running (holds taken and not dropped).
    running: AtomicUsize,
    /// The thread parks (or is about to): the next hold must wake it.
    parked: AtomicBool,
    stop: AtomicBool,
    /// Epoch increments so far (for tests and diagnostics).
    ticks: AtomicU64,
}

/// Guest code may run while this lives: the ticker keeps ticking.
pub struct Running<'a>(&'a Shared);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, SeqCst);
    }
}

impl Ticker {
    /// Start the thread: every `tick` it advances the epoch of each engine
    /// still alive (it ends when one is gone), parking after `park_after`
    /// without a [`Running`] hold.
    pub fn start(engines: Vec<EngineWeak>, tick: Duration, park_after: Duration) -> std::io::Result<Ticker> {
        let shared = Arc::new(Shared {
            running: AtomicUsize::new(0),
            parked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            ticks: AtomicU64::new(0),
        });
        let s = shared.clone();
        let handle = std::thread::Builder::new().name("toolgate-epoch".into()).spawn(move || {
            let mut idle = Duration::ZERO;
            while !s.stop.load(SeqCst) {
                std::thread::sleep(tick);
                for weak in &engines {
                    match weak.upgrade() {
                        Some(e) => e.increment_epoch(),
                        None => return,
                    }
                }
                s.ticks.fetch_add(1, SeqCst);
                if s.running.load(SeqCst) > 0 {
                    idle = Duration::ZERO;
                    continue;
                }
                idle += tick;
                if idle < park_after {
                    continue;
                }
                // Announce, then re-check: a hold taken after the check
                // below sees `parked` and wakes this thread.
                s.parked.store(true, SeqCst);
                while s.parked.load(SeqCst) && s.running.load(SeqCst) == 0 && !s.stop.load(SeqCst) {
                    std::thread::park();
                }
                s.parked.store(false, SeqCst);
                idle = Duration::ZERO;
            }
        })?;
        Ok(Ticker { shared, thread: handle.thread().clone() })
    }

    /// Keep ticking while the returned hold lives; wakes a parked ticker.
    /// Take it before a guest is instantiated.
    pub fn hold(&self) -> Running<'_> {
        let s = &*self.shared;
        s.running.fetch_add(1, SeqCst);
        if s.parked.load(SeqCst) && s.parked.swap(false, SeqCst) {
            self.thread.unpark();
        }
        Running(s)
    }

    /// Epoch increments so far.
    pub fn ticks(&self) -> u64 {
        self.shared.ticks.load(SeqCst)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.thread.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Waits up to 5 s for `f` to hold.
    fn eventually(f: impl Fn() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    fn ticking(t: &Ticker) -> bool {
        let before = t.ticks();
        std::thread::sleep(Duration::from_millis(30));
        t.ticks() > before
    }

    #[test]
    fn it_parks_when_idle_ticks_under_a_hold_and_wakes_for_one() {
        let engine = wasmtime::Engine::default();
        let t = Ticker::start(vec![engine.weak()], Duration::from_millis(1), Duration::from_millis(20)).unwrap();
        assert!(eventually(|| t.shared.parked.load(SeqCst)), "an idle ticker parks");
        assert!(!ticking(&t), "a parked ticker does not tick");
        {
            let _running = t.hold();
            assert!(ticking(&t), "a hold wakes it");
            // Held far longer than `park_after`: it never parks under a hold.
            std::thread::sleep(Duration::from_millis(100));
            assert!(ticking(&t), "it keeps ticking while a guest may run");
        }
        assert!(eventually(|| t.shared.parked.load(SeqCst)), "idle again, it parks again");
    }

    #[test]
    fn holds_taken_while_it_parks_are_never_lost() {
        // Holds race the ticker's decision to park, many times over; each
        // must find it ticking within a few ticks.
        let engine = wasmtime::Engine::default();
        let t = Ticker::start(vec![engine.weak()], Duration::from_micros(200), Duration::from_micros(400)).unwrap();
        for i in 0..200 {
            std::thread::sleep(Duration::from_micros(100 * (i % 9)));
            let _running = t.hold();
            let before = t.ticks();
            assert!(eventually(|| t.ticks() >= before + 2), "hold {i}: the ticker did not wake");
        }
    }

    #[test]
    fn a_parked_ticker_stops_when_dropped() {
        let engine = wasmtime::Engine::default();
        let t = Ticker::start(vec![engine.weak()], Duration::from_millis(1), Duration::from_millis(5)).unwrap();
        assert!(eventually(|| t.shared.parked.load(SeqCst)));
        let shared = t.shared.clone();
        drop(t);
        // The thread held the other reference; it lets go when it ends.
        assert!(eventually(|| Arc::strong_count(&shared) == 1), "the thread ended");
    }
}
