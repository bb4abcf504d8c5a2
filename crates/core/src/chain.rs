//! One rendering of an error and its causes: `outer: cause: root cause`, each cause once.
//!
//! msgtrail's errors display their own message only and return their cause from
//! `source()` (the Rust API guidelines' rule). Some errors of other crates (async-nats among
//! them) also write their cause into their own message; [`ErrorChain`] leaves out a cause
//! whose text the level above it already ends with, so that no cause is printed twice.

use std::error::Error;
use std::fmt;

/// Displays an error with every cause in its `source()` chain, each once.
///
/// ```
/// use msgtrail_core::ErrorChain;
///
/// #[derive(Debug, thiserror::Error)]
/// #[error("cannot open the store")]
/// struct Open(#[source] std::io::Error);
///
/// let e = Open(std::io::Error::other("disk full"));
/// assert_eq!(ErrorChain(&e).to_string(), "cannot open the store: disk full");
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut above = self.0.to_string();
        f.write_str(&above)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            let text = c.to_string();
            if !above.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            above = text;
            cause = c.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("setup failed")]
    struct Setup(#[source] Repeats);

    /// Like async-nats' errors: its message ends with its cause's, which it also returns.
    #[derive(Debug, thiserror::Error)]
    #[error("request failed: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn each_cause_is_shown_once() {
        let e = Setup(Repeats(std::io::Error::other("timed out")));
        assert_eq!(
            ErrorChain(&e).to_string(),
            "setup failed: request failed: timed out"
        );
        let root = std::io::Error::other("alone");
        assert_eq!(ErrorChain(&root).to_string(), "alone");
    }
}
