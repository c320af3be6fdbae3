//! The primitive suite on the in-memory store.
mod common;
mod suite;

primitive_suite!(common::Kind::Memory);
