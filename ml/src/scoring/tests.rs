//! Tests of scoring: evaluations of every model kind split across shards and merged equal
//! the one-pass evaluation; hostile or overflowed parts.

use super::*;
use crate::metrics::tests::Rand;
use crate::metrics::AUC_BINS;
use crate::model::Labels;
use crate::model::{sigmoid, LinearModel, ModelKind};
use crate::row::Row;
use serde_json::Value;

const FEATURES: usize = 4;
const SKIPPED_BY_READER: u64 = 7;
/// Large enough that `Evaluation::new` keeps every score (exact ROC AUC).
const NO_AUC_LIMIT: usize = 1 << 30;

type Rows = Vec<(Vec<f64>, f64)>;

fn features(rng: &mut Rand) -> Vec<f64> {
    (0..FEATURES).map(|_| rng.normal()).collect()
}

/// A binary model and rows whose labels are `positive` with probability sigmoid(z),
/// else `negative`; rows at i >= `unknown_from` with i % 11 == 0 get `unknown`.
fn binary_case(
    kind: ModelKind,
    seed: u64,
    n: usize,
    (negative, positive, unknown): (f64, f64, f64),
    unknown_from: usize,
) -> (LinearModel, Rows) {
    let mut rng = Rand::new(seed);
    let model = LinearModel::single(kind, features(&mut rng), 0.3);
    let rows = (0..n)
        .map(|i| {
            let x = features(&mut rng);
            let z = model.decision(Row::Dense(&x));
            let label = if i >= unknown_from && i % 11 == 0 {
                unknown
            } else if rng.uniform() < sigmoid(z) {
                positive
            } else {
                negative
            };
            (x, label)
        })
        .collect();
    (model, rows)
}

fn softmax_case(seed: u64, n: usize, k: usize, unknown_from: usize) -> (LinearModel, Rows) {
    let mut rng = Rand::new(seed);
    let model = LinearModel {
        kind: ModelKind::Softmax,
        n_features: FEATURES,
        n_outputs: k,
        weights: (0..k * FEATURES).map(|_| rng.normal()).collect(),
        bias: (0..k).map(|_| 0.2 * rng.normal()).collect(),
    };
    let mut probs = Vec::new();
    let rows = (0..n)
        .map(|i| {
            let x = features(&mut rng);
            if i >= unknown_from && i % 11 == 0 {
                // Class indices the model lacks.
                return (x, if i % 2 == 0 { k as f64 } else { k as f64 + 3.0 });
            }
            assert!(model.predict_proba(Row::Dense(&x), &mut probs));
            let (u, mut c) = (rng.uniform(), 0);
            let mut acc = probs[0];
            while acc < u && c + 1 < k {
                c += 1;
                acc += probs[c];
            }
            (x, c as f64)
        })
        .collect();
    (model, rows)
}

fn linear_case(seed: u64, n: usize) -> (LinearModel, Rows) {
    let mut rng = Rand::new(seed);
    let model = LinearModel::single(ModelKind::Linear, features(&mut rng), 4.0);
    let rows = (0..n)
        .map(|_| {
            let x = features(&mut rng);
            let label = 1.1 * model.decision(Row::Dense(&x)) + 0.7 * rng.normal() - 0.2;
            (x, label)
        })
        .collect();
    (model, rows)
}

fn push_rows(e: &mut Evaluation, model: &LinearModel, rows: &[(Vec<f64>, f64)]) {
    for (x, label) in rows {
        e.push(model, Row::Dense(x), *label);
    }
}

/// A part as the coordinator receives it: JSON text, parsed back.
fn over_the_wire(part: &EvaluationPart) -> EvaluationPart {
    let json = serde_json::to_string(part).unwrap();
    let back: EvaluationPart = serde_json::from_str(&json).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), json);
    back
}

