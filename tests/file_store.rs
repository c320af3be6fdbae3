//! The primitive suite on the local-directory store (`file://`).
mod common;
mod suite;

primitive_suite!(common::Kind::File);
