//! Reading a counter row of `tsoracle.seq` out of a heap page, for `tso_seq`'s in-place
//! advance (docs/sequences.md, "The in-place path").
//!
//! The caller holds the page's buffer locked exclusively and has the 8 kB page as bytes. This
//! module decides, from the bytes alone, whether the line pointer it found through the key
//! index holds the *live* version of the row for `key`, and where its `next` column sits, so
//! that the caller may overwrite `next` (and `updated_at`, the 8 bytes after it) in place. Any
//! doubt is a refusal ([`NotInPlace`]); the caller then sends the call to the worker, whose
//! MVCC update handles every case. Layouts are PostgreSQL's (`bufpage.h`, `itemid.h`,
//! `htup_details.h`, `varatt.h`), identical in 15 to 18 on the little-endian platforms
//! tsoracle is built for.
//!
//! The row is `(key text, next bigint, updated_at timestamptz, owner regrole)`: `key` starts
//! the tuple's data (no padding before the first column), `next` follows at the next 8-byte
//! boundary, `updated_at` right after it.

#[cfg(target_endian = "big")]
compile_error!("the in-place counter layout is written for little-endian platforms");

/// Size of a page header (`SizeOfPageHeaderData`); the line pointers follow it.
pub const PAGE_HEADER_SIZE: usize = 24;
/// Size of a heap tuple header before its null bitmap (`SizeofHeapTupleHeader`).
pub const TUPLE_HEADER_SIZE: usize = 23;

const LP_NORMAL: u32 = 1;
const HEAP_HASNULL: u16 = 0x0001;
const HEAP_XMAX_EXCL_LOCK: u16 = 0x0040;
const HEAP_XMAX_LOCK_ONLY: u16 = 0x0080;
const HEAP_LOCK_MASK: u16 = 0x0050;
const HEAP_XMIN_COMMITTED: u16 = 0x0100;
const HEAP_XMIN_INVALID: u16 = 0x0200;
const HEAP_XMAX_INVALID: u16 = 0x0800;
const HEAP_XMAX_IS_MULTI: u16 = 0x1000;
const HEAP_NATTS_MASK: u16 = 0x07FF;

/// Why a line pointer is not a counter that may be advanced in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotInPlace {
    /// The offset is past the page's line pointers, or the page is malformed.
    NoSuchItem,
    /// The line pointer is unused, dead or a redirect.
    NotNormal,
    /// A newer version exists (`t_ctid` points elsewhere).
    Updated,
    /// An updater or deleter is recorded (committed, aborted without a hint, or running).
    Deleted,
    /// The inserting transaction is known to have aborted.
    Aborted,
    /// Fewer columns than expected, or `key`, `next` or `updated_at` is NULL.
    Shape,
    /// The key is stored out of line or compressed.
    KeyNotInline,
    /// The tuple holds another key.
    KeyMismatch,
    /// `next` is negative (the table's CHECK forbids it).
    Negative,
}

/// The live counter tuple for a key, as found in a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterTuple {
    /// Byte offset of `next` in the page; `updated_at` is the 8 bytes after it.
    pub next_at: usize,
    /// The counter's value: the start of the next block.
    pub next: i64,
    /// The inserting transaction.
    pub xmin: u32,
    /// Whether the page already says that `xmin` committed (a hint bit, or frozen). When
    /// false, the caller must ask the commit log, and treat a transaction of its own or one
    /// still running as "not in place".
    pub xmin_committed: bool,
    /// The `owner` column (a role OID); 0 when NULL (a key shared by every sequence user).
    pub owner: u32,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// The inline bytes of the varlena that starts `data`, and its total size with its header.
fn inline_varlena(data: &[u8]) -> Result<(&[u8], usize), NotInPlace> {
    let first = *data.first().ok_or(NotInPlace::Shape)?;
    let (header, size) = if first & 0x01 == 0x01 {
        if first == 0x01 {
            return Err(NotInPlace::KeyNotInline); // a TOAST pointer (VARATT_IS_1B_E)
        }
        (1, usize::from(first >> 1))
    } else {
        if first & 0x03 == 0x02 {
            return Err(NotInPlace::KeyNotInline); // compressed inline (VARATT_IS_4B_C)
        }
        (4, (u32_at(data, 0).ok_or(NotInPlace::Shape)? >> 2) as usize)
    };
    if size < header || size > data.len() {
        return Err(NotInPlace::Shape);
    }
    Ok((&data[header..size], size))
}

