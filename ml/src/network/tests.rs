//! Unit tests of the network: gradients against finite differences (dense and sparse rows,
//! both activations, both heads), determinism, and learning what no linear model can (XOR).

use super::*;
use crate::model::ModelKind;

fn rows_of(x: &[Vec<f64>]) -> Vec<Row<'_>> {
    x.iter().map(|r| Row::Dense(r)).collect()
}

/// Central differences of the batch's mean loss, against the analytic gradient.
fn check_gradient(net: &mut Network, rows: &[Row], labels: &[f64]) {
    let mut ws = Workspace::new(net, rows.len()).unwrap();
    net.loss_and_gradient(rows, labels, &[], &mut ws);
    let analytic = ws.gradient.clone();
    let h = 1e-6;
    #[allow(clippy::needless_range_loop)] // each step perturbs params[i] and reads analytic[i]
    for i in 0..net.params.len() {
        let p = net.params[i];
        net.params[i] = p + h;
        let up = net.loss_and_gradient(rows, labels, &[], &mut ws);
        net.params[i] = p - h;
        let down = net.loss_and_gradient(rows, labels, &[], &mut ws);
        net.params[i] = p;
        let numeric = (up - down) / (2.0 * h);
        let scale = numeric.abs().max(analytic[i].abs()).max(1e-3);
        assert!(
            (numeric - analytic[i]).abs() / scale < 1e-5,
            "param {i}: numeric {numeric} analytic {}",
            analytic[i]
        );
    }
}

fn batch() -> (Vec<Vec<f64>>, Vec<f64>) {
    let x = vec![
        vec![0.5, -1.2, 0.3],
        vec![-0.7, 0.4, 1.1],
        vec![1.5, 0.2, -0.4],
        vec![0.1, -0.3, 0.8],
        vec![-1.1, 0.9, -0.2],
    ];
    (x, vec![0.0, 2.0, 1.0, 2.0, 0.0])
}

#[test]
fn softmax_gradients_match_finite_differences() {
    let (x, y) = batch();
    for activation in [Activation::Relu, Activation::Tanh] {
        let mut net = Network::new(&[3, 4, 5, 3], activation, Head::SOFTMAX, 11).unwrap();
        // Non-zero biases, so that every parameter's gradient is exercised.
        for (i, p) in net.params.iter_mut().enumerate() {
            *p += 0.01 * (i % 7) as f64;
        }
        check_gradient(&mut net, &rows_of(&x), &y);
    }
}

#[test]
fn regression_gradients_match_finite_differences() {
    let (x, _) = batch();
    let y = [0.3, -1.0, 2.5, 0.0, 1.2];
    let mut net = Network::new(&[3, 6, 1], Activation::Tanh, Head::SQUARED, 5).unwrap();
    check_gradient(&mut net, &rows_of(&x), &y);
}

#[test]
fn sparse_rows_give_the_dense_rows_outputs_and_gradients() {
    let (x, y) = batch();
    let net = Network::new(&[3, 4, 3], Activation::Relu, Head::SOFTMAX, 3).unwrap();
    let indices: Vec<Vec<u32>> = x
        .iter()
        .map(|r| (0..3u32).filter(|&j| r[j as usize] != 0.0).collect())
        .collect();
    let values: Vec<Vec<f64>> = x.clone();
    let sparse: Vec<Row> = indices
        .iter()
        .zip(&values)
        .map(|(i, v)| Row::Sparse {
            indices: i,
            values: v,
        })
        .collect();
    let mut dense_ws = Workspace::new(&net, 5).unwrap();
    let mut sparse_ws = Workspace::new(&net, 5).unwrap();
    let dense_loss = net.loss_and_gradient(&rows_of(&x), &y, &[], &mut dense_ws);
    let sparse_loss = net.loss_and_gradient(&sparse, &y, &[], &mut sparse_ws);
    assert!((dense_loss - sparse_loss).abs() < 1e-12);
    for i in 0..5 {
        for (a, b) in net
            .outputs(&dense_ws, i)
            .iter()
            .zip(net.outputs(&sparse_ws, i))
        {
            assert!((a - b).abs() < 1e-12);
        }
    }
    for (a, b) in dense_ws.gradient.iter().zip(&sparse_ws.gradient) {
        assert!((a - b).abs() < 1e-12);
    }
    let mut sparse_net = net.clone();
    check_gradient(&mut sparse_net, &sparse, &y);
}

