//! The command line.
//!
//! - [`app`]: parsing and dispatch of every `cojob` command.
//! - [`operator`]: `cojob controller` and `cojob drain`.
//! - [`target`]: how a command finds its CoordinatedJob (kubeconfig) and its bucket.
//! - [`runs`], [`why`]: a job's history and the reason for one tick's decision, read from the
//!   bucket.
//! - [`ask`]: `trigger`, `cancel`, `suspend` and `resume`, and [`backfill`](mod@backfill),
//!   which ask the controller through the CoordinatedJob (annotations, `spec.suspend`); the
//!   CLI never writes to the bucket.
//! - [`table`]: plain-text tables.

pub mod app;
pub mod ask;
pub mod backfill;
pub mod operator;
pub mod runs;
pub mod table;
pub mod target;
pub mod why;

pub use operator::{
    ControllerArgs, DrainArgs, Forwarded, Redacted, SECRET_NAME_PARTS, controller, drain,
    forwarded_env, looks_secret,
};
