//! `cojob`: the operator, its sidecar and its command line ([`cojob_controller::cli::app`]).

/// jemalloc, with a background thread that returns freed pages to the system 10 s after they
/// were freed. glibc's malloc keeps them: after the controller's start-up burst over 10 000
/// jobs it held 141 MiB resident against 104 to 108 MiB with jemalloc (docs/benchmarks.md).
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() {
    cojob_controller::cli::app::main().await
}