/// Evaluates each of `parts` on its own "shard", merges the parts (in `order`) into
/// a fresh mergeable evaluation and finishes it.
fn sharded(
    model: &LinearModel,
    n_classes: usize,
    binary: BinaryLabels,
    parts: &[&[(Vec<f64>, f64)]],
    order: &[usize],
) -> Value {
    let wire: Vec<EvaluationPart> = parts
        .iter()
        .map(|rows| {
            let mut e = Evaluation::mergeable(model.kind, n_classes, binary);
            push_rows(&mut e, model, rows);
            let part = e.part();
            // Only the kind's metrics travel.
            let json = serde_json::to_value(&part).unwrap();
            let sent: Vec<&str> = ["binary", "multiclass", "regression"]
                .into_iter()
                .filter(|k| !json[*k].is_null())
                .collect();
            let want = match model.kind.labels() {
                Labels::TwoClasses => "binary",
                Labels::Classes => "multiclass",
                Labels::Number => "regression",
            };
            assert_eq!(sent, [want]);
            over_the_wire(&part)
        })
        .collect();
    let mut coordinator = Evaluation::mergeable(model.kind, n_classes, binary);
    for &i in order {
        coordinator.merge(&wire[i]);
    }
    coordinator.finish(SKIPPED_BY_READER)
}

fn one_pass(
    model: &LinearModel,
    n_classes: usize,
    binary: BinaryLabels,
    rows: &[(Vec<f64>, f64)],
) -> Value {
    let mut e = Evaluation::new(model.kind, n_classes, binary, NO_AUC_LIMIT);
    push_rows(&mut e, model, rows);
    e.finish(SKIPPED_BY_READER)
}

/// Same JSON up to float rounding: integers (counts) exactly, floats within 1e-12
/// (relative above 1), nulls and structure identical.
fn assert_json_close(got: &Value, want: &Value, path: &str) {
    match (got, want) {
        (Value::Number(g), Value::Number(w)) => {
            assert_eq!(g.is_u64(), w.is_u64(), "{path}: {g} vs {w}");
            if w.is_u64() {
                assert_eq!(g, w, "{path}");
            } else {
                let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
                assert!(
                    (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                    "{path}: {g} vs {w}"
                );
            }
        }
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{path}");
            for (i, (g, w)) in g.iter().zip(w).enumerate() {
                assert_json_close(g, w, &format!("{path}[{i}]"));
            }
        }
        (Value::Object(g), Value::Object(w)) => {
            assert_eq!(
                g.keys().collect::<Vec<_>>(),
                w.keys().collect::<Vec<_>>(),
                "{path}"
            );
            for (k, w) in w {
                assert_json_close(&g[k], w, &format!("{path}.{k}"));
            }
        }
        _ => assert_eq!(got, want, "{path}"),
    }
}

/// The sharded report equals the one-pass report, except ROC AUC (histogram: within
/// 1e-4 here, where the scores spread over many bins) and its note.
fn assert_sharded_matches(sharded: &Value, whole: &Value) {
    let mut got = sharded.clone();
    let mut want = whole.clone();
    let note = got.as_object_mut().unwrap().remove("roc_auc_note");
    assert!(want.get("roc_auc_note").is_none(), "{want}");
    match (
        got.as_object_mut().unwrap().remove("roc_auc"),
        want.as_object_mut().unwrap().remove("roc_auc"),
    ) {
        (None, None) => assert!(note.is_none()),
        (Some(Value::Null), Some(Value::Null)) => assert!(note.is_none(), "{sharded}"),
        (Some(g), Some(w)) => {
            let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
            assert!((g - w).abs() <= 1e-4, "roc_auc {g} vs exact {w}");
            let note = note.expect("histogram AUC has a note");
            assert!(
                note.as_str().unwrap().contains(&AUC_BINS.to_string()),
                "{note}"
            );
        }
        (g, w) => panic!("roc_auc {g:?} vs {w:?}"),
    }
    assert_json_close(&got, &want, "report");
}

/// Parts of unequal sizes, one empty, merged in three orders.
fn check_sharded_equals_one_pass(
    model: &LinearModel,
    n_classes: usize,
    binary: BinaryLabels,
    rows: &[(Vec<f64>, f64)],
    cut: usize,
) -> Value {
    let whole = one_pass(model, n_classes, binary, rows);
    let parts: [&[(Vec<f64>, f64)]; 3] = [&rows[..cut], &rows[cut..cut], &rows[cut..]];
    for order in [[0, 1, 2], [2, 1, 0], [1, 2, 0]] {
        let got = sharded(model, n_classes, binary, &parts, &order);
        assert_sharded_matches(&got, &whole);
    }
    whole
}

