//! Integration tests, built as one binary. Every test gets its own Redis (primary and replica,
//! started here), its own database and the app on port 0.

mod admission;
mod allowlist;
mod availability;
mod bench;
mod cluster;
mod crash;
mod draw;
mod edge;
mod export;
mod faults;
mod gates;
mod heal;
mod helpers;
mod holes;
mod layout;
mod lifecycle;
mod live_change;
mod lock_order;
mod managed_redis;
mod moving;
mod observability;
mod operator;
mod overload;
mod parting_ways;
mod payments;
mod persister;
mod refusal_limit;
mod schema;
mod scripts;
mod secrecy;
mod sessions;
mod spent_attempts;
mod support;
mod tls;
mod waitlist;