/// Find the live counter for `key` at line pointer `offset` (1-based) of block `block`.
pub fn counter_tuple(
    page: &[u8],
    block: u32,
    offset: u16,
    key: &[u8],
) -> Result<CounterTuple, NotInPlace> {
    let lower = usize::from(u16_at(page, 12).ok_or(NotInPlace::NoSuchItem)?);
    if offset == 0 || lower < PAGE_HEADER_SIZE || lower > page.len() {
        return Err(NotInPlace::NoSuchItem);
    }
    let items = (lower - PAGE_HEADER_SIZE) / 4;
    if usize::from(offset) > items {
        return Err(NotInPlace::NoSuchItem);
    }
    let item = u32_at(page, PAGE_HEADER_SIZE + 4 * (usize::from(offset) - 1))
        .ok_or(NotInPlace::NoSuchItem)?;
    let (lp_off, lp_flags, lp_len) =
        ((item & 0x7FFF) as usize, (item >> 15) & 0x03, (item >> 17) as usize);
    if lp_flags != LP_NORMAL {
        return Err(NotInPlace::NotNormal);
    }
    let tuple = page.get(lp_off..lp_off + lp_len).ok_or(NotInPlace::NoSuchItem)?;
    if tuple.len() < TUPLE_HEADER_SIZE {
        return Err(NotInPlace::NoSuchItem);
    }
    let field = |at| u16_at(tuple, at).ok_or(NotInPlace::NoSuchItem);
    let xmin = u32_at(tuple, 0).ok_or(NotInPlace::NoSuchItem)?;
    let ctid_block = (u32::from(field(12)?) << 16) | u32::from(field(14)?);
    if (ctid_block, field(16)?) != (block, offset) {
        return Err(NotInPlace::Updated);
    }
    let infomask2 = field(18)?;
    let infomask = field(20)?;
    let hoff = usize::from(tuple[22]);
    let xmax_harmless = infomask & HEAP_XMAX_INVALID != 0
        || infomask & HEAP_XMAX_LOCK_ONLY != 0
        || infomask & (HEAP_XMAX_IS_MULTI | HEAP_LOCK_MASK) == HEAP_XMAX_EXCL_LOCK;
    if !xmax_harmless {
        return Err(NotInPlace::Deleted);
    }
    let xmin_committed = infomask & HEAP_XMIN_COMMITTED != 0;
    if !xmin_committed && infomask & HEAP_XMIN_INVALID != 0 {
        return Err(NotInPlace::Aborted);
    }
    if infomask2 & HEAP_NATTS_MASK < 3 || hoff < TUPLE_HEADER_SIZE || hoff > tuple.len() {
        return Err(NotInPlace::Shape);
    }
    if infomask & HEAP_HASNULL != 0 && tuple[TUPLE_HEADER_SIZE] & 0b111 != 0b111 {
        return Err(NotInPlace::Shape); // key, next or updated_at NULL
    }
    let data = &tuple[hoff..];
    let (stored_key, key_size) = inline_varlena(data)?;
    if stored_key != key {
        return Err(NotInPlace::KeyMismatch);
    }
    let next_in_data = key_size.div_ceil(8) * 8;
    let next_bytes = data.get(next_in_data..next_in_data + 16).ok_or(NotInPlace::Shape)?;
    let next = i64::from_ne_bytes(next_bytes[..8].try_into().map_err(|_| NotInPlace::Shape)?);
    if next < 0 {
        return Err(NotInPlace::Negative);
    }
    // owner (regrole, 4-byte aligned) follows updated_at; NULL, or a tuple from before the
    // column existed, is the shared owner 0.
    let owner_null = infomask2 & HEAP_NATTS_MASK < 4
        || (infomask & HEAP_HASNULL != 0 && tuple[TUPLE_HEADER_SIZE] & 0b1000 == 0);
    let owner =
        if owner_null { 0 } else { u32_at(data, next_in_data + 16).ok_or(NotInPlace::Shape)? };
    Ok(CounterTuple { next_at: lp_off + hoff + next_in_data, next, xmin, xmin_committed, owner })
}

