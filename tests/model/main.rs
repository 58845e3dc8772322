//! A model of seatrush's booking protocol, checked exhaustively with stateright (issue 9).
//! MODEL.md beside this file says what is modelled, what is left out, and which real file and
//! function each step stands for.

mod actors;
mod arbiter;
mod checks;
mod cluster;
mod draw;
mod heal;
mod heal_checks;
mod lua_match;
mod offer_match;
mod properties;
mod protocol;
mod replication;
mod scripts;
mod steps;
mod trace;
mod waitlist;
