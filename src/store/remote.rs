//! The backend for every store `object_store` serves: memory, S3, GCS and Azure.

use async_trait::async_trait;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ObjectStore, ObjectStoreExt, PutOptions, PutPayload, UpdateVersion,
};
use std::fmt;
use std::sync::Arc;

use super::{Backend, PutMode, PutOutcome, StoredObject, Version};
use crate::error::{BoxError, Op, StoreError};

/// The user-metadata key that carries a write's token.
pub(crate) const TOKEN_METADATA: &str = "cojobwrite";

/// A [`Backend`] over any [`ObjectStore`] that supports `PutMode::Create` and
/// `PutMode::Update` (S3, GCS, Azure, memory). Not `LocalFileSystem`, which has no
/// compare-and-swap: use [`DirBackend`](super::DirBackend) for directories.
#[derive(Clone)]
pub struct ObjectStoreBackend {
    inner: Arc<dyn ObjectStore>,
}

impl fmt::Debug for ObjectStoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

impl ObjectStoreBackend {
    /// Wraps an object store.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        ObjectStoreBackend { inner }
    }

    /// Builds the backend for a `memory`, `s3`, `gs` or `az` URL, reading credentials and
    /// endpoints from the environment. Returns it with the URL's path as the key prefix.
    pub fn from_url(url: &url::Url) -> Result<(Self, String), StoreError> {
        let invalid = |reason: String| StoreError::InvalidUrl {
            url: url.to_string(),
            reason,
        };
        let built: Result<Arc<dyn ObjectStore>, object_store::Error> = match url.scheme() {
            "memory" => Ok(Arc::new(object_store::memory::InMemory::new())),
            "s3" | "s3a" => object_store::aws::AmazonS3Builder::from_env()
                .with_url(url.as_str())
                .build()
                .map(|s| Arc::new(s) as _),
            "gs" => object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url.as_str())
                .build()
                .map(|s| Arc::new(s) as _),
            "az" | "azure" | "abfs" | "abfss" => {
                object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url.as_str())
                    .build()
                    .map(|s| Arc::new(s) as _)
            }
            other => {
                return Err(invalid(format!(
                    "unsupported scheme {other:?}; use memory://, file:///dir, s3://, gs:// or az://"
                )));
            }
        };
        let store = built.map_err(|e| invalid(e.to_string()))?;
        let prefix = match url.scheme() {
            "memory" => format!("{}{}", url.host_str().unwrap_or(""), url.path()),
            _ => url.path().to_string(),
        };
        Ok((Self::new(store), prefix.trim_matches('/').to_string()))
    }
}

fn path(key: &str) -> Result<Path, StoreError> {
    Path::parse(key).map_err(|_| StoreError::InvalidKey {
        key: key.to_string(),
        reason: "not a valid object path",
    })
}

/// Maps an `object_store` error to a [`StoreError`] whose source is a [`Reply`]: what the
/// server said, without the raw response body.
fn classify(op: Op, key: &str, err: object_store::Error) -> StoreError {
    let key = key.to_string();
    let reply = Reply::of(&err);
    let status = reply.status;
    let denied = matches!(
        err,
        object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }
    ) || matches!(status, Some(401 | 403));
    let unavailable = matches!(&err, object_store::Error::Generic { source, .. } if is_unavailable(source.as_ref()));
    let source: BoxError = Box::new(reply);
    if missing_bucket(&err) {
        StoreError::NoSuchBucket { op, key, source }
    } else if denied {
        StoreError::AccessDenied { op, key, source }
    } else if unavailable {
        StoreError::Unavailable { op, key, source }
    } else {
        StoreError::Backend { op, key, source }
    }
}

/// True when the server said the bucket or container does not exist (S3 `NoSuchBucket`,
/// Azure `ContainerNotFound`), which `object_store` reports as a plain not-found.
fn missing_bucket(err: &object_store::Error) -> bool {
    let text = err.to_string();
    text.contains("NoSuchBucket") || text.contains("ContainerNotFound")
}

/// A store's error reply cut down to what a user can act on: the HTTP status, and the S3 or
/// Azure error code and message. The raw body (canonical request, string to sign, request ids,
/// access key id) and the request URL are dropped; the operation and key are in the
/// [`StoreError`] around it.
#[derive(Debug)]
pub struct Reply {
    status: Option<u16>,
    text: String,
}

