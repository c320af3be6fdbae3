//! Conformance against MinIO on 127.0.0.1 (`COJOB_TEST_MINIO_*`, from `ci/test-servers`): the
//! same primitive suite as on memory and versitygw, plus race tests of the server itself. MinIO
//! is the S3 server of the kind path (`e2e/kind/`) and the one most self-hosted users run.
mod common;
mod conformance;
mod suite;

primitive_suite!(common::Kind::Minio);
server_races!(common::Kind::Minio);