fn unknowns(rows: &[(Vec<f64>, f64)], unknown: impl Fn(f64) -> bool) -> u64 {
    rows.iter().filter(|r| unknown(r.1)).count() as u64
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

const BINARY_KEYS: [&str; 10] = [
    "accuracy",
    "f1",
    "log_loss",
    "n",
    "precision",
    "recall",
    "roc_auc",
    "rows_scored",
    "rows_skipped",
    "rows_with_unknown_label",
];

#[test]
fn sharded_svm_evaluation_equals_one_pass() {
    let labels = BinaryLabels::Values {
        negative: 3.0,
        positive: 5.0,
    };
    let (model, rows) = binary_case(ModelKind::Svm, 1, 3_000, (3.0, 5.0, 9.0), 1_900);
    let whole = check_sharded_equals_one_pass(&model, 2, labels, &rows, 1_900);
    let unknown = unknowns(&rows, |l| l == 9.0);
    assert!(unknown > 50);
    assert_eq!(keys(&whole), BINARY_KEYS);
    assert_eq!(whole["rows_scored"], 3_000 - unknown);
    assert_eq!(whole["n"], 3_000 - unknown);
    assert_eq!(whole["rows_with_unknown_label"], unknown);
    assert_eq!(whole["rows_skipped"], SKIPPED_BY_READER + unknown);
    assert_eq!(whole["log_loss"], Value::Null);
    let auc = whole["roc_auc"].as_f64().unwrap();
    assert!((0.7..0.95).contains(&auc), "{auc}");
}

#[test]
fn sharded_logistic_evaluation_equals_one_pass() {
    // Numeric labels (the unknown ones only in the larger part)...
    let labels = BinaryLabels::Values {
        negative: -1.0,
        positive: 1.0,
    };
    let (model, rows) = binary_case(ModelKind::Logistic, 2, 2_500, (-1.0, 1.0, 0.0), 0);
    let whole = check_sharded_equals_one_pass(&model, 2, labels, &rows, 600);
    let unknown = unknowns(&rows, |l| l == 0.0);
    assert!(unknown > 50);
    assert_eq!(keys(&whole), BINARY_KEYS);
    assert_eq!(whole["rows_with_unknown_label"], unknown);
    assert!(whole["log_loss"].as_f64().unwrap() > 0.1);
    // ... and text labels as class indices, unknown ones only in the smaller part.
    let (model, rows) = binary_case(ModelKind::Logistic, 3, 2_500, (0.0, 1.0, 2.0), 2_000);
    let whole = check_sharded_equals_one_pass(&model, 2, BinaryLabels::ClassIndices, &rows, 2_000);
    assert_eq!(
        whole["rows_with_unknown_label"],
        unknowns(&rows, |l| l == 2.0)
    );
    assert!(whole["roc_auc"].is_number() && whole["log_loss"].is_number());
}

#[test]
fn sharded_softmax_evaluation_equals_one_pass() {
    for (k, cut) in [(3, 1_000), (5, 2_200)] {
        let (model, rows) = softmax_case(4 + k as u64, 3_000, k, 1_500);
        let whole =
            check_sharded_equals_one_pass(&model, k, BinaryLabels::ClassIndices, &rows, cut);
        let unknown = unknowns(&rows, |l| l >= k as f64);
        assert!(unknown > 50);
        assert_eq!(
            keys(&whole),
            [
                "accuracy",
                "log_loss",
                "macro_f1",
                "macro_precision",
                "macro_recall",
                "n",
                "per_class",
                "rows_scored",
                "rows_skipped",
                "rows_with_unknown_label"
            ]
        );
        assert_eq!(whole["per_class"].as_array().unwrap().len(), k);
        assert_eq!(whole["rows_scored"], 3_000 - unknown);
        assert_eq!(whole["rows_skipped"], SKIPPED_BY_READER + unknown);
        let accuracy = whole["accuracy"].as_f64().unwrap();
        assert!(accuracy > 1.5 / k as f64 && accuracy < 1.0, "{accuracy}");
    }
}

#[test]
fn sharded_linear_evaluation_equals_one_pass() {
    let (model, rows) = linear_case(9, 3_000);
    let whole = check_sharded_equals_one_pass(&model, 0, BinaryLabels::ClassIndices, &rows, 2_345);
    assert_eq!(
        keys(&whole),
        [
            "mae",
            "mse",
            "n",
            "r2",
            "rmse",
            "rows_scored",
            "rows_skipped"
        ]
    );
    assert_eq!(whole["rows_scored"], 3_000);
    assert_eq!(whole["rows_skipped"], SKIPPED_BY_READER);
    let r2 = whole["r2"].as_f64().unwrap();
    assert!((0.5..0.99).contains(&r2), "{r2}");
}

#[test]
fn shards_with_one_class_or_only_unknown_labels_merge() {
    let labels = BinaryLabels::Values {
        negative: 3.0,
        positive: 5.0,
    };
    let (model, rows) = binary_case(ModelKind::Logistic, 11, 2_000, (3.0, 5.0, 9.0), 0);
    let positives: Vec<_> = rows.iter().filter(|r| r.1 == 5.0).cloned().collect();
    let negatives: Vec<_> = rows.iter().filter(|r| r.1 == 3.0).cloned().collect();
    let unknown: Vec<_> = rows.iter().filter(|r| r.1 == 9.0).cloned().collect();
    assert!(!positives.is_empty() && !negatives.is_empty() && !unknown.is_empty());
    // Each shard alone has no AUC (one class), nor a note.
    for part in [&positives, &negatives, &unknown] {
        let r = sharded(&model, 2, labels, &[part], &[0]);
        assert_eq!(r["roc_auc"], Value::Null);
        assert!(r.get("roc_auc_note").is_none(), "{r}");
    }
    let only_unknown = sharded(&model, 2, labels, &[&unknown], &[0]);
    assert_eq!(only_unknown["n"], 0);
    // Nothing scored: no accuracy (NULL), not 0.
    assert_eq!(only_unknown["accuracy"], Value::Null);
    assert_eq!(only_unknown["note"], "no rows to score");
    assert_eq!(
        only_unknown["rows_with_unknown_label"],
        unknown.len() as u64
    );
    // Together: the one-pass report over the same rows (in any row order).
    let all: Vec<_> = [&positives, &negatives, &unknown]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let whole = one_pass(&model, 2, labels, &all);
    let parts: [&[(Vec<f64>, f64)]; 3] = [&positives, &unknown, &negatives];
    for order in [[0, 1, 2], [2, 1, 0]] {
        assert_sharded_matches(&sharded(&model, 2, labels, &parts, &order), &whole);
    }
}

#[test]
fn empty_shards_merge_to_the_empty_report() {
    let labels = BinaryLabels::Values {
        negative: 0.0,
        positive: 1.0,
    };
    let models = [
        (LinearModel::single(ModelKind::Svm, vec![1.0; 4], 0.0), 2),
        (
            LinearModel::single(ModelKind::Logistic, vec![1.0; 4], 0.0),
            2,
        ),
        (softmax_case(0, 0, 3, 0).0, 3),
        (LinearModel::single(ModelKind::Linear, vec![1.0; 4], 0.0), 0),
    ];
    for (model, k) in &models {
        let whole = one_pass(model, *k, labels, &[]);
        for n_parts in [0, 1, 3] {
            let parts = vec![&[][..]; n_parts];
            let order: Vec<usize> = (0..n_parts).collect();
            let got = sharded(model, *k, labels, &parts, &order);
            assert_eq!(got, whole, "{:?}", model.kind);
            assert!(got.get("roc_auc_note").is_none());
        }
    }
}

#[test]
fn roc_auc_note_only_when_the_histogram_gives_an_auc() {
    let labels = BinaryLabels::ClassIndices;
    let m = LinearModel::single(ModelKind::Svm, vec![1.0, -1.0], 0.0);
    let rows: Rows = vec![
        (vec![1.0, 0.0], 1.0),
        (vec![0.0, 1.0], 0.0),
        (vec![2.0, 0.0], 0.0),
    ];
    let mut e = Evaluation::mergeable(ModelKind::Svm, 2, labels);
    push_rows(&mut e, &m, &rows);
    let r = e.finish(0);
    assert_eq!(r["roc_auc"], 0.5); // positive z 1 vs negatives -1 and 2
    assert_eq!(
        r["roc_auc_note"],
        format!(
            "from a histogram of {AUC_BINS} score bins merged across the shards: exact up to ties within a bin"
        )
    );
    // The same rows without a histogram: no note.
    let mut e = Evaluation::new(ModelKind::Svm, 2, labels, 100);
    push_rows(&mut e, &m, &rows);
    let r = e.finish(0);
    assert_eq!(r["roc_auc"], 0.5);
    assert!(r.get("roc_auc_note").is_none());
    // One class only, or no rows: AUC null and no note (not the memory note either,
    // however many rows).
    let mut e = Evaluation::mergeable(ModelKind::Svm, 2, labels);
    for _ in 0..10_000 {
        e.push(&m, Row::Dense(&[1.0, 0.0]), 1.0);
    }
    let r = e.finish(0);
    assert_eq!((&r["roc_auc"], r.get("roc_auc_note")), (&Value::Null, None));
    let r = Evaluation::mergeable(ModelKind::Logistic, 2, labels).finish(0);
    assert_eq!((&r["roc_auc"], r.get("roc_auc_note")), (&Value::Null, None));
    // Kinds without ROC AUC: no note.
    let (model, rows) = softmax_case(12, 100, 3, 100);
    let mut e = Evaluation::mergeable(ModelKind::Softmax, 3, labels);
    push_rows(&mut e, &model, &rows);
    let r = e.finish(0);
    assert!(r.get("roc_auc").is_none() && r.get("roc_auc_note").is_none());
    let (model, rows) = linear_case(13, 100);
    let mut e = Evaluation::mergeable(ModelKind::Linear, 0, labels);
    push_rows(&mut e, &model, &rows);
    let r = e.finish(0);
    assert!(r.get("roc_auc").is_none() && r.get("roc_auc_note").is_none());
}

#[test]
fn hostile_part_bins_are_ignored() {
    let labels = BinaryLabels::ClassIndices;
    let m = LinearModel::single(ModelKind::Svm, vec![1.0, -1.0], 0.0);
    let mut e = Evaluation::mergeable(ModelKind::Svm, 2, labels);
    e.push(&m, Row::Dense(&[1.0, 0.0]), 1.0);
    let json = format!(
        r#"{{"binary":{{"tp":0,"fp":0,"tn":1,"fn_":0,"log_loss_sum":0.0,"all_have_prob":false,
            "bins":[[{AUC_BINS},9,9],[4294967295,9,9],[0,0,1]]}},
            "multiclass":null,"regression":null,"scored":1,"unknown":0}}"#
    );
    let part: EvaluationPart = serde_json::from_str(&json).unwrap();
    e.merge(&part);
    let r = e.finish(0);
    assert_eq!((&r["n"], &r["rows_scored"]), (&2.into(), &2.into()));
    // The positive (z = 1) against the one in-range negative, in the lowest bin.
    assert_eq!(r["roc_auc"], 1.0);
}

