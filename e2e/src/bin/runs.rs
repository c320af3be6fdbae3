//! Prints a CoordinatedJob's ticks and runs as recorded in the bucket, as a table:
//!
//!     cargo run -q -p cojob-e2e --bin runs -- [--last N] <bucket-url> <namespace> <name> [uid]
//!
//! One row per tick: its decision (a run, skipped or missed) and the run's lease (epoch,
//! attempt, status, exit code, whether it is still held, pod, node). Store credentials and
//! endpoints come from the environment (`AWS_*`, …), as for the controller. The lease holder,
//! a credential, is never printed.

use anyhow::Context;

const USAGE: &str = "usage: runs [--last N] <bucket-url> <namespace> <name> [uid]";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut last: Option<usize> = None;
    let mut positional = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--last" => {
                let n = args.next().and_then(|n| n.parse().ok());
                last = Some(n.unwrap_or_else(|| usage()));
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            a if a.starts_with('-') => usage(),
            _ => positional.push(arg),
        }
    }
    if !(3..=4).contains(&positional.len()) {
        usage();
    }
    let (url, ns, name) = (&positional[0], &positional[1], &positional[2]);
    let store = cojob::Store::open(url)
        .await
        .with_context(|| format!("opening {url}"))?;
    let mut rows = cojob_e2e::read_runs(&store, ns, name, positional.get(3).map(String::as_str))
        .await
        .with_context(|| format!("reading {ns}/{name} in {url}"))?;
    if rows.is_empty() {
        println!("no ticks or runs of {ns}/{name} under {url} yet");
        return Ok(());
    }
    let total = rows.len();
    if let Some(n) = last.filter(|n| *n < total) {
        rows.drain(..total - n);
        println!("(the last {n} of {total} rows)");
    }
    print!("{}", cojob_e2e::runs_table(&rows));
    Ok(())
}

fn usage() -> ! {
    eprintln!("{USAGE}");
    std::process::exit(2)
}
