//! The operator's subcommands: `cojob controller` (run the operator) and `cojob drain` (delete
//! every CoordinatedJob and wait for the controller to cancel their runs; the Helm chart runs
//! it before uninstalling).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, ResourceExt};

use crate::context::{Context, Settings};
use crate::crd::CoordinatedJob;
use crate::credentials::{Minter, StsSettings};
use crate::sweeper::holder::HolderKey;

/// A secret argument: parsed as given, never printed by `Debug`.
#[derive(Clone)]
pub struct Redacted(pub String);

impl std::str::FromStr for Redacted {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Redacted(s.to_owned()))
    }
}

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Arguments of `cojob controller`.
#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// The store URL, e.g. s3://bucket/prefix (credentials from the environment).
    #[arg(long, env = "COJOB_BUCKET")]
    pub bucket: String,
    /// The image of the lease sidecar injected into run pods (normally the controller's own).
    #[arg(long, env = "COJOB_SIDECAR_IMAGE")]
    pub sidecar_image: String,
    /// How often the leases of active runs that are not quiet (just dispatched, cancelled,
    /// stopping) are checked; a quiet run's lease is checked when a step may be due (a running
    /// attempt's when it may have expired, a pending one's at the first of its start deadline,
    /// its renewal and a ttl after the last check).
    #[arg(long, env = "COJOB_SWEEP_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,
    /// How far a node's clock may run behind the controller's. A run's lease is taken over
    /// only once the controller's clock passes its deadline by this much, so a pod on a node
    /// whose clock is behind by less is never taken for lost.
    #[arg(long, env = "COJOB_CLOCK_SKEW_ALLOWANCE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub clock_skew_allowance: Duration,
    /// The longest a job with no active run goes without its index being read from the bucket.
    /// Between its ticks such a job has nothing to do, so its passes read nothing while the
    /// bucket answers the controller; this read catches what another writer may have changed.
    #[arg(long, env = "COJOB_INDEX_RESYNC", default_value = "1h", value_parser = humantime::parse_duration)]
    pub index_resync: Duration,
    /// Comma-separated prefixes of environment variables copied into each run's Secret for its
    /// sidecar (the store's endpoint and region). A name that looks secret (it contains KEY,
    /// SECRET, TOKEN, PASSWORD, CREDENTIAL, SAS or CONNECTION_STRING) is withheld unless
    /// `--forward-secret-env` lists it. Empty to copy none.
    #[arg(long, env = "COJOB_FORWARD_ENV", default_value = "AWS_,AZURE_,GOOGLE_")]
    pub forward_env: String,
    /// Comma-separated names of secret-looking variables to forward anyway (for example
    /// `AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY`). Whoever may create pods in a job's
    /// namespace can read them from the run's Secret, so use it only when one tenant owns
    /// every watched namespace; otherwise give each namespace its own scoped credentials with
    /// `--sidecar-credentials-secret`.
    #[arg(long, env = "COJOB_FORWARD_SECRET_ENV", default_value = "")]
    pub forward_secret_env: String,
    /// The name of a Secret that each run's namespace provides with the sidecar's store
    /// credentials (scoped to that namespace's jobs). Use it with `--forward-env ""` so the
    /// controller's own credentials never leave its namespace.
    #[arg(long, env = "COJOB_SIDECAR_CREDENTIALS_SECRET")]
    pub sidecar_credentials_secret: Option<String>,
    /// The shortest interval between two ticks that a job's schedule may have; a schedule
    /// that fires more often is `InvalidSpec`. Bounds the load one tenant can cause.
    #[arg(long, env = "COJOB_MIN_SCHEDULE_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub min_schedule_interval: Duration,
    /// The shortest lease ttl a job may ask for (`lease.ttlSeconds`; the CRD's own minimum is
    /// 6 s); a shorter one is `InvalidSpec`. Each active run costs a renewal every ttl/3.
    #[arg(long, env = "COJOB_MIN_LEASE_TTL", default_value = "6s", value_parser = humantime::parse_duration)]
    pub min_lease_ttl: Duration,
    /// How long a job's pass waits for more of its events (trailing edge): the burst of pod
    /// events around a run's start and end then costs one pass, not one each. Passes due at a
    /// tick start on time: their requeue is shortened by as much.
    #[arg(long, env = "COJOB_RECONCILE_DEBOUNCE", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub reconcile_debounce: Duration,
    /// How many CoordinatedJobs are reconciled at once, at most (one object is never
    /// reconciled twice at the same time); passes take their turns in the order they came due
    /// ([`crate::reconcile::Turns`]).
    #[arg(long, env = "COJOB_MAX_CONCURRENT_RECONCILES", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_reconciles: u16,
    /// The key lease holders are derived under: at least 32 random bytes, the same for every
    /// replica (the chart keeps it in a Secret of the controller's namespace). Holders are
    /// never stored where the controller reads them back, so it needs no read access to
    /// Secrets. Changing it costs the runs in flight one takeover each.
    #[arg(long, env = "COJOB_HOLDER_KEY", hide_env_values = true)]
    pub holder_key: Redacted,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "COJOB_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served. Port 0 picks a free port and
    /// logs it (several replicas on one host network).
    #[arg(long, env = "COJOB_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: std::net::SocketAddr,
    /// This replica's name, for Events (the pod name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    pub instance: Option<String>,
    /// Reconcile only while this replica holds the leader lease in the bucket
    /// (`v1/controller/leader`); the other replicas stand by. Correctness never depends on it
    /// (any number of controllers may reconcile at once): it only removes duplicate work.
    #[arg(long, env = "COJOB_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The leader lease's ttl: a leader that crashed is replaced within about this long. It is
    /// renewed every third of it, and a standby asks for it every 2 s.
    #[arg(long, env = "COJOB_LEADER_LEASE_TTL", default_value = "15s", value_parser = humantime::parse_duration)]
    pub leader_lease_ttl: Duration,
    /// Mint each attempt's store credentials with STS AssumeRole on this role, with a session
    /// policy that opens only the run's folder (s3:// stores only). The holder Secret then
    /// carries those, and no tenant sees a credential that opens more than one run. Not with
    /// `--sidecar-credentials-secret`.
    #[arg(long, env = "COJOB_STS_ROLE_ARN")]
    pub sts_role_arn: Option<String>,
    /// The STS endpoint (default: AWS's, for the region in AWS_REGION). For MinIO, its S3
    /// endpoint.
    #[arg(long, env = "COJOB_STS_ENDPOINT")]
    pub sts_endpoint: Option<String>,
    /// How long each set of minted credentials lasts (15 minutes at least; within the role's
    /// maximum session duration). The controller mints the next set at half of it, while the
    /// run lasts.
    #[arg(long, env = "COJOB_STS_DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    pub sts_duration: Duration,
}

