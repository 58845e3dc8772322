//! How guessable an allowlist's codes are, from their shape alone, and codes that are not.
//!
//! The estimate looks at each position of the codes of each length: a position that holds the
//! same character in every code (a prefix like `DEMO-`, a dash) adds nothing; one that only ever
//! holds digits adds 10 possibilities, only letters 26, both 36. The product is the shape's
//! keyspace; divided by the number of codes it is how many guesses a guesser needs per code it
//! finds. `DEMO-0001`…`DEMO-0200` is 10³ / 200 = 5 guesses a hit (the thousands digit never
//! changes): every code found from one address in minutes, however the edge limits it.

use crate::domain::code::NormalisedCode;
use rand::Rng;
use std::collections::{BTreeMap, HashSet};

/// Fewer guesses per hit than this (2⁴⁰, about a trillion) and `allowlist import` warns.
pub(crate) const GUESSES_PER_HIT_BITS_MIN: f64 = 40.0;
/// The characters of generated codes: no `0`/`O`, `1`/`I`/`L`, so a code read aloud or copied by
/// hand comes out the same.
const ALPHABET: &[u8] = b"23456789ABCDEFGHJKMNPQRSTUVWXYZ";
/// Characters of a generated code, in groups of [`GROUP_CHARS`]: 12 × log2(31) ≈ 59 bits.
const GENERATED_CHARS: usize = 12;
const GROUP_CHARS: usize = 4;

/// What the shapes of a set of codes add up to. Its `Debug` shows counts only: the characters
/// seen are pieces of codes.
#[derive(Default)]
pub struct Shapes {
    /// length -> (codes of that length, per position the characters seen)
    by_length: BTreeMap<usize, (u64, Vec<HashSet<u8>>)>,
}

impl std::fmt::Debug for Shapes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shapes").field("codes", &self.codes()).field("keyspace_bits", &self.keyspace_bits()).finish()
    }
}

impl Shapes {
    pub fn add(&mut self, code: &NormalisedCode) {
        let bytes = code.as_bytes();
        let (count, positions) =
            self.by_length.entry(bytes.len()).or_insert_with(|| (0, vec![HashSet::new(); bytes.len()]));
        *count += 1;
        for (seen, byte) in positions.iter_mut().zip(bytes) {
            // Two kinds are enough to tell a fixed position from a free one; stop growing there.
            if seen.len() < 2 || !seen.contains(byte) && seen.len() < 3 {
                seen.insert(*byte);
            }
        }
    }

    pub fn codes(&self) -> u64 {
        self.by_length.values().map(|(count, _)| count).sum()
    }

    /// log2 of the keyspace of all the shapes seen.
    pub fn keyspace_bits(&self) -> f64 {
        let keyspace: f64 =
            self.by_length.values().map(|(_, positions)| positions.iter().map(position_choices).product::<f64>()).sum();
        keyspace.max(1.0).log2()
    }

    /// log2 of the guesses a guesser needs, on average, per code it finds.
    pub fn guesses_per_hit_bits(&self) -> f64 {
        self.keyspace_bits() - (self.codes().max(1) as f64).log2()
    }

    /// The warning `allowlist import` prints, when the codes are guessable.
    pub fn warning(&self) -> Option<String> {
        let bits = self.guesses_per_hit_bits();
        (self.codes() > 0 && bits < GUESSES_PER_HIT_BITS_MIN).then(|| {
            format!(
                "these {} codes are guessable: their shape allows about 2^{:.0} codes, so a guesser finds one in \
                 about 2^{bits:.0} tries (under 2^{GUESSES_PER_HIT_BITS_MIN:.0}); the edge slows one address down, \
                 not a thousand. Issue codes with `seatrush allowlist generate` (59 bits each) for a public sale",
                self.codes(),
                self.keyspace_bits()
            )
        })
    }
}

fn position_choices(seen: &HashSet<u8>) -> f64 {
    if seen.len() <= 1 {
        return 1.0;
    }
    let digits = seen.iter().any(u8::is_ascii_digit);
    let letters = seen.iter().any(u8::is_ascii_uppercase);
    match (digits, letters) {
        (true, true) => 36.0,
        (false, true) => 26.0,
        _ => 10.0,
    }
}

/// `count` distinct codes of [`GENERATED_CHARS`] characters from [`ALPHABET`] (about 59 bits
/// each), grouped like `7KQ2-MX9D-F4TR`, from the thread's CSPRNG.
pub(crate) fn generate(count: usize) -> Vec<String> {
    let mut rng = rand::rng();
    let mut seen = HashSet::with_capacity(count);
    let mut codes = Vec::with_capacity(count);
    while codes.len() < count {
        let mut code = String::with_capacity(GENERATED_CHARS + GENERATED_CHARS / GROUP_CHARS);
        for i in 0..GENERATED_CHARS {
            if i > 0 && i % GROUP_CHARS == 0 {
                code.push('-');
            }
            code.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
        }
        if seen.insert(code.clone()) {
            codes.push(code);
        }
    }
    codes
}

/// Bits of entropy of one generated code.
pub(crate) fn generated_bits() -> f64 {
    GENERATED_CHARS as f64 * (ALPHABET.len() as f64).log2()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(codes: impl IntoIterator<Item = String>) -> Shapes {
        let mut shapes = Shapes::default();
        for code in codes {
            shapes.add(&NormalisedCode::parse(&code).unwrap());
        }
        shapes
    }

    #[test]
    fn demo_style_codes_are_guessable_and_say_so() {
        let demo = shapes((1..=200).map(|i| format!("DEMO-{i:04}")));
        // The thousands digit is always 0: a fixed position, so the shape is DEMO-0 and three digits.
        assert!((demo.keyspace_bits() - 1_000f64.log2()).abs() < 0.01, "{}", demo.keyspace_bits());
        assert!(demo.warning().unwrap().contains("guessable"));
        // Two letters and six digits, 60,000 of them: about 11,000 tries a hit.
        let letters_digits = shapes((0..60_000).map(|i| {
            format!(
                "{}{}{:02}-{:04}",
                (b'A' + (i % 26) as u8) as char,
                (b'A' + (i / 26 % 26) as u8) as char,
                i % 100,
                i % 10_000
            )
        }));
        assert!(letters_digits.guesses_per_hit_bits() < 20.0);
        assert!(letters_digits.warning().is_some());
    }

    #[test]
    fn generated_codes_carry_fifty_bits_and_pass() {
        assert!(generated_bits() >= 50.0, "{}", generated_bits());
        let codes = generate(2_000);
        assert_eq!(codes.iter().collect::<HashSet<_>>().len(), 2_000, "distinct");
        for code in &codes {
            assert_eq!(code.len(), 14);
            assert!(NormalisedCode::parse(code).is_ok(), "{code}");
            assert!(!code.contains(['0', 'O', '1', 'I', 'L']), "{code}");
        }
        assert!(shapes(codes).warning().is_none());
    }
}
