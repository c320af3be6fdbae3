//! Renewed run credentials, sealed for the one sidecar that holds the run's lease.
//!
//! Minted credentials do not outlive their session, and a run may. Before they expire, the
//! controller mints the attempt fresh ones and writes them into the run's folder,
//! `<run>/credentials/<epoch>`, where the attempt's current credentials can read them. The document is
//! sealed (ChaCha20-Poly1305) under a key derived from the attempt's holder, which the
//! controller derives and the sidecar has from its Secret: whoever reads the bucket without the
//! holder (a backup, a read-only credential) learns nothing, and a document planted by someone
//! else fails to open.
//!
//! ```
//! use cojob_controller::credentials::{RunCredentials, sealed::{Renewal, seal, unseal}};
//! let creds = RunCredentials {
//!     access_key_id: "AKID".into(),
//!     secret_access_key: "secret".into(),
//!     session_token: "token".into(),
//!     expires_at: "2026-12-03T18:00:00Z".parse().unwrap(),
//! };
//! let renewal = Renewal { credentials: creds, refresh_at: "2026-12-03T17:36:00Z".parse().unwrap() };
//! let body = seal("holder-of-epoch-2", "v1/jobs/a/j/u/runs/r/lease", 2, &renewal).unwrap();
//! assert!(!String::from_utf8_lossy(&body).contains("secret"));
//! let opened = unseal("holder-of-epoch-2", "v1/jobs/a/j/u/runs/r/lease", 2, &body).unwrap();
//! assert_eq!(opened, renewal);
//! // Another holder, another epoch or another run cannot open it.
//! assert!(unseal("another-holder", "v1/jobs/a/j/u/runs/r/lease", 2, &body).is_err());
//! assert!(unseal("holder-of-epoch-2", "v1/jobs/a/j/u/runs/r/lease", 3, &body).is_err());
//! assert!(unseal("holder-of-epoch-2", "v1/jobs/a/j/u/runs/q/lease", 2, &body).is_err());
//! ```

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, Utc};
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use super::RunCredentials;

/// The `kind` of the document.
pub const KIND: &str = "cojob-run-credentials";

/// Renewed credentials and when the sidecar should next look for newer ones.
#[derive(Debug, Clone, PartialEq)]
pub struct Renewal {
    /// The credentials.
    pub credentials: RunCredentials,
    /// From when the sidecar looks for the next renewal (the controller writes it at half of
    /// the credentials' life, the sidecar looks from 60 %, at every lease renewal).
    pub refresh_at: DateTime<Utc>,
}

/// Why a document could not be sealed or opened.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// Not a sealed credentials document of this version.
    #[error("not a cojob run-credentials document: {0}")]
    Foreign(String),
    /// The seal does not open: another holder, epoch or run, or a tampered document.
    #[error("the credentials do not open with this attempt's holder")]
    Unopened,
    /// The system's random source failed.
    #[error("no randomness for a nonce")]
    Random,
}

#[derive(Serialize, Deserialize)]
struct Doc {
    kind: String,
    v: u32,
    epoch: u64,
    nonce: String,
    sealed: String,
}

#[derive(Serialize, Deserialize)]
struct Plain {
    access_key_id: String,
    secret_access_key: String,
    session_token: String,
    expires_at: DateTime<Utc>,
    refresh_at: DateTime<Utc>,
}

/// The sealing key of an attempt: HMAC-SHA256 under its holder (32 bytes, as
/// ChaCha20-Poly1305 takes).
fn key(holder: &str) -> Result<LessSafeKey, SealError> {
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, holder.as_bytes()),
        b"cojob run credentials v1",
    );
    let unbound =
        UnboundKey::new(&CHACHA20_POLY1305, mac.as_ref()).map_err(|_| SealError::Unopened)?;
    Ok(LessSafeKey::new(unbound))
}

/// What the seal binds besides the content: the run's lease key and the attempt's epoch.
fn aad(lease_key: &str, epoch: u64) -> Vec<u8> {
    format!("{KIND}\n{lease_key}\n{epoch}").into_bytes()
}

