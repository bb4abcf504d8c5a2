//! How much one store transaction takes: at most so many stage-stream messages *and* at most
//! so many of their payload bytes.
//!
//! The ingest loop ([`crate::ingest`]) waits for one message, then takes every message
//! already delivered while [`BatchLimits::admits`] says so, and applies them in one
//! transaction. A record is queryable when its transaction commits, so the transaction's
//! length is what a record waits behind (arrival → queryable). A bound on messages alone
//! lets a transaction's size follow the brokers' batching: 512 stage messages of 128
//! records are 65 k records and ~0.4 s of work on one core, while the same 512 messages split
//! over 16 stage partitions hold 4 k. The byte bound (the payloads, known before decoding)
//! keeps a transaction near the same amount of work whatever the brokers' batches and
//! partitions look like. The benchmark's ingest (`msgtrail bench`, S4) takes its batches by
//! the same rule.

use async_nats::jetstream;
use futures::{FutureExt, Stream, StreamExt};

/// The bounds of one store transaction ([`crate::ListenerConfig::batch_size`] and
/// [`crate::ListenerConfig::batch_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most stage-stream messages per transaction.
    pub messages: usize,
    /// Most payload bytes per transaction; a single message larger than this still makes a
    /// transaction of its own.
    pub bytes: usize,
}

impl BatchLimits {
    /// Whether a transaction that already took `taken` messages of `taken_bytes` payload
    /// bytes takes the next one (of `next_bytes`). The first message is always taken.
    pub fn admits(&self, taken: usize, taken_bytes: usize, next_bytes: usize) -> bool {
        taken == 0
            || (taken < self.messages && taken_bytes.saturating_add(next_bytes) <= self.bytes)
    }

    /// How many of the messages whose payload sizes `sizes` gives, in order, the next
    /// transaction takes (at least one when there is any).
    pub fn take(&self, sizes: impl IntoIterator<Item = usize>) -> usize {
        let (mut taken, mut bytes) = (0, 0);
        for size in sizes {
            if !self.admits(taken, bytes, size) {
                break;
            }
            taken += 1;
            bytes += size;
        }
        taken
    }

    /// One transaction of messages arriving one by one: `first`, then each message `more`
    /// has at hand (`None`: nothing more now) while the limits admit it, `size` giving its
    /// payload bytes. Returns the transaction and the first message refused, to start the
    /// next one.
    pub fn gather<T>(
        &self,
        first: T,
        mut more: impl FnMut() -> Option<T>,
        size: impl Fn(&T) -> usize,
    ) -> (Vec<T>, Option<T>) {
        let mut bytes = size(&first);
        let mut taken = vec![first];
        while let Some(next) = more() {
            let n = size(&next);
            if !self.admits(taken.len(), bytes, n) {
                return (taken, Some(next));
            }
            bytes += n;
            taken.push(next);
        }
        (taken, None)
    }

    /// `set` cut into transactions by [`Self::take`], in order.
    pub fn split<'a, T: AsRef<[u8]>>(&self, set: &'a [T]) -> Vec<&'a [T]> {
        let mut out = Vec::new();
        let mut rest = set;
        while !rest.is_empty() {
            let n = self.take(rest.iter().map(|m| m.as_ref().len()));
            let (head, tail) = rest.split_at(n);
            out.push(head);
            rest = tail;
        }
        out
    }
}

/// A consumer's messages cut into transactions by [`BatchLimits`]: each [`Self::next`] waits
/// for one message, then takes the messages already delivered while the limits admit them;
/// the first one they refuse is held for the next transaction.
pub(crate) struct Chunks<S, E> {
    messages: S,
    held: Option<Result<jetstream::Message, E>>,
    limits: BatchLimits,
}

impl<S, E> Chunks<S, E>
where
    S: Stream<Item = Result<jetstream::Message, E>> + Unpin,
{
    /// Cuts `messages` by `limits`.
    pub(crate) fn new(messages: S, limits: BatchLimits) -> Self {
        Self {
            messages,
            held: None,
            limits,
        }
    }

    /// The next transaction's messages (a consumer error counts no bytes); `None` once the
    /// consumer ended. Cancel-safe: it waits only while it holds nothing.
    pub(crate) async fn next(&mut self) -> Option<Vec<Result<jetstream::Message, E>>> {
        let first = match self.held.take() {
            Some(m) => m,
            None => self.messages.next().await?,
        };
        let messages = &mut self.messages;
        let (chunk, held) = self.limits.gather(
            first,
            || messages.next().now_or_never().flatten(),
            |m| m.as_ref().map_or(0, |m| m.payload.len()),
        );
        self.held = held;
        Some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BatchLimits = BatchLimits {
        messages: 3,
        bytes: 100,
    };

    #[test]
    fn the_first_message_is_always_taken_even_past_the_byte_bound() {
        assert_eq!(LIMITS.take([500, 10]), 1);
        assert_eq!(LIMITS.take(std::iter::empty()), 0);
    }

    #[test]
    fn whichever_bound_comes_first_ends_the_transaction() {
        assert_eq!(LIMITS.take([10, 10, 10, 10]), 3, "messages");
        assert_eq!(LIMITS.take([40, 40, 40]), 2, "bytes");
        assert_eq!(
            LIMITS.take([40, 60, 1]),
            2,
            "exactly the byte bound is taken"
        );
    }

    #[test]
    fn gathering_hands_back_the_first_message_refused() {
        let mut arriving = vec![30, 40, 50, 1].into_iter();
        let (taken, held) = LIMITS.gather(20, || arriving.next(), |&n| n);
        assert_eq!((taken, held), (vec![20, 30, 40], Some(50)));
        assert_eq!(
            arriving.next(),
            Some(1),
            "nothing past the refused one is taken"
        );
    }

    #[test]
    fn a_split_keeps_every_message_once_in_order() {
        let set: Vec<Vec<u8>> = [50, 50, 50, 200, 1, 1, 1, 1]
            .iter()
            .map(|&n| vec![0u8; n])
            .collect();
        let parts = LIMITS.split(&set);
        let lens: Vec<Vec<usize>> = parts
            .iter()
            .map(|p| p.iter().map(Vec::len).collect())
            .collect();
        assert_eq!(
            lens,
            vec![vec![50, 50], vec![50], vec![200], vec![1, 1, 1], vec![1]]
        );
    }
}
