//! Logical decoding of the extension's tables, read back through `test_decoding`: what a
//! change data capture tool would see.

use postgres::Client;

use crate::pg_error_string;

/// The value of column `column` (a bigint) in a `test_decoding` line of an UPDATE of
/// `table`, with `key[text]:'<key>'` if given.
pub fn decoded(line: &str, table: &str, key: Option<&str>, column: &str) -> Option<i64> {
    let rest = line.strip_prefix(&format!("table {table}: UPDATE: "))?;
    if let Some(k) = key {
        if !rest.contains(&format!("key[text]:'{k}' ")) {
            return None;
        }
    }
    let at = rest.find(&format!("{column}[bigint]:"))? + column.len() + "[bigint]:".len();
    rest[at..].split(' ').next()?.parse().ok()
}

/// Every change `slot` (a `test_decoding` slot) has to give, consumed.
pub fn slot_changes(c: &mut Client, slot: &str) -> Vec<String> {
    c.query("SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)", &[&slot])
        .unwrap_or_else(|e| panic!("changes of {slot}: {}", pg_error_string(&e)))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The values of `tsoracle.seq.next` for `key` that `slot` decodes, consumed.
pub fn decoded_nexts(c: &mut Client, slot: &str, key: &str) -> Vec<i64> {
    slot_changes(c, slot)
        .iter()
        .filter_map(|l| decoded(l, "tsoracle.seq", Some(key), "next"))
        .collect()
}