#[test]
fn part_with_an_overflowed_sum_round_trips() {
    let m = LinearModel::single(ModelKind::Linear, vec![1e200], 0.0);
    let rows: Rows = vec![(vec![1.0], 0.0), (vec![2.0], 1.0)];
    let whole = one_pass(&m, 0, BinaryLabels::ClassIndices, &rows);
    assert_eq!(whole["mse"], Value::Null); // inf serializes as null
    let got = sharded(
        &m,
        0,
        BinaryLabels::ClassIndices,
        &[&rows[..1], &rows[1..]],
        &[0, 1],
    );
    assert_eq!(got, whole);
}

#[test]
fn validation_scores_of_parts_merged_are_the_score_of_all_rows() {
    // Logistic (F1, ROC AUC, log loss from the histogram) and linear (R²): three processes'
    // parts, merged into an empty score in order, give the one-pass statistics.
    let (model, rows) = binary_case(ModelKind::Logistic, 3, 3000, (0.0, 1.0, 5.0), 3000);
    let binary = Some(BinaryLabels::Values {
        negative: 0.0,
        positive: 1.0,
    });
    let mut whole = ValidationScore::new(ModelKind::Logistic, binary);
    let mut parts: Vec<ValidationScore> = (0..3)
        .map(|_| ValidationScore::new(ModelKind::Logistic, binary))
        .collect();
    for (i, (x, y)) in rows.iter().enumerate() {
        whole.push(&model, Row::Dense(x), *y);
        parts[i % 3].push(&model, Row::Dense(x), *y);
    }
    let mut merged = parts[0].empty_like();
    for p in &parts {
        let sent: ValidationPart =
            serde_json::from_slice(&serde_json::to_vec(&p.part()).unwrap()).unwrap();
        merged.merge(&sent);
    }
    let (a, b) = (whole.finish(), merged.finish());
    assert_eq!(
        (a.rows, a.accuracy, a.f1, a.roc_auc),
        (b.rows, b.accuracy, b.f1, b.roc_auc)
    );
    assert!(
        (a.loss - b.loss).abs() < 1e-12
            && (a.log_loss.unwrap() - b.log_loss.unwrap()).abs() < 1e-12
    );
    assert!(a.roc_auc.is_some() && a.f1.is_some());

    let mut rng = Rand::new(9);
    let linear = LinearModel::single(ModelKind::Linear, features(&mut rng), 0.5);
    let mut whole = ValidationScore::new(ModelKind::Linear, None);
    let mut parts = [whole.empty_like(), whole.empty_like()];
    for i in 0..500 {
        let x = features(&mut rng);
        let y = rng.normal() * 3.0;
        whole.push(&linear, Row::Dense(&x), y);
        parts[i % 2].push(&linear, Row::Dense(&x), y);
    }
    let mut merged = whole.empty_like();
    parts.iter().for_each(|p| merged.merge(&p.part()));
    let (a, b) = (whole.finish(), merged.finish());
    assert_eq!(a.rows, b.rows);
    assert!((a.r2.unwrap() - b.r2.unwrap()).abs() < 1e-9 && (a.loss - b.loss).abs() < 1e-9);
}

