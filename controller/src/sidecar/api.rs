//! The workload API: HTTP/1.1 on a Unix socket in the pod's shared volume, served by the
//! sidecar. Workload containers find it in `COJOB_API` (`unix:/var/run/cojob/api.sock`).
//!
//! A socket file, not a TCP port: run pods may use the host network, where a port could
//! collide with another pod's on the node and would be reachable by every process there. The
//! socket is private to the pod's containers.
//!
//! | call | what |
//! |---|---|
//! | `GET /v1/run` | the run's identity: run id, epoch, attempt, lease key, fire time, whether a cancel was requested, the progress, whether the lease was lost |
//! | `PUT /v1/progress` | merges a JSON object into the run's `progress` (in the lease state, so `cojob runs -o json` shows it) |
//! | `GET /v1/steps/{name}` | a step's stored result, or 404 |
//! | `POST /v1/steps/{name}` | stores a step's result (any JSON) once per run: a claim at `runs/<run>/steps/<name>`. Returns `{"won", "result"}`, the first stored result; a respawned attempt gets it back |
//! | `POST /v1/fence` | `{"token": N}`: 200 while N is the lease's current epoch and this attempt holds it, else 409 |
//!
//! Every call is fenced by this attempt's epoch: writes go through the sidecar's lease handle
//! (a compare-and-swap guarded by the epoch and holder), and once the lease is lost every call
//! but `GET /v1/run` answers 409 Conflict. Bodies are at most [`MAX_BODY`] bytes (413).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cojob::{Db, Lease};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// The socket's file name in the shared volume.
pub const SOCKET_FILE: &str = "api.sock";
/// The largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// What the handlers share with the sidecar's renewal loop.
pub struct Shared {
    /// The lease of this attempt; the renewal loop and the handlers take turns.
    pub lease: Arc<Mutex<Lease>>,
    /// The bucket.
    pub db: Db,
    /// The run's folder (the lease key without `/lease`).
    pub run_folder: String,
    /// This attempt's epoch.
    pub epoch: u64,
    /// The lease key.
    pub lease_key: String,
    /// Set once the lease is lost: every call but `GET /v1/run` is refused.
    pub lost: AtomicBool,
}

/// Checks a step name: 1 to 128 letters, digits, `-`, `_` and `.`, beginning and ending with a
/// letter or digit.
///
/// ```
/// use cojob_controller::sidecar::api::check_step_name;
/// assert!(check_step_name("load-2026.08").is_ok());
/// assert!(check_step_name("a/b").is_err() && check_step_name("").is_err() && check_step_name(".x").is_err());
/// ```
pub fn check_step_name(name: &str) -> Result<(), String> {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if name.len() > 128 || !chars || !edge(name.chars().next()) || !edge(name.chars().last()) {
        return Err(format!(
            "step name {name:?} must be 1 to 128 letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// Binds the socket in `dir` (replacing a stale one) and serves until the task is dropped.
pub fn serve(dir: &Path, shared: Arc<Shared>) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use std::os::unix::fs::PermissionsExt;
    let path: PathBuf = dir.join(SOCKET_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(&path)?;
    // Workload containers may run as another user; only the pod's containers see the volume.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    tracing::info!(socket = %path.display(), "serving the workload API");
    Ok(tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "workload API: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(req, &shared).await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await
                {
                    tracing::debug!(error = %e, "workload API connection ended");
                }
            });
        }
    }))
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    reply(status, json!({"error": message.into()}))
}

/// Reads a JSON body of at most [`MAX_BODY`] bytes.
async fn json_body(req: Request<Incoming>) -> Result<Value, Response<Full<Bytes>>> {
    let bytes = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|_| {
            error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {MAX_BODY} bytes, or could not be read"),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not JSON: {e}"),
        )
    })
}

/// What a failed store call becomes: 409 once the lease is lost, 413 for a value over the
/// document limit, 503 otherwise.
fn store_error(shared: &Shared, e: &cojob::Error) -> Response<Full<Bytes>> {
    if e.is_lease_lost() {
        shared.lost.store(true, Ordering::SeqCst);
        return error(
            StatusCode::CONFLICT,
            format!("this attempt's lease is lost: {e}"),
        );
    }
    if matches!(e, cojob::Error::TooLarge { .. }) {
        return error(StatusCode::PAYLOAD_TOO_LARGE, e.to_string());
    }
    tracing::warn!(error = %e, "workload API: the store failed");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("the store failed: {e}"),
    )
}

