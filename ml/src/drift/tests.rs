use super::distance::{jensen_shannon, l_infinity, psi, PSI_EPSILON};
use super::*;
use crate::preprocess::profile::{
    bin_of, shares, ColumnProfile, NumberSketch, PredictionSketch, Profile, Summary, PROFILE_BINS,
};

fn close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-12, "{a} != {b}");
}

#[test]
fn psi_by_hand() {
    // (0.3-0.5) ln(0.3/0.5) + (0.7-0.5) ln(0.7/0.5)
    let want = -0.2 * (0.6f64).ln() + 0.2 * (1.4f64).ln();
    close(psi(&[0.5, 0.5], &[0.3, 0.7]), want);
    close(psi(&[0.25; 4], &[0.25; 4]), 0.0);
    // An empty bin is floored at 1e-4, not infinite.
    let want = (0.5 - PSI_EPSILON) * (0.5 / PSI_EPSILON).ln() + (0.5 - 1.0) * (0.5f64 / 1.0).ln();
    close(psi(&[1.0, 0.0], &[0.5, 0.5]), want);
}

#[test]
fn jensen_shannon_by_hand() {
    close(jensen_shannon(&[1.0, 0.0], &[0.0, 1.0]), 1.0);
    close(jensen_shannon(&[0.3, 0.7], &[0.3, 0.7]), 0.0);
    // P = (0.5, 0.5), Q = (0.9, 0.1), M = (0.7, 0.3)
    let kl = |p: [f64; 2], m: [f64; 2]| p[0] * (p[0] / m[0]).log2() + p[1] * (p[1] / m[1]).log2();
    let want = 0.5 * kl([0.5, 0.5], [0.7, 0.3]) + 0.5 * kl([0.9, 0.1], [0.7, 0.3]);
    close(jensen_shannon(&[0.5, 0.5], &[0.9, 0.1]), want);
    close(l_infinity(&[0.5, 0.5], &[0.9, 0.1]), 0.4);
}

#[test]
fn bins_and_shares() {
    let cuts = [1.0, 2.0, 3.0];
    assert_eq!(bin_of(&cuts, 0.5), 0);
    assert_eq!(bin_of(&cuts, 1.0), 1);
    assert_eq!(bin_of(&cuts, 2.5), 2);
    assert_eq!(bin_of(&cuts, 3.0), 3);
    assert_eq!(bin_of(&cuts, 9.0), 3);
    assert_eq!(shares(&[1, 3]), vec![0.25, 0.75]);
    assert_eq!(shares(&[0, 0]), vec![0.0, 0.0]);
}

#[test]
fn number_sketch_few_values_is_exact() {
    let mut s = NumberSketch::new();
    for i in 0..1000 {
        s.push(f64::from(i % 3));
    }
    let (cuts, shares, min, max) = s.finish();
    assert_eq!(cuts, vec![1.0, 2.0]);
    assert_eq!(min, 0.0);
    assert_eq!(max, 2.0);
    close(shares[0], 334.0 / 1000.0);
    close(shares[1], 333.0 / 1000.0);
}

#[test]
fn number_sketch_deciles_of_uniform_values() {
    let mut s = NumberSketch::new();
    let n = 100_000;
    for i in 0..n {
        // A permutation of 0..n (a multiplier prime to n).
        s.push(((i as u64 * 7919) % n as u64) as f64);
    }
    let (cuts, shares, _, _) = s.finish();
    assert_eq!(cuts.len(), PROFILE_BINS as usize - 1);
    for (k, c) in cuts.iter().enumerate() {
        let want = (k + 1) as f64 * n as f64 / 10.0;
        assert!((c - want).abs() < 0.01 * n as f64, "cut {k}: {c}");
    }
    for s in &shares {
        assert!((s - 0.1).abs() < 0.01, "share {s}");
    }
    close(shares.iter().sum::<f64>(), 1.0);
}

#[test]
fn number_profile_counts_today_in_training_bins() {
    let training = Summary::Number {
        rows: 10,
        missing: 0,
        mean: 0.0,
        std: 1.0,
        min: -1.0,
        max: 1.0,
        cuts: vec![0.0],
        shares: vec![0.5, 0.5],
    };
    let mut today = Counter::for_training(Some(&training), ColumnKind::Number);
    for v in [Some(-0.5), Some(0.5), Some(0.7), None] {
        today.number(v);
    }
    let d = compare(&training, &today.finish()).expect("comparable");
    // Training [0.5, 0.5, null 0], today [0.25, 0.5, null 0.25].
    let (p, q) = ([0.5, 0.5, 0.0], [0.25, 0.5, 0.25]);
    close(d.psi, psi(&p, &q));
    close(d.jensen_shannon, jensen_shannon(&p, &q));
    close(d.l_infinity, 0.25);
}

