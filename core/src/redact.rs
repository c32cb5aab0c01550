//! A member's connection string to its oracle (`tsoracle.oracle`) is for the roles that may
//! `SHOW` it: [`redact`] takes its parts out of a text that some other role reads (an error
//! libpq or the oracle answered with, kept in shared memory and cut to fit).
//!
//! - every occurrence of a part (a host, a port, a user, a key file's path, …) as a whole word
//!   becomes [`HIDDEN`], the longest parts first (a path that holds a shorter part is hidden
//!   whole); a part inside a longer word is another word (`dbname=postgres` leaves
//!   `postgresql.conf` alone, host `10.0.0.1` leaves `10.0.0.10`);
//! - a text cut in the middle of a part ends with a prefix of it: that prefix is hidden too;
//! - libpq names the address a host name resolved to right after it (`server at "host"
//!   (10.0.0.5), port …`): an address in parentheses after a hidden part is hidden too.

/// What stands in a text for a part of the connection string.
pub const HIDDEN: &str = "…";

/// The shortest part hidden, and the shortest tail of a cut text hidden as the prefix of a
/// part: a single character is too common to say anything (a port `1`), and hiding it
/// everywhere would leave nothing readable.
const MIN_PART: usize = 2;

/// `text` with every part of `secrets` (and the address libpq resolved a hidden host to)
/// replaced by [`HIDDEN`]. Parts shorter than two bytes are ignored.
pub fn redact(text: &str, secrets: &[String]) -> String {
    let mut parts: Vec<&str> =
        secrets.iter().map(|s| s.as_str()).filter(|s| s.len() >= MIN_PART).collect();
    parts.sort_by_key(|s| std::cmp::Reverse(s.len()));
    parts.dedup();
    let mut out = text.to_string();
    for part in &parts {
        if out.contains(part) {
            out = replace_words(&out, part);
        }
    }
    out = hide_resolved_address(&out);
    hide_cut_tail(&out, &parts)
}

/// A letter, a digit or `_`: a part next to one is inside a longer word.
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `part` at `text[at..]` stands alone: no word character joins it on either side
/// (a part that begins or ends with another character, such as a path's `/`, joins nothing).
fn stands_alone(text: &str, at: usize, part: &str) -> bool {
    let before = text[..at].chars().next_back();
    let after = text[at + part.len()..].chars().next();
    let first = part.chars().next();
    let last = part.chars().next_back();
    let joins = |edge: Option<char>, next: Option<char>| {
        edge.is_some_and(is_word) && next.is_some_and(is_word)
    };
    !joins(first, before) && !joins(last, after)
}

/// `text` with each occurrence of `part` that stands alone replaced by [`HIDDEN`].
fn replace_words(text: &str, part: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(found) = text[from..].find(part) {
        let at = from + found;
        if stands_alone(text, at, part) {
            out.push_str(&text[from..at]);
            out.push_str(HIDDEN);
            from = at + part.len();
        } else {
            let next = at + text[at..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&text[from..next]);
            from = next;
        }
    }
    out.push_str(&text[from..]);
    out
}

/// `"…" (address)` → `"…" (…)`.
fn hide_resolved_address(text: &str) -> String {
    let marker = format!("{HIDDEN}\" (");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&marker) {
        let open = at + marker.len();
        out.push_str(&rest[..open]);
        rest = &rest[open..];
        match rest.find(')') {
            Some(close) => {
                out.push_str(HIDDEN);
                rest = &rest[close..];
            }
            None => {
                // Cut before the parenthesis closed: the rest is the address.
                out.push_str(HIDDEN);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// A text that ends with the first bytes of a part (cut to fit): those bytes hidden.
fn hide_cut_tail(text: &str, parts: &[&str]) -> String {
    let mut cut = 0;
    for part in parts {
        let longest = (part.len() - 1).min(text.len());
        for n in (MIN_PART..=longest).rev() {
            if part.is_char_boundary(n)
                && text.ends_with(&part[..n])
                && stands_alone(text, text.len() - n, &part[..n])
            {
                cut = cut.max(n);
                break;
            }
        }
    }
    if cut == 0 {
        return text.to_string();
    }
    format!("{}{HIDDEN}", &text[..text.len() - cut])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn hides_each_part_and_the_address_it_resolved_to() {
        let text = "cannot connect to the oracle: connection to server at \"db.example\" (10.1.2.3), port 6543 failed: FATAL:  password authentication failed for user \"m1\"";
        let out = redact(text, &s(&["db.example", "6543", "m1"]));
        assert_eq!(
            out,
            "cannot connect to the oracle: connection to server at \"…\" (…), port … failed: FATAL:  password authentication failed for user \"…\""
        );
    }

    #[test]
    fn a_longer_part_is_hidden_whole() {
        let out =
            redact("could not open \"/keys/m1/client.key\"", &s(&["m1", "/keys/m1/client.key"]));
        assert_eq!(out, "could not open \"…\"");
    }

    #[test]
    fn a_cut_part_is_hidden() {
        assert_eq!(redact("file \"/keys/cli", &s(&["/keys/client.key"])), "file \"…");
        assert_eq!(redact("port 6", &s(&["6543"])), "port 6", "one byte says nothing");
        assert_eq!(redact("server at \"hq\" (10.0", &s(&["hq"])), "server at \"…\" (…");
    }

    #[test]
    fn a_part_inside_a_longer_word_is_another_word() {
        let parts = s(&["postgres", "10.0.0.1"]);
        assert_eq!(
            redact("set it in postgresql.conf for postgres at 10.0.0.10, not 10.0.0.1", &parts),
            "set it in postgresql.conf for … at 10.0.0.10, not …"
        );
        assert_eq!(
            redact("socket \"/tmp/.s.PGSQL.6543\"", &s(&["/tmp", "6543"])),
            "socket \"…/.s.PGSQL.…\""
        );
    }

    #[test]
    fn short_parts_and_clean_texts_are_left_alone() {
        assert_eq!(redact("the oracle refused", &s(&["", "h1"])), "the oracle refused");
        assert_eq!(redact("port 1 failed", &s(&["1"])), "port 1 failed");
    }

    proptest! {
        /// No part of at least two bytes survives as a word of the text, cut or whole.
        #[test]
        fn no_part_survives(
            parts in prop::collection::vec("[a-z0-9/._-]{2,12}", 1..4),
            glue in prop::collection::vec("[ :\"()]{1,6}", 1..6),
            cut in 0usize..200,
        ) {
            let mut text = String::new();
            for (i, g) in glue.iter().enumerate() {
                text.push_str(g);
                text.push_str(&parts[i % parts.len()]);
            }
            let end = cut.min(text.len());
            let text = &text[..end];
            let out = redact(text, &parts);
            for p in &parts {
                prop_assert!(!out.contains(p.as_str()), "{p:?} in {out:?} (from {text:?})");
            }
        }
    }
}
