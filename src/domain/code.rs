//! Candidate codes: parsed once at the edge into [`NormalisedCode`], then hashed into a
//! [`CodeHash`]. Past the HTTP and import edges nothing sees a raw code, and only the hash is
//! ever stored, logged or sent to Redis.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::fmt;

/// Shortest normalised code accepted.
pub const CODE_LEN_MIN: usize = 4;
/// Longest normalised code accepted.
pub const CODE_LEN_MAX: usize = 64;

/// A code trimmed and uppercased, 4–64 characters of `A-Z 0-9 -`.
///
/// Deliberately not `Debug`/`Display`: a raw code must not reach a log line by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct NormalisedCode(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodeError {
    #[error("code must be {CODE_LEN_MIN}-{CODE_LEN_MAX} characters after trimming, got {0}")]
    Length(usize),
    #[error("code may hold only letters A-Z, digits and '-'")]
    Characters,
}

impl NormalisedCode {
    /// Trims surrounding whitespace, uppercases, then checks length and alphabet, so that
    /// `ab123` and ` AB123 ` are one candidate.
    pub fn parse(raw: &str) -> Result<Self, CodeError> {
        // ASCII-only uppercasing: a non-ASCII letter must fail, not turn into ASCII (ß -> SS).
        let code = raw.trim().to_ascii_uppercase();
        let len = code.chars().count();
        if !(CODE_LEN_MIN..=CODE_LEN_MAX).contains(&len) {
            return Err(CodeError::Length(len));
        }
        if !code.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-') {
            return Err(CodeError::Characters);
        }
        Ok(Self(code))
    }

    /// The normalised code's bytes: for hashing, and for the shape estimate of
    /// `ops/code_strength.rs`; never for a log.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// Lowercase hex SHA-256 (or HMAC-SHA-256 with the pepper) of a normalised code: the database key
/// and the Redis member.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CodeHash(String);

impl CodeHash {
    /// Accepts an already computed hash (from Redis or the database): 64 lowercase hex digits.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let ok = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| Self(hex.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for CodeHash {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CodeHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Turns normalised codes into hashes; holds the optional pepper (`SEATRUSH_CODE_PEPPER`).
#[derive(Clone, Default)]
pub struct CodeHasher {
    pepper: Option<Vec<u8>>,
}

impl fmt::Debug for CodeHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeHasher").field("peppered", &self.pepper.is_some()).finish()
    }
}

/// The fingerprint of "no pepper": plain SHA-256.
pub const PLAIN_FINGERPRINT: &str = "none";

/// The environment variable that holds the pepper; never a flag, so it stays out of `ps`.
pub const PEPPER_ENV: &str = "SEATRUSH_CODE_PEPPER";

impl CodeHasher {
    pub fn plain() -> Self {
        Self { pepper: None }
    }

    pub fn with_pepper(pepper: &[u8]) -> Self {
        Self { pepper: Some(pepper.to_vec()) }
    }

    /// Plain SHA-256 unless `SEATRUSH_CODE_PEPPER` is set and non-empty.
    pub fn from_env() -> Self {
        match std::env::var(PEPPER_ENV) {
            Ok(p) if !p.is_empty() => Self::with_pepper(p.as_bytes()),
            _ => Self::plain(),
        }
    }

    /// True when a pepper is set (HMAC-SHA-256), false for plain SHA-256.
    pub fn is_peppered(&self) -> bool {
        self.pepper.is_some()
    }

    /// What identifies the pepper without revealing it: the first 16 hex digits of an HMAC of a
    /// fixed label under it, or `none` for plain SHA-256. Stored with the allowlist at import, so
    /// an allowlist is never served with another pepper (every candidate would be refused).
    pub fn fingerprint(&self) -> String {
        match &self.pepper {
            None => PLAIN_FINGERPRINT.to_owned(),
            Some(key) => {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
                mac.update(b"seatrush pepper fingerprint v1");
                hex::encode(&mac.finalize().into_bytes()[..8])
            }
        }
    }

