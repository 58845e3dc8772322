//! How the store's columns decode into the domain's types, once for both backends: a value that
//! does not parse is a decode error of its query, never a row silently dropped.

use crate::domain::code::CodeHash;
use crate::domain::event::{EventId, LevelName};
use crate::domain::nonce::Nonce;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::{Database, Decode, Encode, Type};
use std::fmt;

/// A booking's state, as the `state` column spells it (both schemas check these three).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BookingState {
    Held,
    Paid,
    Released,
}

/// The SQL spelling of [`BookingState::holds_seat`], for every query that counts or lists holders.
pub(super) const HOLDS_SEAT: &str = "state IN ('held', 'paid')";

impl BookingState {
    pub fn as_str(self) -> &'static str {
        match self {
            BookingState::Held => "held",
            BookingState::Paid => "paid",
            BookingState::Released => "released",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "held" => Some(BookingState::Held),
            "paid" => Some(BookingState::Paid),
            "released" => Some(BookingState::Released),
            _ => None,
        }
    }

    /// Held and paid rows count against the caps and keep their seat.
    pub fn holds_seat(self) -> bool {
        matches!(self, BookingState::Held | BookingState::Paid)
    }
}

impl fmt::Display for BookingState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'q, DB: Database> Encode<'q, DB> for BookingState
where
    &'q str: Encode<'q, DB>,
{
    fn encode_by_ref(&self, buf: &mut <DB as Database>::ArgumentBuffer<'q>) -> Result<IsNull, BoxDynError> {
        let text: &'q str = self.as_str();
        text.encode_by_ref(buf)
    }
}

/// A text column whose value is one of the domain's parsed types.
macro_rules! text_column {
    ($ty:ty, $parse:expr) => {
        impl<DB: Database> Type<DB> for $ty
        where
            str: Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <str as Type<DB>>::type_info()
            }

            fn compatible(ty: &DB::TypeInfo) -> bool {
                <str as Type<DB>>::compatible(ty)
            }
        }

        impl<'r, DB: Database> Decode<'r, DB> for $ty
        where
            &'r str: Decode<'r, DB>,
        {
            fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
                let text = <&'r str as Decode<'r, DB>>::decode(value)?;
                let parsed: Option<$ty> = $parse(text);
                // The value is a hash, a nonce, an event id, a level or a state: never a raw code.
                parsed.ok_or_else(|| format!("not a valid {}: {text:?}", stringify!($ty)).into())
            }
        }
    };
}

text_column!(BookingState, BookingState::parse);
text_column!(CodeHash, CodeHash::from_hex);
text_column!(Nonce, Nonce::parse);
text_column!(EventId, |text: &str| EventId::parse(text).ok());
text_column!(LevelName, LevelName::parse);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_parses_back_from_its_spelling_and_nothing_else_does() {
        for state in [BookingState::Held, BookingState::Paid, BookingState::Released] {
            assert_eq!(BookingState::parse(state.as_str()), Some(state));
        }
        assert_eq!(BookingState::parse("HELD"), None);
        assert_eq!(BookingState::parse("lost"), None);
        assert!(BookingState::Paid.holds_seat() && !BookingState::Released.holds_seat());
    }
}
