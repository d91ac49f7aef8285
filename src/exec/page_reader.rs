//! The fast path's page reader: a block is read a page at a time, in heapam's page mode (one
//! pin and one visibility pass per page, listing the tuples visible to the query's snapshot),
//! and the columns a training reads are deformed straight from the page, with no PostgreSQL
//! call (and no pgrx guard) per tuple. Used when BlockShuffle's output is plain table columns;
//! quals (a `"where"` filter, row-level security) are evaluated on the deformed columns (see
//! block_shuffle's `PageFilter`: one guarded call per row then). Quals with a subquery or a
//! system column, and EXPLAIN ANALYZE, take the executor path, which gives the same rows in the
//! same order.
//!
//! Why reading a visible tuple without a lock is sound: as in heapam's page mode, the scan
//! holds a pin on the page, and tuples are moved or removed only under a cleanup lock, which
//! a pin blocks; the visibility of the listed tuples was decided under the page's share lock.

use pgrx::pg_sys;

#[cfg(not(target_endian = "little"))]
compile_error!("the page reader reads varlena headers in their little-endian layout");

/// How one attribute is stored (from pg_attribute: attlen, attbyval, attalign).
#[derive(Clone, Copy)]
pub struct Attr {
    len: i16,
    byval: bool,
    align: usize,
}

/// The storage of attributes 1..=`natts` of a tuple descriptor (dropped ones included: their
/// bytes are still in old tuples).
///
/// # Safety
/// `desc` is a valid tuple descriptor with at least `natts` attributes.
pub unsafe fn attrs(desc: pg_sys::TupleDesc, natts: usize) -> Vec<Attr> {
    crate::pg::compat::tuple_desc_attrs(desc)[..natts]
        .iter()
        .map(|a| Attr {
            len: a.attlen,
            byval: a.attbyval,
            align: match a.attalign as u8 {
                b'c' => 1,
                b's' => 2,
                b'i' => 4,
                _ => 8, // 'd'
            },
        })
        .collect()
}

/// The total size of the varlena at `p` (any header form), or None for a form that never
/// appears in a stored tuple or a header that would not fit in the `avail` bytes left.
unsafe fn varsize_any(p: *const u8, avail: usize) -> Option<usize> {
    let first = *p;
    if first == 0x01 {
        // 1-byte header, external (TOAST pointer): a tag byte, then the pointer.
        if avail >= 2 && *p.add(1) as u32 == pg_sys::vartag_external::VARTAG_ONDISK {
            Some(2 + std::mem::size_of::<pg_sys::varatt_external>())
        } else {
            None
        }
    } else if first & 0x01 == 0x01 {
        Some((first >> 1) as usize) // 1-byte header: up to 126 bytes inline
    } else if avail >= 4 {
        Some((std::ptr::read_unaligned(p.cast::<u32>()) >> 2) as usize) // 4-byte header
    } else {
        None
    }
}

/// Deforms attributes 1..=`attrs.len()` of the heap tuple `tup` (`len` bytes) into `values`
/// and `nulls`, as heap_deform_tuple does. Returns false — leaving the tuple to PostgreSQL's
/// own deforming — when the tuple has fewer attributes than asked (a column added later may
/// have a stored default), or anything is not as a well-formed tuple has it.
///
/// # Safety
/// `tup` points to a tuple of `len` bytes that stays in place during the call, and `attrs`
/// describes its relation's columns; `values`/`nulls` hold `attrs.len()` entries.
pub unsafe fn deform(
    tup: *const pg_sys::HeapTupleHeaderData,
    len: usize,
    attrs: &[Attr],
    values: &mut [pg_sys::Datum],
    nulls: &mut [bool],
) -> bool {
    let natts = ((*tup).t_infomask2 as u32 & pg_sys::HEAP_NATTS_MASK) as usize;
    let hoff = (*tup).t_hoff as usize;
    if natts < attrs.len() || hoff > len {
        return false;
    }
    let has_nulls = (*tup).t_infomask as u32 & pg_sys::HEAP_HASNULL != 0;
    let bits = tup
        .cast::<u8>()
        .add(std::mem::offset_of!(pg_sys::HeapTupleHeaderData, t_bits));
    let data = tup.cast::<u8>().add(hoff);
    let data_len = len - hoff;
    let mut off = 0usize;
    for (i, a) in attrs.iter().enumerate() {
        if has_nulls && *bits.add(i >> 3) & (1 << (i & 7)) == 0 {
            values[i] = pg_sys::Datum::from(0usize);
            nulls[i] = true;
            continue;
        }
        nulls[i] = false;
        // A varlena with a 1-byte header is not aligned (its first byte is never a pad byte).
        if a.len != -1 || off >= data_len || *data.add(off) == 0 {
            off = (off + a.align - 1) & !(a.align - 1); // a power of two: no division
        }
        if off >= data_len {
            return false;
        }
        if a.len > 0 && off + a.len as usize > data_len {
            return false;
        }
        let p = data.add(off);
        values[i] = if a.byval {
            // As fetch_att makes them: CharGetDatum of a C char, Int16/Int32GetDatum
            // sign-extended.
            let v: i64 = match a.len {
                1 => *p as std::ffi::c_char as i64,
                2 => std::ptr::read_unaligned(p.cast::<i16>()) as i64,
                4 => std::ptr::read_unaligned(p.cast::<i32>()) as i64,
                8 => std::ptr::read_unaligned(p.cast::<i64>()),
                _ => return false,
            };
            pg_sys::Datum::from(v as usize)
        } else {
            pg_sys::Datum::from(p)
        };
        off += match a.len {
            n if n > 0 => n as usize,
            -1 => match varsize_any(p, data_len - off) {
                Some(n) => n,
                None => return false,
            },
            _ => return false, // cstring: not a table column type
        };
        if off > data_len {
            return false;
        }
    }
    true
}
