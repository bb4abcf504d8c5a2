//! Hooks: functions registered for events of a message's life. The SDK's own
//! stage reporting is one such hook.
//!
//! **A slow hook never stalls the message path.** Every hook has its own bounded queue and
//! task: the message path only `try_send`s an event into each queue and moves on. If a hook
//! falls behind and its queue is full, its events are dropped and counted
//! ([`Hooks::dropped`]); other hooks, and the messages, are not affected. A hook that must not
//! miss events should be quick (hand work to its own channel) or get a larger queue
//! ([`Hooks::register_with_capacity`]).

use crate::ClientError;
use msgtrail_core::sync::Recover;
use msgtrail_core::wire::{SettleKind, UploadReply};
use msgtrail_core::{MessageId, RequestId, Topic};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::mpsc;

/// Default queue length of one hook.
pub const DEFAULT_HOOK_CAPACITY: usize = 4096;

/// What happened. Every event carries its time (Unix nanoseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HookEvent {
    /// An upload attempt is about to be sent (stage P1).
    BeforeSend {
        /// Request ID (the same for every attempt).
        request_id: RequestId,
        /// Topic.
        topic: Topic,
        /// Attempt, from 1.
        attempt: u32,
        /// W3C traceparent sent along, if any.
        traceparent: Option<String>,
        /// When.
        at: u64,
    },
    /// An upload attempt ended: stored, duplicate, refused, or timed out.
    AfterSend {
        /// Request ID.
        request_id: RequestId,
        /// Topic.
        topic: Topic,
        /// Attempt.
        attempt: u32,
        /// The broker's reply, or why there is none: the same error the send returns, its
        /// causes kept ([`msgtrail_core::ErrorChain`] renders it with them).
        result: Result<UploadReply, ClientError>,
        /// When.
        at: u64,
    },
    /// The broker confirmed the message is stored (stage P4).
    StoreConfirmed {
        /// The broker's reply.
        reply: UploadReply,
        /// When.
        at: u64,
    },
    /// A delivery was received (stage C2 for push, C6 for pull).
    Received {
        /// The delivery.
        delivery: DeliveryInfo,
        /// When.
        at: u64,
    },
    /// Processing started (stage X1, "consuming").
    ProcessingStarted {
        /// The delivery.
        delivery: DeliveryInfo,
        /// When.
        at: u64,
    },
    /// Processing finished (stage X2): `Ok` or the error text.
    ProcessingFinished {
        /// The delivery.
        delivery: DeliveryInfo,
        /// The outcome.
        outcome: Result<(), String>,
        /// When.
        at: u64,
    },
    /// The consumer settled the delivery (stage C3 for push, C7 for pull).
    Settled {
        /// The delivery.
        delivery: DeliveryInfo,
        /// Ack, nack or term.
        kind: SettleKind,
        /// When.
        at: u64,
    },
}

/// Which event a hook wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookKind {
    /// [`HookEvent::BeforeSend`].
    BeforeSend,
    /// [`HookEvent::AfterSend`].
    AfterSend,
    /// [`HookEvent::StoreConfirmed`].
    StoreConfirmed,
    /// [`HookEvent::Received`].
    Received,
    /// [`HookEvent::ProcessingStarted`].
    ProcessingStarted,
    /// [`HookEvent::ProcessingFinished`].
    ProcessingFinished,
    /// [`HookEvent::Settled`].
    Settled,
}

impl HookEvent {
    /// The kind of this event.
    pub fn kind(&self) -> HookKind {
        match self {
            HookEvent::BeforeSend { .. } => HookKind::BeforeSend,
            HookEvent::AfterSend { .. } => HookKind::AfterSend,
            HookEvent::StoreConfirmed { .. } => HookKind::StoreConfirmed,
            HookEvent::Received { .. } => HookKind::Received,
            HookEvent::ProcessingStarted { .. } => HookKind::ProcessingStarted,
            HookEvent::ProcessingFinished { .. } => HookKind::ProcessingFinished,
            HookEvent::Settled { .. } => HookKind::Settled,
        }
    }
}

/// What a consumer-side event says about the delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryInfo {
    /// Message ID.
    pub message_id: MessageId,
    /// Topic.
    pub topic: Topic,
    /// Consumer group.
    pub group: crate::GroupId,
    /// Delivery attempt.
    pub attempt: u32,
    /// Push (true) or pull (false).
    pub push: bool,
    /// The delivery's ack token (it also proves the consumer's stage reports).
    pub ack_token: String,
}

struct Registered {
    kinds: Option<Vec<HookKind>>,
    tx: mpsc::Sender<Arc<HookEvent>>,
}

impl Registered {
    /// Whether it wants events of `kind` (`None`: every kind).
    fn wants(&self, kind: HookKind) -> bool {
        self.kinds.as_ref().is_none_or(|k| k.contains(&kind))
    }

    /// Whether it wants any event at all (a lifeline wants none).
    fn listens(&self) -> bool {
        self.kinds.as_ref().is_none_or(|k| !k.is_empty())
    }
}

