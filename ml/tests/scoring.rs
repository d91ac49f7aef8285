//! Scoring a model on labelled rows: validation statistics and the evaluation report.

use corgipile_ml::arena::TupleArena;
use corgipile_ml::model::{LinearModel, ModelKind};
use corgipile_ml::scoring::{BinaryLabels, Evaluation, ValidationScore, ValidationStats};

/// z = x0 - x1 (+ bias).
fn binary_model(kind: ModelKind) -> LinearModel {
    LinearModel::single(kind, vec![1.0, -1.0], 0.0)
}

fn arena(rows: &[(f64, [f64; 2])]) -> TupleArena {
    let mut a = TupleArena::new(2, rows.len());
    for (label, x) in rows {
        a.push(*label, x);
    }
    a
}

fn validate(model: &LinearModel, a: &TupleArena, binary: Option<BinaryLabels>) -> ValidationStats {
    let mut v = ValidationScore::new(model.kind, binary);
    for i in 0..a.len() {
        v.push(model, a.row(i), a.label(i));
    }
    v.finish()
}

fn evaluate(
    model: &LinearModel,
    a: &TupleArena,
    k: usize,
    binary: BinaryLabels,
    auc: usize,
) -> serde_json::Value {
    let mut e = Evaluation::new(model.kind, k, binary, auc);
    for i in 0..a.len() {
        e.push(model, a.row(i), a.label(i));
    }
    e.finish(3)
}

#[test]
fn binary_labels_map_values_and_class_indices() {
    let v = BinaryLabels::Values {
        negative: 3.0,
        positive: 5.0,
    };
    assert_eq!(
        (v.positive(5.0), v.positive(3.0), v.positive(4.0)),
        (Some(true), Some(false), None)
    );
    assert_eq!(
        (v.sign(5.0), v.sign(3.0), v.sign(f64::NAN)),
        (Some(1.0), Some(-1.0), None)
    );
    let c = BinaryLabels::ClassIndices;
    assert_eq!(
        (c.positive(0.0), c.positive(1.0), c.positive(2.0)),
        (Some(false), Some(true), None)
    );
    assert_eq!((c.sign(0.0), c.sign(1.0)), (Some(-1.0), Some(1.0)));
    let nan = BinaryLabels::Values {
        negative: f64::NAN,
        positive: 1.0,
    };
    assert_eq!(nan.positive(f64::NAN), None);
}

#[test]
fn binary_validation_skips_labels_of_neither_class() {
    let m = binary_model(ModelKind::Svm);
    // z: 1, -1, 2, 0, and a row labelled 9.
    let a = arena(&[
        (5.0, [1.0, 0.0]),
        (5.0, [0.0, 1.0]),
        (3.0, [2.0, 0.0]),
        (3.0, [1.0, 1.0]),
        (9.0, [1.0, 0.0]),
    ]);
    let s = validate(
        &m,
        &a,
        Some(BinaryLabels::Values {
            negative: 3.0,
            positive: 5.0,
        }),
    );
    assert_eq!(s.rows, 4);
    assert_eq!(s.accuracy, Some(0.25)); // only the first row is right (z = 0 predicts +1)
                                        // hinge: max(0, 1 - y z) = 0, 2, 3, 1
    assert_eq!(s.loss, 6.0 / 4.0);
    assert_eq!(s.r2, None);
    // Without a mapping no binary row is scored.
    let none = validate(&m, &a, None);
    assert_eq!((none.rows, none.accuracy), (0, Some(0.0)));
    assert!(none.loss.is_nan());
}

