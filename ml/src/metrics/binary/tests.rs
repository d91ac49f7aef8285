//! Tests of the binary metrics: counts and ratios, exact ROC AUC, log loss, the AUC memory
//! bound, and parts merged across shards.

use super::*;
use crate::metrics::tests::{close, near, Rand};

#[test]
fn binary_counts_and_ratios() {
    // scores:  0.9 0.8 -0.1 0.3 -0.7 -0.2
    // actual:   +   -    +   +    -    -
    // predicted + + - + - -: TP 2, FP 1, FN 1, TN 2
    let mut m = BinaryMetrics::new();
    for (s, a) in [
        (0.9, true),
        (0.8, false),
        (-0.1, true),
        (0.3, true),
        (-0.7, false),
        (-0.2, false),
    ] {
        m.push(s, None, a);
    }
    let r = m.finish();
    assert_eq!(r.n, 6);
    assert!(close(r.accuracy, 4.0 / 6.0));
    assert!(close(r.precision, 2.0 / 3.0));
    assert!(close(r.recall, 2.0 / 3.0));
    assert!(close(r.f1, 2.0 / 3.0));
    // Positive scores 0.9, 0.3, -0.1 vs negatives 0.8, -0.2, -0.7:
    // pairs won: 0.9 beats 3, 0.3 beats 2, -0.1 beats 2 → 7/9.
    assert!(close(r.roc_auc.unwrap(), 7.0 / 9.0));
    assert_eq!(r.log_loss, None);
}

#[test]
fn roc_auc_ranking_and_ties() {
    let auc = |v: &[(f64, bool)]| {
        let mut m = BinaryMetrics::new();
        for &(s, a) in v {
            m.push(s, None, a);
        }
        m.finish().roc_auc
    };
    assert_eq!(auc(&[(1.0, true), (2.0, true), (-1.0, false)]), Some(1.0));
    assert_eq!(auc(&[(1.0, false), (2.0, false), (-1.0, true)]), Some(0.0));
    // All tied: 1/2.
    assert_eq!(
        auc(&[(0.0, true), (0.0, false), (0.0, true), (0.0, false)]),
        Some(0.5)
    );
    // sklearn roc_auc_score([0,0,1,1], [0.1,0.4,0.35,0.8]) == 0.75
    assert_eq!(
        auc(&[(0.1, false), (0.4, false), (0.35, true), (0.8, true)]),
        Some(0.75)
    );
    // One tie between a positive and a negative: 3 wins + 1/2 of 4 pairs.
    assert_eq!(
        auc(&[(0.5, true), (0.5, false), (0.9, true), (0.1, false)]),
        Some(3.5 / 4.0)
    );
    assert_eq!(auc(&[(1.0, true)]), None);
    assert_eq!(auc(&[]), None);
}

#[test]
fn binary_log_loss_and_zero_division() {
    let mut m = BinaryMetrics::new();
    m.push(-1.0, Some(0.2), false); // -ln 0.8
    m.push(-1.0, Some(0.4), true); // -ln 0.4
    let r = m.finish();
    assert!(close(
        r.log_loss.unwrap(),
        -(0.8f64.ln() + 0.4f64.ln()) / 2.0
    ));
    assert_eq!(r.precision, 0.0); // nothing predicted positive
    assert_eq!(r.recall, 0.0);
    assert_eq!(r.f1, 0.0);
    let mut m = BinaryMetrics::new();
    m.push(1.0, Some(1.0), false); // clipped to 1 - 1e-15: -ln(1 - (1 - 1e-15)) ≈ 34.4
    let r = m.finish();
    assert_eq!(r.log_loss.unwrap(), -(1.0 - (1.0 - EPS)).ln());
    assert!(r.log_loss.unwrap() > 34.0 && r.log_loss.unwrap() < 35.0);
    let mut m = BinaryMetrics::new();
    m.push(1.0, Some(0.9), true);
    m.push(1.0, None, true);
    assert_eq!(m.finish().log_loss, None);
    let r = BinaryMetrics::new().finish();
    assert_eq!(
        (r.n, r.accuracy, r.roc_auc, r.log_loss),
        (0, 0.0, None, None)
    );
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["roc_auc"], serde_json::Value::Null);
    assert_eq!(j["n"], 0);
}

#[test]
fn auc_limit_bounds_memory_and_drops_auc() {
    let mut m = BinaryMetrics::with_auc_limit(3);
    for (score, positive) in [(0.9, true), (-0.5, false), (0.2, true)] {
        m.push(score, None, positive);
    }
    let mut over = m.clone();
    assert_eq!(m.finish().roc_auc, Some(1.0));
    over.push(-0.1, None, false);
    let report = over.finish();
    assert_eq!(report.roc_auc, None);
    assert_eq!(report.n, 4);
    assert_eq!(report.accuracy, 1.0);
}

/// Rows (score, P(positive), actual positive) of a logistic-like model.
fn binary_rows(seed: u64, n: usize) -> Vec<(f64, f64, bool)> {
    let mut rng = Rand::new(seed);
    (0..n)
        .map(|_| {
            let z = 2.0 * rng.normal();
            let p = 1.0 / (1.0 + (-z).exp());
            (z, p, rng.uniform() < p)
        })
        .collect()
}

