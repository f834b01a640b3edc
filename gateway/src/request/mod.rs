//! What a request is, decided once from its head: the route to a member cluster (`route`).

pub mod route;
