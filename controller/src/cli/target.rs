//! How a command finds its CoordinatedJob (through the kubeconfig, as kubectl does) and the
//! bucket the controller keeps its decisions in.

use anyhow::Context as _;
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::crd::CoordinatedJob;
use crate::layout::JobKeys;

/// Which CoordinatedJob a command is about.
#[derive(Debug, Clone, clap::Args)]
pub struct JobArgs {
    /// The CoordinatedJob: NAMESPACE/NAME, or NAME in the namespace of --namespace (or of the
    /// kubeconfig's context).
    #[arg(value_name = "[NAMESPACE/]NAME")]
    pub job: String,
    /// The namespace, when the job is given without one.
    #[arg(short, long)]
    pub namespace: Option<String>,
}

/// Where the controller keeps its decisions; read only. Credentials and endpoints come from
/// the environment (`AWS_*`, `AZURE_*`, `GOOGLE_*`), as for the controller.
#[derive(Debug, Clone, clap::Args)]
pub struct BucketArgs {
    /// The controller's store URL, e.g. s3://bucket/prefix (the chart's `bucket` value).
    #[arg(long, env = "COJOB_BUCKET")]
    pub bucket: String,
}

/// A resolved CoordinatedJob: its API and name.
pub struct Target {
    /// The job's namespace.
    pub namespace: String,
    /// The job's name.
    pub name: String,
    /// The CoordinatedJob API of the namespace.
    pub api: Api<CoordinatedJob>,
}

impl JobArgs {
    /// Splits `[NAMESPACE/]NAME` and connects with the kubeconfig (or in-cluster config).
    pub async fn resolve(&self) -> anyhow::Result<Target> {
        let client = Client::try_default()
            .await
            .context("connecting to the cluster (kubeconfig or in-cluster configuration)")?;
        let (namespace, name) = split_job(
            &self.job,
            self.namespace.as_deref(),
            client.default_namespace(),
        )?;
        Ok(Target {
            api: Api::namespaced(client, &namespace),
            namespace,
            name,
        })
    }
}

/// Splits `[NAMESPACE/]NAME`: the namespace in the argument wins; one also given with
/// `--namespace` must agree.
///
/// ```
/// use cojob_controller::cli::target::split_job;
/// assert_eq!(split_job("prod/nightly", None, "default").unwrap(), ("prod".into(), "nightly".into()));
/// assert_eq!(split_job("nightly", Some("prod"), "default").unwrap(), ("prod".into(), "nightly".into()));
/// assert_eq!(split_job("nightly", None, "default").unwrap(), ("default".into(), "nightly".into()));
/// assert!(split_job("prod/nightly", Some("dev"), "default").is_err());
/// assert!(split_job("a/b/c", None, "default").is_err());
/// ```
pub fn split_job(
    job: &str,
    flag: Option<&str>,
    context_default: &str,
) -> anyhow::Result<(String, String)> {
    let (namespace, name) = match job.split_once('/') {
        Some((ns, name)) => {
            if let Some(flag) = flag.filter(|f| *f != ns) {
                anyhow::bail!("{job:?} is in namespace {ns}, but --namespace says {flag}");
            }
            (ns.to_string(), name.to_string())
        }
        None => (flag.unwrap_or(context_default).to_string(), job.to_string()),
    };
    if namespace.is_empty() || name.is_empty() || name.contains('/') {
        anyhow::bail!("{job:?} is not NAMESPACE/NAME or NAME");
    }
    Ok((namespace, name))
}

impl Target {
    /// `namespace/name`, for messages.
    pub fn display(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The CoordinatedJob as stored now; a clear error when there is none.
    pub async fn get(&self) -> anyhow::Result<CoordinatedJob> {
        self.api
            .get_opt(&self.name)
            .await
            .with_context(|| format!("reading CoordinatedJob {}", self.display()))?
            .with_context(|| format!("there is no CoordinatedJob {}", self.display()))
    }

    /// The bucket keys of `job` (they include its UID).
    pub fn keys(&self, job: &CoordinatedJob) -> anyhow::Result<JobKeys> {
        let uid = job
            .uid()
            .with_context(|| format!("CoordinatedJob {} has no UID", self.display()))?;
        Ok(JobKeys::new(&self.namespace, &self.name, &uid))
    }
}

impl BucketArgs {
    /// Opens the bucket.
    pub async fn open(&self) -> anyhow::Result<cojob::Db> {
        let store = cojob::Store::open(&self.bucket)
            .await
            .with_context(|| format!("opening the bucket {}", self.bucket))?;
        Ok(cojob::Db::new(store))
    }
}
