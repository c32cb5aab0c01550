//! Reading a row of one of tsoracle's tables out of a heap page, for the writes made in
//! place: `tso_seq`'s advance of a counter of `tsoracle.seq` in the calling backend, and the
//! worker's raise of the durable high-water in `tsoracle.high_water` (docs/seq-in-place.md;
//! docs/high-water.md).
//!
//! The caller holds the page's buffer locked exclusively and has the 8 kB page as bytes. This
//! module decides, from the bytes alone, whether a line pointer holds the *live* version of
//! the row, and where the columns to overwrite sit. Any doubt is a refusal ([`NotInPlace`]);
//! the caller then takes the MVCC path, which handles every case. Layouts are PostgreSQL's
//! (`bufpage.h`, `itemid.h`, `htup_details.h`, `varatt.h`), identical in 15 to 18 on the
//! little-endian platforms tsoracle is built for.
//!
//! A row may be written in place only while no other transaction may be about to replace it
//! with a version computed from what it read before: its `xmax` is unset, or is a row lock
//! (`FOR UPDATE`, or the lock a `BEFORE UPDATE` trigger's fetch takes) whose transaction has
//! ended ([`Xmax::LockedBy`]: the caller asks the commit log). Every MVCC writer of these
//! tables locks the row before it reads the value it writes back (the worker explicitly, the
//! others through the tables' `BEFORE UPDATE` triggers), so a row without a running locker
//! is one no writer is working from.
//!
//! `tsoracle.seq` is `(key text, next bigint, updated_at timestamptz, owner regrole)`: `key`
//! starts the tuple's data (no padding before the first column), `next` follows at the next
//! 8-byte boundary, `updated_at` right after it. `tsoracle.high_water` is `(id boolean,
//! physical_ms bigint, epoch bigint, updated_at timestamptz)`: `physical_ms` at 8, `epoch` at
//! 16, `updated_at` at 24.
//!
//! The write itself is the caller's: each 8-byte column is stored with one aligned store (a
//! reader holding only a pin never sees half of it), and logged as one fragment of a generic
//! WAL record ([`generic_fragment`]), which core PostgreSQL replays on standbys and in
//! recovery.

#[cfg(target_endian = "big")]
compile_error!("the in-place row layouts are written for little-endian platforms");

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

/// Why a line pointer is not a row that may be written in place.
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
    /// Several transactions lock the row (a MultiXact): not worth asking about each.
    Locked,
    /// The inserting transaction is known to have aborted.
    Aborted,
    /// Fewer columns than expected, or a column this code reads is NULL.
    Shape,
    /// The key is stored out of line or compressed.
    KeyNotInline,
    /// The tuple holds another key (or, in `tsoracle.high_water`, not the row `id = true`).
    KeyMismatch,
    /// A value is negative (the table's CHECK forbids it).
    Negative,
}

/// Who may be about to replace the row, as far as its `xmax` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Xmax {
    /// Nobody: the row may be written in place.
    None,
    /// A row lock of transaction `xid`: the row may be written in place only if that
    /// transaction is no longer running (the caller asks).
    LockedBy(u32),
}

/// The live tuple at a line pointer: where its data starts and what its header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LiveTuple {
    /// Byte offset of the tuple's data (after its header) in the page.
    data_at: usize,
    /// Bytes of data.
    data_len: usize,
    natts: u16,
    /// The first byte of the null bitmap, if the tuple has one.
    nulls: Option<u8>,
    xmin: u32,
    xmin_committed: bool,
    xmax: Xmax,
}