/// The minter of `--sts-role-arn`, if any; refuses settings that would not work.
fn minter(args: &ControllerArgs) -> anyhow::Result<Option<Arc<Minter>>> {
    let Some(role_arn) = args.sts_role_arn.clone().filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    if args
        .sidecar_credentials_secret
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        anyhow::bail!(
            "refusing to start: --sts-role-arn and --sidecar-credentials-secret both give sidecars \
             credentials; choose one"
        );
    }
    if args.sts_duration < crate::credentials::MIN_DURATION {
        anyhow::bail!(
            "refusing to start: --sts-duration {:?} is under STS's minimum of 15 minutes",
            args.sts_duration
        );
    }
    let region = ["AWS_REGION", "AWS_DEFAULT_REGION"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|r| !r.is_empty()))
        .unwrap_or_else(|| "us-east-1".into());
    let sts = StsSettings {
        role_arn,
        endpoint: args.sts_endpoint.clone().filter(|e| !e.is_empty()),
        region,
        duration: args.sts_duration,
    };
    let m = Minter::new(&args.bucket, sts).context("refusing to start: --sts-role-arn")?;
    Ok(Some(Arc::new(m)))
}

/// Parts of a variable's name that mark it as a secret, which is never forwarded by default.
pub const SECRET_NAME_PARTS: [&str; 7] = [
    "KEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "CREDENTIAL",
    "SAS",
    "CONNECTION_STRING",
];

/// True when `name` looks like it holds a secret.
///
/// ```
/// use cojob_controller::cli::looks_secret;
/// assert!(looks_secret("AWS_SECRET_ACCESS_KEY") && looks_secret("AWS_ACCESS_KEY_ID"));
/// assert!(looks_secret("AZURE_STORAGE_SAS_TOKEN") && looks_secret("aws_session_token"));
/// assert!(!looks_secret("AWS_REGION") && !looks_secret("AWS_ENDPOINT_URL"));
/// ```
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_NAME_PARTS.iter().any(|part| upper.contains(part))
}

/// Environment to forward to sidecars, and the names withheld because they look secret.
#[derive(Debug, Default, PartialEq)]
pub struct Forwarded {
    /// Forwarded, by name.
    pub env: BTreeMap<String, String>,
    /// Matched a prefix but look secret and were not allowed ([`looks_secret`]).
    pub withheld: Vec<String>,
}