/// Seals `renewal` for the attempt `epoch` of the run whose lease is `lease_key`.
pub fn seal(
    holder: &str,
    lease_key: &str,
    epoch: u64,
    renewal: &Renewal,
) -> Result<Vec<u8>, SealError> {
    let c = &renewal.credentials;
    let mut body = serde_json::to_vec(&Plain {
        access_key_id: c.access_key_id.clone(),
        secret_access_key: c.secret_access_key.clone(),
        session_token: c.session_token.clone(),
        expires_at: c.expires_at,
        refresh_at: renewal.refresh_at,
    })
    .map_err(|e| SealError::Foreign(e.to_string()))?;
    let mut nonce = [0u8; NONCE_LEN];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| SealError::Random)?;
    key(holder)?
        .seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(lease_key, epoch)),
            &mut body,
        )
        .map_err(|_| SealError::Unopened)?;
    serde_json::to_vec(&Doc {
        kind: KIND.into(),
        v: 1,
        epoch,
        nonce: B64.encode(nonce),
        sealed: B64.encode(&body),
    })
    .map_err(|e| SealError::Foreign(e.to_string()))
}

/// The epoch a document was sealed for, without opening it.
pub fn epoch_of(body: &[u8]) -> Result<u64, SealError> {
    parse(body).map(|d| d.epoch)
}

fn parse(body: &[u8]) -> Result<Doc, SealError> {
    let doc: Doc = serde_json::from_slice(body).map_err(|e| SealError::Foreign(e.to_string()))?;
    if doc.kind != KIND || doc.v != 1 {
        return Err(SealError::Foreign(format!("kind {} v{}", doc.kind, doc.v)));
    }
    Ok(doc)
}

/// Opens a document sealed for the attempt `epoch` of the run whose lease is `lease_key`.
pub fn unseal(
    holder: &str,
    lease_key: &str,
    epoch: u64,
    body: &[u8],
) -> Result<Renewal, SealError> {
    let doc = parse(body)?;
    if doc.epoch != epoch {
        return Err(SealError::Unopened);
    }
    let nonce: [u8; NONCE_LEN] = B64
        .decode(&doc.nonce)
        .ok()
        .and_then(|n| n.try_into().ok())
        .ok_or_else(|| SealError::Foreign("a bad nonce".into()))?;
    let mut sealed = B64
        .decode(&doc.sealed)
        .map_err(|e| SealError::Foreign(e.to_string()))?;
    let plain = key(holder)?
        .open_in_place(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(lease_key, epoch)),
            &mut sealed,
        )
        .map_err(|_| SealError::Unopened)?;
    let p: Plain = serde_json::from_slice(plain).map_err(|e| SealError::Foreign(e.to_string()))?;
    Ok(Renewal {
        credentials: RunCredentials {
            access_key_id: p.access_key_id,
            secret_access_key: p.secret_access_key,
            session_token: p.session_token,
            expires_at: p.expires_at,
        },
        refresh_at: p.refresh_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn renewal() -> Renewal {
        Renewal {
            credentials: RunCredentials {
                access_key_id: "AKID".into(),
                secret_access_key: "secret".into(),
                session_token: "token".into(),
                expires_at: DateTime::UNIX_EPOCH,
            },
            refresh_at: DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_tampered_document_does_not_open() {
        let body = seal("h", "k", 1, &renewal()).unwrap();
        let mut doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let sealed = doc["sealed"].as_str().unwrap().to_string();
        let mut bytes = B64.decode(sealed).unwrap();
        bytes[0] ^= 1;
        doc["sealed"] = B64.encode(bytes).into();
        let tampered = serde_json::to_vec(&doc).unwrap();
        assert!(matches!(
            unseal("h", "k", 1, &tampered),
            Err(SealError::Unopened)
        ));
    }

    #[test]
    fn the_seal_binds_the_epoch_and_the_run() {
        // The epoch outside the seal is checked first; the AAD binds it too, so a document
        // whose visible epoch was changed does not open.
        let body = seal("h", "k", 1, &renewal()).unwrap();
        let mut doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
        doc["epoch"] = 2.into();
        let moved = serde_json::to_vec(&doc).unwrap();
        assert!(matches!(
            unseal("h", "k", 2, &moved),
            Err(SealError::Unopened)
        ));
        assert!(matches!(
            unseal("h", "other", 1, &body),
            Err(SealError::Unopened)
        ));
    }

    #[test]
    fn a_foreign_document_is_named_so() {
        assert!(matches!(
            unseal("h", "k", 1, b"{}"),
            Err(SealError::Foreign(_))
        ));
        assert!(matches!(epoch_of(b"not json"), Err(SealError::Foreign(_))));
        let body = seal("h", "k", 4, &renewal()).unwrap();
        assert_eq!(epoch_of(&body).unwrap(), 4);
    }

    #[test]
    fn two_seals_of_the_same_credentials_differ() {
        let a = seal("h", "k", 1, &renewal()).unwrap();
        let b = seal("h", "k", 1, &renewal()).unwrap();
        assert_ne!(a, b, "a fresh nonce each time");
    }
}
