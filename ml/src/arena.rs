//! Contiguous in-memory buffer of decoded tuples.
//!
//! Dense: one flat `Vec<f64>` for all features (row-major) plus one for labels.
//! Sparse: offsets + indices + values, CSR style, so rows may differ in nnz.
//! No per-tuple allocation, good locality for the SGD inner loop, and `clear()`
//! keeps the allocations so the buffer is reused across fills.

use crate::prefetch::{prefetch, prefetch_range};
use crate::row::Row;
use crate::shuffle::{BufferShuffle, SHUFFLE_BUCKET_BYTES};
use crate::standardize::Standardizer;

/// Largest number of features (and so largest 0-based index + 1) accepted.
pub const MAX_FEATURES: usize = i32::MAX as usize;

/// Contiguous storage of decoded tuples, dense or sparse (fixed at creation).
#[derive(Clone, Debug, Default)]
pub struct TupleArena {
    /// A training buffer's pages being faulted in ahead of its fill (see `memory::Prefault`).
    /// First: dropped, and so waited for, before the vectors it touches are freed.
    prefault: crate::memory::Prefault,
    sparse: bool,
    /// Dense: the row length. Sparse: largest index + 1 stored since `clear`.
    n_features: usize,
    /// Dense: all features, row-major. Sparse: all values.
    values: Vec<f64>,
    /// Sparse only: 0-based feature indices, parallel to `values`.
    indices: Vec<u32>,
    /// Sparse only: row i is `offsets[i]..offsets[i+1]`; starts as `[0]`.
    offsets: Vec<usize>,
    labels: Vec<f64>,
    /// Sparse: how many rows (the first ones) were scaled (see [`TupleArena::scale_values`]).
    scaled_rows: usize,
    /// Per-group models (see [`TupleArena::set_grouped`]): each row's group, parallel to
    /// `labels`, and the group of the next row pushed.
    grouped: bool,
    groups: Vec<u32>,
    next_group: u32,
}

/// The group of a row that belongs to no group with a model of its own.
pub const NO_GROUP: u32 = u32::MAX;

impl TupleArena {
    /// Empty dense arena for tuples of `n_features` features, with room for
    /// `capacity_tuples` tuples reserved up front.
    pub fn new(n_features: usize, capacity_tuples: usize) -> Self {
        TupleArena {
            prefault: Default::default(),
            sparse: false,
            n_features,
            values: Vec::with_capacity(n_features.saturating_mul(capacity_tuples)),
            indices: Vec::new(),
            offsets: Vec::new(),
            labels: Vec::with_capacity(capacity_tuples),
            scaled_rows: 0,
            grouped: false,
            groups: Vec::new(),
            next_group: NO_GROUP,
        }
    }

    /// [`TupleArena::new`], failing instead of aborting when the room cannot be allocated.
    pub fn try_new(
        n_features: usize,
        capacity_tuples: usize,
    ) -> Result<Self, std::collections::TryReserveError> {
        let mut a = TupleArena::new(n_features, 0);
        a.values
            .try_reserve_exact(n_features.saturating_mul(capacity_tuples))?;
        a.labels.try_reserve_exact(capacity_tuples)?;
        a.advise_huge_pages();
        Ok(a)
    }

    /// A training buffer is read in random order: its reserved memory goes on huge pages (see
    /// `memory::advise_huge_pages`). Measured on a 92 MB dense buffer (4.5M × 18 rows,
    /// double-buffered, three rounds side by side): an epoch 1.23–1.28× the scan floor → 1.11×
    /// on PostgreSQL 15, 1.78–1.88× → 1.51–1.65× on 18.
    fn advise_huge_pages(&self) {
        use crate::memory::advise_huge_pages;
        advise_huge_pages(&self.values);
        advise_huge_pages(&self.labels);
        advise_huge_pages(&self.indices);
        advise_huge_pages(&self.offsets);
    }

    /// Faults in the whole reserved room on another thread, from its far end, while the
    /// caller fills it from the front (`memory::Prefault`): for a buffer that will be filled
    /// (the pages become resident at once, not as rows arrive). Measured on two 92 MB buffers
    /// in a fresh session: the backend's first epoch 0.69–0.79 s → 0.55–0.60 s.
    pub fn prefault(&mut self) {
        use crate::memory::{huge_pages_within, Prefault};
        self.prefault = Prefault::start([
            huge_pages_within(&self.values),
            huge_pages_within(&self.labels),
            huge_pages_within(&self.indices),
            huge_pages_within(&self.offsets),
        ]);
    }