/// A synchronous observer of every event, called inline by [`Hooks::emit`]: the SDK's own
/// stage reporting, which only moves a record into its outbox.
pub(crate) type Observer = Arc<dyn Fn(&HookEvent) + Send + Sync>;

/// The hook registry of a producer or consumer; cheap to clone.
#[derive(Clone, Default)]
pub struct Hooks {
    /// The registered hooks. Poison is recovered ([`Recover`]): writers push or clear, and
    /// the hooks themselves run on their own tasks, never under this lock.
    hooks: Arc<RwLock<Vec<Registered>>>,
    /// The inline observer. Poison is recovered ([`Recover`]): writers assign it whole; it is
    /// called under a read guard, and a reader's panic does not poison.
    observer: Arc<RwLock<Option<Observer>>>,
    dropped: Arc<AtomicU64>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("hooks", &self.hooks.read().map(|h| h.len()).unwrap_or(0))
            .field("dropped", &self.dropped())
            .finish()
    }
}

impl Hooks {
    /// Registers `hook` for the events of `kinds` (all events when empty).
    pub fn register<F>(&self, kinds: &[HookKind], hook: F)
    where
        F: FnMut(&HookEvent) + Send + 'static,
    {
        self.register_with_capacity(kinds, DEFAULT_HOOK_CAPACITY, hook)
    }

    /// Registers `hook` with its own queue of `capacity` events.
    pub fn register_with_capacity<F>(&self, kinds: &[HookKind], capacity: usize, mut hook: F)
    where
        F: FnMut(&HookEvent) + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<Arc<HookEvent>>(capacity.max(1));
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                hook(&ev);
            }
        });
        self.hooks.write().recover().push(Registered {
            kinds: (!kinds.is_empty()).then(|| kinds.to_vec()),
            tx,
        });
    }

    /// Registers an async consumer of events: returns the receiving end of a bounded queue.
    pub fn channel(&self, kinds: &[HookKind], capacity: usize) -> mpsc::Receiver<Arc<HookEvent>> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.hooks.write().recover().push(Registered {
            kinds: (!kinds.is_empty()).then(|| kinds.to_vec()),
            tx,
        });
        rx
    }

    /// Sets the inline observer (the SDK's stage reporting): it sees every event first,
    /// synchronously, without a queue or a task hop of its own.
    pub(crate) fn observe(&self, observer: Observer) {
        *self.observer.write().recover() = Some(observer);
    }

    /// A queue that receives no event and ends when the hooks are closed or the last clone
    /// is dropped: how a task tied to the hooks learns that they are gone.
    pub(crate) fn lifeline(&self) -> mpsc::Receiver<Arc<HookEvent>> {
        let (tx, rx) = mpsc::channel(1);
        self.hooks.write().recover().push(Registered {
            kinds: Some(Vec::new()),
            tx,
        });
        rx
    }

    /// Whether anyone listens: the observer (stage reporting) or a registered hook.
    pub fn is_active(&self) -> bool {
        self.observer.read().recover().is_some()
            || self.hooks.read().recover().iter().any(Registered::listens)
    }

    /// [`Hooks::emit`] of the event `make` builds, built only when someone listens (events
    /// copy the delivery's strings; without reporting or hooks that is wasted work).
    pub fn emit_with(&self, make: impl FnOnce() -> HookEvent) {
        let observer = self.observer.read().recover();
        let hooks = self.hooks.read().recover();
        if observer.is_none() && !hooks.iter().any(Registered::listens) {
            return;
        }
        let event = make();
        if let Some(observer) = observer.as_ref() {
            observer(&event);
        }
        drop(observer);
        let kind = event.kind();
        if !hooks.iter().any(|h| h.wants(kind)) {
            return;
        }
        let event = Arc::new(event);
        for h in hooks.iter().filter(|h| h.wants(kind)) {
            if h.tx.try_send(event.clone()).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Hands an event to the observer, then to every interested hook without waiting.
    pub fn emit(&self, event: HookEvent) {
        self.emit_with(move || event);
    }

    /// Unregisters every hook: their tasks finish the events already queued, then end.
    pub fn close(&self) {
        *self.observer.write().recover() = None;
        self.hooks.write().recover().clear();
    }

    /// Events dropped because a hook's queue was full or the hook had ended.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ev(attempt: u32) -> HookEvent {
        HookEvent::BeforeSend {
            request_id: RequestId::new("r").unwrap(),
            topic: Topic::new("t").unwrap(),
            attempt,
            traceparent: None,
            at: 0,
        }
    }

    #[tokio::test]
    async fn a_slow_hook_drops_its_own_events_only() {
        let hooks = Hooks::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        hooks.register(&[HookKind::BeforeSend], move |e| {
            let _ = tx.send(e.clone());
        });
        hooks.register_with_capacity(&[], 1, |_| std::thread::sleep(Duration::from_millis(200)));
        for i in 0..10 {
            hooks.emit(ev(i));
        }
        for i in 0..10 {
            let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, ev(i));
        }
        assert!(hooks.dropped() >= 8, "dropped {}", hooks.dropped());
    }
}