/// Write the advanced counter (`next`) and its `updated_at` into the page at `tuple.next_at`.
pub fn write_counter(page: &mut [u8], tuple: &CounterTuple, next: i64, updated_at: i64) -> bool {
    match page.get_mut(tuple.next_at..tuple.next_at + 16) {
        Some(slot) => {
            slot[..8].copy_from_slice(&next.to_ne_bytes());
            slot[8..].copy_from_slice(&updated_at.to_ne_bytes());
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BLCKSZ: usize = 8192;

    /// A page holding, at line pointer `offset`, the tuple PostgreSQL's `heap_form_tuple`
    /// would make for `(key, next, updated_at, owner)` with `owner` NULL or not.
    fn page_with(key: &[u8], next: i64, infomask: u16, owner_null: bool, offset: u16) -> Vec<u8> {
        let mut page = vec![0u8; BLCKSZ];
        let hoff = 24; // 23 bytes of header (+ 1 of null bitmap), rounded up to 8
        let mut data = Vec::new();
        if key.len() < 127 {
            // heap_form_tuple gives a short (1-byte) header when payload + 1 fits in 127 bytes
            data.push(((key.len() + 1) << 1) as u8 | 0x01);
        } else {
            data.extend_from_slice(&(((key.len() + 4) as u32) << 2).to_ne_bytes());
        }
        data.extend_from_slice(key);
        while data.len() % 8 != 0 {
            data.push(0);
        }
        data.extend_from_slice(&next.to_ne_bytes());
        data.extend_from_slice(&777i64.to_ne_bytes());
        if !owner_null {
            data.extend_from_slice(&16384u32.to_ne_bytes());
        }
        let len = hoff + data.len();
        let lp_off = BLCKSZ - len.div_ceil(8) * 8;
        let mut tuple = vec![0u8; len];
        tuple[0..4].copy_from_slice(&1234u32.to_ne_bytes());
        tuple[12..14].copy_from_slice(&0u16.to_ne_bytes());
        tuple[14..16].copy_from_slice(&3u16.to_ne_bytes()); // block 3
        tuple[16..18].copy_from_slice(&offset.to_ne_bytes());
        tuple[18..20].copy_from_slice(&4u16.to_ne_bytes());
        let infomask = if owner_null { infomask | HEAP_HASNULL } else { infomask };
        tuple[20..22].copy_from_slice(&infomask.to_ne_bytes());
        tuple[22] = hoff as u8;
        tuple[23] = if owner_null { 0b0111 } else { 0 };
        tuple[hoff..].copy_from_slice(&data);
        page[lp_off..lp_off + len].copy_from_slice(&tuple);
        let lower = PAGE_HEADER_SIZE + 4 * usize::from(offset);
        page[12..14].copy_from_slice(&(lower as u16).to_ne_bytes());
        let item = (lp_off as u32) | (LP_NORMAL << 15) | ((len as u32) << 17);
        let at = PAGE_HEADER_SIZE + 4 * (usize::from(offset) - 1);
        page[at..at + 4].copy_from_slice(&item.to_ne_bytes());
        page
    }

    const LIVE: u16 = HEAP_XMIN_COMMITTED | HEAP_XMAX_INVALID;

    proptest! {
        /// A live counter is found, its value read, and a write lands on `next` and
        /// `updated_at` only: reading again gives the new value, every other byte is as it was.
        #[test]
        fn finds_reads_and_writes_the_counter(
            key in proptest::collection::vec(1u8..=255, 1..=128),
            next in 0i64..=i64::MAX,
            new in 0i64..=i64::MAX,
            owner_null: bool,
            offset in 1u16..20,
        ) {
            let page = page_with(&key, next, LIVE, owner_null, offset);
            let found = counter_tuple(&page, 3, offset, &key).unwrap();
            prop_assert_eq!(found.next, next);
            prop_assert_eq!(found.owner, if owner_null { 0 } else { 16384 });
            prop_assert!(found.xmin_committed);
            prop_assert_eq!(found.xmin, 1234);
            let mut written = page.clone();
            prop_assert!(write_counter(&mut written, &found, new, 99));
            prop_assert_eq!(counter_tuple(&written, 3, offset, &key).unwrap().next, new);
            let changed: Vec<usize> = (0..BLCKSZ).filter(|&i| page[i] != written[i]).collect();
            prop_assert!(changed.iter().all(|&i| (found.next_at..found.next_at + 16).contains(&i)));
        }

        /// Anything but the live version of this key's row is refused.
        #[test]
        fn refuses_what_is_not_the_live_row(
            key in proptest::collection::vec(1u8..=255, 1..=128),
            next in 0i64..=i64::MAX,
            offset in 1u16..20,
        ) {
            let page = page_with(&key, next, LIVE, true, offset);
            prop_assert_eq!(counter_tuple(&page, 4, offset, &key), Err(NotInPlace::Updated));
            prop_assert_eq!(counter_tuple(&page, 3, offset + 1, &key), Err(NotInPlace::NoSuchItem));
            prop_assert_eq!(counter_tuple(&page, 3, 0, &key), Err(NotInPlace::NoSuchItem));
            let mut other = key.clone();
            other[0] ^= 0x01;
            if other[0] == 0 { other[0] = 2; }
            prop_assert_eq!(counter_tuple(&page, 3, offset, &other), Err(NotInPlace::KeyMismatch));
            let deleted = page_with(&key, next, HEAP_XMIN_COMMITTED, true, offset);
            prop_assert_eq!(counter_tuple(&deleted, 3, offset, &key), Err(NotInPlace::Deleted));
            let aborted = page_with(&key, next, HEAP_XMIN_INVALID | HEAP_XMAX_INVALID, true, offset);
            prop_assert_eq!(counter_tuple(&aborted, 3, offset, &key), Err(NotInPlace::Aborted));
            let unhinted = page_with(&key, next, HEAP_XMAX_INVALID, true, offset);
            prop_assert!(!counter_tuple(&unhinted, 3, offset, &key).unwrap().xmin_committed);
            let locked = page_with(&key, next, HEAP_XMIN_COMMITTED | HEAP_XMAX_LOCK_ONLY | HEAP_XMAX_EXCL_LOCK, true, offset);
            prop_assert!(counter_tuple(&locked, 3, offset, &key).is_ok(), "a row lock alone is harmless");
            let frozen = page_with(&key, next, HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID | HEAP_XMAX_INVALID, true, offset);
            prop_assert!(counter_tuple(&frozen, 3, offset, &key).unwrap().xmin_committed, "frozen is committed");
        }
    }

    #[test]
    fn refuses_dead_redirects_nulls_toast_and_negative_values() {
        let key = b"orders";
        let page = page_with(key, 5, LIVE, true, 1);
        let mut dead = page.clone();
        let item = u32::from_ne_bytes(dead[24..28].try_into().unwrap());
        dead[24..28].copy_from_slice(&((item & !(0x03 << 15)) | (3 << 15)).to_ne_bytes());
        assert_eq!(counter_tuple(&dead, 3, 1, key), Err(NotInPlace::NotNormal));
        let found = counter_tuple(&page, 3, 1, key).unwrap();
        let tuple_at = found.next_at - 8 - 24; // key "orders" (7 bytes) padded to 8, hoff 24
        let mut nulls = page.clone();
        nulls[tuple_at + 23] = 0b0101; // next NULL
        assert_eq!(counter_tuple(&nulls, 3, 1, key), Err(NotInPlace::Shape));
        let mut toast = page.clone();
        toast[tuple_at + 24] = 0x01;
        assert_eq!(counter_tuple(&toast, 3, 1, key), Err(NotInPlace::KeyNotInline));
        let mut compressed = page.clone();
        compressed[tuple_at + 24] = 0x02;
        assert_eq!(counter_tuple(&compressed, 3, 1, key), Err(NotInPlace::KeyNotInline));
        let negative = page_with(key, -1, LIVE, true, 1);
        assert_eq!(counter_tuple(&negative, 3, 1, key), Err(NotInPlace::Negative));
        let mut empty = page.clone();
        empty[12..14].copy_from_slice(&24u16.to_ne_bytes());
        assert_eq!(counter_tuple(&empty, 3, 1, key), Err(NotInPlace::NoSuchItem));
    }
}
