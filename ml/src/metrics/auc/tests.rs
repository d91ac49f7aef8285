//! Tests of the score histogram: its bins, and its ROC AUC against the exact one.

use super::*;
use crate::metrics::tests::{close, Rand};
use crate::metrics::BinaryMetrics;

/// ROC AUC of `scored` (score, is positive) as `m` computes it.
fn auc(mut m: BinaryMetrics, scored: &[(f64, bool)]) -> Option<f64> {
    for &(s, a) in scored {
        m.push(s, None, a);
    }
    m.finish().roc_auc
}

fn exact_auc(scored: &[(f64, bool)]) -> Option<f64> {
    auc(BinaryMetrics::new(), scored)
}

/// The exact AUC of `v` lies in `expect`, and the histogram's is within `tolerance` of it.
fn check_histogram_auc(v: &[(f64, bool)], expect: std::ops::Range<f64>, tolerance: f64, seed: u64) {
    let (exact, hist) = (exact_auc(v).unwrap(), histogram_auc(v).unwrap());
    assert!(expect.contains(&exact), "seed {seed}: exact {exact}");
    assert!(
        (exact - hist).abs() <= tolerance,
        "seed {seed}: {exact} vs {hist}"
    );
}

fn histogram_auc(scored: &[(f64, bool)]) -> Option<f64> {
    auc(BinaryMetrics::with_histogram(), scored)
}

/// Positives from `pos(rng)`, negatives from `neg(rng)`, one in three positive.
fn sample(seed: u64, n: usize, mut score: impl FnMut(&mut Rand, bool) -> f64) -> Vec<(f64, bool)> {
    let mut rng = Rand::new(seed);
    (0..n)
        .map(|i| {
            let positive = i % 3 == 0;
            (score(&mut rng, positive), positive)
        })
        .collect()
}

/// The monotone map the histogram bins (for the tests' own expectations).
fn log_map(s: f64) -> f64 {
    s.signum() * (s.abs() / AUC_SCORE_UNIT).ln_1p()
}

const BIN_WIDTH: f64 = 2.0 * AUC_LOG_RANGE / AUC_BINS as f64;

#[test]
fn histogram_bins_are_monotone_and_cover_the_range() {
    assert!((AUC_LOG_RANGE - (1e15 / AUC_SCORE_UNIT).ln_1p()).abs() < 1e-12);
    let mid = AUC_BINS / 2;
    assert_eq!(ScoreHistogram::bin(0.0), mid);
    assert_eq!(ScoreHistogram::bin(-0.0), mid);
    assert_eq!(ScoreHistogram::bin(1e-300), mid);
    assert_eq!(ScoreHistogram::bin(-1e-9), mid - 1);
    assert_eq!(ScoreHistogram::bin(1e-9), mid);
    assert_eq!(ScoreHistogram::bin(2e-9), mid + 1);
    for top in [1e15 * 1.0001, 1e16, 1e300, f64::MAX, f64::INFINITY] {
        assert_eq!(ScoreHistogram::bin(top), AUC_BINS - 1, "{top}");
        assert_eq!(ScoreHistogram::bin(-top), 0, "{}", -top);
    }
    assert_eq!(ScoreHistogram::bin(f64::NAN), 0);
    assert!(ScoreHistogram::bin(1e15 * 0.99) < AUC_BINS - 1);
    assert!(ScoreHistogram::bin(-1e15 * 0.99) > 0);
    // Sorted scores of every magnitude, both signs: bins never decrease, and scores
    // further apart (in the log map) than a bin are in different bins.
    let mut scores: Vec<f64> = (-1500..=1500)
        .map(|e| 10f64.powf(e as f64 / 100.0))
        .flat_map(|m| [m, -m])
        .chain((-2000..=2000).map(|i| i as f64 * 1.7e-4))
        .collect();
    scores.sort_by(f64::total_cmp);
    let bins: Vec<usize> = scores.iter().map(|&s| ScoreHistogram::bin(s)).collect();
    for i in 1..scores.len() {
        assert!(bins[i - 1] <= bins[i], "{} {}", scores[i - 1], scores[i]);
    }
    for (i, &a) in scores.iter().enumerate() {
        for &b in &scores[i + 1..(i + 40).min(scores.len())] {
            if log_map(b) - log_map(a) > BIN_WIDTH * (1.0 + 1e-9) {
                assert!(ScoreHistogram::bin(a) < ScoreHistogram::bin(b), "{a} {b}");
            }
        }
    }
    // About 0.1% apart from 1 to 10^15.
    for m in [1.0, 37.0, 1e3, 1e6, 1e9, 1e14] {
        assert!(
            ScoreHistogram::bin(m) < ScoreHistogram::bin(m * 1.0022),
            "{m}"
        );
        assert!(
            ScoreHistogram::bin(-m * 1.0022) < ScoreHistogram::bin(-m),
            "{m}"
        );
    }
}

