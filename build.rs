//! `sqlx::migrate!` embeds `migrations/` at compile time but cannot tell cargo to watch it on
//! stable Rust: without this, a changed migration ships in the binary only after some `.rs` file
//! changes too.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
