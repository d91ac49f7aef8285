//! Tests of the evaluation tables against counts made directly from the rows, and of merging
//! parts (shards) against one pass.

use super::*;
use crate::metrics::tests::Rand;
use crate::model::LinearModel;
use crate::row::Row;
use crate::scoring::{BinaryLabels, Evaluation};

const SPEC: TableSpec = TableSpec {
    calibration_bins: 10,
};

/// Scores far apart (no two in one bin) with random labels.
fn spread_scores(seed: u64, n: usize) -> Vec<(f64, bool)> {
    let mut rng = Rand::new(seed);
    (0..n)
        .map(|i| {
            // 3% apart in size, of both signs: the bins are 0.6% of a score wide.
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            let score = sign * 0.001 * 1.03f64.powi(i as i32);
            (score, rng.uniform() < 0.4)
        })
        .collect()
}

#[test]
fn roc_points_are_the_exact_counts_at_each_threshold() {
    let rows = spread_scores(1, 400);
    let mut t = EvaluationTables::new(ModelKind::Svm, 2, SPEC);
    for &(z, positive) in &rows {
        t.push_binary(z, None, positive);
    }
    let points = t.roc_curve();
    assert_eq!(
        points.len(),
        rows.len() + 1,
        "one point per distinct score + the start"
    );
    assert_eq!((points[0].tp, points[0].fp), (0, 0));
    assert!(points[0].threshold.is_infinite());
    let (p, n) = (
        rows.iter().filter(|r| r.1).count() as u64,
        rows.iter().filter(|r| !r.1).count() as u64,
    );
    for point in &points[1..] {
        let tp = rows
            .iter()
            .filter(|r| r.1 && r.0 >= point.threshold)
            .count() as u64;
        let fp = rows
            .iter()
            .filter(|r| !r.1 && r.0 >= point.threshold)
            .count() as u64;
        assert_eq!((point.tp, point.fp), (tp, fp), "at {}", point.threshold);
        assert_eq!(point.tpr, Some(tp as f64 / p as f64));
        assert_eq!(point.fpr, Some(fp as f64 / n as f64));
        assert_eq!(point.class, 1);
    }
    let last = points.last().unwrap();
    assert_eq!((last.tp, last.fp), (p, n));
    // Thresholds fall from +inf.
    assert!(points.windows(2).all(|w| w[0].threshold > w[1].threshold));
}

#[test]
fn precision_and_f1_follow_the_counts() {
    let mut t = EvaluationTables::new(ModelKind::Svm, 2, SPEC);
    for (z, positive) in [(3.0, true), (2.0, false), (1.0, true), (-1.0, false)] {
        t.push_binary(z, None, positive);
    }
    let points = t.roc_curve();
    assert_eq!(points[0].precision, None, "nothing predicted positive");
    let at_2 = points[2];
    assert_eq!((at_2.tp, at_2.fp), (1, 1));
    assert_eq!(at_2.precision, Some(0.5));
    assert_eq!(at_2.tpr, Some(0.5));
    assert_eq!(at_2.f1, Some(0.5));
}

#[test]
fn logistic_thresholds_are_probabilities() {
    let mut t = EvaluationTables::new(ModelKind::Logistic, 2, SPEC);
    for z in [-4.0, -1.0, 0.5, 2.0] {
        t.push_binary(z, Some(crate::model::sigmoid(z)), z > 0.0);
    }
    let points = t.roc_curve();
    for (point, z) in points[1..].iter().zip([2.0, 0.5, -1.0, -4.0]) {
        let p = crate::model::sigmoid(z);
        assert!(
            point.threshold <= p && point.threshold > p - 0.01,
            "{point:?}"
        );
    }
}

#[test]
fn confusion_matrix_counts_actual_by_predicted() {
    let mut t = EvaluationTables::new(ModelKind::Svm, 2, SPEC);
    for (z, positive) in [
        (1.0, true),
        (1.0, true),
        (-1.0, true),
        (0.0, false),
        (-2.0, false),
    ] {
        t.push_binary(z, None, positive);
    }
    // (actual, predicted): 0 = negative, 1 = positive; z >= 0 predicts positive.
    assert_eq!(
        t.confusion_matrix(),
        vec![(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 2)]
    );
    assert_eq!(t.rows(), 5);
    assert!(!t.has_calibration(), "an svm has no probabilities");
}

