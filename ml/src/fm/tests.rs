use super::*;
use crate::arena::TupleArena;
use crate::learner::Learner;
use crate::learner::Shape;
use crate::model::Predictor;
use crate::params::TrainParams;
use crate::standardize::Standardizer;
use crate::trained::{ModelParts, Trained};
use serde_json::json;

/// A reproducible value in [-1, 1).
fn uniform(seed: &mut u64) -> f64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    (*seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// `n` rows of 3 features: `label(x)` of each.
fn table(n: usize, label: impl Fn(&[f64]) -> f64) -> TupleArena {
    let mut arena = TupleArena::new(3, n);
    let mut seed = 7;
    for _ in 0..n {
        let x = [uniform(&mut seed), uniform(&mut seed), uniform(&mut seed)];
        arena.push(label(&x), &x);
    }
    arena
}

fn learner(kind: ModelKind, params: serde_json::Value, outputs: usize, target: Target) -> Learner {
    let params = TrainParams::for_kind(&params, kind).unwrap();
    let shape = Shape {
        n_features: 3,
        outputs,
        target,
    };
    kind.family()
        .learner(params.train_config(kind), &params, &shape)
        .unwrap()
}

fn train(mut learner: Learner, arena: &TupleArena, epochs: u32) -> (Model, f64) {
    let mut last = None;
    for epoch in 1..=epochs {
        learner.start_epoch(epoch);
        learner.train_buffer(arena, None).unwrap();
        last = Some(learner.finish_epoch().unwrap());
    }
    let stats = last.unwrap();
    (learner.into_model(), stats.accuracy.or(stats.r2).unwrap())
}

#[test]
fn learns_the_xor_of_two_signs_which_no_line_separates() {
    let arena = table(2000, |x| f64::from(u8::from(x[0] * x[1] > 0.0)));
    let params = json!({"learning_rate": 0.01, "seed": 3});
    let (model, accuracy) = train(
        learner(ModelKind::Fm, params.clone(), 2, Target::new(0.0, 1.0)),
        &arena,
        30,
    );
    assert!(accuracy > 0.95, "{accuracy}");
    let right = (0..arena.len())
        .filter(|&i| model.predict(arena.row(i)) == arena.label(i))
        .count();
    assert!(right as f64 > 0.95 * arena.len() as f64, "{right}");
    // Probabilities agree with the predicted class.
    let mut p = Vec::new();
    for i in 0..arena.len() {
        assert!(model.predict_proba(arena.row(i), &mut p));
        assert_eq!(
            crate::model::argmax(&p).unwrap() as f64,
            model.predict(arena.row(i))
        );
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
    // The same seed and rows: the same model, bit for bit.
    let (again, _) = train(
        learner(ModelKind::Fm, params, 2, Target::new(0.0, 1.0)),
        &arena,
        30,
    );
    assert_eq!(model, again);
}

#[test]
fn learns_a_product_in_the_label_s_units() {
    let arena = table(2000, |x| 100.0 + 30.0 * x[0] * x[1] + 10.0 * x[2]);
    let (model, r2) = train(
        learner(
            ModelKind::FmRegression,
            json!({"learning_rate": 0.01}),
            1,
            Target::new(100.0, 8.0),
        ),
        &arena,
        40,
    );
    assert!(r2 > 0.98, "{r2}");
    let x = [0.5, -0.5, 0.25];
    let want = 100.0 + 30.0 * x[0] * x[1] + 10.0 * x[2];
    let got = model.predict(Row::Dense(&x));
    assert!((got - want).abs() < 1.0, "{got} against {want}");
}

fn machine(head: Head, outputs: usize) -> Machine {
    let mut m = Machine::new(4, 3, outputs, head, 11).unwrap();
    let mut seed = 99;
    m.params.iter_mut().for_each(|p| *p = uniform(&mut seed));
    m
}

#[test]
fn the_gradient_is_the_loss_s_slope() {
    let rows_dense = [[0.5, -1.0, 2.0, 0.0], [1.5, 0.25, -0.5, 1.0]];
    let indices = [0u32, 2, 3];
    let values = [0.7, -1.2, 0.4];
    for (head, outputs, labels) in [
        (Head::SOFTMAX, 3, [2.0, 0.0]),
        (Head::SQUARED, 1, [0.3, -1.1]),
    ] {
        for sparse in [false, true] {
            let rows: Vec<Row> = if sparse {
                vec![
                    Row::Sparse {
                        indices: &indices,
                        values: &values,
                    },
                    Row::Dense(&rows_dense[1]),
                ]
            } else {
                rows_dense.iter().map(|r| Row::Dense(r)).collect()
            };
            let mut m = machine(head, outputs);
            let mut ws = m.workspace(2).unwrap();
            m.add_loss_and_gradient(&rows, &labels, &[2.0, 0.5], 2, true, &mut ws);
            let gradient = ws.gradient.clone();
            for (p, &want) in gradient.iter().enumerate() {
                let h = 1e-6;
                let at = m.params[p];
                m.params[p] = at + h;
                let up = m.add_loss_and_gradient(&rows, &labels, &[2.0, 0.5], 2, true, &mut ws);
                m.params[p] = at - h;
                let down = m.add_loss_and_gradient(&rows, &labels, &[2.0, 0.5], 2, true, &mut ws);
                m.params[p] = at;
                let slope = (up - down) / (2.0 * h);
                assert!(
                    (slope - want).abs() < 1e-6 * (1.0 + slope.abs()),
                    "{head:?} sparse {sparse} param {p}: {slope} against {want}"
                );
            }
        }
    }
}

#[test]
fn a_folded_standardizer_predicts_on_the_table_s_units_what_the_machine_did_on_scaled_rows() {
    for center in [true, false] {
        // The fourth feature is beyond the standardizer: it keeps its parameters.
        let s = Standardizer {
            mean: vec![0.3, -2.0, 5.0],
            scale: vec![2.0, 0.5, 0.1],
            center,
        };
        let trained = FmModel::new(ModelKind::Fm, machine(Head::SOFTMAX, 2));
        let mut folded = trained.clone();
        Trained::fold_standardizer(&mut folded, &s);
        let x = [1.0, -3.0, 7.5, 0.25];
        let mut scaled = x.to_vec();
        for j in 0..3 {
            let c = if center { s.mean[j] } else { 0.0 };
            scaled[j] = (x[j] - c) * s.scale[j];
        }
        let (mut want, mut got) = (Vec::new(), Vec::new());
        trained.scores(Row::Dense(&scaled), &mut want);
        folded.scores(Row::Dense(&x), &mut got);
        for (w, g) in want.iter().zip(&got) {
            assert!((w - g).abs() < 1e-9 * (1.0 + w.abs()), "{want:?} {got:?}");
        }
    }
}

#[test]
fn shares_add_up_to_the_change_of_the_output_exactly() {
    let model = FmModel::new(ModelKind::Fm, machine(Head::SOFTMAX, 2));
    let (x, x0) = ([1.0, -0.5, 2.0, 0.3], [0.2, 0.4, -1.0, 0.0]);
    for k in 0..2 {
        let shares = model.attribute(&x, &x0, k).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        model.scores(Row::Dense(&x), &mut a);
        model.scores(Row::Dense(&x0), &mut b);
        let change = a[k] - b[k];
        let sum: f64 = shares.iter().sum();
        assert!(
            (sum - change).abs() < 1e-12 * (1.0 + change.abs()),
            "{sum} {change}"
        );
        // A feature that did not move has no share.
        assert_eq!(shares[3] == 0.0, x[3] == x0[3]);
    }
}

#[test]
fn a_machine_round_trips_through_its_parts_and_other_shapes_are_refused() {
    let model = Model::new(FmModel::new(ModelKind::Fm, machine(Head::SOFTMAX, 2)));
    let parts = model.to_parts();
    assert_eq!(parts.layers, Some(vec![4, 3, 2]));
    assert_eq!(parts.clone().into_model().unwrap(), model);
    let mut bad = Vec::new();
    for layers in [
        vec![4, 3, 3],
        vec![4, 0, 2],
        vec![4, 3],
        vec![4, 257, 2],
        vec![5, 3, 2],
    ] {
        bad.push(ModelParts {
            layers: Some(layers),
            ..parts.clone()
        });
    }
    bad.push(ModelParts {
        weights: parts.weights[1..].to_vec(),
        ..parts.clone()
    });
    bad.push(ModelParts {
        kind: ModelKind::FmRegression,
        ..parts.clone()
    });
    bad.push(ModelParts {
        layers: None,
        ..parts.clone()
    });
    for parts in bad {
        assert!(parts.clone().into_model().is_err(), "{parts:?}");
    }
}

#[test]
fn its_params_are_its_own() {
    let p = TrainParams::for_kind(&json!({}), ModelKind::Fm).unwrap();
    assert_eq!(p.factors, Some(8));
    assert_eq!(p.batch_size, 32);
    for (params, kind, message) in [
        (
            json!({"factors": 4}),
            ModelKind::Logistic,
            "\"factors\" applies to fm and fm_regression only",
        ),
        (
            json!({"factors": 4}),
            ModelKind::Mlp,
            "\"factors\" applies to fm and fm_regression only",
        ),
        (
            json!({"hidden": [4]}),
            ModelKind::Fm,
            "\"hidden\" applies to mlp and mlp_regression only",
        ),
        (
            json!({"optimizer": "sgd"}),
            ModelKind::Svm,
            "\"optimizer\" applies to mlp, mlp_regression, fm and fm_regression only",
        ),
    ] {
        let e = TrainParams::for_kind(&params, kind).unwrap_err();
        assert_eq!(e.message, message);
    }
    for factors in [json!(0), json!(257), json!("8"), json!(1.5)] {
        assert!(TrainParams::for_kind(&json!({ "factors": factors }), ModelKind::Fm).is_err());
    }
}

#[test]
fn sparse_rows_step_the_features_they_touch_and_equal_dense_rows_under_plain_sgd() {
    // Rows with zeros: stored sparse, a batch touches a few features' blocks only.
    let (n, d) = (600, 200);
    let mut dense = TupleArena::new(d, n);
    let mut sparse = TupleArena::new_sparse(n, n * 3);
    let mut seed = 5;
    for i in 0..n {
        let mut x = vec![0.0; d];
        let (a, b) = (i % d, (i * 7 + 3) % d);
        x[a] = uniform(&mut seed);
        x[b] = uniform(&mut seed);
        let y = f64::from(u8::from(x[a] * x[b] > 0.0));
        let (indices, values): (Vec<u32>, Vec<f64>) = x
            .iter()
            .enumerate()
            .filter(|(_, v)| **v != 0.0)
            .map(|(j, v)| (j as u32, *v))
            .unzip();
        dense.push(y, &x);
        sparse.push_sparse(y, &indices, &values);
    }
    let run = |arena: &TupleArena, params: serde_json::Value| {
        let params = TrainParams::for_kind(&params, ModelKind::Fm).unwrap();
        let shape = Shape {
            n_features: d,
            outputs: 2,
            target: Target::new(0.0, 1.0),
        };
        let mut config = params.train_config(ModelKind::Fm);
        config.standardizer = None;
        let mut l = ModelKind::Fm
            .family()
            .learner(config, &params, &shape)
            .unwrap();
        for epoch in 1..=3 {
            l.start_epoch(epoch);
            l.train_buffer(arena, None).unwrap();
            l.finish_epoch().unwrap();
        }
        l.parameters()
    };
    // Plain SGD moves an untouched parameter by nothing: lazy steps are the dense ones.
    let sgd = json!({"optimizer": "sgd", "momentum": 0, "learning_rate": 0.05, "normalize": false, "seed": 1});
    let (a, b) = (run(&dense, sgd.clone()), run(&sparse, sgd));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    // Adam's lazy steps differ from its dense ones (an untouched parameter's moments wait).
    let adam = json!({"learning_rate": 0.01, "batch_size": 4, "normalize": false, "seed": 1});
    assert_ne!(run(&dense, adam.clone()), run(&sparse, adam));
}
