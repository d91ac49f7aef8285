//! [`Welford`]: the running count, mean and M2 (sum of squared deviations from the mean) of a
//! series, and Chan's merge of two. The one implementation behind the feature and label
//! statistics ([`crate::stats`]), the preprocessing statistics ([`crate::preprocess`]), the
//! regression metrics and the trainer's per-epoch R² ([`crate::metrics`]): each of them
//! computed exactly these operations, in this order, before they shared it (the tests prove
//! it bit for bit). Models depend on every bit: never reorder an operation.
//!
//! A leaf: imports nothing from the crate but the serde helper `crate::nonfinite`.

use serde::{Deserialize, Serialize};

/// Welford's streaming mean and M2 of a series: M2 of the actual values is the SST of R².
/// Serializes as `{"n", "mean", "m2"}` (non-finite sums as strings), the part a shard sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Welford {
    n: u64,
    #[serde(with = "crate::nonfinite")]
    mean: f64,
    #[serde(with = "crate::nonfinite")]
    m2: f64,
}

impl Welford {
    pub fn new() -> Self {
        Self::default()
    }

    /// The moments as they were stored or sent (count, mean, M2).
    pub fn from_parts(n: u64, mean: f64, m2: f64) -> Self {
        Welford { n, mean, m2 }
    }

    #[inline]
    pub fn push(&mut self, x: f64) {
        self.n += 1;
        let delta = x - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (x - self.mean);
    }

    /// Adds another series' values (Chan's pairwise merge). The count saturates: one from
    /// another server is not trusted to stay small.
    pub fn merge(&mut self, other: &Welford) {
        if other.n == 0 {
            return;
        }
        let n = self.n.saturating_add(other.n);
        let delta = other.mean - self.mean;
        let (af, bf, nf) = (self.n as f64, other.n as f64, n as f64);
        self.mean += delta * bf / nf;
        self.m2 += other.m2 + delta * delta * af * bf / nf;
        self.n = n;
    }

    /// Values pushed.
    pub fn n(&self) -> u64 {
        self.n
    }

    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// Σ (x - mean)².
    pub fn m2(&self) -> f64 {
        self.m2
    }

    /// (mean, population standard deviation √(M2/n), never NaN from a rounded negative M2);
    /// (0, 0) when empty.
    pub fn mean_std(&self) -> (f64, f64) {
        if self.n == 0 {
            (0.0, 0.0)
        } else {
            (self.mean, (self.m2 / self.n as f64).max(0.0).sqrt())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_core::{RngCore, SeedableRng};

    /// The three implementations as they were before they became [`Welford`], verbatim but for
    /// their names: the reference for bit-identity.
    mod old {
        use serde::{Deserialize, Serialize};

        // ml/src/stats.rs: FeatureStats's per-feature Moments and label moments.
        #[inline]
        pub fn welford(n: u64, mean: &mut f64, m2: &mut f64, x: f64) {
            let delta = x - *mean;
            *mean += delta / n as f64;
            *m2 += delta * (x - *mean);
        }

        pub fn merge_moments(
            na: &mut u64,
            mean_a: &mut f64,
            m2_a: &mut f64,
            nb: u64,
            mean_b: f64,
            m2_b: f64,
        ) {
            if nb == 0 {
                return;
            }
            let n = na.saturating_add(nb);
            let delta = mean_b - *mean_a;
            let (af, bf, nf) = (*na as f64, nb as f64, n as f64);
            *mean_a += delta * bf / nf;
            *m2_a += m2_b + delta * delta * af * bf / nf;
            *na = n;
        }

        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct StatsMoments {
            pub seen: u64,
            pub mean: f64,
            pub m2: f64,
            pub max_abs: f64,
        }

        impl StatsMoments {
            pub fn push(&mut self, v: f64) {
                self.seen += 1;
                self.max_abs = self.max_abs.max(v.abs());
                welford(self.seen, &mut self.mean, &mut self.m2, v);
            }
            // FeatureStats::merge, per feature.
            pub fn merge(&mut self, b: &StatsMoments) {
                merge_moments(
                    &mut self.seen,
                    &mut self.mean,
                    &mut self.m2,
                    b.seen,
                    b.mean,
                    b.m2,
                );
                self.max_abs = self.max_abs.max(b.max_abs);
            }
        }

        // FeatureStats::label_mean_variance.
        pub fn label_mean_variance(n: u64, mean: f64, m2: f64) -> (f64, f64) {
            if n == 0 {
                return (0.0, 0.0);
            }
            (mean, m2 / n as f64)
        }

        // ml/src/preprocess.rs
        #[derive(Clone, Debug, Default)]
        pub struct PreprocessMoments {
            pub n: u64,
            pub mean: f64,
            pub m2: f64,
        }

        impl PreprocessMoments {
            pub fn push(&mut self, x: f64) {
                self.n += 1;
                let delta = x - self.mean;
                self.mean += delta / self.n as f64;
                self.m2 += delta * (x - self.mean);
            }
            pub fn mean_std(&self) -> (f64, f64) {
                if self.n == 0 {
                    (0.0, 0.0)
                } else {
                    (self.mean, (self.m2 / self.n as f64).max(0.0).sqrt())
                }
            }
        }

        // ml/src/metrics.rs (its merge called stats.rs's merge_moments).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
        pub struct MetricsWelford {
            pub n: u64,
            #[serde(with = "crate::nonfinite")]
            pub mean: f64,
            #[serde(with = "crate::nonfinite")]
            pub m2: f64,
        }

        impl MetricsWelford {
            pub fn push(&mut self, x: f64) {
                self.n += 1;
                let delta = x - self.mean;
                self.mean += delta / self.n as f64;
                self.m2 += delta * (x - self.mean);
            }
            pub fn merge(&mut self, other: &MetricsWelford) {
                merge_moments(
                    &mut self.n,
                    &mut self.mean,
                    &mut self.m2,
                    other.n,
                    other.mean,
                    other.m2,
                );
            }
        }
    }

    /// Values of every kind a column holds: tiny, huge, offset, constant runs, signed zeros.
    fn values(seed: u64, n: usize) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let u = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            let x = match rng.next_u32() % 8 {
                0 => 1e6 + 3.0 * (u - 0.5),
                1 => (u - 0.5) * 1e-9,
                2 => (u * 60.0 - 30.0).exp(),
                3 => -0.0,
                4 => 0.0,
                5 => 7.25,
                _ => u * 10.0 - 4.0,
            };
            v.push(x);
        }
        v
    }

