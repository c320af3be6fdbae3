//! `file://`: our own local-directory backend with atomic conditional writes.
//!
//! `object_store`'s `LocalFileSystem` has no compare-and-swap, so directories get this backend:
//!
//! - **Put-if-absent** writes a temporary file and `link`s it into place; `link` fails if the
//!   name exists, atomically.
//! - **Compare-and-swap, overwrite and delete** hold an exclusive `flock` on a sibling lock file
//!   (`.cojob-lock.<name>`) while they compare the version and `rename` a temporary file over
//!   the object. A lock file is re-checked after locking, so deleting it cannot split the lock.
//! - Every write gets a new ETag, its write token, even when the bytes are identical. The ETag
//!   is kept in a one-line header in front of the body: `cojob-dir-v1 <etag>\n`.
//! - Files are fsynced before they are linked or renamed, and so is their directory after.
//!
//! `flock` is honoured between threads, processes and containers that share the directory on
//! one kernel. Network filesystems vary: check them with
//! [`Store::verify_conditional_writes`](super::Store::verify_conditional_writes) and a race test.

use async_trait::async_trait;
use bytes::Bytes;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{Backend, PutMode, PutOutcome, StoredObject, Version};
use crate::error::{Op, StoreError};

const HEADER: &[u8] = b"cojob-dir-v1 ";
const RESERVED: &str = ".cojob";
/// Room for the header line (`HEADER`, the ETag, a newline) in a size check.
const HEADER_ALLOWANCE: u64 = 256;

/// A [`Backend`] on a local directory, safe across threads and processes.
#[derive(Debug, Clone)]
pub struct DirBackend {
    root: PathBuf,
}

impl DirBackend {
    /// Opens (and creates, if needed) the directory `root`.
    pub async fn open(root: &Path) -> Result<Self, StoreError> {
        let dir = root.to_path_buf();
        let root2 = dir.clone();
        blocking(Op::List, "", move || {
            fs::create_dir_all(&root2)?;
            if !fs::metadata(&root2)?.is_dir() {
                return Err(io::Error::other("not a directory"));
            }
            Ok(())
        })
        .await
        .map_err(|e| StoreError::InvalidUrl {
            url: format!("file://{}", dir.display()),
            reason: e.to_string(),
        })?;
        Ok(DirBackend { root: dir })
    }

    fn file(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

async fn blocking<T, F>(op: Op, key: &str, f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let key = key.to_string();
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
            Err(StoreError::AccessDenied {
                op,
                key,
                source: Box::new(e),
            })
        }
        Ok(Err(e)) => Err(StoreError::Backend {
            op,
            key,
            source: Box::new(e),
        }),
        Err(join) => Err(StoreError::Backend {
            op,
            key,
            source: Box::new(join),
        }),
    }
}

fn sibling(file: &Path, kind: &str, suffix: &str) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    file.with_file_name(format!("{RESERVED}-{kind}.{name}{suffix}"))
}

/// An exclusive lock on a file's sibling lock file, released on drop.
struct Locked {
    _file: File,
}

