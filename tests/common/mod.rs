//! Test rigs shared by the primitive suite: one per backend, plus race injection.
#![allow(dead_code)]

use async_trait::async_trait;
use bytes::Bytes;
use cojob::clock::FakeClock;
use cojob::store::{Backend, DirBackend, ObjectStoreBackend, StoredObject};
use cojob::{Db, PutMode, PutOutcome, Store, StoreError};
use futures::future::BoxFuture;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// An action a rival runs just before the next request of the code under test.
pub type Hook = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// How the backend misreports the outcome of the next put, after the write has landed.
#[derive(Debug, Clone, Copy)]
pub enum Lie {
    /// Report a lost race, like a retried request that met its own first attempt.
    Conflict,
    /// Report a failure, like a timeout after the server applied the write.
    Error,
}

/// A backend that injects races: queued hooks run before the next put or get, and queued lies
/// misreport a put that landed.
#[derive(Debug)]
pub struct RaceBackend {
    inner: Arc<dyn Backend>,
    hooks: Mutex<Hooks>,
}

#[derive(Default)]
struct Hooks {
    before_put: VecDeque<Hook>,
    before_get: VecDeque<Hook>,
    lies: VecDeque<Lie>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hooks")
    }
}

impl RaceBackend {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        RaceBackend {
            inner,
            hooks: Mutex::default(),
        }
    }

    /// Runs `f` just before the next put.
    pub fn before_next_put<F, Fut>(&self, f: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let hook: Hook = Box::new(move || Box::pin(f()));
        self.hooks.lock().unwrap().before_put.push_back(hook);
    }

    /// Runs `f` just before the next get.
    pub fn before_next_get<F, Fut>(&self, f: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let hook: Hook = Box::new(move || Box::pin(f()));
        self.hooks.lock().unwrap().before_get.push_back(hook);
    }

    /// Makes the next put land, then report `lie`.
    pub fn lie_on_next_put(&self, lie: Lie) {
        self.hooks.lock().unwrap().lies.push_back(lie);
    }

    pub fn pending_hooks(&self) -> usize {
        let h = self.hooks.lock().unwrap();
        h.before_put.len() + h.before_get.len() + h.lies.len()
    }
}

#[async_trait]
impl Backend for RaceBackend {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        let hook = self.hooks.lock().unwrap().before_get.pop_front();
        if let Some(hook) = hook {
            hook().await;
        }
        self.inner.get(key).await
    }

    async fn put(
        &self,
        key: &str,
        body: Bytes,
        mode: &PutMode,
        token: &str,
    ) -> Result<PutOutcome, StoreError> {
        let hook = self.hooks.lock().unwrap().before_put.pop_front();
        if let Some(hook) = hook {
            hook().await;
        }
        let outcome = self.inner.put(key, body, mode, token).await?;
        let lie = self.hooks.lock().unwrap().lies.pop_front();
        match (lie, outcome) {
            (Some(Lie::Conflict), PutOutcome::Written(_)) => Ok(PutOutcome::Conflict(None)),
            (Some(Lie::Error), PutOutcome::Written(_)) => Err(StoreError::Unavailable {
                op: cojob::error::Op::PutIfMatch,
                key: key.to_string(),
                source: "injected timeout after the write landed".into(),
            }),
            (_, outcome) => Ok(outcome),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix).await
    }
}

/// Which store a rig runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    File,
    S3,
    Azure,
    /// MinIO (`COJOB_TEST_MINIO_*`), the S3 server of the kind path and of STS.
    Minio,
}

/// The code under test (`db`, through race injection) and a rival (`rival`, direct) on the same
/// store, sharing one fake clock.
pub struct Rig {
    pub kind: Kind,
    pub db: Db,
    pub rival: Db,
    pub race: Arc<RaceBackend>,
    pub clock: FakeClock,
    /// A raw store on the same prefix, for inspecting and planting objects.
    pub raw: Store,
    _dir: Option<tempfile::TempDir>,
}

/// A fresh key prefix, so that runs and tests sharing a server never collide.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        cojob::new_holder()[..12].replace(['-', '_'], "x")
    )
}

/// The URL of a required test server, or a panic that says how to start it.
pub fn required_env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: this test needs the local test servers. Run `ci/test-servers up` \
             and `source .test-servers/env`, or run every test with `ci/test`."
        )
    })
}

impl Rig {
    pub async fn new(kind: Kind) -> Rig {
        let (inner, prefix, dir): (Arc<dyn Backend>, String, Option<tempfile::TempDir>) = match kind
        {
            Kind::Memory => (
                Arc::new(ObjectStoreBackend::new(Arc::new(
                    object_store::memory::InMemory::new(),
                ))),
                String::new(),
                None,
            ),
            Kind::File => {
                let dir = tempfile::tempdir().unwrap();
                let backend = DirBackend::open(dir.path()).await.unwrap();
                (Arc::new(backend), String::new(), Some(dir))
            }
            Kind::S3 | Kind::Azure => {
                let var = if kind == Kind::S3 {
                    "COJOB_TEST_S3_URL"
                } else {
                    "COJOB_TEST_AZ_URL"
                };
                let url = url::Url::parse(&required_env(var)).unwrap();
                let (backend, base) = ObjectStoreBackend::from_url(&url).unwrap();
                let prefix = if base.is_empty() {
                    unique("suite")
                } else {
                    format!("{base}/{}", unique("suite"))
                };
                (Arc::new(backend), prefix, None)
            }
            Kind::Minio => {
                // Built from its own variables: `AWS_*` name the other S3 server.
                let s3 = object_store::aws::AmazonS3Builder::new()
                    .with_url(required_env("COJOB_TEST_MINIO_URL"))
                    .with_endpoint(required_env("COJOB_TEST_MINIO_ENDPOINT"))
                    .with_allow_http(true)
                    .with_region("us-east-1")
                    .with_access_key_id(required_env("COJOB_TEST_MINIO_ACCESS_KEY_ID"))
                    .with_secret_access_key(required_env("COJOB_TEST_MINIO_SECRET_ACCESS_KEY"))
                    .build()
                    .unwrap();
                let backend = ObjectStoreBackend::new(Arc::new(s3));
                (Arc::new(backend), unique("suite"), None)
            }
        };
        let clock = FakeClock::at_unix_micros(1_786_240_800_000_000);
        let race = Arc::new(RaceBackend::new(inner.clone()));
        let db = Db::new(Store::new(race.clone(), &prefix)).with_clock(clock.clone());
        let raw = Store::new(inner, &prefix);
        let rival = Db::new(raw.clone()).with_clock(clock.clone());
        Rig {
            kind,
            db,
            rival,
            race,
            clock,
            raw,
            _dir: dir,
        }
    }
}

/// `writers` tasks each make `increments` `doc.update` increments of one counter (each update
/// allowed `max_attempts` rounds); the total must be exact: no increment lost or doubled.
pub async fn concurrent_increments(db: &Db, writers: u64, increments: u64, max_attempts: u32) {
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let doc = db.doc::<u64>("counter").max_attempts(max_attempts);
            tokio::spawn(async move {
                for _ in 0..increments {
                    doc.update(|n| n + 1, Some(0)).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let (total, _) = db.doc::<u64>("counter").get().await.unwrap().unwrap();
    assert_eq!(total, writers * increments, "no increment lost or doubled");
}