    /// Seeded uniforms in (0, 1) and normals (Box–Muller), as the metrics tests draw them.
    struct Rand(ChaCha8Rng);

    impl Rand {
        fn new(seed: u64) -> Self {
            Rand(ChaCha8Rng::seed_from_u64(seed))
        }

        fn uniform(&mut self) -> f64 {
            ((self.0.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }

        fn normal(&mut self) -> f64 {
            let (a, b) = (self.uniform(), self.uniform());
            (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
        }
    }

    /// |a - b| within `tol` relative to the larger magnitude (absolute below 1).
    fn near(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * a.abs().max(b.abs()).max(1.0)
    }

    fn same(a: f64, b: f64, what: &str) {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: {a} vs {b}");
    }

    /// Asserts every output of the new type equals every old one's, bit for bit.
    fn check(
        new: &Welford,
        stats: &old::StatsMoments,
        pre: &old::PreprocessMoments,
        met: &old::MetricsWelford,
    ) {
        assert_eq!(new.n(), stats.seen);
        assert_eq!(new.n(), pre.n);
        assert_eq!(new.n(), met.n);
        for (name, mean, m2) in [
            ("stats", stats.mean, stats.m2),
            ("preprocess", pre.mean, pre.m2),
            ("metrics", met.mean, met.m2),
        ] {
            same(new.mean(), mean, name);
            same(new.m2(), m2, name);
        }
        let (m, s) = new.mean_std();
        let (pm, ps) = pre.mean_std();
        same(m, pm, "mean_std mean");
        same(s, ps, "mean_std std");
        let (lm, lv) = old::label_mean_variance(stats.seen, stats.mean, stats.m2);
        let (nm, nv) = if new.n() == 0 {
            (0.0, 0.0)
        } else {
            (new.mean(), new.m2() / new.n() as f64)
        };
        same(nm, lm, "label mean");
        same(nv, lv, "label variance");
        // The wire form is unchanged.
        assert_eq!(
            serde_json::to_string(new).unwrap(),
            serde_json::to_string(met).unwrap()
        );
    }

    fn push_all(
        xs: &[f64],
    ) -> (
        Welford,
        old::StatsMoments,
        old::PreprocessMoments,
        old::MetricsWelford,
    ) {
        let mut new = Welford::new();
        let mut stats = old::StatsMoments::default();
        let mut pre = old::PreprocessMoments::default();
        let mut met = old::MetricsWelford::default();
        // The label moments of stats.rs: a count kept apart, welford() after incrementing it.
        let (mut ln, mut lmean, mut lm2) = (0u64, 0.0, 0.0);
        for &x in xs {
            new.push(x);
            stats.push(x);
            pre.push(x);
            met.push(x);
            ln += 1;
            old::welford(ln, &mut lmean, &mut lm2, x);
            check(&new, &stats, &pre, &met);
            same(new.mean(), lmean, "label mean");
            same(new.m2(), lm2, "label m2");
        }
        (new, stats, pre, met)
    }

    #[test]
    fn push_is_bit_identical_to_the_three_old_copies() {
        for seed in 0..4 {
            push_all(&values(seed, 3_000));
        }
        push_all(&[]);
        push_all(&[f64::MAX, -f64::MAX, 1.0]);
        push_all(&[f64::INFINITY, 1.0]);
        push_all(&[f64::NAN, 1.0]);
    }

    #[test]
    fn merges_of_random_splits_are_bit_identical() {
        let mut rng = ChaCha8Rng::seed_from_u64(99);
        for seed in 10..40 {
            let xs = values(seed, 2_000 + seed as usize);
            // 1 to 6 parts at random cuts (empty parts included), merged in a random order.
            let parts = 1 + (rng.next_u32() % 6) as usize;
            let mut cuts: Vec<usize> = (0..parts - 1)
                .map(|_| (rng.next_u64() % (xs.len() as u64 + 1)) as usize)
                .collect();
            cuts.push(0);
            cuts.push(xs.len());
            cuts.sort_unstable();
            let mut pieces: Vec<_> = cuts.windows(2).map(|w| push_all(&xs[w[0]..w[1]])).collect();
            for i in (1..pieces.len()).rev() {
                let j = (rng.next_u64() % (i as u64 + 1)) as usize;
                pieces.swap(i, j);
            }
            let mut new = Welford::new();
            let mut stats = old::StatsMoments::default();
            let mut met = old::MetricsWelford::default();
            for (n, s, _, m) in &pieces {
                // Through JSON, as a shard's part travels.
                let n: Welford = serde_json::from_str(&serde_json::to_string(n).unwrap()).unwrap();
                new.merge(&n);
                stats.merge(s);
                met.merge(m);
                let pre = old::PreprocessMoments {
                    n: stats.seen,
                    mean: stats.mean,
                    m2: stats.m2,
                };
                check(&new, &stats, &pre, &met);
            }
            assert_eq!(new.n(), xs.len() as u64);
        }
        // Saturating counts.
        let mut a = Welford::from_parts(u64::MAX - 1, 1.0, 2.0);
        let mut s = old::StatsMoments {
            seen: u64::MAX - 1,
            mean: 1.0,
            m2: 2.0,
            max_abs: 0.0,
        };
        a.merge(&Welford::from_parts(5, -3.0, 0.5));
        s.merge(&old::StatsMoments {
            seen: 5,
            mean: -3.0,
            m2: 0.5,
            max_abs: 0.0,
        });
        assert_eq!(a.n(), s.seen);
        same(a.mean(), s.mean, "saturated mean");
        same(a.m2(), s.m2, "saturated m2");
    }

    #[test]
    fn welford_merge_equals_pushing_all() {
        let mut rng = Rand::new(60);
        // Large offset, small spread: a naive sum-of-squares merge would lose it.
        let values: Vec<f64> = (0..2_001).map(|_| 1e6 + 3.0 * rng.normal()).collect();
        let mut whole = Welford::new();
        for &v in &values {
            whole.push(v);
        }
        assert!(near(whole.m2() / 2_001.0, 9.0, 0.1));
        let of = |vs: &[f64]| {
            let mut w = Welford::new();
            for &v in vs {
                w.push(v);
            }
            w
        };
        for cuts in [
            [0, 0],
            [0, 2_001],
            [1, 2],
            [700, 700],
            [13, 1_500],
            [2_000, 2_001],
        ] {
            let parts = [
                of(&values[..cuts[0]]),
                of(&values[cuts[0]..cuts[1]]),
                of(&values[cuts[1]..]),
            ];
            for order in [[0, 1, 2], [2, 0, 1]] {
                let mut merged = Welford::new();
                for &i in &order {
                    let json = serde_json::to_string(&parts[i]).unwrap();
                    merged.merge(&serde_json::from_str(&json).unwrap());
                }
                assert_eq!(merged.n(), 2_001);
                assert!(near(merged.mean(), whole.mean(), 1e-14), "{cuts:?}");
                assert!(
                    near(merged.m2(), whole.m2(), 1e-9),
                    "{cuts:?}: {} vs {}",
                    merged.m2(),
                    whole.m2()
                );
            }
        }
        // With an empty one, both directions.
        let mut a = whole;
        a.merge(&Welford::new());
        assert_eq!(a, whole);
        let mut b = Welford::new();
        b.merge(&whole);
        assert_eq!(b.n(), whole.n());
        assert!(near(b.mean(), whole.mean(), 1e-15));
        assert_eq!(b.m2(), whole.m2());
        let mut e = Welford::new();
        e.merge(&Welford::new());
        assert_eq!(e, Welford::new());
        // Two single values: mean and M2 by hand.
        let (mut x, mut y) = (Welford::new(), Welford::new());
        x.push(1.0);
        y.push(4.0);
        x.merge(&y);
        assert_eq!((x.n(), x.mean(), x.m2()), (2, 2.5, 4.5));
    }
}