    /// [`TupleArena::new_sparse`], failing instead of aborting when the room cannot be
    /// allocated.
    pub fn try_new_sparse(
        capacity_tuples: usize,
        capacity_nnz: usize,
    ) -> Result<Self, std::collections::TryReserveError> {
        let mut a = TupleArena::new_sparse(0, 0);
        a.offsets
            .try_reserve_exact(capacity_tuples.saturating_add(1))?;
        a.values.try_reserve_exact(capacity_nnz)?;
        a.indices.try_reserve_exact(capacity_nnz)?;
        a.labels.try_reserve_exact(capacity_tuples)?;
        a.advise_huge_pages();
        Ok(a)
    }

    /// Empty sparse arena with room for `capacity_tuples` rows holding
    /// `capacity_nnz` non-zeros in total.
    pub fn new_sparse(capacity_tuples: usize, capacity_nnz: usize) -> Self {
        let mut offsets = Vec::with_capacity(capacity_tuples + 1);
        offsets.push(0);
        TupleArena {
            prefault: Default::default(),
            sparse: true,
            n_features: 0,
            values: Vec::with_capacity(capacity_nnz),
            indices: Vec::with_capacity(capacity_nnz),
            offsets,
            labels: Vec::with_capacity(capacity_tuples),
            scaled_rows: 0,
            grouped: false,
            groups: Vec::new(),
            next_group: NO_GROUP,
        }
    }

    /// From now on every row pushed carries a group (the one last given to
    /// [`set_next_group`](Self::set_next_group)), read back by [`group`](Self::group). Reserves
    /// a group per row of the arena's room; fails (and changes nothing) when it cannot.
    pub fn set_grouped(&mut self) -> Result<(), std::collections::TryReserveError> {
        if !self.grouped {
            let room = self.labels.capacity().max(self.labels.len());
            self.groups.try_reserve_exact(room)?;
            self.groups.resize(self.labels.len(), NO_GROUP);
            self.grouped = true;
        }
        Ok(())
    }

    /// The group of the rows pushed next (see [`set_grouped`](Self::set_grouped)).
    #[inline]
    pub fn set_next_group(&mut self, group: u32) {
        self.next_group = group;
    }

    /// The group of tuple `i` ([`NO_GROUP`] in an arena without groups).
    #[inline]
    pub fn group(&self, i: usize) -> u32 {
        self.groups.get(i).copied().unwrap_or(NO_GROUP)
    }

    pub fn is_sparse(&self) -> bool {
        self.sparse
    }

    /// Dense: the row length. Sparse: the largest index + 1 stored since the
    /// last `clear` (0 if none): the dimension a model needs for these rows.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// Number of tuples stored.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of stored feature values (dense: len · n_features).
    pub fn nnz(&self) -> usize {
        self.values.len()
    }

    /// Bytes held by the stored tuples (not the reserved capacity).
    pub fn bytes_used(&self) -> usize {
        self.values.len() * 8
            + self.indices.len() * 4
            + self.labels.len() * 8
            + if self.sparse {
                self.labels.len() * 8
            } else {
                0
            }
    }

    /// Removes all tuples but keeps the allocation.
    pub fn clear(&mut self) {
        self.scaled_rows = 0;
        self.values.clear();
        self.indices.clear();
        self.labels.clear();
        self.groups.clear();
        if self.sparse {
            self.offsets.clear();
            self.offsets.push(0);
            self.n_features = 0;
        }
    }

    pub fn push(&mut self, label: f64, features: &[f64]) {
        assert!(!self.sparse, "push on a sparse arena");
        debug_assert_eq!(features.len(), self.n_features, "feature vector length");
        self.values.extend_from_slice(features);
        self.labels.push(label);
        self.push_group();
    }

    #[inline]
    fn push_group(&mut self) {
        if self.grouped {
            self.groups.push(self.next_group);
        }
    }

    /// Like [`push`](Self::push) for `real[]` columns: widens to f64.
    pub fn push_f32(&mut self, label: f64, features: &[f32]) {
        assert!(!self.sparse, "push_f32 on a sparse arena");
        debug_assert_eq!(features.len(), self.n_features, "feature vector length");
        self.values.extend(features.iter().map(|&v| f64::from(v)));
        self.labels.push(label);
        self.push_group();
    }

