//! A shard's view of the routing table. The config-watcher publishes each new table into one
//! `ArcSwap` shared by every shard; a shard keeps the table it last saw behind an `Rc`, so a
//! request takes its snapshot with one atomic load (has the table changed?) and a non-atomic
//! count, and no shard touches a reference count another shard touches. A request keeps its
//! snapshot for as long as it decides: routing, policy and identity all read the same table.
//! Per shard, never sent across threads; never blocks.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use fleetgate_config_watcher::{RouteTable, SharedTable};

/// One routing table, as a request holds it.
pub type TableSnapshot = Rc<Arc<RouteTable>>;

/// The shard's current table, refreshed from the shared one when it changes.
pub struct ShardTable {
    shared: SharedTable,
    current: RefCell<TableSnapshot>,
}

impl ShardTable {
    pub fn new(shared: SharedTable) -> ShardTable {
        let current = Rc::new(shared.load_full());
        ShardTable {
            shared,
            current: RefCell::new(current),
        }
    }

    /// The table in force now.
    pub fn load(&self) -> TableSnapshot {
        let latest = self.shared.load();
        let mut current = self.current.borrow_mut();
        if !Arc::ptr_eq(&latest, &current) {
            *current = Rc::new(arc_swap::Guard::into_inner(latest));
        }
        current.clone()
    }

    /// The table every shard shares (for the tasks that watch it change).
    pub fn shared(&self) -> &SharedTable {
        &self.shared
    }
}
