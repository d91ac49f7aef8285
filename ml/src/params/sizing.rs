//! Buffer and block sizes: the `block_size` and `buffer_size` params (parsed from and
//! written to JSON) and their resolution to pages per block and tuples per buffer.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::units::{format_bytes_exact, format_bytes_human, format_percent, parse_bytes};
use super::values::{bad_value, get_int, wrong_type};
use super::ParamError;
use crate::arena::TupleArena;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum BlockSize {
    /// See [`resolve_block_pages`].
    Auto,
    Pages(u32),
    Bytes(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum BufferSize {
    /// Fraction of the table's on-disk size, in (0, 1].
    Fraction(f64),
    Bytes(u64),
    Tuples(u64),
}

/// The least a default buffer of a network or a factorization machine holds, up to the whole
/// table (see [`BufferSize::at_least`]).
pub const GRADIENT_BUFFER_FLOOR: u64 = 16 << 20;

impl BufferSize {
    /// A buffer of at least `floor` bytes of a table of `table_bytes`, or the whole table when
    /// it is smaller, as a whole percentage (so that the params written back train the same
    /// buffer again). 10% of a small table is a few pages, whose mix of classes swings from
    /// buffer to buffer: on 60,000 rows of 22 classes stored by label (500 pages), a network
    /// reached 0.40 with 10% and 0.54 with all of it (`make bench-stopping`). Sizes in bytes or
    /// rows stay as they are.
    pub fn at_least(self, floor: u64, table_bytes: u64) -> BufferSize {
        match self {
            BufferSize::Fraction(f) if floor > 0 && table_bytes > 0 => {
                let least = floor.min(table_bytes) as f64 / table_bytes as f64;
                let percent = (least * 100.0).ceil().min(100.0);
                BufferSize::Fraction(f.max(percent / 100.0))
            }
            other => other,
        }
    }
}

const MAX_BLOCK_PAGES: u64 = 1 << 31;
/// The default buffer_size ("10%").
pub(super) const DEFAULT_BUFFER: BufferSize = BufferSize::Fraction(0.10);

pub(super) fn get_block_size(key: &str, v: &Value) -> Result<BlockSize, ParamError> {
    match v {
        Value::String(s) if s == "auto" => Ok(BlockSize::Auto),
        Value::String(s) => parse_bytes(s)
            .map(BlockSize::Bytes)
            .map_err(|e| bad_value(key, v, &e)),
        Value::Number(_) => Ok(BlockSize::Pages(get_int(key, v, 1, MAX_BLOCK_PAGES)? as u32)),
        _ => Err(wrong_type(key, v, "a string or an integer")),
    }
}

pub(super) fn get_buffer_size(key: &str, v: &Value) -> Result<BufferSize, ParamError> {
    match v {
        Value::String(s) => {
            if let Some(pct) = s.trim().strip_suffix('%') {
                // Plain decimal only: no signs, exponents, "inf" or "nan".
                let pct_s = pct.trim();
                let plain =
                    !pct_s.is_empty() && pct_s.chars().all(|c| c.is_ascii_digit() || c == '.');
                let pct: f64 = match pct_s.parse() {
                    Ok(x) if plain => x,
                    _ => return Err(bad_value(key, v, "not a percentage")),
                };
                if !(pct > 0.0 && pct <= 100.0) {
                    return Err(bad_value(key, v, "percentage out of range"));
                }
                Ok(BufferSize::Fraction(pct / 100.0))
            } else {
                parse_bytes(s)
                    .map(BufferSize::Bytes)
                    .map_err(|e| bad_value(key, v, &e))
            }
        }
        Value::Number(_) => Ok(BufferSize::Tuples(get_int(key, v, 1, u64::MAX)?)),
        _ => Err(wrong_type(key, v, "a string or an integer")),
    }
}

/// block_size as written back by `TrainParams::to_json`.
pub(super) fn block_size_json(b: &BlockSize) -> Value {
    match *b {
        BlockSize::Auto => json!("auto"),
        BlockSize::Pages(p) => json!(p),
        BlockSize::Bytes(b) => json!(format_bytes_exact(b)),
    }
}

/// buffer_size as written back by `TrainParams::to_json`.
pub(super) fn buffer_size_json(b: &BufferSize) -> Value {
    match *b {
        BufferSize::Fraction(f) => json!(format_percent(f)),
        BufferSize::Bytes(b) => json!(format_bytes_exact(b)),
        BufferSize::Tuples(t) => json!(t),
    }
}

/// Blocks one buffer should hold under the automatic block size. The tuple shuffle only mixes
/// what is in one buffer, so a buffer of a few large blocks stays nearly as clustered as the
/// table: on a 200k-row label-clustered table (5 epochs, svm) 10%/2% buffers of ~6/~1 auto
/// blocks gave 0.803/0.614 test accuracy, 1-page blocks 0.855/0.853, Shuffle Once 0.854.
pub const AUTO_BLOCKS_PER_BUFFER: u64 = 256;

/// Pages per block. Auto: the buffer's pages / [`AUTO_BLOCKS_PER_BUFFER`], at most 1280 pages
/// (10MB of 8kB pages), at least 1. `buffer_pages` is the buffer's size in table pages (an
/// estimate is fine). Never more than the table (min 1).
pub fn resolve_block_pages(
    spec: BlockSize,
    n_pages: u32,
    page_size: u32,
    buffer_pages: u64,
) -> u32 {
    let pages = match spec {
        BlockSize::Auto => (buffer_pages / AUTO_BLOCKS_PER_BUFFER).clamp(1, 1280) as u32,
        BlockSize::Pages(p) => p,
        BlockSize::Bytes(b) => u32::try_from(b / u64::from(page_size.max(1))).unwrap_or(u32::MAX),
    };
    pages.clamp(1, n_pages.max(1))
}

/// Capacity in tuples of ONE buffer (see the module docs of the extension for
/// how buffers are used). `n_buffers` is 2 with double buffering, else 1;
/// `max_bytes` is the limit for all buffers together.
///
/// Fraction(f): ceil(f · table_bytes / bytes_per_tuple); Bytes(b):
/// b / bytes_per_tuple; Tuples(t): t; always at least 1. If the buffers would
/// exceed `max_bytes`, an explicit size is an error and the default is clamped.
pub fn resolve_buffer_tuples(
    spec: BufferSize,
    explicit: bool,
    n_features: usize,
    table_bytes: u64,
    n_buffers: u64,
    max_bytes: u64,
) -> Result<u64, ParamError> {
    let bpt = TupleArena::bytes_per_tuple(n_features);
    resolve_buffer_tuples_bytes(spec, explicit, bpt, table_bytes, n_buffers, max_bytes)
}

/// [`resolve_buffer_tuples`] for a given size of one tuple in memory, e.g.
/// [`TupleArena::bytes_per_sparse_tuple`] of the average nnz for sparse data.
pub fn resolve_buffer_tuples_bytes(
    spec: BufferSize,
    explicit: bool,
    bytes_per_tuple: usize,
    table_bytes: u64,
    n_buffers: u64,
    max_bytes: u64,
) -> Result<u64, ParamError> {
    let bpt = bytes_per_tuple.max(1) as u64;
    let n_buffers = n_buffers.max(1);
    let tuples = match spec {
        // `as` saturates, so absurd fractions cannot wrap.
        BufferSize::Fraction(f) => (f * table_bytes as f64 / bpt as f64).ceil() as u64,
        BufferSize::Bytes(b) => b / bpt,
        BufferSize::Tuples(t) => t,
    }
    .max(1);
    let total = u128::from(tuples) * u128::from(bpt) * u128::from(n_buffers);
    if total <= u128::from(max_bytes) {
        return Ok(tuples);
    }
    if !explicit {
        return Ok((max_bytes / n_buffers / bpt).max(1));
    }
    let given = match spec {
        BufferSize::Fraction(f) => format!("{} of the table", format_percent(f)),
        BufferSize::Bytes(b) => format_bytes_exact(b),
        BufferSize::Tuples(t) => format!("{t} tuples"),
    };
    let buffers = if n_buffers == 1 {
        "1 buffer".to_string()
    } else {
        format!("{n_buffers} buffers")
    };
    Err(ParamError {
        message: format!(
            "buffer_size of {given} ({tuples} tuples × {buffers} × {bpt} bytes = {}) exceeds corgipile.max_buffer_memory ({})",
            format_bytes_human(total),
            format_bytes_human(u128::from(max_bytes)),
        ),
        hint: Some(if n_buffers > 1 {
            "lower buffer_size, set double_buffer to false, or raise corgipile.max_buffer_memory".to_string()
        } else {
            "lower buffer_size or raise corgipile.max_buffer_memory".to_string()
        }),
    })
}
