//! Unguessable tokens from a CSPRNG (lease holder strings and write tokens), and the digest
//! under which a holder is stored.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;

/// Returns `n` random bytes as URL-safe base64, from the thread-local CSPRNG (ChaCha12,
/// seeded and periodically reseeded from the operating system).
fn random_urlsafe(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Mints a new lease holder string with 256 bits from a CSPRNG, like Python's
/// `secrets.token_urlsafe(32)`.
///
/// A holder string is a credential: whoever knows it can attach to the lease and renew, write
/// or release it. Keep it in a Secret and out of logs.
///
/// ```
/// let a = cojob::new_holder();
/// assert_eq!(a.len(), 43);
/// assert_ne!(a, cojob::new_holder());
/// ```
pub fn new_holder() -> String {
    random_urlsafe(32)
}

/// The form in which a lease document records `holder`: `sha256:` and the hex SHA-256 of the
/// holder string. A holder is a credential (whoever knows it can attach), so the bucket keeps
/// only its digest, as a password file would: reading a lease reveals who holds it, and which
/// holder it is can be checked, but the credential itself cannot be read back.
///
/// ```
/// let d = cojob::holder_digest("w1");
/// assert!(d.starts_with("sha256:") && d.len() == 7 + 64);
/// assert_eq!(d, cojob::holder_digest("w1"));
/// assert_ne!(d, cojob::holder_digest("w2"));
/// ```
pub fn holder_digest(holder: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, holder.as_bytes());
    let mut out = String::with_capacity(DIGEST_PREFIX.len() + 64);
    out.push_str(DIGEST_PREFIX);
    for byte in digest.as_ref() {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The prefix of a recorded digest. No holder may begin with it (see [`is_digest_like`]).
const DIGEST_PREFIX: &str = "sha256:";

/// True for strings in the recorded form, which are refused as holders: otherwise whoever read a
/// digest could present it as a holder of a document written before digests.
pub(crate) fn is_digest_like(holder: &str) -> bool {
    holder.starts_with(DIGEST_PREFIX)
}

/// True when a lease document's recorded holder (`stored`) is `holder`: its digest, or, in a
/// document written before holders were stored as digests, the holder itself.
pub(crate) fn records_holder(stored: Option<&str>, holder: &str) -> bool {
    match stored {
        Some(s) if is_digest_like(s) => s == holder_digest(holder),
        Some(s) => s == holder,
        None => false,
    }
}

/// A 128-bit token that marks one write, so the writer can recognise it on a re-read.
pub(crate) fn write_token() -> String {
    random_urlsafe(16)
}
