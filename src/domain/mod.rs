//! Values parsed once at the edge: registration codes and their hashes, nonces, events and their
//! levels. Past the edge no function sees a raw string where one of these belongs. And connection
//! URLs as they may be printed (`url`: passwords masked).

pub mod admission;
pub mod code;
pub mod draw;
pub mod event;
pub mod nonce;
pub mod payment_url;
pub mod session;
pub(crate) mod url;
