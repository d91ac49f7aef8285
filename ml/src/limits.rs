//! Memory bounds of a training, checked before anything is allocated: every size here comes
//! from a param, from the data or from the catalog, so none may reach an infallible
//! allocation unchecked (Rust's out-of-memory handler aborts the whole server process).

use std::collections::TryReserveError;

/// Most weights one model may have: a float8[] of them must fit PostgreSQL's 1 GB limit on
/// one value (MaxAllocSize, minus the array header).
pub const MAX_STORED_WEIGHTS: u64 = ((1u64 << 30) - 1 - 64) / 8;

/// Bytes a training holds for a model of `n_features` × `n_outputs` weights at its peak: the
/// weights, the sums of iterate averaging, one same-sized copy (mini-batch gradient sums, or
/// the per-epoch validation snapshot), one more for folding the standardizer and handing the
/// model to the catalog, plus per-feature bookkeeping (lazy-regularization step, mini-batch mark, and the
/// statistics pass's count, mean and M2: 40 bytes a feature).
pub fn model_memory_bytes(n_features: u64, n_outputs: u64) -> u64 {
    n_features
        .saturating_mul(n_outputs)
        .saturating_mul(4 * 8)
        .saturating_add(n_features.saturating_mul(40))
}

/// Why a model of some size may not be trained.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSizeError {
    /// More memory than the configured limit.
    Memory { bytes: u64, limit: u64 },
    /// More weights than one float8[] in the catalog can hold.
    Weights { weights: u64 },
}

/// Checks a model of `n_features` × `n_outputs` against `limit_bytes`.
pub fn check_model_size(
    n_features: u64,
    n_outputs: u64,
    limit_bytes: u64,
) -> Result<(), ModelSizeError> {
    // The memory limit first: it is the one a DBA sets, and the one the ERROR should name.
    let bytes = model_memory_bytes(n_features, n_outputs);
    if bytes > limit_bytes {
        return Err(ModelSizeError::Memory {
            bytes,
            limit: limit_bytes,
        });
    }
    let weights = n_features.saturating_mul(n_outputs);
    if weights > MAX_STORED_WEIGHTS {
        return Err(ModelSizeError::Weights { weights });
    }
    Ok(())
}

/// Bytes in a human unit, as PostgreSQL's pg_size_pretty would say them.
pub fn pretty_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 10.0 * 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", value.round() as u64, UNITS[unit])
}

/// `bytes` and `limit` in human units, exact when the rounding would make them look equal.
pub fn pretty_pair(bytes: u64, limit: u64) -> (String, String) {
    let (a, b) = (pretty_bytes(bytes), pretty_bytes(limit));
    if a == b {
        (format!("{bytes} bytes"), format!("{limit} bytes"))
    } else {
        (a, b)
    }
}

/// `n` copies of `value`, or an error instead of aborting when memory runs out.
pub fn try_filled<T: Clone>(n: usize, value: T) -> Result<Vec<T>, TryReserveError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)?;
    v.resize(n, value);
    Ok(v)
}

/// Grows `v` to `n` elements (new ones `value`), failing instead of aborting.
pub fn try_resize<T: Clone>(v: &mut Vec<T>, n: usize, value: T) -> Result<(), TryReserveError> {
    if n > v.len() {
        v.try_reserve_exact(n - v.len())?;
    }
    v.resize(n, value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_saturate_instead_of_wrapping() {
        assert_eq!(model_memory_bytes(u64::MAX, u64::MAX), u64::MAX);
        assert!(check_model_size(i32::MAX as u64, 1, u64::MAX).is_err());
    }

    #[test]
    fn limit_is_checked_on_the_peak() {
        // 1M features, one output: 32 MB of weight copies + 40 MB of bookkeeping.
        assert_eq!(model_memory_bytes(1_000_000, 1), 72_000_000);
        assert!(check_model_size(1_000_000, 1, 72_000_000).is_ok());
        assert_eq!(
            check_model_size(1_000_000, 1, 71_999_999),
            Err(ModelSizeError::Memory {
                bytes: 72_000_000,
                limit: 71_999_999
            })
        );
        // Over both limits: the memory limit (a setting) is named.
        assert!(matches!(
            check_model_size(MAX_STORED_WEIGHTS + 1, 1, 1 << 29),
            Err(ModelSizeError::Memory { .. })
        ));
        assert_eq!(
            check_model_size(MAX_STORED_WEIGHTS + 1, 1, u64::MAX),
            Err(ModelSizeError::Weights {
                weights: MAX_STORED_WEIGHTS + 1
            })
        );
    }

    #[test]
    fn fallible_allocation_reports_instead_of_aborting() {
        assert!(try_filled(usize::MAX / 2, 0u64).is_err());
        let mut v = vec![1u8; 3];
        assert!(try_resize(&mut v, usize::MAX, 0u8).is_err());
        assert_eq!(v, vec![1, 1, 1]);
        try_resize(&mut v, 5, 0u8).unwrap();
        assert_eq!(v, vec![1, 1, 1, 0, 0]);
    }

    #[test]
    fn pretty() {
        assert_eq!(pretty_bytes(512), "512 bytes");
        assert_eq!(pretty_bytes(512 * 1024 * 1024), "512 MB");
        assert_eq!(pretty_bytes(48 * 1024 * 1024 * 1024), "48 GB");
        assert_eq!(
            pretty_pair(65_560, 65_536),
            ("65560 bytes".into(), "65536 bytes".into())
        );
        assert_eq!(
            pretty_pair(1 << 30, 512 << 20),
            ("1024 MB".into(), "512 MB".into())
        );
    }
}
