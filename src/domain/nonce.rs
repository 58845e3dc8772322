//! The client's per-attempt nonce: a retry of the same attempt sends the same one, which is how
//! a lost reply becomes a safe retry.

use std::fmt;

/// 8–64 characters of `[A-Za-z0-9_-]` (a UUID fits).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nonce(String);

impl Nonce {
    pub fn parse(s: &str) -> Option<Self> {
        let ok = (8..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        ok.then(|| Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Nonce;

    #[test]
    fn nonce_bounds_are_eight_and_sixty_four() {
        assert!(Nonce::parse("1234567").is_none());
        assert!(Nonce::parse("12345678").is_some());
        assert!(Nonce::parse(&"n".repeat(64)).is_some());
        assert!(Nonce::parse(&"n".repeat(65)).is_none());
        assert!(Nonce::parse("6f1c2a3e-0000-4000-8000-000000000000").is_some());
        assert!(Nonce::parse("has space").is_none());
        assert!(Nonce::parse("semi;colon").is_none());
    }
}
