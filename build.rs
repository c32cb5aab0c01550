//! Link arguments of the extension's library.

fn main() {
    // libpq (a member's connection to its oracle, src/pg/libpq.rs) is looked up next to the
    // library first, as PostgreSQL's own libpqwalreceiver looks it up: a relocatable
    // installation carries its own libpq there. Both must load the same one, since the first
    // loaded serves the whole process, and the walreceiver of a newer major needs its own.
    println!("cargo:rustc-link-arg-cdylib=-Wl,-rpath,$ORIGIN");
}
