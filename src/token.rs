//! Unguessable tokens from a CSPRNG: lease holder strings and write tokens.

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

/// A 128-bit token that marks one write, so the writer can recognise it on a re-read.
pub(crate) fn write_token() -> String {
    random_urlsafe(16)
}
