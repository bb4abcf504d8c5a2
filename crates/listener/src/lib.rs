//! Placeholder: see the issue for this crate.
