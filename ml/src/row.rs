//! One feature vector (dense or sparse) and the kernels over it: dot products and updates.
//! A leaf module: it imports nothing from this crate, so every other module can use it.

/// One feature vector: dense, or sparse with 0-based strictly increasing
/// indices (validated by the caller, see [`crate::validate_sparse`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Row<'a> {
    Dense(&'a [f64]),
    Sparse {
        indices: &'a [u32],
        values: &'a [f64],
    },
}

impl Row<'_> {
    /// `Σ w_j x_j`. Dense rows use [`dot`] (and must be as long as `w`); sparse
    /// indices beyond `w` count as zero weights (features the model never saw).
    #[inline]
    pub fn dot(&self, w: &[f64]) -> f64 {
        match *self {
            Row::Dense(x) => dot(w, x),
            Row::Sparse { indices, values } => {
                let mut acc = 0.0;
                for (&j, &v) in indices.iter().zip(values) {
                    if let Some(wj) = w.get(j as usize) {
                        acc += wj * v;
                    }
                }
                acc
            }
        }
    }

    /// Number of stored values (dense: the length).
    pub fn nnz(&self) -> usize {
        match *self {
            Row::Dense(x) => x.len(),
            Row::Sparse { values, .. } => values.len(),
        }
    }

    /// The dimension this row needs: dense length, or largest index + 1.
    pub fn dim(&self) -> usize {
        match *self {
            Row::Dense(x) => x.len(),
            Row::Sparse { indices, .. } => indices.last().map_or(0, |&j| j as usize + 1),
        }
    }
}

/// Dot product. Four independent accumulators break the serial dependency on
/// one sum, which lets LLVM vectorize (it may not reassociate a single f64 sum).
/// Panics in debug builds if the lengths differ; uses the shorter one otherwise.
#[inline]
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    debug_assert_eq!(a.len(), b.len(), "dot: length mismatch");
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f64; 4];
    let ca = a.chunks_exact(4);
    let cb = b.chunks_exact(4);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        acc[0] += x[0] * y[0];
        acc[1] += x[1] * y[1];
        acc[2] += x[2] * y[2];
        acc[3] += x[3] * y[3];
    }
    let mut rest = 0.0;
    for (x, y) in ra.iter().zip(rb) {
        rest += x * y;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + rest
}

/// `Σ w[indices[i]]·values[i]`, summed like [`dot`] with four accumulators (one serial sum
/// would bound a sparse row by its latency). Panics if an index is beyond `w`.
#[inline]
pub fn sparse_dot(w: &[f64], indices: &[u32], values: &[f64]) -> f64 {
    debug_assert_eq!(indices.len(), values.len(), "sparse_dot: length mismatch");
    assert!(
        all_below(indices, w.len()),
        "sparse index beyond the weights"
    );
    // SAFETY (each get_unchecked): every index is below w.len(), asserted above.
    let at = |j: u32| unsafe { *w.get_unchecked(j as usize) };
    let mut acc = [0.0f64; 4];
    let ci = indices.chunks_exact(4);
    let cv = values.chunks_exact(4);
    let (ri, rv) = (ci.remainder(), cv.remainder());
    for (j, v) in ci.zip(cv) {
        acc[0] += at(j[0]) * v[0];
        acc[1] += at(j[1]) * v[1];
        acc[2] += at(j[2]) * v[2];
        acc[3] += at(j[3]) * v[3];
    }
    let mut rest = 0.0;
    for (&j, &v) in ri.iter().zip(rv) {
        rest += at(j) * v;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + rest
}

/// `w[indices[i]] += a·values[i]`. Panics if an index is beyond `w`.
#[inline]
pub fn sparse_axpy(w: &mut [f64], a: f64, indices: &[u32], values: &[f64]) {
    debug_assert_eq!(indices.len(), values.len(), "sparse_axpy: length mismatch");
    assert!(
        all_below(indices, w.len()),
        "sparse index beyond the weights"
    );
    for (&j, &v) in indices.iter().zip(values) {
        // SAFETY: every index is below w.len(), asserted above.
        unsafe { *w.get_unchecked_mut(j as usize) += a * v };
    }
}

/// Whether every index is below `len`: one branch-free pass (it vectorizes), cheaper than a
/// bounds check on each access.
#[inline]
fn all_below(indices: &[u32], len: usize) -> bool {
    match u32::try_from(len) {
        Ok(len) => indices.iter().fold(true, |ok, &j| ok & (j < len)),
        Err(_) => true, // beyond every u32
    }
}