#[test]
fn calibration_bins_hold_mean_prediction_and_observed_rate() {
    let mut t = EvaluationTables::new(ModelKind::Logistic, 2, SPEC);
    let rows = [
        (0.05, false),
        (0.08, true),
        (0.55, true),
        (0.51, false),
        (0.52, true),
        (1.0, true),
    ];
    for (p, positive) in rows {
        let p: f64 = p;
        let z = (p / (1.0 - p)).ln();
        t.push_binary(z, Some(p), positive);
    }
    let table = t.calibration();
    assert_eq!(table.len(), 10);
    let first = table[0];
    assert_eq!(
        (first.bin, first.lower, first.upper, first.rows),
        (1, 0.0, 0.1, 2)
    );
    assert!((first.mean_predicted.unwrap() - 0.065).abs() < 1e-12);
    assert_eq!(first.observed, Some(0.5));
    let sixth = table[5];
    assert_eq!(sixth.rows, 3);
    assert!((sixth.observed.unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(table[9].rows, 1, "p = 1 is in the last bin");
    assert_eq!((table[3].rows, table[3].mean_predicted), (0, None));
}

#[test]
fn classes_get_one_curve_and_calibration_per_class() {
    let mut t = EvaluationTables::new(ModelKind::Softmax, 3, SPEC);
    let rows = [
        ([0.7, 0.2, 0.1], 0, 0),
        ([0.1, 0.6, 0.3], 1, 2),
        ([0.2, 0.3, 0.5], 2, 2),
        ([0.5, 0.4, 0.1], 0, 1),
    ];
    for (probs, predicted, actual) in rows {
        t.push_classes(predicted, actual, &probs, &[]);
    }
    let matrix = t.confusion_matrix();
    assert_eq!(matrix.len(), 9);
    let count = |a, p| matrix.iter().find(|c| c.0 == a && c.1 == p).unwrap().2;
    assert_eq!(
        (count(0, 0), count(2, 1), count(2, 2), count(1, 0)),
        (1, 1, 1, 1)
    );
    let points = t.roc_curve();
    for class in 0..3 {
        let curve: Vec<_> = points.iter().filter(|p| p.class == class).collect();
        let positives = rows.iter().filter(|r| r.2 == class).count() as u64;
        assert_eq!(curve.last().unwrap().tp, positives);
        assert_eq!(curve.last().unwrap().fp, 4 - positives);
    }
    assert_eq!(t.calibration().len(), 30);
}

#[test]
fn merged_parts_equal_one_pass() {
    let mut rng = Rand::new(7);
    let model = LinearModel::single(ModelKind::Logistic, vec![0.8, -0.5, 0.3], 0.1);
    let rows: Vec<(Vec<f64>, f64)> = (0..3000)
        .map(|_| {
            let x: Vec<f64> = (0..3).map(|_| rng.normal()).collect();
            let y = (rng.uniform() < crate::model::sigmoid(model.decision(Row::Dense(&x)))) as u8;
            (x, y as f64)
        })
        .collect();
    let labels = BinaryLabels::Values {
        negative: 0.0,
        positive: 1.0,
    };
    let evaluation = || Evaluation::mergeable(ModelKind::Logistic, 2, labels).with_tables(SPEC);
    let mut whole = evaluation();
    let mut parts = vec![evaluation(), evaluation(), evaluation()];
    for (i, (x, y)) in rows.iter().enumerate() {
        whole.push(&model, Row::Dense(x), *y);
        parts[i % 3].push(&model, Row::Dense(x), *y);
    }
    let mut merged = evaluation();
    for p in &parts {
        let part = p.part();
        part.check(ModelKind::Logistic, 2, Some(SPEC)).unwrap();
        merged.merge(&part);
    }
    let (a, b) = (whole.tables().unwrap(), merged.tables().unwrap());
    assert_eq!(a.confusion_matrix(), b.confusion_matrix());
    assert_eq!(a.roc_curve(), b.roc_curve());
    // Sums of probabilities add in another order: equal to rounding.
    for (x, y) in a.calibration().iter().zip(b.calibration()) {
        assert_eq!((x.rows, x.observed), (y.rows, y.observed));
        let (mx, my) = (
            x.mean_predicted.unwrap_or(0.0),
            y.mean_predicted.unwrap_or(0.0),
        );
        assert!((mx - my).abs() < 1e-12);
    }
}

#[test]
fn parts_of_another_shape_are_refused() {
    let labels = BinaryLabels::ClassIndices;
    let part = Evaluation::mergeable(ModelKind::Logistic, 2, labels)
        .with_tables(SPEC)
        .part();
    let other_bins = TableSpec {
        calibration_bins: 20,
    };
    assert!(part
        .check(ModelKind::Logistic, 2, Some(other_bins))
        .is_err());
    assert!(part.check(ModelKind::Logistic, 2, None).is_err());
    let no_tables = Evaluation::mergeable(ModelKind::Logistic, 2, labels).part();
    assert!(no_tables.check(ModelKind::Logistic, 2, Some(SPEC)).is_err());
    let mut json = serde_json::to_value(&part).unwrap();
    json["tables"]["roc"][0] = serde_json::json!([[ROC_BINS as u32, 1, 0]]);
    let bad: crate::scoring::EvaluationPart = serde_json::from_value(json).unwrap();
    let err = bad.check(ModelKind::Logistic, 2, Some(SPEC)).unwrap_err();
    assert!(err.contains("beyond"), "{err}");
}

#[test]
fn memory_is_bounded_by_the_shape() {
    let two = EvaluationTables::bytes_needed(ModelKind::Svm, 2, SPEC);
    assert_eq!(two, 4 * 8 + ROC_BINS as u64 * 16);
    let many = EvaluationTables::bytes_needed(ModelKind::Softmax, 1 << 16, SPEC);
    assert!(
        many > 1 << 35,
        "65,536 classes: a matrix of 2^32 cells and 2^16 curves"
    );
}
