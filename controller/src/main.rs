//! `cojob`: the operator binary. The controller, sidecar and CRD subcommands arrive with the
//! operator; for now it reports its version.

fn main() {
    println!("cojob {}", env!("CARGO_PKG_VERSION"));
}
