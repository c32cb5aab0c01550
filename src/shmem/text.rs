//! A bounded UTF-8 text in shared memory: what the worker says to callers (its refusal, a
//! member's errors, its connection string), kept whole or cut with a note that says so
//! (`tsoracle_core::text::fit`).

/// A bounded UTF-8 text in shared memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Text<const N: usize> {
    bytes: [u8; N],
    len: usize,
}

impl<const N: usize> Default for Text<N> {
    fn default() -> Self {
        Text { bytes: [0; N], len: 0 }
    }
}

impl<const N: usize> Text<N> {
    /// `s` whole if it fits; otherwise cut, with a note saying so (`tsoracle_core::text::fit`),
    /// and `s` logged whole.
    pub fn new(s: &str) -> Self {
        let cut;
        let kept = match tsoracle_core::text::fit(s, N) {
            Ok(s) => s,
            Err(c) => {
                pgrx::log!("tsoracle: a text of {} bytes kept cut to {N}: {s}", s.len());
                cut = c;
                &cut
            }
        };
        let mut bytes = [0; N];
        bytes[..kept.len()].copy_from_slice(kept.as_bytes());
        Text { bytes, len: kept.len() }
    }

    pub fn get(&self) -> Option<String> {
        let text = std::str::from_utf8(&self.bytes[..self.len.min(N)]).unwrap_or("");
        (!text.is_empty()).then(|| text.to_string())
    }
}
