//! Turning PostgreSQL datums into plain Rust numbers, without per-value allocation.

use pgrx::array::RawArray;
use pgrx::pg_sys;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

/// A one-dimensional, NULL-free float array, borrowed from a (possibly detoasted) datum.
pub enum FloatSlice<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
}

impl FloatSlice<'_> {
    pub fn len(&self) -> usize {
        match self {
            FloatSlice::F64(s) => s.len(),
            FloatSlice::F32(s) => s.len(),
        }
    }
    pub fn all_finite(&self) -> bool {
        match self {
            FloatSlice::F64(s) => s.iter().all(|v| v.is_finite()),
            FloatSlice::F32(s) => s.iter().all(|v| v.is_finite()),
        }
    }
}

/// Why an array could not be used as a feature vector.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ArrayProblem {
    #[error("the features array is empty")]
    Empty,
    #[error("the features array has {0} dimensions, expected 1")]
    MultiDimensional(i32),
    #[error("the features array contains NULL elements")]
    HasNulls,
    #[error("the array has an unexpected element type")]
    WrongElementType,
}

/// Detoast a one-dimensional, NULL-free array datum, hand it to `f`, and free any detoasted copy.
/// The array `f` sees may live in a buffer on this function's stack (`ShortVarlena`): nothing
/// `f` returns may point into it.
///
/// # Safety
/// `datum` must be a non-NULL array datum, and this must run on the backend thread.
unsafe fn with_array<R>(
    datum: pg_sys::Datum,
    f: impl FnOnce(&mut RawArray) -> Result<R, ArrayProblem>,
) -> Result<R, ArrayProblem> {
    let original = datum.cast_mut_ptr::<pg_sys::varlena>();
    let mut scratch = ShortVarlena::uninit();
    // SAFETY: the caller guarantees a valid array varlena; pg_detoast_datum returns either the
    // same pointer (plain 4-byte-header datum) or a palloc'd, MAXALIGNed copy; `scratch`
    // outlives every use of the pointer into it.
    let detoasted = if is_plain_4b(original) {
        original
    } else if let Some(copy) = scratch.expand(original) {
        copy
    } else {
        pg_sys::pg_detoast_datum(original)
    };
    let result = (|| {
        // SAFETY: detoasted points to a complete ArrayType that lives until we pfree it below.
        let mut raw = RawArray::from_ptr(NonNull::new_unchecked(
            detoasted.cast::<pg_sys::ArrayType>(),
        ));
        let ndim = raw.dims().len();
        if ndim == 0 {
            return Err(ArrayProblem::Empty);
        }
        if ndim != 1 {
            return Err(ArrayProblem::MultiDimensional(ndim as i32));
        }
        // An array without a NULL bitmap (dataoffset 0, ARR_HASNULL) has no NULL element: the
        // common case needs no (guarded) call to scan the bitmap.
        if (*detoasted.cast::<pg_sys::ArrayType>()).dataoffset != 0 && raw.any_nulls() {
            return Err(ArrayProblem::HasNulls);
        }
        f(&mut raw)
    })();
    if detoasted != original && !scratch.holds(detoasted) {
        // SAFETY: detoasted is a fresh palloc'd copy that nothing else references.
        pg_sys::pfree(detoasted.cast());
    }
    result
}

/// A short varlena (1-byte header, at most 127 bytes: an array of up to 13 float8 or 26 float4
/// or int4 is stored so) made what PostgreSQL's detoasting would make of it — a 4-byte header
/// and the same bytes, aligned — in a buffer on the stack instead of palloc'd memory: for a
/// table of 8 features the palloc, guarded call and pfree per row were 17% of an epoch's
/// backend. Left uninitialized until a short varlena is copied in (it is made for every array
/// read, most of which do not need it).
#[repr(C, align(8))]
struct ShortVarlena(MaybeUninit<[u8; 4 + 127]>);

impl ShortVarlena {
    fn uninit() -> ShortVarlena {
        ShortVarlena(MaybeUninit::uninit())
    }

    /// The expanded copy of `ptr` if it is an in-line short varlena (not one stored out of line
    /// or compressed: those are PostgreSQL's to detoast).
    ///
    /// # Safety
    /// `ptr` is a valid varlena.
    #[inline]
    unsafe fn expand(&mut self, ptr: *mut pg_sys::varlena) -> Option<*mut pg_sys::varlena> {
        // SAFETY: every varlena starts with at least one header byte; a short one holds
        // (first byte >> 1) bytes in all, that byte included (VARSIZE_1B; little-endian, as
        // is_plain_4b), at most 127: its 4-byte form fits the buffer. 0x01 is the
        // external-pointer header (VARATT_IS_1B_E). Only the bytes written here are read.
        if !cfg!(target_endian = "little") {
            return None;
        }
        let first = *ptr.cast::<u8>();
        if first & 0x01 == 0 || first == 0x01 {
            return None;
        }
        let body = (first >> 1) as usize - 1;
        let to = self.0.as_mut_ptr().cast::<u8>();
        // SET_VARSIZE_4B (little-endian): the total size shifted past the two flag bits.
        let header = (((4 + body) as u32) << 2).to_le_bytes();
        std::ptr::copy_nonoverlapping(header.as_ptr(), to, 4);
        std::ptr::copy_nonoverlapping(ptr.cast::<u8>().add(1), to.add(4), body);
        Some(to.cast())
    }

