//! A text kept in a fixed number of bytes (a member's shared memory keeps the oracle's errors
//! for their callers so): whole when it fits; when it does not, cut at a character boundary
//! and ended by a note that says so and how long it was, never cut silently. Whoever keeps a
//! text that did not fit logs it whole.

/// The note that ends a text cut to fit: its whole length, and where it is whole.
pub fn cut_note(len: usize) -> String {
    format!(" … (cut: {len} bytes in all; this server's log has it whole)")
}

/// The fewest bytes a room must have for [`fit`]: the note of the longest text (`usize::MAX`
/// bytes) and a character before it.
pub const MIN_ROOM: usize = 96;

/// `s` if it fits in `room` bytes; otherwise as much of it as fits, cut at a character
/// boundary, followed by [`cut_note`]. The result never exceeds `room` (at least
/// [`MIN_ROOM`]). `Err` carries the cut text: the caller logs `s` whole.
pub fn fit(s: &str, room: usize) -> Result<&str, String> {
    assert!(room >= MIN_ROOM, "a room of {room} bytes cannot hold the note of a cut text");
    if s.len() <= room {
        return Ok(s);
    }
    let note = cut_note(s.len());
    let mut keep = room - note.len();
    while !s.is_char_boundary(keep) {
        keep -= 1;
    }
    Err(format!("{}{note}", &s[..keep]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_longest_note_fits_the_smallest_room() {
        assert!(cut_note(usize::MAX).len() < MIN_ROOM);
    }

    #[test]
    fn a_text_that_fits_is_kept_whole() {
        let s = "x".repeat(240);
        assert_eq!(fit(&s, 240), Ok(s.as_str()));
    }

    #[test]
    fn a_text_too_long_says_it_was_cut() {
        let s = "é".repeat(200); // 400 bytes, two to a character
        let cut = fit(&s, 128).unwrap_err();
        assert!(cut.len() <= 128, "{} bytes", cut.len());
        assert!(cut.ends_with("(cut: 400 bytes in all; this server's log has it whole)"), "{cut}");
        assert!(cut.starts_with("éé"));
    }

    proptest! {
        #[test]
        fn fit_never_exceeds_its_room_and_never_cuts_silently(
            s in "\\PC{0,400}",
            room in MIN_ROOM..600,
        ) {
            match fit(&s, room) {
                Ok(kept) => {
                    prop_assert!(s.len() <= room);
                    prop_assert_eq!(kept, s.as_str());
                }
                Err(cut) => {
                    prop_assert!(s.len() > room);
                    prop_assert!(cut.len() <= room);
                    let note = cut_note(s.len());
                    prop_assert!(cut.ends_with(&note));
                    prop_assert!(s.starts_with(&cut[..cut.len() - note.len()]));
                }
            }
        }
    }
}