    /// Whether [`move_rows_to`](Self::move_rows_to) can take rows of this arena: dense, not
    /// scaled.
    pub fn can_move_rows(&self) -> bool {
        !self.sparse && self.scaled_rows == 0
    }

    /// Moves rows `from..` to the end of `to`, in order (groups with them), and truncates this
    /// arena to `from` rows. Both dense and unscaled ([`can_move_rows`](Self::can_move_rows)),
    /// of one row length, grouped alike. `to` grows only if its room is short of the rows.
    pub fn move_rows_to(&mut self, from: usize, to: &mut TupleArena) {
        assert!(
            self.can_move_rows() && to.can_move_rows(),
            "move_rows_to: dense, unscaled arenas"
        );
        assert_eq!(self.n_features, to.n_features, "move_rows_to: row length");
        assert_eq!(self.grouped, to.grouped, "move_rows_to: grouped alike");
        let n = self.n_features;
        to.values.extend_from_slice(&self.values[from * n..]);
        to.labels.extend_from_slice(&self.labels[from..]);
        self.values.truncate(from * n);
        self.labels.truncate(from);
        if self.grouped {
            to.groups.extend_from_slice(&self.groups[from..]);
            self.groups.truncate(from);
        }
    }

    /// How to shuffle this arena once it is filled with up to `rows` rows: bucketed (see
    /// [`BufferShuffle`]) when it is dense, empty, and has room reserved for them — when 0.4.0
    /// filled it scattered into buckets, whose visiting order this keeps — otherwise one
    /// permutation.
    pub fn shuffle_plan(&self, rows: usize) -> BufferShuffle {
        let room = self
            .n_features
            .checked_mul(rows)
            .is_some_and(|v| v <= self.values.capacity())
            && rows <= self.labels.capacity()
            && (!self.grouped || rows <= self.groups.capacity());
        if self.sparse || !self.is_empty() || !room || rows == 0 {
            return BufferShuffle::Whole;
        }
        let bytes = rows.saturating_mul(Self::bytes_per_tuple(self.n_features));
        BufferShuffle::Bucketed {
            rows,
            buckets: bytes.div_ceil(SHUFFLE_BUCKET_BYTES),
        }
    }

    /// Appends a sparse row: 0-based strictly increasing `indices` below
    /// [`MAX_FEATURES`], one value each (checked in debug builds only).
    pub fn push_sparse(&mut self, label: f64, indices: &[u32], values: &[f64]) {
        assert!(self.sparse, "push_sparse on a dense arena");
        debug_assert_eq!(indices.len(), values.len());
        debug_assert!(indices.windows(2).all(|w| w[0] < w[1]), "unsorted indices");
        self.indices.extend_from_slice(indices);
        self.values.extend_from_slice(values);
        self.end_sparse_row(label);
    }

    /// Appends a sparse row straight from decoded array columns, checked on the way in without
    /// an intermediate copy (the hot path of reading a table): `indices` (i32 or i64) in base
    /// `index_base`, `values` (f32 or f64), `n_features` the declared dimension (None: up to
    /// [`MAX_FEATURES`]). On any problem the arena is left as it was and the error is the one
    /// [`validate_sparse`] reports (index problems first), or `NotFinite`.
    pub fn try_push_sparse<I, V>(
        &mut self,
        label: f64,
        indices: &[I],
        index_base: i64,
        n_features: Option<usize>,
        values: &[V],
    ) -> Result<(), SparsePushError>
    where
        I: Copy + Into<i64>,
        V: Copy + Into<f64>,
    {
        assert!(self.sparse, "try_push_sparse on a dense arena");
        let n = n_features.unwrap_or(MAX_FEATURES).min(MAX_FEATURES) as i64;
        let (start_i, start_v) = (self.indices.len(), self.values.len());
        // Raw indices must lie in lo..hi; strictly increasing ones do if the first and last do.
        // The check reads only the input, so the copy below is a plain conversion (it vectorizes).
        let (lo, hi) = (index_base, index_base.saturating_add(n));
        let indices_ok = indices.len() == values.len()
            && indices.first().is_none_or(|&i| i.into() >= lo)
            && indices.last().is_none_or(|&i| i.into() < hi)
            && indices
                .windows(2)
                .fold(true, |ok, w| ok & (w[0].into() < w[1].into()));
        if !indices_ok {
            let e = validate_sparse(indices, values.len(), index_base, n_features);
            return Err(SparsePushError::Index(
                e.expect_err("the quick check found a problem"),
            ));
        }
        self.indices
            .extend(indices.iter().map(|&i| (i.into() - index_base) as u32));
        let mut finite = true;
        self.values.extend(values.iter().map(|&v| {
            let v: f64 = v.into();
            finite &= v.is_finite();
            v
        }));
        if !finite {
            self.indices.truncate(start_i);
            self.values.truncate(start_v);
            return Err(SparsePushError::NotFinite);
        }
        self.end_sparse_row(label);
        Ok(())
    }

