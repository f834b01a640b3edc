//! Shared watches per gateway (`spec.sharedWatches.scope: Gateway`): one member watch per key
//! for the whole gateway instead of one per shard, without a lock on the event path.
//!
//! Each key has a home shard (its hash over the shards). The home shard's hub watches the member
//! as a per-shard hub does. A hub on any other shard is a mirror: it asks the home shard, through
//! that shard's inbox, for a feed of the key; the home shard's [`serve_feed`] joins its own hub
//! like a client (keeping it open) and sends what it holds (objects, ring, resourceVersions),
//! then every event as it enters the ring, over a channel to the mirror's shard. The events are
//! the home's own `Arc`s: parsed and encoded once for the gateway, their bytes shared by every
//! client on every shard. A mirror keeps its own ring of them, so its clients follow it exactly
//! as they follow a home hub, on their own shard.
//!
//! The channels are tokio's unbounded MPSC (atomics, no lock), each read on one shard and written
//! on one other. The home ends a feed when its hub ends (the mirror ends with the same phase, its
//! clients end cleanly and watch again); a mirror that ends (no clients, the route retired, its
//! shard drains) closes its feed, and the home's hub is released. A shard that cannot reach a
//! key's home (not running yet, restarting) watches the member itself, as with `scope: Shard`.

use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use fleetgate_config_watcher::ClusterRoute;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::hub::{Phase, Update};
use super::ShardWatches;
use super::{Caller, HubKey};
use crate::runtime::inbox::Inboxes;
use crate::runtime::{self, First};

/// A mirror's request for a feed of `key`.
pub struct Subscribe {
    key: HubKey,
    cluster: Arc<ClusterRoute>,
    caller: Caller,
    /// The resourceVersion the mirror's first client starts after, if any.
    from: Option<u64>,
    feed: UnboundedSender<Update>,
}

fn inboxes() -> &'static Inboxes<Subscribe> {
    static INBOXES: OnceLock<Inboxes<Subscribe>> = OnceLock::new();
    INBOXES.get_or_init(Default::default)
}

/// Opens shard `index`'s inbox of feed requests (a restarted shard's replaces its predecessor's).
pub fn register(index: usize) -> UnboundedReceiver<Subscribe> {
    inboxes().register(index)
}

/// The shard whose hub watches the member for `key`, out of `shards`.
pub fn home(key: &HubKey, shards: usize) -> usize {
    // SipHash with fixed keys: every shard computes the same home.
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % shards.max(1) as u64) as usize
}

/// Asks `home` for a feed of `key`; None when that shard has no inbox open (then the caller
/// watches the member itself).
pub fn subscribe(
    home: usize,
    key: &HubKey,
    cluster: &Arc<ClusterRoute>,
    caller: Caller,
    from: Option<u64>,
) -> Option<UnboundedReceiver<Update>> {
    let inboxes = inboxes().load();
    let inbox = inboxes.get(home)?.as_ref()?;
    let (feed, updates) = unbounded_channel();
    let asked = Subscribe {
        key: key.clone(),
        cluster: Arc::clone(cluster),
        caller,
        from,
        feed,
    };
    inbox.send(asked).ok()?;
    Some(updates)
}

/// A shard's inbox: each feed asked of it served by a task of its own.
pub async fn receive(ctx: Rc<ShardWatches>, mut inbox: UnboundedReceiver<Subscribe>) {
    while let Some(asked) = inbox.recv().await {
        runtime::spawn(serve_feed(Rc::clone(&ctx), asked));
    }
}

/// Feeds one mirror from this shard's hub for its key (started if there is none) until either
/// ends.
async fn serve_feed(ctx: Rc<ShardWatches>, asked: Subscribe) {
    let Subscribe {
        key,
        cluster,
        caller,
        from,
        feed,
    } = asked;
    let hub = super::hub_for(&ctx, &cluster, &key, caller, from);
    let Some(hub) = hub else {
        let _ = feed.send(Update::End(Phase::Failed));
        return;
    };
    let _joined = hub.join();
    // Ready first: the snapshot is a listed hub's.
    loop {
        let seen = hub.signal.epoch();
        match hub.phase() {
            Phase::Starting => {}
            Phase::Ready => break,
            ended => {
                let _ = feed.send(Update::End(ended));
                return;
            }
        }
        if let First::Right(()) = runtime::race(hub.signal.after(seen), feed.closed()).await {
            return;
        }
    }
    let (mut seq, mut columns_sent, lost_before) = {
        let state = hub.state.borrow();
        // The same events (Arcs), not copies of them.
        if feed
            .send(Update::Snapshot(Box::new(state.clone())))
            .is_err()
        {
            return;
        }
        (state.next_seq(), state.columns.is_some(), state.replay_lost)
    };
    loop {
        let seen = hub.signal.epoch();
        {
            let state = hub.state.borrow();
            if state.phase != Phase::Ready || seq < state.base || state.replay_lost != lost_before {
                // Ended or failed; or (never while this task keeps up) events left the ring
                // before they were sent; or the member could not replay what the mirror holds
                // part of: the mirror ends, its clients watch again.
                let phase = match state.phase {
                    Phase::Ready => Phase::Ended,
                    phase => phase,
                };
                let _ = feed.send(Update::End(phase));
                return;
            }
            if !columns_sent {
                if let Some(columns) = &state.columns {
                    columns_sent = true;
                    if feed.send(Update::Columns(columns.clone())).is_err() {
                        return;
                    }
                }
            }
            while let Some(event) = state.at(seq) {
                if feed.send(Update::Event(Arc::clone(event))).is_err() {
                    return;
                }
                seq += 1;
            }
        }
        if let First::Right(()) = runtime::race(hub.signal.after(seen), feed.closed()).await {
            return;
        }
    }
}
