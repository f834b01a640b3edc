//! Each shard's inbox for one kind of message other threads send it (a pull-mode agent the
//! tunnel thread accepted, a shared watch's feed another shard asks for): a tokio unbounded
//! channel per shard, found by the shard's index in a list swapped whole when a shard starts
//! (rare), so sending takes no lock.

use arc_swap::{ArcSwap, Guard};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The shards' inboxes for messages of type `T`, by shard index.
pub struct Inboxes<T>(ArcSwap<Vec<Option<UnboundedSender<T>>>>);

impl<T> Default for Inboxes<T> {
    fn default() -> Self {
        Inboxes(ArcSwap::default())
    }
}

impl<T> Inboxes<T> {
    /// Opens shard `index`'s inbox (a restarted shard's replaces its predecessor's).
    pub fn register(&self, index: usize) -> UnboundedReceiver<T> {
        let (send, receive) = unbounded_channel();
        self.0.rcu(|inboxes| {
            let mut inboxes = Vec::clone(inboxes);
            if inboxes.len() <= index {
                inboxes.resize_with(index + 1, || None);
            }
            inboxes[index] = Some(send.clone());
            inboxes
        });
        receive
    }

    /// Every shard's inbox as now (`None` for a shard that never opened one).
    pub fn load(&self) -> Guard<Arc<Vec<Option<UnboundedSender<T>>>>> {
        self.0.load()
    }
}
