//! `kubectl-cojob`: the `cojob` command line as a kubectl plugin (`kubectl cojob runs …`).

#[tokio::main]
async fn main() {
    cojob_controller::cli::app::main().await
}
