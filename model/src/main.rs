//! Runs the model check of cojob's run protocol, by default with larger bounds than CI's.
//!
//! ```text
//! cargo run -p cojob-model --release -- [--preset release|ci|tiny] [--time N] [--ttl N] [--pending-ttl N]
//!     [--allowance N] [--skew N] [--attempts N] [--epochs N] [--controllers 1|2]
//!     [--cancel | --no-cancel] [--threads N] [--rules NAME] [--base new|proposed]
//!     [--first-counterexample] [--traces]
//! ```
//!
//! `--rules` takes a rule set (`new`, the default, `proposed` or `old`) or a variant that turns
//! one rule off (`--rules help` lists them); a variant applies to `--base` (default `new`).
//! It prints the rules, the bounds, the states explored (with repeats and unique), the
//! verdict on every property and the trace of every counterexample; it exits 1 if a
//! property fails.

use std::process::ExitCode;

use cojob_model::{Bounds, Report, Rules, RunModel, check, refute};

const USAGE: &str = "usage: cojob-model [--preset release|ci|tiny] [--time N] [--ttl N] [--pending-ttl N] \
[--allowance N] [--skew N] [--attempts N] [--epochs N] [--controllers 1|2] [--cancel|--no-cancel] \
[--threads N] [--rules NAME] [--base new|proposed] [--first-counterexample] [--traces]";

fn rule_names() -> String {
    let mut out = String::from("rules (--rules NAME; a variant applies to --base):\n");
    for (name, about) in Rules::NAMES {
        out.push_str(&format!("  {name:27} {about}\n"));
    }
    out
}

struct Options {
    bounds: Bounds,
    rules: Rules,
    base: Rules,
    variant: Option<String>,
    threads: usize,
    first_counterexample: bool,
    traces: bool,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        bounds: Bounds::release(),
        rules: Rules::NEW,
        base: Rules::NEW,
        variant: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        first_counterexample: false,
        traces: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value"))
                .cloned()
        };
        let number = |v: String| -> Result<i64, String> {
            v.parse::<i64>()
                .map_err(|e| format!("{flag}: '{v}' is not a number ({e})"))
        };
        let b = &mut options.bounds;
        match flag.as_str() {
            "--preset" => {
                options.bounds = match value()?.as_str() {
                    "release" => Bounds::release(),
                    "ci" => Bounds::ci(),
                    "tiny" => Bounds::tiny(),
                    other => return Err(format!("unknown preset '{other}'")),
                }
            }
            "--time" => b.max_time = small(number(value()?)?)?,
            "--ttl" => b.ttl = small(number(value()?)?)?,
            "--pending-ttl" => b.pending_ttl = small(number(value()?)?)?,
            "--allowance" => b.allowance = small(number(value()?)?)?,
            "--skew" => b.skew = small(number(value()?)?)?,
            "--attempts" => b.max_attempts = tiny(number(value()?)?)?,
            "--epochs" => b.max_epochs = tiny(number(value()?)?)?,
            "--controllers" => b.controllers = tiny(number(value()?)?)?,
            "--cancel" => b.cancel = true,
            "--no-cancel" => b.cancel = false,
            "--threads" => options.threads = usize::try_from(number(value()?)?).unwrap_or(1),
            "--rules" => {
                let name = value()?;
                if name == "help" {
                    return Err(rule_names());
                }
                match name.as_str() {
                    "new" | "proposed" | "old" => {
                        options.rules = Rules::named(&name).unwrap_or_default();
                        options.variant = None;
                    }
                    _ if Rules::NEW.variant(&name).is_some() => options.variant = Some(name),
                    _ => return Err(format!("unknown rules '{name}'\n{}", rule_names())),
                }
            }
            "--base" => {
                options.base = match value()?.as_str() {
                    "new" => Rules::NEW,
                    "proposed" => Rules::PROPOSED,
                    other => return Err(format!("unknown base '{other}' (new or proposed)")),
                }
            }
            "--first-counterexample" => options.first_counterexample = true,
            "--traces" => options.traces = true,
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    if let Some(name) = &options.variant {
        options.rules = options.base.variant(name).unwrap_or(options.base);
    }
    if options.bounds.pending_ttl < options.bounds.ttl {
        return Err(format!(
            "--pending-ttl {} is shorter than --ttl {}: the controller's is max(ttl, start timeout)",
            options.bounds.pending_ttl, options.bounds.ttl
        ));
    }
    Ok(options)
}

fn small(n: i64) -> Result<i16, String> {
    i16::try_from(n).map_err(|e| format!("{n}: {e}"))
}

fn tiny(n: i64) -> Result<u8, String> {
    u8::try_from(n).map_err(|e| format!("{n}: {e}"))
}

fn print_traces(model: &RunModel, report: &Report, all: bool) {
    for v in &report.verdicts {
        let Some(trace) = &v.trace else { continue };
        if all || !v.holds() {
            println!(
                "\n{} ({}):",
                v.name,
                if v.holds() {
                    "example"
                } else {
                    "counterexample"
                }
            );
            print!("{}", trace.render(model));
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let model = RunModel::new(options.rules, options.bounds);
    println!("threads: {}", options.threads);
    let report = if options.first_counterexample {
        refute(&model, options.threads)
    } else {
        check(&model, options.threads)
    };
    print!("{report}");
    print_traces(&model, &report, options.traces);
    if report.all_hold() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
