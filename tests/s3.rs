//! Conformance against a real S3 server on 127.0.0.1 (`COJOB_TEST_S3_URL`, `AWS_*`): the same
//! primitive suite as on memory, plus race tests of the server itself.
mod common;
mod conformance;
mod suite;

primitive_suite!(common::Kind::S3);
server_races!(common::Kind::S3);