#[test]
fn same_seed_same_network_bit_for_bit() {
    let a = Network::new(&[10, 64, 2], Activation::Relu, Head::SOFTMAX, 42).unwrap();
    let b = Network::new(&[10, 64, 2], Activation::Relu, Head::SOFTMAX, 42).unwrap();
    let c = Network::new(&[10, 64, 2], Activation::Relu, Head::SOFTMAX, 43).unwrap();
    assert!(a
        .params
        .iter()
        .zip(&b.params)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_ne!(a.params, c.params);
    // He-uniform for the ReLU layer: every weight within sqrt(6 / fan_in).
    let limit = (6.0f64 / 10.0).sqrt();
    assert!(a.params[..640].iter().all(|w| w.abs() <= limit));
    assert!(a.params[640..704].iter().all(|&b| b == 0.0));
    assert_eq!(Network::n_params(&[10, 64, 2]), 10 * 64 + 64 + 64 * 2 + 2);
}

#[test]
fn bad_shapes_and_huge_networks_are_errors_not_aborts() {
    assert_eq!(
        Network::new(&[3], Activation::Relu, Head::SQUARED, 1),
        Err(NetworkError::BadShape)
    );
    assert_eq!(
        Network::new(&[3, 0, 1], Activation::Relu, Head::SQUARED, 1),
        Err(NetworkError::BadShape)
    );
    assert!(matches!(
        Network::new(&[1 << 40, 1 << 20, 2], Activation::Relu, Head::SOFTMAX, 1),
        Err(NetworkError::OutOfMemory { .. })
    ));
}

/// XOR of two inputs, which no linear model separates (a linear one stays at 50%).
fn learn_xor(kind: OptimizerKind, learning_rate: f64) -> f64 {
    let x: Vec<Vec<f64>> = (0..4)
        .map(|i| vec![(i & 1) as f64, ((i >> 1) & 1) as f64])
        .collect();
    let y: Vec<f64> = (0..4).map(|i| ((i & 1) ^ ((i >> 1) & 1)) as f64).collect();
    let mut net = Network::new(&[2, 8, 2], Activation::Tanh, Head::SOFTMAX, 7).unwrap();
    let mut ws = Workspace::new(&net, 4).unwrap();
    let mut opt = Optimizer::new(kind, learning_rate, 0.0, net.params.len()).unwrap();
    let is_weight = net.is_weight();
    let rows = rows_of(&x);
    for _ in 0..2000 {
        net.loss_and_gradient(&rows, &y, &[], &mut ws);
        opt.step(&mut net.params, &ws.gradient, &is_weight);
    }
    net.forward(&rows, &mut ws);
    let correct = (0..4)
        .filter(|&i| {
            let p = net.outputs(&ws, i);
            (p[1] > p[0]) == (y[i] == 1.0)
        })
        .count();
    correct as f64 / 4.0
}

#[test]
fn adam_and_momentum_learn_xor() {
    assert_eq!(learn_xor(OptimizerKind::Adam, 0.01), 1.0);
    assert_eq!(learn_xor(OptimizerKind::Sgd { momentum: 0.9 }, 0.1), 1.0);
}

#[test]
fn l2_shrinks_weights_not_biases() {
    let mut opt = Optimizer::new(OptimizerKind::Sgd { momentum: 0.0 }, 0.1, 0.5, 2).unwrap();
    let mut params = [2.0, 2.0];
    opt.step(&mut params, &[0.0, 0.0], &[true, false]);
    assert_eq!(params, [2.0 - 0.1 * 0.5 * 2.0, 2.0]);
}

#[test]
fn workspace_bytes_cover_what_it_allocates() {
    let sizes = [18, 64, 2];
    let net = Network::new(&sizes, Activation::Relu, Head::SOFTMAX, 1).unwrap();
    let ws = Workspace::new(&net, 32).unwrap();
    let held: usize = ws
        .activations
        .iter()
        .chain(&ws.pre)
        .map(Vec::len)
        .sum::<usize>()
        + ws.delta.len()
        + ws.delta_prev.len()
        + ws.gradient.len();
    assert!(held as u64 * 8 <= Workspace::bytes(&sizes, 32));
}

#[test]
fn a_batch_in_parts_adds_up_to_the_whole_batch() {
    // What a wide network's trainer does to look at the stop flag inside a batch; row weights
    // (class weights) included.
    let (x, _) = batch();
    let y = vec![0.0, 1.0, 1.0, 0.0, 1.0];
    let w = vec![1.0, 2.0, 0.5, 1.0, 3.0];
    let net = Network::new(&[3, 4, 2], Activation::Relu, Head::SOFTMAX, 9).unwrap();
    let rows = rows_of(&x);
    let mut whole = Workspace::new(&net, 5).unwrap();
    let loss = net.loss_and_gradient(&rows, &y, &w, &mut whole);
    let mut parts = Workspace::new(&net, 5).unwrap();
    let mut parts_loss = 0.0;
    for (start, end) in [(0, 2), (2, 3), (3, 5)] {
        parts_loss += net.add_loss_and_gradient(
            &rows[start..end],
            &y[start..end],
            &w[start..end],
            5,
            start == 0,
            &mut parts,
        );
    }
    assert!((loss - parts_loss).abs() < 1e-12);
    for (a, b) in whole.gradient.iter().zip(&parts.gradient) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

#[test]
fn a_class_beyond_the_output_layer_is_an_error_not_a_panic() {
    // A sharded training reads the table anew every round: a class may appear after the
    // statistics pass sized the output layer.
    let mut arena = crate::arena::TupleArena::new(2, 3);
    for (y, x) in [(0.0, [0.0, 1.0]), (1.0, [1.0, 0.0]), (2.0, [1.0, 1.0])] {
        arena.push(y, &x);
    }
    let net = Network::new(&[2, 4, 2], Activation::Relu, Head::SOFTMAX, 1).unwrap();
    let mut t = NetworkTrainer::adam_for_tests(net, 8);
    t.start_epoch(1);
    assert_eq!(
        t.train_buffer(&arena, None),
        Err(crate::trainer::TrainError::UnknownClass {
            class: 2.0,
            classes: 2
        })
    );
}

/// A deterministic pseudo-random stream in [-1, 1) for the prediction tests.
fn stream(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// A network of these widths with random weights and biases.
fn random_net(sizes: &[usize], activation: Activation, head: Head, seed: u64) -> Network {
    let mut net = Network::new(sizes, activation, head, seed).unwrap();
    let mut r = stream(seed);
    net.params.iter_mut().for_each(|p| *p = r());
    net
}

/// The row prediction as it was before the kernels: bias, then an axpy per input in input
/// order (a hidden layer's zeros skipped), each layer into a new vector.
fn reference_scores(net: &Network, x: &[f64]) -> Vec<f64> {
    let mut current = x.to_vec();
    for l in 0..net.n_layers() {
        let (n_in, n_out) = (net.sizes[l], net.sizes[l + 1]);
        let w = net.weights_slice(l);
        let mut next = net.bias(l).to_vec();
        for (j, &a) in current.iter().enumerate().take(n_in) {
            if l == 0 || a != 0.0 {
                next.iter_mut()
                    .zip(&w[j * n_out..(j + 1) * n_out])
                    .for_each(|(z, w)| *z += a * w);
            }
        }
        if l + 1 < net.n_layers() {
            net.activation.apply_for_tests(&mut next);
        }
        current = next;
    }
    current
}

/// Σ |terms| of each output of the last layer: the scale a reordered sum's rounding is
/// measured against.
fn last_layer_scale(net: &Network, x: &[f64]) -> Vec<f64> {
    let mut hidden = x.to_vec();
    let last = net.n_layers() - 1;
    if last > 0 {
        let mut trimmed = net.clone();
        trimmed.sizes.truncate(last + 1);
        trimmed.head = Head::SQUARED;
        hidden = reference_scores(&trimmed, x);
        trimmed.activation.apply_for_tests(&mut hidden);
    }
    let n_out = net.sizes[last + 1];
    let w = net.weights_slice(last);
    (0..n_out)
        .map(|k| {
            net.bias(last)[k].abs()
                + hidden
                    .iter()
                    .enumerate()
                    .map(|(j, a)| (a * w[j * n_out + k]).abs())
                    .sum::<f64>()
        })
        .collect()
}

const SHAPES: [&[usize]; 7] = [
    &[3, 4, 3],
    &[18, 64, 2],
    &[5, 17, 1],
    &[7, 9, 13, 2],
    &[11, 33, 65, 8],
    &[2, 70, 40, 5],
    &[20, 8, 7, 9, 3],
];

#[test]
fn row_predictions_match_the_reference_and_every_vector_width_gives_the_same_bits() {
    for (s, sizes) in SHAPES.iter().enumerate() {
        for activation in [Activation::Relu, Activation::Tanh] {
            for head in [Head::SOFTMAX, Head::SQUARED] {
                let sizes = if head == Head::SQUARED {
                    let mut v = sizes.to_vec();
                    *v.last_mut().unwrap() = 1;
                    v
                } else {
                    sizes.to_vec()
                };
                let kind = if head == Head::SOFTMAX {
                    ModelKind::Mlp
                } else {
                    ModelKind::MlpRegression
                };
                let net = random_net(&sizes, activation, head, 100 + s as u64);
                let model = NetworkModel::new(kind, net.clone());
                let narrow = (1..net.n_layers()).any(|l| sizes[l + 1] < 8);
                let mut r = stream(7 + s as u64);
                for _ in 0..20 {
                    let x: Vec<f64> = (0..sizes[0])
                        .map(|j| if j % 3 == 1 { 0.0 } else { 3.0 * r() })
                        .collect();
                    let want = reference_scores(&net, &x);
                    let scale = last_layer_scale(&net, &x);
                    let mut got = Vec::new();
                    model.scores(Row::Dense(&x), &mut got);
                    for ((g, w), sc) in got.iter().zip(&want).zip(&scale) {
                        if narrow {
                            // A narrow last layer's dot product adds in lanes: rounding only.
                            assert!((g - w).abs() <= 1e-12 * sc, "{sizes:?}: {g} vs {w}");
                        } else {
                            assert_eq!(g.to_bits(), w.to_bits(), "{sizes:?}: {g} vs {w}");
                        }
                    }
                    // The same row as sparse non-zeros: the same bits.
                    let idx: Vec<u32> = (0..x.len() as u32)
                        .filter(|&j| x[j as usize] != 0.0)
                        .collect();
                    let val: Vec<f64> = idx.iter().map(|&j| x[j as usize]).collect();
                    let mut sparse = Vec::new();
                    model.scores(
                        Row::Sparse {
                            indices: &idx,
                            values: &val,
                        },
                        &mut sparse,
                    );
                    // Every kernel variant this CPU runs: the same bits.
                    for isa in model::Isa::available() {
                        let mut other = Vec::new();
                        model.with_isa(isa).scores(Row::Dense(&x), &mut other);
                        assert_eq!(other, got, "{isa:?}");
                    }
                    assert_eq!(sparse, got);
                    assert_eq!(model.decision(Row::Dense(&x)).to_bits(), got[0].to_bits());
                }
            }
        }
    }
}

#[test]
fn row_predictions_match_the_batch_forward_pass() {
    for (s, sizes) in SHAPES.iter().enumerate() {
        let net = random_net(sizes, Activation::Relu, Head::SOFTMAX, 200 + s as u64);
        let model = NetworkModel::new(ModelKind::Mlp, net.clone());
        let mut r = stream(s as u64);
        let x: Vec<Vec<f64>> = (0..9)
            .map(|_| (0..sizes[0]).map(|_| 2.0 * r()).collect())
            .collect();
        let mut ws = Workspace::new(&net, x.len()).unwrap();
        net.forward(&rows_of(&x), &mut ws);
        for (i, row) in x.iter().enumerate() {
            let mut proba = Vec::new();
            assert!(model.predict_proba(Row::Dense(row), &mut proba));
            for (p, q) in proba.iter().zip(net.outputs(&ws, i)) {
                assert!((p - q).abs() <= 1e-12 * q.abs().max(1e-3), "{p} vs {q}");
            }
            let best = crate::model::argmax(net.outputs(&ws, i)).unwrap();
            assert_eq!(model.predict(Row::Dense(row)), best as f64);
        }
    }
}

#[test]
fn folding_a_target_keeps_the_output_major_copy_in_step() {
    let net = random_net(&[4, 10, 1], Activation::Tanh, Head::SQUARED, 3);
    let mut model = NetworkModel::new(ModelKind::MlpRegression, net.clone());
    let x = [0.5, -1.0, 2.0, 0.25];
    let before = model.decision(Row::Dense(&x));
    model.fold_target(100.0, 20.0);
    let after = model.decision(Row::Dense(&x));
    assert!(
        (after - (before * 20.0 + 100.0)).abs() < 1e-9,
        "{after} vs {before}"
    );
    let rebuilt = NetworkModel::new(ModelKind::MlpRegression, model.net().clone());
    assert_eq!(rebuilt.decision(Row::Dense(&x)).to_bits(), after.to_bits());
}

#[test]
fn a_round_with_a_control_steps_corrected_and_answers_its_mean_gradient() {
    let sgd = OptimizerKind::Sgd { momentum: 0.0 };
    let mut o = Optimizer::new(sgd, 0.5, 0.0, 2).unwrap();
    // A correction of another length is refused; none taken without a round.
    assert!(!o.start_control(vec![1.0]).unwrap());
    assert_eq!(o.take_control(), None);
    assert!(o.start_control(vec![1.0, -2.0]).unwrap());
    let mut p = vec![0.0, 0.0];
    o.step(&mut p, &[2.0, 0.0], &[true, true]);
    // Each step along the gradient plus the correction: 0.5 × (2 + 1), 0.5 × (0 − 2).
    assert_eq!(p, vec![-1.5, 1.0]);
    o.step(&mut p, &[4.0, 2.0], &[true, true]);
    // The control: the mean of the raw gradients; the round's correction ends with it.
    assert_eq!(o.take_control(), Some(vec![3.0, 1.0]));
    assert_eq!(o.take_control(), None);
    o.step(&mut p, &[2.0, 2.0], &[true, true]);
    // After the round: 0.5 × (4 + 1), 0.5 × (2 − 2); then uncorrected: 0.5 × 2 each.
    assert_eq!(p, vec![-5.0, 0.0]);
    // The first round has no correction yet (empty): its steps go as they are, summed.
    assert!(o.start_control(Vec::new()).unwrap());
    o.step(&mut p, &[2.0, -2.0], &[true, true]);
    assert_eq!(p, vec![-6.0, 1.0]);
    assert_eq!(o.take_control(), Some(vec![2.0, -2.0]));
}