fn lock(file: &Path) -> io::Result<Locked> {
    let path = sibling(file, "lock", "");
    loop {
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        f.lock()?;
        // A deleter may have unlinked the lock file while we waited: then retry on the new one.
        let held = f.metadata()?;
        match fs::metadata(&path) {
            Ok(now) if now.dev() == held.dev() && now.ino() == held.ino() => {
                return Ok(Locked { _file: f });
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
}

fn sync_dir(file: &Path) -> io::Result<()> {
    match file.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

fn read(file: &Path) -> io::Result<Option<StoredObject>> {
    // Without a limit nothing is refused.
    read_within(file, None).map(|r| r.unwrap_or(None))
}

/// Reads `file`, unless it is larger than `limit` (plus the header line, which is not part of
/// the object): then `Err(size)`, before anything is read.
fn read_within(file: &Path, limit: Option<usize>) -> io::Result<Result<Option<StoredObject>, u64>> {
    let mut f = match File::open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(None)),
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    if let Some(limit) = limit
        && meta.len()
            > u64::try_from(limit)
                .unwrap_or(u64::MAX)
                .saturating_add(HEADER_ALLOWANCE)
    {
        return Ok(Err(meta.len()));
    }
    let last_modified = meta
        .modified()
        .ok()
        .map(chrono::DateTime::<chrono::Utc>::from);
    let mut buf = Vec::with_capacity(meta.len() as usize);
    f.read_to_end(&mut buf)?;
    let header_end = buf.iter().position(|&b| b == b'\n');
    Ok(Ok(Some(match header_end {
        Some(end) if buf.starts_with(HEADER) => {
            let etag = String::from_utf8_lossy(&buf[HEADER.len()..end]).into_owned();
            let body = Bytes::from(buf).slice(end + 1..);
            StoredObject {
                body,
                version: Version {
                    etag: Some(etag.clone()),
                    generation: None,
                },
                token: Some(etag),
                last_modified,
            }
        }
        // A file put there by something else: version it by inode, size and change time.
        _ => StoredObject {
            version: Version {
                etag: Some(format!(
                    "foreign-{}-{}-{}.{}",
                    meta.ino(),
                    meta.len(),
                    meta.ctime(),
                    meta.ctime_nsec()
                )),
                generation: None,
            },
            body: Bytes::from(buf),
            token: None,
            last_modified,
        },
    })))
}

fn write_temp(file: &Path, body: &[u8], token: &str) -> io::Result<PathBuf> {
    if let Some(dir) = file.parent() {
        fs::create_dir_all(dir)?;
    }
    let tmp = sibling(file, "tmp", &format!(".{token}"));
    let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
    let written = f
        .write_all(HEADER)
        .and_then(|()| f.write_all(token.as_bytes()))
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.write_all(body))
        .and_then(|()| f.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

fn written(token: &str) -> PutOutcome {
    PutOutcome::Written(Version {
        etag: Some(token.to_string()),
        generation: None,
    })
}

fn put_sync(file: &Path, body: &[u8], mode: &PutMode, token: &str) -> io::Result<PutOutcome> {
    match mode {
        PutMode::IfAbsent => {
            let tmp = write_temp(file, body, token)?;
            let linked = fs::hard_link(&tmp, file);
            fs::remove_file(&tmp)?;
            match linked {
                Ok(()) => {
                    sync_dir(file)?;
                    Ok(written(token))
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    Ok(PutOutcome::Conflict(None))
                }
                Err(e) => Err(e),
            }
        }
        PutMode::Overwrite | PutMode::IfMatch(_) => {
            if let Some(dir) = file.parent() {
                fs::create_dir_all(dir)?;
            }
            let _guard = lock(file)?;
            if let PutMode::IfMatch(expected) = mode {
                let current = read(file)?.map(|o| o.version.etag);
                if current.is_none() || current != Some(expected.etag.clone()) {
                    return Ok(PutOutcome::Conflict(None));
                }
            }
            let tmp = write_temp(file, body, token)?;
            if let Err(e) = fs::rename(&tmp, file) {
                let _ = fs::remove_file(&tmp);
                return Err(e);
            }
            sync_dir(file)?;
            Ok(written(token))
        }
    }
}

fn delete_sync(file: &Path) -> io::Result<()> {
    if !file.parent().is_some_and(Path::exists) {
        return Ok(());
    }
    let _guard = lock(file)?;
    match fs::remove_file(file) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Unlinking the lock file while holding it is safe: lockers re-check its inode.
    match fs::remove_file(sibling(file, "lock", "")) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn list_sync(root: &Path, prefix: &str) -> io::Result<Vec<String>> {
    let mut keys = Vec::new();
    let start = if prefix.is_empty() {
        root.to_path_buf()
    } else {
        root.join(prefix)
    };
    let mut stack = vec![(start, prefix.to_string())];
    while let Some((dir, key_prefix)) = stack.pop() {
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                continue;
            }
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(RESERVED) {
                continue;
            }
            let key = if key_prefix.is_empty() {
                name
            } else {
                format!("{key_prefix}/{name}")
            };
            if entry.file_type()?.is_dir() {
                stack.push((entry.path(), key));
            } else {
                keys.push(key);
            }
        }
    }
    Ok(keys)
}

#[async_trait]
impl Backend for DirBackend {
    async fn get(&self, key: &str) -> Result<Option<StoredObject>, StoreError> {
        let file = self.file(key);
        blocking(Op::Get, key, move || read(&file)).await
    }

    async fn get_bounded(
        &self,
        key: &str,
        limit: usize,
    ) -> Result<Option<StoredObject>, StoreError> {
        let file = self.file(key);
        match blocking(Op::Get, key, move || read_within(&file, Some(limit))).await? {
            Err(size) => Err(StoreError::TooLarge {
                key: key.to_string(),
                size,
                limit,
            }),
            // Within the limit with its header line; the object itself is checked exactly.
            Ok(object) => super::within_limit(key, object, limit),
        }
    }

    async fn put(
        &self,
        key: &str,
        body: Bytes,
        mode: &PutMode,
        token: &str,
    ) -> Result<PutOutcome, StoreError> {
        let file = self.file(key);
        let op = mode.op();
        let (mode, token) = (mode.clone(), token.to_string());
        blocking(op, key, move || put_sync(&file, &body, &mode, &token)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let file = self.file(key);
        blocking(Op::Delete, key, move || delete_sync(&file)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let (root, p) = (self.root.clone(), prefix.to_string());
        blocking(Op::List, prefix, move || list_sync(&root, &p)).await
    }
}
