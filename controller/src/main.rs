//! `cojob`: the operator, its sidecar and its command line ([`cojob_controller::cli::app`]).

#[tokio::main]
async fn main() {
    cojob_controller::cli::app::main().await
}