#[test]
fn softmax_validation_skips_classes_the_model_lacks() {
    let m = LinearModel {
        kind: ModelKind::Softmax,
        n_features: 2,
        n_outputs: 2,
        weights: vec![1.0, 0.0, 0.0, 1.0],
        bias: vec![0.0, 0.0],
    };
    let a = arena(&[(0.0, [2.0, 0.0]), (1.0, [2.0, 0.0]), (2.0, [0.0, 2.0])]);
    let s = validate(&m, &a, None);
    assert_eq!((s.rows, s.accuracy), (2, Some(0.5)));
    let p0 = 1.0 / (1.0 + (-2f64).exp());
    assert!((s.loss - (-p0.ln() - (1.0 - p0).ln()) / 2.0).abs() < 1e-12);
    // Evaluation counts it as unknown and skipped.
    let r = evaluate(&m, &a, 2, BinaryLabels::ClassIndices, 100);
    assert_eq!(r["rows_scored"], 2);
    assert_eq!(r["rows_skipped"], 3 + 1);
    assert_eq!(r["rows_with_unknown_label"], 1);
    assert_eq!(r["accuracy"], 0.5);
    assert!(r["per_class"].is_array() && r["log_loss"].is_number());
}

#[test]
fn linear_validation_reports_r2() {
    let m = LinearModel::single(ModelKind::Linear, vec![1.0, 0.0], 0.0);
    let a = arena(&[(1.0, [1.0, 0.0]), (2.0, [2.0, 0.0]), (3.0, [4.0, 0.0])]);
    let s = validate(&m, &a, None);
    assert_eq!((s.rows, s.accuracy), (3, None));
    assert_eq!(s.loss, 0.5 * 1.0 / 3.0);
    assert!((s.r2.unwrap() - 0.5).abs() < 1e-12); // SSE 1, SST 2
    let r = evaluate(&m, &a, 0, BinaryLabels::ClassIndices, 0);
    assert_eq!(
        (
            r["n"].as_u64(),
            r["rows_scored"].as_u64(),
            r["rows_skipped"].as_u64()
        ),
        (Some(3), Some(3), Some(3))
    );
    assert!(r.get("rows_with_unknown_label").is_none() && r.get("roc_auc_note").is_none());
    assert!((r["r2"].as_f64().unwrap() - 0.5).abs() < 1e-12);
}

#[test]
fn binary_evaluation_report() {
    let rows = [
        (1.0, [1.0, 0.0]),
        (0.0, [0.0, 1.0]),
        (0.0, [2.0, 0.0]),
        (7.0, [1.0, 1.0]),
    ];
    let a = arena(&rows);
    // Text labels: class indices, 7 is unknown.
    let lg = binary_model(ModelKind::Logistic);
    let r = evaluate(&lg, &a, 2, BinaryLabels::ClassIndices, 100);
    let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "accuracy",
            "f1",
            "log_loss",
            "n",
            "precision",
            "recall",
            "roc_auc",
            "rows_scored",
            "rows_skipped",
            "rows_with_unknown_label"
        ]
    );
    assert_eq!(r["n"], 3);
    assert_eq!(r["rows_with_unknown_label"], 1);
    assert_eq!(r["rows_skipped"], 4);
    assert!((r["accuracy"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert!(r["log_loss"].is_number());
    // Numeric labels: the two values; svm has no probabilities.
    let svm = binary_model(ModelKind::Svm);
    let numeric = BinaryLabels::Values {
        negative: 0.0,
        positive: 1.0,
    };
    let r = evaluate(&svm, &a, 2, numeric, 100);
    assert_eq!(r["log_loss"], serde_json::Value::Null);
    assert_eq!(r["rows_scored"], 3);
    // ROC AUC past the row limit: null, with a note.
    let r = evaluate(&svm, &a, 2, numeric, 1);
    assert_eq!(r["roc_auc"], serde_json::Value::Null);
    assert_eq!(
        r["roc_auc_note"],
        "not computed: more rows than corgipile.max_buffer_memory can hold scores for"
    );
    // A single class has no AUC either, but no note within the limit.
    let one = arena(&[(1.0, [1.0, 0.0])]);
    let r = evaluate(&svm, &one, 2, numeric, 10);
    assert_eq!(r["roc_auc"], serde_json::Value::Null);
    assert!(r.get("roc_auc_note").is_none());
}

#[test]
fn validation_stats_serialize() {
    let s = ValidationStats {
        loss: 0.5,
        accuracy: Some(1.0),
        rows: 2,
        ..ValidationStats::empty()
    };
    assert_eq!(
        serde_json::to_value(&s).unwrap(),
        serde_json::json!({"loss": 0.5, "accuracy": 1.0, "r2": null, "rows": 2})
    );
}
