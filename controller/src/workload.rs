//! The workload's side of the sidecar's API ([`crate::sidecar::api`]), for workloads without
//! HTTP code: `cojob step NAME -- cmd…` checkpoints a command, and `cojob api METHOD PATH
//! [BODY]` makes one call. Both run from the copy of this binary in the shared volume
//! (`/var/run/cojob/cojob`) and find the API in `COJOB_API`.

use std::process::Stdio;

use anyhow::Context as _;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

/// The `COJOB_API` value the pod builder gives workload containers.
pub fn api_address() -> String {
    format!(
        "unix:{}/{}",
        crate::pod::SHARED_MOUNT,
        crate::sidecar::api::SOCKET_FILE
    )
}

/// Exit code of `cojob step` and `cojob api` when this attempt's lease is lost (409): the
/// workload must stop and discard its work.
pub const EXIT_FENCED: i32 = 3;
/// The most command output `cojob step` records (more is cut, and marked so).
pub const MAX_OUTPUT: usize = 256 * 1024;

/// Where the API is.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The workload API's address: `unix:<socket path>`.
    #[arg(long, env = "COJOB_API", default_value_t = api_address())]
    api: String,
}

/// Makes one call; returns the status and the JSON body.
pub async fn call(
    api: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> anyhow::Result<(StatusCode, Value)> {
    let socket = api
        .strip_prefix("unix:")
        .with_context(|| format!("COJOB_API {api:?} is not unix:<path>"))?;
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| {
            format!("connecting to the workload API at {socket} (is the cojob sidecar running?)")
        })?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "workload API connection ended");
        }
    });
    let bytes = body.map(|b| b.to_string()).unwrap_or_default();
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "cojob")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&body)}));
    Ok((status, value))
}

/// Arguments of `cojob api`.
#[derive(Debug, clap::Args)]
pub struct CallArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// GET, PUT or POST.
    method: Method,
    /// The call's path, e.g. /v1/run.
    path: String,
    /// The JSON body.
    body: Option<String>,
}

/// `cojob api`: prints the reply; exit 0 on 2xx, [`EXIT_FENCED`] on 409, 1 otherwise.
pub async fn run_call(args: CallArgs) -> anyhow::Result<i32> {
    let body = args
        .body
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .context("the body is not JSON")?;
    let (status, reply) = call(&args.api.api, args.method, &args.path, body).await?;
    println!("{reply}");
    Ok(exit_code(status))
}

fn exit_code(status: StatusCode) -> i32 {
    if status.is_success() {
        0
    } else if status == StatusCode::CONFLICT {
        EXIT_FENCED
    } else {
        1
    }
}

/// Arguments of `cojob step`.
#[derive(Debug, clap::Args)]
pub struct StepArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The step's name, unique within the run.
    name: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `cojob step NAME -- cmd…`: if an earlier attempt of this run completed the step, prints its
/// recorded output and exits 0 without running the command. Otherwise runs it (stdin and
/// stderr pass through, stdout is recorded, up to [`MAX_OUTPUT`] bytes) and, if it exits 0,
/// records the step; a failed command is not recorded, so the next attempt runs it again.
/// Exits with the command's status, or [`EXIT_FENCED`] when this attempt's lease is lost.
pub async fn run_step(args: StepArgs) -> anyhow::Result<i32> {
    crate::sidecar::api::check_step_name(&args.name).map_err(anyhow::Error::msg)?;
    let path = format!("/v1/steps/{}", args.name);
    let (status, stored) = call(&args.api.api, Method::GET, &path, None).await?;
    match status {
        StatusCode::OK => {
            eprintln!(
                "cojob step {}: done by an earlier attempt; not run again",
                args.name
            );
            print_output(&stored["result"]);
            return Ok(0);
        }
        StatusCode::NOT_FOUND => {}
        other => return Ok(refused(&args.name, other, &stored)),
    }
    let (program, rest) = args
        .command
        .split_first()
        .context("no command given after --")?;
    let mut child = tokio::process::Command::new(program)
        .args(rest)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    let mut stdout = child.stdout.take().context("the command's stdout")?;
    let mut output = Vec::new();
    let mut chunk = [0u8; 8192];
    let mut truncated = false;
    loop {
        let n = stdout.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        let room = MAX_OUTPUT.saturating_sub(output.len());
        truncated |= n > room;
        output.extend_from_slice(&chunk[..n.min(room)]);
    }
    let code = child.wait().await?.code().unwrap_or(1);
    let text = String::from_utf8_lossy(&output).into_owned();
    if code != 0 {
        print!("{text}");
        eprintln!(
            "cojob step {}: the command failed (exit {code}); not recorded",
            args.name
        );
        return Ok(code);
    }
    let result = json!({"exit_code": 0, "stdout": text, "truncated": truncated});
    let (status, reply) = call(&args.api.api, Method::POST, &path, Some(result)).await?;
    if !status.is_success() {
        print!("{text}");
        return Ok(refused(&args.name, status, &reply));
    }
    if reply["won"] == json!(false) {
        eprintln!(
            "cojob step {}: an earlier attempt recorded it first; its output follows",
            args.name
        );
    }
    print_output(&reply["result"]);
    Ok(0)
}

fn print_output(result: &Value) {
    if let Some(text) = result.get("stdout").and_then(Value::as_str) {
        print!("{text}");
    }
}

fn refused(name: &str, status: StatusCode, reply: &Value) -> i32 {
    let why = reply.get("error").and_then(Value::as_str).unwrap_or("");
    eprintln!("cojob step {name}: the workload API answered {status}: {why}");
    exit_code(status)
}
