//! Contiguous in-memory buffer of decoded tuples.
//!
//! One flat `Vec<f64>` for all features (row-major) plus one for labels: no
//! per-tuple allocation, good locality for the SGD inner loop, and `clear()`
//! keeps the allocation so the buffer is reused across fills.

/// Contiguous storage of decoded dense tuples: one `Vec<f64>` for all features
/// (row-major), one for labels.
#[derive(Clone, Debug, Default)]
pub struct TupleArena {
    n_features: usize,
    features: Vec<f64>,
    labels: Vec<f64>,
}

impl TupleArena {
    /// Empty arena for tuples of `n_features` features, with room for
    /// `capacity_tuples` tuples reserved up front.
    pub fn new(n_features: usize, capacity_tuples: usize) -> Self {
        TupleArena {
            n_features,
            features: Vec::with_capacity(n_features.saturating_mul(capacity_tuples)),
            labels: Vec::with_capacity(capacity_tuples),
        }
    }

    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// Number of tuples stored.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Removes all tuples but keeps the allocation.
    pub fn clear(&mut self) {
        self.features.clear();
        self.labels.clear();
    }

    pub fn push(&mut self, label: f64, features: &[f64]) {
        debug_assert_eq!(features.len(), self.n_features, "feature vector length");
        self.features.extend_from_slice(features);
        self.labels.push(label);
    }

    /// Like [`push`](Self::push) for `real[]` columns: widens to f64.
    pub fn push_f32(&mut self, label: f64, features: &[f32]) {
        debug_assert_eq!(features.len(), self.n_features, "feature vector length");
        self.features.extend(features.iter().map(|&v| f64::from(v)));
        self.labels.push(label);
    }

    /// Features of tuple `i`. Panics if `i >= len()`.
    #[inline]
    pub fn features(&self, i: usize) -> &[f64] {
        let start = i * self.n_features;
        &self.features[start..start + self.n_features]
    }

    /// Label of tuple `i`. Panics if `i >= len()`.
    #[inline]
    pub fn label(&self, i: usize) -> f64 {
        self.labels[i]
    }

    /// Memory used by one tuple: its features plus its label, 8 bytes each.
    pub fn bytes_per_tuple(n_features: usize) -> usize {
        (n_features + 1) * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_and_read_back() {
        let mut a = TupleArena::new(3, 4);
        assert!(a.is_empty());
        a.push(1.0, &[1.0, 2.0, 3.0]);
        a.push_f32(-1.0, &[4.5f32, 5.0, 6.0]);
        assert_eq!(a.len(), 2);
        assert_eq!(a.n_features(), 3);
        assert_eq!(a.features(0), &[1.0, 2.0, 3.0]);
        assert_eq!(a.features(1), &[4.5, 5.0, 6.0]);
        assert_eq!(a.label(1), -1.0);
    }

    #[test]
    fn clear_keeps_allocation() {
        let mut a = TupleArena::new(2, 100);
        for i in 0..100 {
            a.push(i as f64, &[1.0, 2.0]);
        }
        let cap = a.features.capacity();
        a.clear();
        assert!(a.is_empty());
        assert_eq!(a.features.capacity(), cap);
    }

    #[test]
    fn zero_features() {
        let mut a = TupleArena::new(0, 2);
        a.push(1.0, &[]);
        assert_eq!(a.len(), 1);
        assert_eq!(a.features(0), &[] as &[f64]);
        assert_eq!(TupleArena::bytes_per_tuple(0), 8);
        assert_eq!(TupleArena::bytes_per_tuple(9), 80);
    }
}