    fn holds(&self, ptr: *mut pg_sys::varlena) -> bool {
        std::ptr::eq(ptr.cast::<u8>(), self.0.as_ptr().cast::<u8>())
    }
}

/// The elements of a float8[]/float4[] datum (see `with_array`).
///
/// # Safety
/// As for `with_array`.
pub unsafe fn with_float_array<R>(
    datum: pg_sys::Datum,
    f: impl FnOnce(FloatSlice<'_>) -> R,
) -> Result<R, ArrayProblem> {
    with_array(datum, |raw| {
        let n = raw.len();
        // SAFETY: element type checked before reinterpreting the data area; float arrays are
        // stored with 'd'/'i' alignment, so the data pointer is aligned for the element type.
        match raw.oid() {
            pg_sys::FLOAT8OID => {
                let data = raw.data::<f64>();
                Ok(f(FloatSlice::F64(std::slice::from_raw_parts(
                    data.as_ptr().cast::<f64>(),
                    n,
                ))))
            }
            pg_sys::FLOAT4OID => {
                let data = raw.data::<f32>();
                Ok(f(FloatSlice::F32(std::slice::from_raw_parts(
                    data.as_ptr().cast::<f32>(),
                    n,
                ))))
            }
            _ => Err(ArrayProblem::WrongElementType),
        }
    })
}

/// The elements of a float8[]/float4[] datum as f64 into `out` (an empty array gives none),
/// if `accept_len` accepts their number (its error is returned, and nothing copied, if not).
///
/// # Safety
/// As for `with_array`.
pub unsafe fn float_array_into<E>(
    datum: pg_sys::Datum,
    out: &mut Vec<f64>,
    accept_len: impl FnOnce(usize) -> Result<(), E>,
) -> Result<Result<(), E>, ArrayProblem> {
    out.clear();
    let mut accept_len = Some(accept_len);
    let read = with_float_array(datum, |a| {
        // The length is checked before anything is copied (one detoast for both).
        let accepted = (accept_len.take().expect("called once"))(a.len());
        if accepted.is_ok() {
            match a {
                FloatSlice::F64(x) => out.extend_from_slice(x),
                FloatSlice::F32(x) => out.extend(x.iter().map(|&v| v as f64)),
            }
        }
        accepted
    });
    match read {
        Err(ArrayProblem::Empty) => Ok((accept_len.take().expect("not called"))(0)),
        other => other,
    }
}

/// The elements of an int4[] datum (see `with_array`).
///
/// # Safety
/// As for `with_array`.
pub unsafe fn with_int4_array<R>(
    datum: pg_sys::Datum,
    f: impl FnOnce(&[i32]) -> R,
) -> Result<R, ArrayProblem> {
    with_array(datum, |raw| {
        if raw.oid() != pg_sys::INT4OID {
            return Err(ArrayProblem::WrongElementType);
        }
        let n = raw.len();
        let data = raw.data::<i32>();
        // SAFETY: int4 arrays are 'i'-aligned and hold n elements (type checked above).
        Ok(f(std::slice::from_raw_parts(
            data.as_ptr().cast::<i32>(),
            n,
        )))
    })
}

/// "(block,offset)", as PostgreSQL prints a ctid.
pub fn format_tid(tid: &pg_sys::ItemPointerData) -> String {
    let block = (tid.ip_blkid.bi_hi as u32) << 16 | tid.ip_blkid.bi_lo as u32;
    format!("({},{})", block, tid.ip_posid)
}

/// True for an uncompressed, in-line varlena with a 4-byte header, which needs no detoasting
/// (saves a guarded FFI call per tuple on the hot path).
///
/// # Safety
/// `ptr` points to a readable varlena (at least its first header byte).
#[inline]
pub unsafe fn is_plain_4b(ptr: *mut pg_sys::varlena) -> bool {
    // SAFETY: every varlena starts with at least one header byte.
    #[cfg(target_endian = "little")]
    {
        (*(ptr as *const u8) & 0x03) == 0x00
    }
    #[cfg(not(target_endian = "little"))]
    {
        let _ = ptr;
        false
    }
}

/// The bytes of a text datum, read in place unless it is compressed or stored out of line.
///
/// # Safety
/// `datum` must be a non-NULL text datum valid for this call.
pub unsafe fn with_text_bytes<R>(datum: pg_sys::Datum, f: impl FnOnce(&[u8]) -> R) -> R {
    use pgrx::varlena::{varatt_is_1b_e, varatt_is_4b_c, varlena_to_byte_slice};
    let original = datum.cast_mut_ptr::<pg_sys::varlena>();
    // SAFETY: a valid varlena; detoasting returns a palloc'd copy, freed here once `f` is done
    // (rows are decoded by the million in one memory context).
    let ptr = if varatt_is_1b_e(original) || varatt_is_4b_c(original) {
        pg_sys::pg_detoast_datum_packed(original)
    } else {
        original
    };
    let result = f(varlena_to_byte_slice(ptr));
    if ptr != original {
        pg_sys::pfree(ptr.cast());
    }
    result
}

/// The length of a one-dimensional, NULL-free array datum (any element type), checked
/// before its elements are converted or copied.
///
/// # Safety
/// As for `with_array`.
pub unsafe fn array_len(datum: pg_sys::Datum) -> Result<usize, ArrayProblem> {
    with_array(datum, |raw| Ok(raw.len()))
}

/// A numeric datum as f64: its base-10000 digits written out as decimal text and parsed by
/// Rust's correctly rounded parser, which gives the value `::float8` gives (PostgreSQL's
/// numeric_float8 prints the numeric and calls strtod, also correctly rounded) without a
/// palloc'd string and a guarded call per value. None for a compressed or external datum,
/// or NaN/Infinity (the caller then asks PostgreSQL).
///
/// # Safety
/// `datum` must be a non-NULL numeric datum valid for this call.
pub unsafe fn numeric_to_f64(datum: pg_sys::Datum, text: &mut String) -> Option<f64> {
    use pgrx::varlena::{varatt_is_1b_e, varatt_is_4b_c, vardata_any, varsize_any_exhdr};
    use std::fmt::Write;
    let ptr = datum.cast_mut_ptr::<pg_sys::varlena>();
    if varatt_is_1b_e(ptr) || varatt_is_4b_c(ptr) {
        return None;
    }
    // SAFETY: an uncompressed, inline numeric: a 2-byte header (short form) or a 2-byte
    // sign/dscale and a 2-byte weight (long form), then int16 base-10000 digits. Read
    // unaligned: a packed (1-byte header) datum is not aligned.
    let len = varsize_any_exhdr(ptr);
    let bytes = std::slice::from_raw_parts(vardata_any(ptr).cast::<u8>(), len);
    let u16_at = |i: usize| u16::from_ne_bytes([bytes[i], bytes[i + 1]]);
    if len < 2 {
        return None;
    }
    let header = u16_at(0);
    let (negative, weight, digits_at) = match header & 0xC000 {
        0x8000 => {
            // Short form: sign 0x2000, weight sign 0x0040, weight 0x003F.
            let w = (header & 0x003F) as i32;
            let w = if header & 0x0040 != 0 { w - 64 } else { w };
            (header & 0x2000 != 0, w, 2)
        }
        0xC000 => return None, // NaN, +-Infinity
        sign if len >= 4 => (sign == 0x4000, u16_at(2) as i16 as i32, 4),
        _ => return None,
    };
    let n = (len - digits_at) / 2;
    if n == 0 {
        return Some(0.0);
    }
    // The last digit stands for 10000^(weight - n + 1): value = mantissa · 10^exp10.
    let exp10 = 4 * (weight - n as i32 + 1);
    let mut mantissa: u64 = 0;
    let mut exact = n <= 4;
    for i in 0..n {
        let digit = u16_at(digits_at + 2 * i);
        if digit > 9999 {
            return None;
        }
        mantissa = mantissa.wrapping_mul(10000).wrapping_add(digit as u64);
    }
    // Clinger's fast path: a mantissa below 2^53 and a power of ten below 10^23 are exact
    // doubles, so one multiplication or division rounds correctly, as strtod does.
    const POW10: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    ];
    exact &= mantissa < (1u64 << 53) && exp10.unsigned_abs() < 23;
    let value = if exact {
        let m = mantissa as f64;
        if exp10 >= 0 {
            m * POW10[exp10 as usize]
        } else {
            m / POW10[(-exp10) as usize]
        }
    } else {
        // The digits as decimal text, parsed by Rust's correctly rounded parser.
        text.clear();
        for i in 0..n {
            let d = u16_at(digits_at + 2 * i);
            for p in [1000, 100, 10, 1] {
                text.push(char::from(b'0' + (d / p % 10) as u8));
            }
        }
        let _ = write!(text, "e{exp10}");
        text.parse::<f64>().ok()?
    };
    Some(if negative { -value } else { value })
}
