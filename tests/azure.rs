//! Conformance against Azurite on 127.0.0.1 (`COJOB_TEST_AZ_URL`, `AZURE_*`): the same primitive
//! suite as on memory, plus race tests of the server itself.
mod common;
mod conformance;
mod suite;

primitive_suite!(common::Kind::Azure);
server_races!(common::Kind::Azure);