    pub fn hash(&self, code: &NormalisedCode) -> CodeHash {
        let digest: Vec<u8> = match &self.pepper {
            None => Sha256::digest(code.as_bytes()).to_vec(),
            Some(key) => {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
                mac.update(code.as_bytes());
                mac.finalize().into_bytes().to_vec()
            }
        };
        CodeHash(hex::encode(digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_and_surrounding_whitespace_make_one_candidate() {
        let a = NormalisedCode::parse("ab123").unwrap();
        let b = NormalisedCode::parse("  AB123\t\n").unwrap();
        assert!(a == b);
        let h = CodeHasher::plain();
        assert_eq!(h.hash(&a), h.hash(&b));
    }

    #[test]
    fn a_fingerprint_tells_peppers_apart_and_reveals_neither() {
        let (one, two) = (CodeHasher::with_pepper(b"pepper-one"), CodeHasher::with_pepper(b"pepper-two"));
        assert_eq!(CodeHasher::plain().fingerprint(), PLAIN_FINGERPRINT);
        assert_eq!(one.fingerprint(), CodeHasher::with_pepper(b"pepper-one").fingerprint());
        assert_ne!(one.fingerprint(), two.fingerprint());
        assert_eq!(one.fingerprint().len(), 16);
        assert!(!one.fingerprint().contains("pepper"));
    }

    #[test]
    fn length_boundaries_are_four_and_sixty_four() {
        assert_eq!(NormalisedCode::parse("ABC").err(), Some(CodeError::Length(3)));
        assert!(NormalisedCode::parse("ABCD").is_ok());
        assert!(NormalisedCode::parse(&"A".repeat(64)).is_ok());
        assert_eq!(NormalisedCode::parse(&"A".repeat(65)).err(), Some(CodeError::Length(65)));
        assert_eq!(NormalisedCode::parse("   ").err(), Some(CodeError::Length(0)));
    }

    #[test]
    fn only_letters_digits_and_dash_are_accepted() {
        assert!(NormalisedCode::parse("EXAM-2027-0001").is_ok());
        assert_eq!(NormalisedCode::parse("AB 123").err(), Some(CodeError::Characters));
        assert_eq!(NormalisedCode::parse("AB_123").err(), Some(CodeError::Characters));
        assert_eq!(NormalisedCode::parse("ÄBCD").err(), Some(CodeError::Characters));
        assert_eq!(NormalisedCode::parse("ab12ß").err(), Some(CodeError::Characters));
    }

    #[test]
    fn plain_hash_is_lowercase_hex_sha256_of_the_normalised_code() {
        let code = NormalisedCode::parse(" abcd ").unwrap();
        // sha256("ABCD")
        assert_eq!(
            CodeHasher::plain().hash(&code).as_str(),
            "e12e115acf4552b2568b55e93cbd39394c4ef81c82447fafc997882a02d23677"
        );
    }

    #[test]
    fn pepper_changes_the_hash_and_is_stable() {
        let code = NormalisedCode::parse("ABCD").unwrap();
        let peppered = CodeHasher::with_pepper(b"secret");
        assert_ne!(peppered.hash(&code), CodeHasher::plain().hash(&code));
        assert_eq!(peppered.hash(&code), CodeHasher::with_pepper(b"secret").hash(&code));
        assert!(CodeHash::from_hex(peppered.hash(&code).as_str()).is_some());
    }

    #[test]
    fn from_hex_rejects_anything_but_64_lowercase_hex_digits() {
        assert!(CodeHash::from_hex(&"a".repeat(64)).is_some());
        assert!(CodeHash::from_hex(&"A".repeat(64)).is_none());
        assert!(CodeHash::from_hex(&"a".repeat(63)).is_none());
        assert!(CodeHash::from_hex(&"g".repeat(64)).is_none());
    }

    proptest::proptest! {
        #[test]
        fn every_accepted_code_is_its_own_normal_form(raw in "\\PC{0,80}") {
            if let Ok(code) = NormalisedCode::parse(&raw) {
                let again = NormalisedCode::parse(&code.0).unwrap();
                proptest::prop_assert!(again == code);
                proptest::prop_assert!((CODE_LEN_MIN..=CODE_LEN_MAX).contains(&code.0.len()));
            }
        }
    }
}