    /// Sparse: multiplies every stored value by its feature's `scale` (a feature beyond it
    /// keeps its value), exactly as a non-centering [`Standardizer`](crate::standardize::Standardizer)
    /// does, and counts the rows as scaled: [`Trainer`] then trains on them as they are,
    /// skipping its standardizer. On a model of millions of features the scales are as much a
    /// cache miss per non-zero as the weights, which bound the SGD thread: this moves the
    /// scales' misses to the thread that fills the buffer, in one pass that prefetches them
    /// well ahead. Rows pushed afterwards are not scaled (SGD refuses such a mix).
    ///
    /// [`Trainer`]: crate::trainer::Trainer
    pub fn scale_values(&mut self, scale: &[f64]) {
        assert!(self.sparse, "scale_values on a dense arena");
        assert_eq!(self.scaled_rows, 0, "the rows are scaled already");
        /// Non-zeros ahead whose scale is prefetched: a row and a half of 40 non-zeros.
        const AHEAD: usize = 64;
        let n = self.values.len();
        for k in 0..n {
            if let Some(&j) = self.indices.get(k + AHEAD) {
                if let Some(s) = scale.get(j as usize) {
                    prefetch(s);
                }
            }
            if let Some(&s) = scale.get(self.indices[k] as usize) {
                self.values[k] = crate::standardize::scale_value(self.values[k], s);
            }
        }
        self.scaled_rows = self.labels.len();
    }

    /// Dense: appends a row standardized by `s` (bit for bit the values a [`Trainer`] with
    /// `s` computes per row) and counts it as scaled, so a [`Trainer`] trains on it as it is:
    /// rows standardized once for many learners of that same standardizer.
    ///
    /// [`Trainer`]: crate::trainer::Trainer
    pub fn push_standardized(&mut self, label: f64, features: &[f64], s: &Standardizer) {
        assert!(!self.sparse, "push_standardized on a dense arena");
        assert_eq!(
            self.scaled_rows,
            self.labels.len(),
            "an arena of scaled and unscaled rows"
        );
        debug_assert_eq!(features.len(), self.n_features, "feature vector length");
        s.extend_dense(features, &mut self.values);
        self.labels.push(label);
        self.push_group();
        self.scaled_rows += 1;
    }

    /// How many rows [`scale_values`](Self::scale_values) or
    /// [`push_standardized`](Self::push_standardized) scaled.
    pub fn scaled_rows(&self) -> usize {
        self.scaled_rows
    }

    fn end_sparse_row(&mut self, label: f64) {
        let start = *self.offsets.last().expect("offsets start with 0");
        if let Some(&last) = self.indices[start..].last() {
            self.n_features = self.n_features.max(last as usize + 1);
        }
        self.offsets.push(self.values.len());
        self.labels.push(label);
        self.push_group();
    }

    /// Features of dense tuple `i`. Panics if `i >= len()` or the arena is sparse.
    #[inline]
    pub fn features(&self, i: usize) -> &[f64] {
        assert!(!self.sparse, "features() on a sparse arena; use row()");
        let start = i * self.n_features;
        &self.values[start..start + self.n_features]
    }

