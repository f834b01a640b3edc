//! fleetgate data plane.