impl Reply {
    /// Summarises `err` (see the type's documentation).
    fn of(err: &object_store::Error) -> Reply {
        // The deepest message of the chain carries the server's answer.
        let mut deepest = err.to_string();
        let mut cause = std::error::Error::source(err);
        while let Some(e) = cause {
            deepest = e.to_string();
            cause = e.source();
        }
        let full = err.to_string();
        let status = status_code(&full).or_else(|| status_code(&deepest));
        let tag = |name: &str| {
            let open = format!("<{name}>");
            let close = format!("</{name}>");
            let start = full.find(&open)? + open.len();
            let len = full[start..].find(&close)?;
            Some(full[start..start + len].trim().to_string())
        };
        let text = match (tag("Code"), tag("Message")) {
            (Some(code), Some(message)) => {
                let line = full
                    .split("status code: ")
                    .nth(1)
                    .and_then(|rest| rest.split(':').next())
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                format!("{line}: {code}: {message}")
            }
            _ => {
                // No XML error document: a transport failure or a bare status. Keep the text
                // before any body, bounded.
                let head = deepest.split("<?xml").next().unwrap_or_default().trim();
                let mut end = head.len().min(300);
                while !head.is_char_boundary(end) {
                    end -= 1;
                }
                head[..end].to_string()
            }
        };
        Reply { status, text }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Reply {}

/// The HTTP status in an `object_store` error message ("… status code: 503 …").
fn status_code(text: &str) -> Option<u16> {
    text.split("status code: ")
        .nth(1)
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
}

/// True for transport failures and server-side errors (5xx, 429, 408) that outlasted
/// `object_store`'s own retries. `object_store` does not export its retry error, so a status is
/// recognised from its message ("Server returned non-2xx status code: 503 …").
fn is_unavailable(source: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(e) = cause {
        if e.downcast_ref::<object_store::client::HttpError>()
            .is_some()
        {
            return true;
        }
        cause = e.source();
    }
    status_code(&source.to_string()).is_some_and(|code| code >= 500 || code == 429 || code == 408)
}

impl ObjectStoreBackend {
    /// Reads `key`; with a `limit`, refuses a larger object from its response head, before the
    /// body is read.
    async fn read(
        &self,
        key: &str,
        limit: Option<usize>,
    ) -> Result<Option<StoredObject>, StoreError> {
        let location = path(key)?;
        let result = match self.inner.get(&location).await {
            Ok(r) => r,
            Err(e @ object_store::Error::NotFound { .. }) if !missing_bucket(&e) => {
                return Ok(None);
            }
            Err(e) => return Err(classify(Op::Get, key, e)),
        };
        let version = Version {
            etag: result.meta.e_tag.clone(),
            generation: result.meta.version.clone(),
        };
        if let Some(limit) = limit
            && result.meta.size > u64::try_from(limit).unwrap_or(u64::MAX)
        {
            return Err(StoreError::TooLarge {
                key: key.to_string(),
                size: result.meta.size,
                limit,
            });
        }
        let last_modified = Some(result.meta.last_modified);
        let token = result
            .attributes
            .get(&Attribute::Metadata(TOKEN_METADATA.into()))
            .map(|v| v.to_string());
        let body = match result.bytes().await {
            Ok(b) => b,
            // Deleted between the response head and its body.
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(classify(Op::Get, key, e)),
        };
        Ok(Some(StoredObject {
            body,
            version,
            token,
            last_modified,
        }))
    }
}

#[async_trait]
impl Backend for ObjectStoreBackend {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        self.read(key, None).await
    }

    async fn get_bounded(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Option<StoredObject>, StoreError> {
        self.read(key, Some(limit)).await
    }

    async fn put(
        &self,
        key: &str,
        body: Bytes,
        mode: &PutMode,
        token: &str,
    ) -> Result<PutOutcome, StoreError> {
        let location = path(key)?;
        let mut attributes = Attributes::new();
        attributes.insert(
            Attribute::Metadata(TOKEN_METADATA.into()),
            token.to_string().into(),
        );
        let (os_mode, op) = match mode {
            PutMode::Overwrite => (object_store::PutMode::Overwrite, Op::PutOverwrite),
            PutMode::IfAbsent => (object_store::PutMode::Create, Op::PutIfAbsent),
            PutMode::IfMatch(v) => (
                object_store::PutMode::Update(UpdateVersion {
                    e_tag: v.etag.clone(),
                    version: v.generation.clone(),
                }),
                Op::PutIfMatch,
            ),
        };
        let opts = PutOptions {
            mode: os_mode,
            attributes,
            ..PutOptions::default()
        };
        match self
            .inner
            .put_opts(&location, PutPayload::from_bytes(body), opts)
            .await
        {
            Ok(r) => Ok(PutOutcome::Written(Version {
                etag: r.e_tag,
                generation: r.version,
            })),
            // 409 and 412 alike are a lost race; some servers answer If-Match on a missing key
            // with 404.
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotModified { .. },
            ) => Ok(PutOutcome::Conflict(None)),
            Err(e @ object_store::Error::NotFound { .. })
                if op == Op::PutIfMatch && !missing_bucket(&e) =>
            {
                Ok(PutOutcome::Conflict(None))
            }
            Err(e) => Err(classify(op, key, e)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.inner.delete(&path(key)?).await {
            Ok(()) => Ok(()),
            Err(e @ object_store::Error::NotFound { .. }) if !missing_bucket(&e) => Ok(()),
            Err(e) => Err(classify(Op::Delete, key, e)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let location = if prefix.is_empty() {
            None
        } else {
            Some(path(prefix)?)
        };
        self.inner
            .list(location.as_ref())
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .map_err(|e| classify(Op::List, prefix, e))
    }
}