#[test]
fn histogram_auc_close_to_exact_on_overlapping_normals() {
    for seed in 0..3 {
        // N(±0.6, 1): AUC ≈ 0.80.
        let v = sample(seed, 60_000, |r, p| r.normal() + if p { 0.6 } else { -0.6 });
        // Required: 1e-3; on unit-scale scores the bins are ~500x narrower than
        // the spread, so it is far closer.
        check_histogram_auc(&v, 0.75..0.85, 1e-4, seed);
        // Shifted and scaled (all positive, large): still close.
        let v: Vec<(f64, bool)> = v.iter().map(|&(s, p)| (5e3 + 800.0 * s, p)).collect();
        check_histogram_auc(&v, 0.0..1.0, 1e-4, seed);
    }
}

#[test]
fn histogram_auc_close_to_exact_on_huge_magnitudes() {
    for seed in 0..3 {
        // ±10^(3|z|) with |s| up to 10^6, both signs in both classes.
        let v = sample(seed + 10, 60_000, |r, p| {
            let z = r.normal() + if p { 0.6 } else { -0.6 };
            z.signum() * 10f64.powf((z.abs() * 3.0).min(6.0))
        });
        assert!(v.iter().any(|s| s.0 > 1e5) && v.iter().any(|s| s.0 < -1e5));
        assert!(v.iter().all(|s| s.0.abs() <= 1e6));
        assert!(v.iter().any(|s| s.1 && s.0 < 0.0) && v.iter().any(|s| !s.1 && s.0 > 0.0));
        check_histogram_auc(&v, 0.7..0.9, 1e-3, seed);
    }
}

#[test]
fn histogram_auc_close_to_exact_on_tiny_magnitudes() {
    for seed in 0..3 {
        // N(±0.0021, 0.003) clipped to |s| < 1e-2: AUC ≈ 0.84.
        let v = sample(seed + 20, 60_000, |r, p| {
            (0.003 * r.normal() + if p { 0.0021 } else { -0.0021 }).clamp(-0.0099, 0.0099)
        });
        check_histogram_auc(&v, 0.75..0.9, 1e-3, seed);
    }
}

#[test]
fn histogram_auc_exact_when_scores_are_apart() {
    // The hand examples of the exact tests.
    let v = [
        (0.9, true),
        (0.8, false),
        (-0.1, true),
        (0.3, true),
        (-0.7, false),
        (-0.2, false),
    ];
    assert!(close(histogram_auc(&v).unwrap(), 7.0 / 9.0));
    let v = [(0.1, false), (0.4, false), (0.35, true), (0.8, true)];
    assert_eq!(histogram_auc(&v), Some(0.75));
    let v = [(0.5, true), (0.5, false), (0.9, true), (0.1, false)];
    assert_eq!(histogram_auc(&v), Some(3.5 / 4.0));
    // Perfectly separated (even by less than 1% at 10^6, and across 0): 1; reversed: 0.
    let sep: Vec<(f64, bool)> = (0..500)
        .map(|i| (1e6 + i as f64 * 50.0, true))
        .chain((0..500).map(|i| (1e6 - 6e3 - i as f64 * 1e4, false)))
        .chain((0..200).map(|i| (-1e-2 - i as f64, false)))
        .collect();
    assert_eq!(histogram_auc(&sep), Some(1.0));
    let rev: Vec<(f64, bool)> = sep.iter().map(|&(s, p)| (s, !p)).collect();
    assert_eq!(histogram_auc(&rev), Some(0.0));
    // Scores from a grid whose neighbours are more than a bin apart, with repeats (real
    // ties) and random labels: the histogram is exact, ties included.
    let mut grid = Vec::new();
    let mut m = 0.0f64;
    while m < 45.0 {
        grid.push(m.exp_m1() * AUC_SCORE_UNIT); // log_map(grid[k]) = m
        m += 2.5 * BIN_WIDTH + 0.3 * (grid.len() % 7) as f64;
    }
    let grid: Vec<f64> = grid.iter().flat_map(|&g| [g, -g]).collect();
    for seed in 0..3 {
        let mut rng = Rand::new(seed + 30);
        let v: Vec<(f64, bool)> = (0..20_000)
            .map(|_| {
                let s = grid[(rng.uniform() * grid.len() as f64) as usize];
                let positive = rng.uniform() < 1.0 / (1.0 + (-log_map(s) / 5.0).exp());
                (s, positive)
            })
            .collect();
        check_histogram_auc(&v, 0.6..0.99, 1e-12, seed);
    }
}

#[test]
fn histogram_auc_ties_and_single_class() {
    for s in [0.0, 3.7, -1e9, 1e-5, 1e20] {
        let v = [(s, true), (s, false), (s, true), (s, false), (s, false)];
        assert_eq!(histogram_auc(&v), Some(0.5), "{s}");
    }
    let v: Vec<(f64, bool)> = (0..100).map(|i| (i as f64 - 50.0, true)).collect();
    assert_eq!(histogram_auc(&v), None);
    let v: Vec<(f64, bool)> = (0..100).map(|i| (i as f64 - 50.0, false)).collect();
    assert_eq!(histogram_auc(&v), None);
    assert_eq!(histogram_auc(&[]), None);
    let r = BinaryMetrics::with_histogram().finish();
    assert_eq!((r.n, r.roc_auc, r.log_loss), (0, None, None));
}
