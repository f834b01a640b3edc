//! Config objects and routing table.
