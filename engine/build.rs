//! `sqlx::migrate!` embeds `migrations/` at compile time; a new or changed migration file must
//! rebuild the engine, or the binary would carry an old schema.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