fn push_all(m: &mut BinaryMetrics, rows: &[(f64, f64, bool)], with_prob: bool) {
    for &(z, p, a) in rows {
        m.push(z, with_prob.then_some(p), a);
    }
}

fn round_trip_binary(part: &BinaryPart) -> BinaryPart {
    let json = serde_json::to_string(part).unwrap();
    let back: BinaryPart = serde_json::from_str(&json).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
    back
}

#[test]
fn binary_parts_merge_to_one_pass() {
    let rows = binary_rows(40, 5_000);
    let mut whole = BinaryMetrics::with_histogram();
    push_all(&mut whole, &rows, true);
    let mut exact = BinaryMetrics::new();
    push_all(&mut exact, &rows, true);
    let whole_part = whole.part();
    let whole = whole.finish();
    let exact = exact.finish();
    // Parts of 1234, 0 and 3766 rows, merged in two orders.
    let splits = [&rows[..1234], &rows[1234..1234], &rows[1234..]];
    for order in [[0, 1, 2], [2, 1, 0]] {
        let mut merged = BinaryMetrics::with_histogram();
        for &i in &order {
            let mut m = BinaryMetrics::with_histogram();
            push_all(&mut m, splits[i], true);
            merged.merge(&round_trip_binary(&m.part()));
        }
        let p = merged.part();
        assert_eq!(
            (p.tp, p.fp, p.tn, p.fn_, p.all_have_prob),
            (
                whole_part.tp,
                whole_part.fp,
                whole_part.tn,
                whole_part.fn_,
                whole_part.all_have_prob
            )
        );
        assert_eq!(p.bins, whole_part.bins);
        assert!(!p.bins.is_empty());
        let r = merged.finish();
        assert_eq!(r.n, 5_000);
        assert_eq!(
            (r.accuracy, r.precision, r.recall, r.f1, r.roc_auc),
            (
                whole.accuracy,
                whole.precision,
                whole.recall,
                whole.f1,
                whole.roc_auc
            )
        );
        assert!(near(r.log_loss.unwrap(), whole.log_loss.unwrap(), 1e-12));
        // And the same as the exact one-pass metrics, AUC aside.
        assert_eq!(
            (r.accuracy, r.precision, r.recall, r.f1, r.n),
            (
                exact.accuracy,
                exact.precision,
                exact.recall,
                exact.f1,
                exact.n
            )
        );
        assert!(near(r.log_loss.unwrap(), exact.log_loss.unwrap(), 1e-12));
        assert!((r.roc_auc.unwrap() - exact.roc_auc.unwrap()).abs() <= 1e-4);
    }
    // A part without probabilities (svm-like) makes the merged log loss None, in either
    // order; an empty part (no rows, so "every row had one") does not.
    let mut no_prob = BinaryMetrics::with_histogram();
    push_all(&mut no_prob, &rows[..10], false);
    let mut with_prob = BinaryMetrics::with_histogram();
    push_all(&mut with_prob, &rows[10..], true);
    for parts in [
        [no_prob.part(), with_prob.part()],
        [with_prob.part(), no_prob.part()],
    ] {
        let mut merged = BinaryMetrics::with_histogram();
        for p in &parts {
            merged.merge(&round_trip_binary(p));
        }
        let r = merged.finish();
        assert_eq!((r.n, r.log_loss), (5_000, None));
        assert!(r.roc_auc.is_some());
    }
    let mut merged = BinaryMetrics::with_histogram();
    merged.merge(&BinaryMetrics::with_histogram().part());
    merged.merge(&with_prob.part());
    merged.merge(&BinaryMetrics::with_histogram().part());
    assert!(merged.finish().log_loss.is_some());
    // Only empty parts: the empty report.
    let mut merged = BinaryMetrics::with_histogram();
    merged.merge(&round_trip_binary(&BinaryMetrics::with_histogram().part()));
    assert_eq!(merged.finish(), BinaryMetrics::new().finish());
}

#[test]
fn binary_merge_ignores_bins_out_of_range() {
    let hostile = BinaryPart {
        tp: 1,
        fp: 0,
        tn: 1,
        fn_: 0,
        log_loss_sum: 0.0,
        all_have_prob: false,
        bins: vec![
            (AUC_BINS as u32, 7, 7),
            (3, 1, 0),
            (u32::MAX, 5, 9),
            (AUC_BINS as u32 - 1, 0, 1),
            (AUC_BINS as u32 + 1, 0, 3),
        ],
    };
    let mut m = BinaryMetrics::with_histogram();
    m.merge(&hostile);
    let p = m.part();
    assert_eq!(p.bins, vec![(3, 1, 0), (AUC_BINS as u32 - 1, 0, 1)]);
    // The positive is in the lowest bin, the negative in the highest.
    assert_eq!(m.clone().finish().roc_auc, Some(0.0));
    // From JSON, as a shard's reply would arrive.
    let json = r#"{"tp":0,"fp":0,"tn":0,"fn_":0,"log_loss_sum":0.0,"all_have_prob":true,
                   "bins":[[65536,1,1],[4294967295,2,2],[100,0,1],[200,1,0]]}"#;
    m.merge(&serde_json::from_str(json).unwrap());
    let r = m.finish();
    assert_eq!(r.n, 2);
    // Positives in bins 3, 200; negatives in 100, 65535: 1 win of 4.
    assert_eq!(r.roc_auc, Some(0.25));
}