#[test]
fn category_profile_pools_unknown_values() {
    let training = Summary::Categories {
        rows: 4,
        missing: 0,
        categories: vec!["a".into(), "b".into()],
        shares: vec![0.5, 0.5, 0.0, 0.0],
    };
    let mut today = Counter::for_training(Some(&training), ColumnKind::Text);
    for v in [Some(&b"a"[..]), Some(b"c"), Some(b"c"), None] {
        today.text(v);
    }
    let Summary::Categories { shares, .. } = today.finish() else {
        panic!("categories")
    };
    assert_eq!(shares, vec![0.25, 0.0, 0.5, 0.25]);
}

#[test]
fn profile_round_trips_as_json() {
    let p = Profile {
        rows: 3,
        columns: vec![ColumnProfile {
            name: "x".into(),
            summary: Summary::Number {
                rows: 3,
                missing: 1,
                mean: 1.0,
                std: 0.5,
                min: 0.0,
                max: 2.0,
                cuts: vec![1.0],
                shares: vec![0.5, 0.5],
            },
        }],
        label: None,
        predictions: None,
    };
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(serde_json::from_value::<Profile>(json).unwrap(), p);
}

#[test]
fn a_profile_without_predictions_still_reads() {
    // A model trained before predictions were profiled: its stored profile has no such key.
    let old = serde_json::json!({"rows": 2, "columns": [], "label": null});
    let p: Profile = serde_json::from_value(old).unwrap();
    assert_eq!(p.predictions, None);
    assert!(serde_json::to_value(&p)
        .unwrap()
        .get("predictions")
        .is_none());
}

#[test]
fn class_predictions_are_shares_in_the_model_order() {
    let mut s = PredictionSketch::classes(3);
    for c in [2, 0, 2, 2, 7] {
        s.push_class(c);
    }
    let summary = s.finish(vec!["b".into(), "a".into(), "c".into()]);
    let Summary::Categories {
        rows,
        categories,
        shares,
        ..
    } = &summary
    else {
        panic!("categories")
    };
    assert_eq!(*rows, 5);
    assert_eq!(categories, &["b", "a", "c"]);
    // Each class, "(other)" (an index past the classes), NULL.
    assert_eq!(shares, &[0.2, 0.0, 0.6, 0.2, 0.0]);
    // Today's predictions, counted by name in the same categories, compare with it.
    let mut today = Counter::for_training(Some(&summary), ColumnKind::Text);
    for v in [b"b", b"b", b"c", b"a"] {
        today.text(Some(&v[..]));
    }
    let d = compare(&summary, &today.finish()).unwrap();
    assert!((d.l_infinity - 0.35).abs() < 1e-12);
    let p = [0.2, 0.0, 0.6, 0.2, 0.0];
    let q = [0.5, 0.25, 0.25, 0.0, 0.0];
    assert!((d.jensen_shannon - jensen_shannon(&p, &q)).abs() < 1e-15);
}

#[test]
fn number_predictions_are_deciles_and_today_counts_in_them() {
    let mut s = PredictionSketch::number();
    for i in 0..1000 {
        s.push_number(i as f64);
    }
    s.push_number(f64::NAN);
    let summary = s.finish(Vec::new());
    let Summary::Number {
        rows,
        missing,
        cuts,
        shares,
        mean,
        min,
        max,
        ..
    } = &summary
    else {
        panic!("number")
    };
    assert_eq!((*rows, *missing), (1001, 1));
    assert_eq!((*min, *max, *mean), (0.0, 999.0, 499.5));
    assert_eq!(cuts.len(), 9);
    for (k, c) in cuts.iter().enumerate() {
        assert!((c - 100.0 * (k + 1) as f64).abs() < 10.0, "{cuts:?}");
    }
    assert!(shares.iter().all(|s| (s - 0.1).abs() < 0.02), "{shares:?}");
    // The same values today: a PSI near 0; shifted by a decile's width: far from it.
    let count = |shift: f64| {
        let mut today = Counter::for_training(Some(&summary), ColumnKind::Number);
        for i in 0..1000 {
            today.number(Some(i as f64 + shift));
        }
        today.number(None);
        compare(&summary, &today.finish()).unwrap()
    };
    assert!(count(0.0).psi < 0.01);
    assert!(count(300.0).psi > 0.25);
}

#[test]
fn only_finite_predictions_are_summarised() {
    let mut s = PredictionSketch::number();
    s.push_number(f64::INFINITY);
    let Summary::Number {
        rows,
        missing,
        shares,
        ..
    } = s.finish(Vec::new())
    else {
        panic!("number")
    };
    assert_eq!((rows, missing, shares), (1, 1, vec![0.0]));
}
