//! The draw's rank function (docs/design.md#the-draw-at-the-opening), pure so that `serve`, `draw
//! verify` and anyone re-computing it by hand get the same order from the same inputs: the
//! secret committed at `open` and the set of code hashes that entered. Nothing a client chooses
//! besides its code is an input: not the nonce, not the arrival time, not the level.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a draw secret (hex in Redis and the database).
pub const SECRET_BYTES: usize = 32;

/// A fresh secret from the OS's generator, hex.
pub fn fresh_secret() -> String {
    hex::encode(rand::random::<[u8; SECRET_BYTES]>())
}

/// The commitment published at `open`: the hex SHA-256 of the secret's hex text.
pub fn commitment(secret_hex: &str) -> String {
    hex::encode(Sha256::digest(secret_hex.as_bytes()))
}

/// SHA-256 over the sorted code hashes, each followed by `\n`: what only the window decides.
pub fn entries_digest<S: AsRef<str>>(codes: &[S]) -> [u8; 32] {
    let mut sorted: Vec<&str> = codes.iter().map(AsRef::as_ref).collect();
    sorted.sort_unstable();
    let mut digest = Sha256::new();
    for code in sorted {
        digest.update(code.as_bytes());
        digest.update(b"\n");
    }
    digest.finalize().into()
}

/// An entry's key: hex HMAC-SHA-256 keyed by the secret's hex text, over the digest and the code
/// hash.
pub fn rank_key(secret_hex: &str, digest: &[u8; 32], code: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret_hex.as_bytes()).expect("HMAC accepts any key length");
    mac.update(digest);
    mac.update(code.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// The draw's order: the code hashes by their keys (ties, never seen in practice, by code hash).
/// Rank 1 is the first admitted.
pub fn order<S: AsRef<str>>(secret_hex: &str, codes: &[S]) -> Vec<String> {
    let digest = entries_digest(codes);
    let mut keyed: Vec<(String, &str)> =
        codes.iter().map(|c| (rank_key(secret_hex, &digest, c.as_ref()), c.as_ref())).collect();
    keyed.sort_unstable();
    keyed.dedup_by(|a, b| a.1 == b.1);
    keyed.into_iter().map(|(_, code)| code.to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn codes(n: usize) -> Vec<String> {
        (0..n).map(|i| hex::encode(Sha256::digest(format!("CODE-{i}")))).collect()
    }

    #[test]
    fn the_order_depends_on_the_set_not_on_the_arrival() {
        let secret = "ab".repeat(32);
        let arrived = codes(20);
        let mut reversed = arrived.clone();
        reversed.reverse();
        assert_eq!(order(&secret, &arrived), order(&secret, &reversed), "arrival order is not an input");
        let drawn = order(&secret, &arrived);
        assert_eq!(drawn.len(), 20);
        assert_ne!(
            drawn,
            {
                let mut s = arrived.clone();
                s.sort();
                s
            },
            "the order is not the code hashes' own"
        );
    }

    #[test]
    fn another_secret_or_another_entry_reorders_every_rank() {
        let secret = "ab".repeat(32);
        let base = order(&secret, &codes(20));
        assert_ne!(base, order(&"cd".repeat(32), &codes(20)));
        // One more entry changes the digest, so the relative order of the others changes too.
        let more = order(&secret, &codes(21));
        let others: Vec<&String> = more.iter().filter(|c| base.contains(c)).collect();
        assert_ne!(others, base.iter().collect::<Vec<_>>());
    }

    #[test]
    fn the_commitment_is_the_secrets_sha256() {
        let secret = fresh_secret();
        assert_eq!(secret.len(), 64);
        assert_eq!(commitment(&secret), hex::encode(Sha256::digest(secret.as_bytes())));
        assert_ne!(fresh_secret(), secret);
    }
}
