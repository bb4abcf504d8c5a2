//! Locks that one panic does not turn into a panic of every later user.
//!
//! A std lock whose holder panicked is *poisoned*: every later `lock()`, `read()` or
//! `write()` returns an error, and an `.expect(…)` on it makes one panic (a bug in one
//! request, one hook) a panic of every request after it — a broker that can no longer
//! deliver, a client that can no longer send. msgtrail's locks guard state that a panicking
//! holder cannot leave torn: each critical section is one map, queue or field update, or a
//! series of updates of which each leaves a state the next reader can use. So the guard is
//! taken back from the [`PoisonError`] ([`PoisonError::into_inner`]) and used as it is.
//!
//! Each lock that uses [`Recover`] says at its declaration why its state stays consistent;
//! a lock whose state a panic could tear (two fields that must change together, with code
//! that can panic between them) must not use it.

use std::sync::{LockResult, PoisonError};

/// The guard of a lock, poisoned or not: see the [module documentation](self).
pub trait Recover<G> {
    /// The guard, taken back from a [`PoisonError`] if an earlier holder panicked.
    fn recover(self) -> G;
}

impl<G> Recover<G> for LockResult<G> {
    fn recover(self) -> G {
        self.unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::Recover;
    use std::sync::{Arc, Mutex, RwLock};

    #[test]
    fn a_panicking_holder_leaves_the_lock_usable() {
        let m = Arc::new(Mutex::new(vec![1]));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            g.push(2);
            panic!("a holder panics");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.lock().recover(), [1, 2]);
        m.lock().recover().push(3);
        assert_eq!(*m.lock().recover(), [1, 2, 3]);

        let l = Arc::new(RwLock::new(0));
        let l2 = l.clone();
        let _ = std::thread::spawn(move || {
            let mut g = l2.write().unwrap();
            *g = 7;
            panic!("a writer panics");
        })
        .join();
        assert!(l.is_poisoned());
        assert_eq!(*l.read().recover(), 7);
        *l.write().recover() = 8;
        assert_eq!(*l.read().recover(), 8);
    }
}