/// The variables of `env` whose names start with one of the comma-separated `prefixes`,
/// except those that look secret ([`looks_secret`]) and are not named in the comma-separated
/// `allowed_secrets`.
///
/// ```
/// let env = [("AWS_REGION", "eu"), ("AWS_SECRET_ACCESS_KEY", "s"), ("HOME", "/")]
///     .map(|(k, v)| (k.to_string(), v.to_string()));
/// let kept = cojob_controller::cli::forwarded_env("AWS_, AZURE_", "", env.clone());
/// assert_eq!(kept.env.keys().collect::<Vec<_>>(), ["AWS_REGION"]);
/// assert_eq!(kept.withheld, ["AWS_SECRET_ACCESS_KEY"]);
/// let all = cojob_controller::cli::forwarded_env("AWS_", "AWS_SECRET_ACCESS_KEY", env);
/// assert_eq!(all.env.len(), 2);
/// ```
pub fn forwarded_env(
    prefixes: &str,
    allowed_secrets: &str,
    env: impl IntoIterator<Item = (String, String)>,
) -> Forwarded {
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (prefixes, allowed) = (list(prefixes), list(allowed_secrets));
    let mut out = Forwarded::default();
    for (k, v) in env {
        if !prefixes.iter().any(|p| k.starts_with(p.as_str())) {
            continue;
        }
        if looks_secret(&k) && !allowed.contains(&k) {
            out.withheld.push(k);
        } else {
            out.env.insert(k, v);
        }
    }
    out.withheld.sort();
    out
}

/// Why the controller will not start on `bucket`, in the words a user can act on, with the
/// store's error (its reply, without the raw body) as the cause.
fn refusal(bucket: &str, err: cojob::StoreError) -> anyhow::Error {
    use cojob::StoreError;
    let why = match &err {
        StoreError::NoConditionalWrites { .. } => "it does not honour conditional writes",
        StoreError::NoSuchBucket { .. } => "the bucket does not exist",
        StoreError::AccessDenied { .. } => {
            "the store refused the credentials (check the credentials Secret or the AWS_*, \
             AZURE_* or GOOGLE_* variables)"
        }
        StoreError::Unavailable { .. } => "the store cannot be reached",
        _ => "its start-up check failed",
    };
    anyhow::Error::new(err).context(format!("refusing to start on {bucket}: {why}"))
}

/// Runs the operator until SIGTERM: checks that the bucket honours conditional writes (fails
/// closed otherwise), then reconciles.
pub async fn controller(args: ControllerArgs) -> anyhow::Result<()> {
    let holder_key = HolderKey::new(args.holder_key.0.as_bytes())
        .context("refusing to start: COJOB_HOLDER_KEY (--holder-key) is too short")?;
    if args.leader_elect && args.leader_lease_ttl < Duration::from_secs(3) {
        anyhow::bail!(
            "refusing to start: --leader-lease-ttl {:?} is under 3 s (a leader renews every third of it)",
            args.leader_lease_ttl
        );
    }
    let minter = minter(&args)?;
    let db = cojob::Db::open(&args.bucket)
        .await
        .with_context(|| format!("opening the store {}", args.bucket))?;
    db.store()
        .verify_conditional_writes()
        .await
        .map_err(|e| refusal(&args.bucket, e))?;
    let metrics = Arc::new(crate::metrics::Metrics::new(db.store().clone()));
    let config = kube::Config::infer()
        .await
        .context("finding the Kubernetes API (in-cluster, or KUBECONFIG)")?;
    let client = kube::client::ClientBuilder::try_from(config)
        .context("connecting to the Kubernetes API")?
        .with_layer(&metrics.kube_requests().layer())
        .build();
    let reporter = Reporter {
        controller: "cojob-controller".into(),
        instance: args.instance.clone(),
    };
    let forwarded = forwarded_env(
        &args.forward_env,
        &args.forward_secret_env,
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
    );
    if !forwarded.withheld.is_empty() {
        tracing::info!(
            withheld = ?forwarded.withheld,
            "not forwarding these variables to run pods, since their names look secret; give \
             sidecars credentials with --sidecar-credentials-secret (scoped to each namespace), \
             or list them in --forward-secret-env (only where one tenant owns every namespace)"
        );
    }
    let settings = Settings {
        sidecar_image: args.sidecar_image,
        bucket: args.bucket,
        forwarded_env: forwarded.env,
        sweep_interval: args.sweep_interval,
        clock_skew_allowance: args.clock_skew_allowance,
        index_resync: args.index_resync,
        sidecar_credentials_secret: args.sidecar_credentials_secret.filter(|s| !s.is_empty()),
        holder_key,
        min_schedule_interval: args.min_schedule_interval,
        min_lease_ttl: args.min_lease_ttl,
        debounce: args.reconcile_debounce,
        minter,
    };
    tracing::info!(?settings, namespace = ?args.namespace, "starting the cojob controller");
    crate::metrics::serve(args.metrics_addr, metrics.clone())
        .await
        .with_context(|| format!("serving metrics on {}", args.metrics_addr))?;
    let cx = Arc::new(Context {
        run_events: crate::announce::RunEvents::new(client.clone(), reporter.clone()),
        recorder: Recorder::new(client.clone(), reporter),
        skipped: Default::default(),
        renewals: Default::default(),
        pod_cache: Default::default(),
        retries: Default::default(),
        focus: Default::default(),
        client,
        db,
        settings,
        metrics,
    });
    // Reports this controller's clock skew against the store's (log and Event), now and
    // every few minutes; it ends with the process.
    let skew = tokio::spawn(crate::skew::watch(
        cx.db.store().clone(),
        cx.settings.clock_skew_allowance,
        crate::skew::Reporter::new(cx.recorder.clone()),
    ));
    let namespace = args.namespace.as_deref();
    let reconcile = || crate::reconcile::run(cx.clone(), namespace, args.max_concurrent_reconciles);
    let result = if args.leader_elect {
        let mut election = crate::leader::Election::new(
            args.instance
                .clone()
                .unwrap_or_else(|| "cojob-controller".into()),
        );
        election.ttl = args.leader_lease_ttl;
        crate::leader::lead(&cx.db, &election, &cx.metrics, shutdown_signal(), reconcile).await
    } else {
        cx.metrics.set_leader(true);
        reconcile().await
    };
    skew.abort();
    result
        .context("watching CoordinatedJobs (is the CRD installed and may this account list it?)")?;
    tracing::info!("controller stopped");
    Ok(())
}

