//! The shutdown signal the broker's long-running tasks watch.

use tokio::sync::watch;

/// Receives the shutdown signal; cheap to clone.
#[derive(Debug, Clone)]
pub struct Shutdown(watch::Receiver<bool>);

/// Sends the shutdown signal.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// A connected trigger and signal.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), Shutdown(rx))
}

impl ShutdownTrigger {
    /// Signals every [`Shutdown`].
    pub fn trigger(&self) {
        let _ = self.0.send(true);
    }

    /// A new receiver.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

impl Shutdown {
    /// Resolves once shutdown has been signalled.
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    /// Whether shutdown has been signalled.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }
}