#[test]
fn a_shards_validation_part_is_checked_before_it_is_merged() {
    // A real part of each kind passes; forged counts, a negative loss and another kind's
    // metrics are refused (a shard server's reply may be written by its role).
    let (model, rows) = binary_case(ModelKind::Logistic, 5, 400, (0.0, 1.0, 5.0), 400);
    let binary = Some(BinaryLabels::Values {
        negative: 0.0,
        positive: 1.0,
    });
    let mut score = ValidationScore::new(ModelKind::Logistic, binary);
    for (x, y) in &rows {
        score.push(&model, Row::Dense(x), *y);
    }
    let part = score.part();
    assert_eq!(part.check(ModelKind::Logistic), Ok(()));
    assert!(part.check(ModelKind::Linear).is_err());
    assert!(part.check(ModelKind::Softmax).is_err());
    let mut json: Value = serde_json::to_value(&part).unwrap();
    let mut no_matrix = json.clone();
    no_matrix["binary"] = Value::Null;
    let forged: ValidationPart = serde_json::from_value(no_matrix).unwrap();
    assert!(forged.check(ModelKind::Logistic).is_err());
    json["correct"] = Value::from(rows.len() as u64 + 1);
    let forged: ValidationPart = serde_json::from_value(json.clone()).unwrap();
    assert!(forged.check(ModelKind::Logistic).is_err());
    json["correct"] = Value::from(1);
    json["rows"] = Value::from(3);
    let forged: ValidationPart = serde_json::from_value(json.clone()).unwrap();
    assert!(
        forged.check(ModelKind::Logistic).is_err(),
        "its confusion matrix counts 400 rows"
    );
    json["rows"] = Value::from(rows.len() as u64);
    json["loss"] = Value::from(-1.0);
    let forged: ValidationPart = serde_json::from_value(json).unwrap();
    assert!(forged.check(ModelKind::Logistic).is_err());

    let mut rng = Rand::new(2);
    let linear = LinearModel::single(ModelKind::Linear, features(&mut rng), 0.5);
    let mut score = ValidationScore::new(ModelKind::Linear, None);
    for _ in 0..50 {
        let x = features(&mut rng);
        score.push(&linear, Row::Dense(&x), rng.normal());
    }
    assert_eq!(score.part().check(ModelKind::Linear), Ok(()));
    assert!(score.part().check(ModelKind::Svm).is_err());
    assert_eq!(
        ValidationScore::new(ModelKind::Softmax, None)
            .part()
            .check(ModelKind::Softmax),
        Ok(())
    );
}