impl LiveTuple {
    /// Whether column `i` (0-based, among the first eight) is present and not NULL.
    fn has(&self, i: u16) -> bool {
        i < self.natts && self.nulls.is_none_or(|bits| bits & (1 << i) != 0)
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn i64_at(b: &[u8], at: usize) -> Option<i64> {
    Some(i64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The live tuple at line pointer `offset` (1-based) of block `block`.
fn live_tuple(page: &[u8], block: u32, offset: u16) -> Result<LiveTuple, NotInPlace> {
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
    let raw_xmax = u32_at(tuple, 4).ok_or(NotInPlace::NoSuchItem)?;
    let ctid_block = (u32::from(field(12)?) << 16) | u32::from(field(14)?);
    if (ctid_block, field(16)?) != (block, offset) {
        return Err(NotInPlace::Updated);
    }
    let infomask2 = field(18)?;
    let infomask = field(20)?;
    let hoff = usize::from(tuple[22]);
    let lock_only = infomask & HEAP_XMAX_LOCK_ONLY != 0
        || infomask & (HEAP_XMAX_IS_MULTI | HEAP_LOCK_MASK) == HEAP_XMAX_EXCL_LOCK;
    let xmax = if infomask & HEAP_XMAX_INVALID != 0 || raw_xmax == 0 {
        Xmax::None
    } else if infomask & HEAP_XMAX_IS_MULTI != 0 {
        return Err(if lock_only { NotInPlace::Locked } else { NotInPlace::Deleted });
    } else if lock_only {
        Xmax::LockedBy(raw_xmax)
    } else {
        return Err(NotInPlace::Deleted);
    };
    let xmin_committed = infomask & HEAP_XMIN_COMMITTED != 0;
    if !xmin_committed && infomask & HEAP_XMIN_INVALID != 0 {
        return Err(NotInPlace::Aborted);
    }
    if hoff < TUPLE_HEADER_SIZE || hoff > tuple.len() {
        return Err(NotInPlace::Shape);
    }
    let nulls = (infomask & HEAP_HASNULL != 0).then(|| tuple[TUPLE_HEADER_SIZE]);
    Ok(LiveTuple {
        data_at: lp_off + hoff,
        data_len: tuple.len() - hoff,
        natts: infomask2 & HEAP_NATTS_MASK,
        nulls,
        xmin,
        xmin_committed,
        xmax,
    })
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

/// The live counter row of a key, as found in a page.
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
    /// A row lock the caller must check (see the module doc).
    pub xmax: Xmax,
    /// The `owner` column (a role OID); 0 when NULL (a key shared by every sequence user).
    pub owner: u32,
    /// The `made` column (the key's incarnation); 0 when NULL, or for a tuple from before the
    /// column existed (its default then).
    pub made: i64,
}

/// Find the live counter for `key` at line pointer `offset` (1-based) of block `block`.
pub fn counter_tuple(
    page: &[u8],
    block: u32,
    offset: u16,
    key: &[u8],
) -> Result<CounterTuple, NotInPlace> {
    let t = live_tuple(page, block, offset)?;
    if !(t.has(0) && t.has(1) && t.has(2)) {
        return Err(NotInPlace::Shape); // key, next or updated_at NULL
    }
    let data = &page[t.data_at..t.data_at + t.data_len];
    let (stored_key, key_size) = inline_varlena(data)?;
    if stored_key != key {
        return Err(NotInPlace::KeyMismatch);
    }
    let next_in_data = key_size.div_ceil(8) * 8;
    if data.len() < next_in_data + 16 {
        return Err(NotInPlace::Shape);
    }
    let next = i64_at(data, next_in_data).ok_or(NotInPlace::Shape)?;
    if next < 0 {
        return Err(NotInPlace::Negative);
    }
    // owner (regrole, 4-byte aligned) follows updated_at; NULL, or a tuple from before the
    // column existed, is the shared owner 0.
    let owner =
        if t.has(3) { u32_at(data, next_in_data + 16).ok_or(NotInPlace::Shape)? } else { 0 };
    // made (bigint, 8-byte aligned) follows owner, or updated_at when owner is NULL.
    let made_at = if t.has(3) { (next_in_data + 20).div_ceil(8) * 8 } else { next_in_data + 16 };
    let made = if t.has(4) { i64_at(data, made_at).ok_or(NotInPlace::Shape)? } else { 0 };
    if made < 0 {
        return Err(NotInPlace::Negative);
    }
    Ok(CounterTuple {
        next_at: t.data_at + next_in_data,
        next,
        xmin: t.xmin,
        xmin_committed: t.xmin_committed,
        xmax: t.xmax,
        owner,
        made,
    })
}

/// The live row of `tsoracle.high_water`, as found in a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HighWaterTuple {
    /// Byte offset of `physical_ms` in the page; `epoch` and `updated_at` are the 16 bytes
    /// after it.
    pub physical_at: usize,
    pub physical_ms: i64,
    pub epoch: i64,
    pub xmin: u32,
    pub xmin_committed: bool,
    pub xmax: Xmax,
}

/// Find the live high-water row (`id = true`) at line pointer `offset` of block `block`.
pub fn high_water_tuple(
    page: &[u8],
    block: u32,
    offset: u16,
) -> Result<HighWaterTuple, NotInPlace> {
    let t = live_tuple(page, block, offset)?;
    if !(t.has(0) && t.has(1) && t.has(2) && t.has(3)) || t.data_len < 32 {
        return Err(NotInPlace::Shape);
    }
    let data = &page[t.data_at..t.data_at + t.data_len];
    if data[0] != 1 {
        return Err(NotInPlace::KeyMismatch);
    }
    let physical_ms = i64_at(data, 8).ok_or(NotInPlace::Shape)?;
    let epoch = i64_at(data, 16).ok_or(NotInPlace::Shape)?;
    if physical_ms < 0 || epoch < 0 {
        return Err(NotInPlace::Negative);
    }
    Ok(HighWaterTuple {
        physical_at: t.data_at + 8,
        physical_ms,
        epoch,
        xmin: t.xmin,
        xmin_committed: t.xmin_committed,
        xmax: t.xmax,
    })
}

/// Largest fragment a generic WAL record carries in one piece here (its length is a 16-bit
/// field; the writes made in place are 16 or 24 bytes).
pub const MAX_FRAGMENT: usize = 64;

/// One fragment of a generic WAL record's block data (`generic_xlog.c`): the region's offset
/// in the page and its length, each an `OffsetNumber` (16 bits), then its bytes. Core
/// PostgreSQL's `generic_redo` copies the bytes to that offset (and zeroes the page's hole,
/// which a heap page's line pointers and tuples are never in). `None` if the region is not
/// inside a page or too long.
pub fn generic_fragment(offset: usize, bytes: &[u8], page_size: usize) -> Option<Vec<u8>> {
    if bytes.is_empty() || bytes.len() > MAX_FRAGMENT || offset + bytes.len() > page_size {
        return None;
    }
    let mut out = Vec::with_capacity(4 + bytes.len());
    out.extend_from_slice(&u16::try_from(offset).ok()?.to_ne_bytes());
    out.extend_from_slice(&u16::try_from(bytes.len()).ok()?.to_ne_bytes());
    out.extend_from_slice(bytes);
    Some(out)
}

/// What `generic_redo` does with a block's data: each fragment's bytes copied to its offset
/// (`applyPageRedo`). The model the tests hold [`generic_fragment`] to.
pub fn apply_generic_delta(page: &mut [u8], mut delta: &[u8]) -> bool {
    while !delta.is_empty() {
        let (Some(offset), Some(len)) = (u16_at(delta, 0), u16_at(delta, 2)) else {
            return false;
        };
        let (offset, len) = (usize::from(offset), usize::from(len));
        let Some(bytes) = delta.get(4..4 + len) else {
            return false;
        };
        let Some(target) = page.get_mut(offset..offset + len) else {
            return false;
        };
        target.copy_from_slice(bytes);
        delta = &delta[4 + len..];
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BLCKSZ: usize = 8192;

    /// Put `tuple` (header and data) at line pointer `offset` of a fresh page, as
    /// `PageAddItem` would, with `t_ctid` pointing at itself in block 3.
    fn page_holding(header: &[u8], data: &[u8], offset: u16) -> Vec<u8> {
        let mut page = vec![0u8; BLCKSZ];
        let hoff = header.len();
        let len = hoff + data.len();
        let lp_off = BLCKSZ - len.div_ceil(8) * 8;
        page[lp_off..lp_off + hoff].copy_from_slice(header);
        page[lp_off + hoff..lp_off + len].copy_from_slice(data);
        page[lp_off + 22] = hoff as u8;
        let lower = PAGE_HEADER_SIZE + 4 * usize::from(offset);
        page[12..14].copy_from_slice(&(lower as u16).to_ne_bytes());
        let item = (lp_off as u32) | (LP_NORMAL << 15) | ((len as u32) << 17);
        let at = PAGE_HEADER_SIZE + 4 * (usize::from(offset) - 1);
        page[at..at + 4].copy_from_slice(&item.to_ne_bytes());
        page
    }

    /// A tuple header: xmin 1234, `xmax`, ctid (3, offset), `natts` columns, `infomask`, and
    /// a null bitmap byte when `nulls` is given; padded to 8 bytes.
    fn header(xmax: u32, offset: u16, natts: u16, infomask: u16, nulls: Option<u8>) -> Vec<u8> {
        let mut h = vec![0u8; 24];
        h[0..4].copy_from_slice(&1234u32.to_ne_bytes());
        h[4..8].copy_from_slice(&xmax.to_ne_bytes());
        h[12..14].copy_from_slice(&0u16.to_ne_bytes());
        h[14..16].copy_from_slice(&3u16.to_ne_bytes()); // block 3
        h[16..18].copy_from_slice(&offset.to_ne_bytes());
        h[18..20].copy_from_slice(&natts.to_ne_bytes());
        let infomask = if nulls.is_some() { infomask | HEAP_HASNULL } else { infomask };
        h[20..22].copy_from_slice(&infomask.to_ne_bytes());
        if let Some(bits) = nulls {
            h[23] = bits;
        }
        h
    }

    /// The page `heap_form_tuple` would make for `(key, next, updated_at, owner)`, owner
    /// NULL or not.
    fn page_with(key: &[u8], next: i64, infomask: u16, owner_null: bool, offset: u16) -> Vec<u8> {
        counter_page(key, next, infomask, 0, owner_null, offset, None)
    }

    /// The page of a row of 0.6.0's table: `made` after `owner` (NULL or not).
    fn page_with_made(key: &[u8], next: i64, owner_null: bool, made: i64) -> Vec<u8> {
        counter_page(key, next, LIVE, 0, owner_null, 1, Some(made))
    }

    /// A counter row as `heap_form_tuple` lays it out: `(key, next, updated_at, owner)`, and
    /// `made` when given (a tuple of 0.6.0's table; without it, one from before the column).
    fn counter_page(
        key: &[u8],
        next: i64,
        infomask: u16,
        xmax: u32,
        owner_null: bool,
        offset: u16,
        made: Option<i64>,
    ) -> Vec<u8> {
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
        let (natts, nulls) = match made {
            Some(made) => {
                while data.len() % 8 != 0 {
                    data.push(0);
                }
                data.extend_from_slice(&made.to_ne_bytes());
                (5, 0b10111)
            }
            None => (4, 0b0111),
        };
        page_holding(
            &header(xmax, offset, natts, infomask, owner_null.then_some(nulls)),
            &data,
            offset,
        )
    }

    fn high_water_page(physical: i64, epoch: i64, id: u8, infomask: u16, xmax: u32) -> Vec<u8> {
        let mut data = vec![0u8; 32];
        data[0] = id;
        data[8..16].copy_from_slice(&physical.to_ne_bytes());
        data[16..24].copy_from_slice(&epoch.to_ne_bytes());
        data[24..32].copy_from_slice(&555i64.to_ne_bytes());
        page_holding(&header(xmax, 1, 4, infomask, None), &data, 1)
    }

    const LIVE: u16 = HEAP_XMIN_COMMITTED | HEAP_XMAX_INVALID;
    const LOCKED: u16 = HEAP_XMIN_COMMITTED | HEAP_XMAX_LOCK_ONLY | HEAP_XMAX_EXCL_LOCK;

    /// Write `values` at `at` the way the in-place writers do: the page's bytes, and the
    /// fragment the WAL record carries, replayed on a copy of the page as it was.
    fn write_and_replay(page: &[u8], at: usize, values: &[i64]) -> (Vec<u8>, Vec<u8>) {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let mut written = page.to_vec();
        written[at..at + bytes.len()].copy_from_slice(&bytes);
        let fragment = generic_fragment(at, &bytes, BLCKSZ).unwrap();
        let mut replayed = page.to_vec();
        assert!(apply_generic_delta(&mut replayed, &fragment));
        (written, replayed)
    }

    proptest! {
        /// A live counter is found, its value read, and a write of `next` and `updated_at`
        /// changes those 16 bytes only: reading again gives the new value, and replaying the
        /// WAL fragment gives the same page.
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
            prop_assert_eq!(found.xmax, Xmax::None);
            prop_assert_eq!(found.next_at % 8, 0, "an aligned 8-byte store");
            let (written, replayed) = write_and_replay(&page, found.next_at, &[new, 99]);
            prop_assert_eq!(&written, &replayed, "the standby's page is the primary's");
            prop_assert_eq!(counter_tuple(&written, 3, offset, &key).unwrap().next, new);
            let changed: Vec<usize> = (0..BLCKSZ).filter(|&i| page[i] != written[i]).collect();
            prop_assert!(changed.iter().all(|&i| (found.next_at..found.next_at + 16).contains(&i)));
        }

        /// Anything but the live version of this key's row is refused, and a row lock is
        /// reported for the caller to check.
        #[test]
        fn refuses_what_is_not_the_live_row(
            key in proptest::collection::vec(1u8..=255, 1..=128),
            next in 0i64..=i64::MAX,
            offset in 1u16..20,
            locker in 3u32..,
        ) {
            let page = page_with(&key, next, LIVE, true, offset);
            prop_assert_eq!(counter_tuple(&page, 4, offset, &key), Err(NotInPlace::Updated));
            prop_assert_eq!(counter_tuple(&page, 3, offset + 1, &key), Err(NotInPlace::NoSuchItem));
            prop_assert_eq!(counter_tuple(&page, 3, 0, &key), Err(NotInPlace::NoSuchItem));
            let mut other = key.clone();
            other[0] ^= 0x01;
            if other[0] == 0 { other[0] = 2; }
            prop_assert_eq!(counter_tuple(&page, 3, offset, &other), Err(NotInPlace::KeyMismatch));
            let deleted = counter_page(&key, next, HEAP_XMIN_COMMITTED, locker, true, offset, None);
            prop_assert_eq!(counter_tuple(&deleted, 3, offset, &key), Err(NotInPlace::Deleted));
            let aborted = page_with(&key, next, HEAP_XMIN_INVALID | HEAP_XMAX_INVALID, true, offset);
            prop_assert_eq!(counter_tuple(&aborted, 3, offset, &key), Err(NotInPlace::Aborted));
            let unhinted = page_with(&key, next, HEAP_XMAX_INVALID, true, offset);
            prop_assert!(!counter_tuple(&unhinted, 3, offset, &key).unwrap().xmin_committed);
            let locked = counter_page(&key, next, LOCKED, locker, true, offset, None);
            prop_assert_eq!(counter_tuple(&locked, 3, offset, &key).unwrap().xmax, Xmax::LockedBy(locker), "a row lock is the caller's to check");
            let multi = counter_page(&key, next, LOCKED | HEAP_XMAX_IS_MULTI, locker, true, offset, None);
            prop_assert_eq!(counter_tuple(&multi, 3, offset, &key), Err(NotInPlace::Locked));
            let frozen = page_with(&key, next, HEAP_XMIN_COMMITTED | HEAP_XMIN_INVALID | HEAP_XMAX_INVALID, true, offset);
            prop_assert!(counter_tuple(&frozen, 3, offset, &key).unwrap().xmin_committed, "frozen is committed");
        }

        /// The high-water row: found, read, written (physical_ms, epoch, updated_at) and
        /// replayed alike; anything else refused.
        #[test]
        fn finds_reads_and_writes_the_high_water(
            physical in 0i64..=i64::MAX,
            epoch in 0i64..=i64::MAX,
            new in 0i64..=i64::MAX,
            locker in 3u32..,
        ) {
            let page = high_water_page(physical, epoch, 1, LIVE, 0);
            let found = high_water_tuple(&page, 3, 1).unwrap();
            prop_assert_eq!((found.physical_ms, found.epoch, found.xmax), (physical, epoch, Xmax::None));
            prop_assert_eq!(found.physical_at % 8, 0, "aligned 8-byte stores");
            let (written, replayed) = write_and_replay(&page, found.physical_at, &[new, epoch, 7]);
            prop_assert_eq!(&written, &replayed);
            prop_assert_eq!(high_water_tuple(&written, 3, 1).unwrap().physical_ms, new);
            prop_assert_eq!(high_water_tuple(&high_water_page(physical, epoch, 0, LIVE, 0), 3, 1), Err(NotInPlace::KeyMismatch));
            prop_assert_eq!(high_water_tuple(&high_water_page(physical, epoch, 1, LIVE, 0), 4, 1), Err(NotInPlace::Updated));
            prop_assert_eq!(high_water_tuple(&high_water_page(physical, epoch, 1, HEAP_XMIN_COMMITTED, locker), 3, 1), Err(NotInPlace::Deleted));
            prop_assert_eq!(high_water_tuple(&high_water_page(physical, epoch, 1, LOCKED, locker), 3, 1).unwrap().xmax, Xmax::LockedBy(locker));
        }
    }

    proptest! {
        /// A row with `made` reads it, owner NULL or not; a row from before the column
        /// existed reads 0 (its default); the counter is where it always was.
        #[test]
        fn reads_the_incarnation(
            key in proptest::collection::vec(1u8..=255, 1..=100),
            next in 0i64..=i64::MAX,
            made in 0i64..=i64::MAX,
            owner_null: bool,
        ) {
            let found = counter_tuple(&page_with_made(&key, next, owner_null, made), 3, 1, &key).unwrap();
            prop_assert_eq!((found.next, found.made), (next, made));
            prop_assert_eq!(found.owner, if owner_null { 0 } else { 16384 });
            prop_assert_eq!(counter_tuple(&page_with(&key, next, LIVE, owner_null, 1), 3, 1, &key).unwrap().made, 0);
            prop_assert_eq!(counter_tuple(&page_with_made(&key, next, owner_null, -made - 1), 3, 1, &key), Err(NotInPlace::Negative));
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
        assert_eq!(
            high_water_tuple(&high_water_page(-1, 1, 1, LIVE, 0), 3, 1),
            Err(NotInPlace::Negative)
        );
    }

    #[test]
    fn fragments_stay_inside_the_page() {
        assert_eq!(generic_fragment(8184, &[1; 8], BLCKSZ).map(|f| f.len()), Some(12));
        assert_eq!(generic_fragment(8185, &[1; 8], BLCKSZ), None);
        assert_eq!(generic_fragment(0, &[], BLCKSZ), None);
        assert_eq!(generic_fragment(0, &[0; MAX_FRAGMENT + 1], BLCKSZ), None);
        let mut page = vec![0u8; BLCKSZ];
        assert!(!apply_generic_delta(&mut page, &[0, 0, 9]), "a truncated fragment is refused");
        let mut two = generic_fragment(16, &[7; 8], BLCKSZ).unwrap();
        two.extend(generic_fragment(100, &[9; 4], BLCKSZ).unwrap());
        assert!(apply_generic_delta(&mut page, &two));
        assert_eq!((&page[16..24], &page[100..104]), (&[7u8; 8][..], &[9u8; 4][..]));
    }
}