    /// Tuple `i`, dense or sparse. Panics if `i >= len()`.
    #[inline]
    pub fn row(&self, i: usize) -> Row<'_> {
        if self.sparse {
            let (a, b) = (self.offsets[i], self.offsets[i + 1]);
            Row::Sparse {
                indices: &self.indices[a..b],
                values: &self.values[a..b],
            }
        } else {
            Row::Dense(self.features(i))
        }
    }

    /// Label of tuple `i`. Panics if `i >= len()`.
    #[inline]
    pub fn label(&self, i: usize) -> f64 {
        self.labels[i]
    }

    /// Hint the CPU to start loading tuple `i` into cache. Visiting a large buffer in shuffled
    /// order is otherwise bound by memory latency: every tuple is a cache miss (measured: ~80%
    /// of the SGD thread's time on a 4.5M x 18 table went to the first load of each row and
    /// its label). Out-of-range `i` is ignored.
    #[inline]
    pub fn prefetch(&self, i: usize) {
        if i >= self.labels.len() {
            return;
        }
        prefetch_range(&self.labels[i..i + 1]);
        if self.sparse {
            let (a, b) = (self.offsets[i], self.offsets[i + 1]);
            prefetch_range(&self.indices[a..b]);
            prefetch_range(&self.values[a..b]);
        } else {
            let start = i * self.n_features;
            prefetch_range(&self.values[start..start + self.n_features]);
        }
    }

    /// Hint the CPU to load where sparse tuple `i` starts (its offset), so that a later
    /// `prefetch(i)` finds it in cache instead of stalling on it. Out-of-range `i` is ignored.
    #[inline]
    pub fn prefetch_offset(&self, i: usize) {
        if self.sparse && i < self.labels.len() {
            prefetch(&self.offsets[i]);
        }
    }

    /// Memory used by one dense tuple: its features plus its label, 8 bytes each.
    pub fn bytes_per_tuple(n_features: usize) -> usize {
        (n_features + 1) * 8
    }

    /// Memory used by one sparse tuple with `nnz` non-zeros: 12 bytes per
    /// non-zero (u32 index + f64 value) plus its offset and label.
    pub fn bytes_per_sparse_tuple(nnz: usize) -> usize {
        nnz * 12 + 16
    }
}

/// Why a sparse row is invalid. Positions are 0-based positions in the
/// indices array; indices are shown as the user wrote them (in their base).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SparseError {
    /// indices and values arrays differ in length.
    #[error("sparse row has {indices} indices but {values} values")]
    LengthMismatch { indices: usize, values: usize },
    /// An index below the index base (negative, or 0 with base 1).
    #[error("sparse index {index} at position {} is below the index base {base}", .position + 1)]
    BelowBase {
        position: usize,
        index: i64,
        base: i64,
    },
    /// An index at or beyond n_features (or [`MAX_FEATURES`]).
    #[error(
        "sparse index {index} at position {} is out of range: the largest valid index is {} ({n_features} features, index base {base})",
        .position + 1,
        *.n_features as i64 - 1 + .base
    )]
    OutOfRange {
        position: usize,
        index: i64,
        base: i64,
        n_features: usize,
    },
    /// An index smaller than the one before it.
    #[error(
        "sparse indices must be in increasing order: {index} at position {} follows {previous}",
        .position + 1
    )]
    Unsorted {
        position: usize,
        index: i64,
        previous: i64,
    },
    /// The same index twice in a row.
    #[error("sparse index {index} appears twice (positions {position} and {})", .position + 1)]
    Duplicate { position: usize, index: i64 },
}

/// Why [`TupleArena::try_push_sparse`] refused a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SparsePushError {
    Index(SparseError),
    /// A value is NaN or infinite.
    NotFinite,
}

/// Checks one sparse row as the user gave it: `indices` in base `index_base`
/// (0 or 1), `values_len` values, `n_features` the declared dimension (None:
/// up to [`MAX_FEATURES`]).
pub fn validate_sparse<I: Copy + Into<i64>>(
    indices: &[I],
    values_len: usize,
    index_base: i64,
    n_features: Option<usize>,
) -> Result<(), SparseError> {
    if indices.len() != values_len {
        return Err(SparseError::LengthMismatch {
            indices: indices.len(),
            values: values_len,
        });
    }
    let n = n_features.unwrap_or(MAX_FEATURES).min(MAX_FEATURES);
    let mut previous: Option<i64> = None;
    for (position, &i) in indices.iter().enumerate() {
        let index: i64 = i.into();
        if index < index_base {
            return Err(SparseError::BelowBase {
                position,
                index,
                base: index_base,
            });
        }
        if (index - index_base) as u64 >= n as u64 {
            return Err(SparseError::OutOfRange {
                position,
                index,
                base: index_base,
                n_features: n,
            });
        }
        if let Some(p) = previous {
            if index == p {
                return Err(SparseError::Duplicate { position, index });
            }
            if index < p {
                return Err(SparseError::Unsorted {
                    position,
                    index,
                    previous: p,
                });
            }
        }
        previous = Some(index);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