async fn handle(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let lost = shared.lost.load(Ordering::SeqCst);
    if lost && !(method == Method::GET && path == "/v1/run") {
        return error(
            StatusCode::CONFLICT,
            "this attempt's lease is lost; discard its work",
        );
    }
    match (method, path.as_str()) {
        (Method::GET, "/v1/run") => run(shared).await,
        (Method::PUT, "/v1/progress") => progress(req, shared).await,
        (Method::POST, "/v1/fence") => fence(req, shared).await,
        (method, p) if p.starts_with("/v1/steps/") => {
            let name = &p["/v1/steps/".len()..];
            if let Err(why) = check_step_name(name) {
                return error(StatusCode::BAD_REQUEST, why);
            }
            let key = format!("{}/steps/{name}", shared.run_folder);
            match method {
                Method::GET => get_step(shared, &key, name).await,
                Method::POST => put_step(req, shared, &key, name).await,
                _ => error(StatusCode::METHOD_NOT_ALLOWED, "use GET or POST"),
            }
        }
        (_, "/v1/run" | "/v1/progress" | "/v1/fence") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "see the workload API's calls",
        ),
        _ => error(StatusCode::NOT_FOUND, format!("no such call: {path}")),
    }
}

async fn run(shared: &Shared) -> Response<Full<Bytes>> {
    let lease = shared.lease.lock().await;
    let state = lease.state();
    reply(
        StatusCode::OK,
        json!({
            "run_id": state.get("run_id"),
            "epoch": shared.epoch,
            "attempt": state.get("attempt"),
            "lease_key": shared.lease_key,
            "fire_time": state.get("fire_time"),
            "deadline": cojob::json::format_time(lease.deadline()),
            "cancel_requested": state.get("cancel_requested").and_then(Value::as_bool).unwrap_or(false),
            "progress": state.get("progress").cloned().unwrap_or_else(|| json!({})),
            "lease_lost": shared.lost.load(Ordering::SeqCst),
        }),
    )
}

async fn progress(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let patch = match json_body(req).await {
        Ok(Value::Object(p)) => Value::Object(p),
        Ok(_) => return error(StatusCode::BAD_REQUEST, "progress must be a JSON object"),
        Err(response) => return response,
    };
    let mut lease = shared.lease.lock().await;
    let result = lease
        .update_state(|s| {
            let merged =
                cojob::lease::merge(s.get("progress").unwrap_or(&Value::Null), patch.clone());
            cojob::lease::merge(s, json!({"progress": merged}))
        })
        .await;
    match result {
        Ok(()) => reply(
            StatusCode::OK,
            json!({"progress": lease.state().get("progress")}),
        ),
        Err(e) => store_error(shared, &e),
    }
}

async fn fence(req: Request<Incoming>, shared: &Shared) -> Response<Full<Bytes>> {
    let token = match json_body(req).await {
        Ok(body) => match body.get("token").and_then(Value::as_u64) {
            Some(t) => t,
            None => return error(StatusCode::BAD_REQUEST, r#"expected {"token": <epoch>}"#),
        },
        Err(response) => return response,
    };
    // A fresh read: the answer must not come from this sidecar's memory.
    let stored = match shared.db.inspect_lease(&shared.lease_key).await {
        Ok(stored) => stored,
        Err(e) => return store_error(shared, &e),
    };
    let holder = shared.lease.lock().await.holder().to_string();
    let current = stored.as_ref().map(|l| l.epoch);
    let ours = stored.as_ref().is_some_and(|l| l.is_held_by(&holder));
    if Some(token) == current && token == shared.epoch && ours {
        reply(StatusCode::OK, json!({"token": token, "current": true}))
    } else {
        if current != Some(shared.epoch) || !ours {
            shared.lost.store(true, Ordering::SeqCst);
        }
        reply(
            StatusCode::CONFLICT,
            json!({"token": token, "current": false, "epoch": current}),
        )
    }
}

async fn get_step(shared: &Shared, key: &str, name: &str) -> Response<Full<Bytes>> {
    match shared.db.store().get(key).await {
        Ok(Some((body, _))) => match serde_json::from_slice::<Value>(&body) {
            Ok(result) => reply(StatusCode::OK, json!({"step": name, "result": result})),
            Err(e) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("step {name}: the stored result is not JSON: {e}"),
            ),
        },
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            format!("step {name} has no result yet"),
        ),
        Err(e) => store_error(shared, &cojob::Error::Store(e)),
    }
}

async fn put_step(
    req: Request<Incoming>,
    shared: &Shared,
    key: &str,
    name: &str,
) -> Response<Full<Bytes>> {
    let result = match json_body(req).await {
        Ok(v) => v,
        Err(response) => return response,
    };
    // Fenced: only the current holder of this epoch records a step (a renewal is the proof).
    if let Err(e) = shared.lease.lock().await.renew().await {
        return store_error(shared, &e);
    }
    match shared.db.claim(key, &result).await {
        Ok(claim) => {
            if claim.won {
                tracing::info!(step = name, "step recorded");
            }
            reply(
                StatusCode::OK,
                json!({"step": name, "won": claim.won, "result": claim.value}),
            )
        }
        Err(e) => store_error(shared, &e),
    }
}