/// Completes at SIGTERM or SIGINT (the controller's own watch stops on them too).
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// Arguments of `cojob drain`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    /// Drain only this namespace (default: all namespaces).
    #[arg(long, env = "COJOB_WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// How long to wait for the objects to go.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// How many CoordinatedJobs one list request of `cojob drain` asks for.
pub const DRAIN_PAGE: u32 = 500;

/// Every CoordinatedJob that `api` sees, as `(namespace, name, being deleted)`: their metadata
/// only, `page` at a time, so the drain's memory does not grow with the jobs' specs and
/// statuses (at 10 000 jobs one list of the whole objects took more than the hook's 128 MiB).
/// `None` without the CRD.
pub async fn list_for_drain(
    api: &Api<CoordinatedJob>,
    page: u32,
) -> anyhow::Result<Option<Vec<(String, String, bool)>>> {
    let mut jobs = Vec::new();
    let size = page.max(1);
    let mut page = ListParams::default().limit(size);
    loop {
        let list = match api.list_metadata(&page).await {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(e).context("listing CoordinatedJobs"),
        };
        jobs.extend(list.items.into_iter().map(|j| {
            let deleting = j.metadata.deletion_timestamp.is_some();
            (j.namespace().unwrap_or_default(), j.name_any(), deleting)
        }));
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => page = ListParams::default().limit(size).continue_token(&next),
            None => return Ok(Some(jobs)),
        }
    }
}

/// Deletes every CoordinatedJob (in every namespace, or in `--namespace`) and waits until they
/// are gone (their finalizers cancel active runs), so that uninstalling leaves nothing behind.
/// A missing CRD means there is nothing to drain.
pub async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let api: Api<CoordinatedJob> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let Some(jobs) = list_for_drain(&api, DRAIN_PAGE).await? else {
            println!("no CoordinatedJob CRD: nothing to drain");
            return Ok(());
        };
        if jobs.is_empty() {
            println!("every CoordinatedJob is gone");
            return Ok(());
        }
        // Objects created while draining are deleted too.
        for (ns, name, _) in jobs.iter().filter(|(_, _, deleting)| !deleting) {
            let namespaced: Api<CoordinatedJob> = Api::namespaced(client.clone(), ns);
            match namespaced.delete(name, &DeleteParams::default()).await {
                Ok(_) => println!("deleting {ns}/{name}"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).context("deleting a CoordinatedJob"),
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let shown: Vec<String> = jobs
                .iter()
                .take(20)
                .map(|(ns, name, _)| format!("{ns}/{name}"))
                .collect();
            anyhow::bail!(
                "timed out after {:?}; {} still present: {}{}",
                args.timeout,
                jobs.len(),
                shown.join(", "),
                if jobs.len() > shown.len() {
                    ", …"
                } else {
                    ""
                }
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
