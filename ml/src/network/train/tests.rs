use super::*;
use crate::network::Activation;

/// Two interleaved rings (label = which ring): no line separates them.
fn rings(n: usize) -> TupleArena {
    let mut arena = TupleArena::new(2, n);
    for i in 0..n {
        let angle = i as f64 * 0.7;
        let r = if i % 2 == 0 { 1.0 } else { 2.0 };
        arena.push((i % 2) as f64, &[r * angle.cos(), r * angle.sin()]);
    }
    arena
}

fn train(epochs: u32, seed: u64) -> (NetworkTrainer, EpochStats) {
    let arena = rings(400);
    let net = Network::new(&[2, 16, 2], Activation::Relu, Head::SOFTMAX, seed).unwrap();
    let mut t = NetworkTrainer::adam_for_tests(net, 16);
    let mut last = None;
    for epoch in 1..=epochs {
        t.start_epoch(epoch);
        t.train_buffer(&arena, None).unwrap();
        last = Some(t.finish_epoch());
    }
    (t, last.unwrap())
}

#[test]
fn learns_two_rings_that_no_line_separates() {
    let (_, stats) = train(60, 1);
    assert_eq!(stats.tuples, 400);
    assert!(stats.accuracy.unwrap() > 0.97, "{stats:?}");
    assert_eq!(stats.r2, None);
}

#[test]
fn same_seed_same_data_same_network_bit_for_bit() {
    let (a, sa) = train(3, 9);
    let (b, sb) = train(3, 9);
    assert_eq!(sa.loss.to_bits(), sb.loss.to_bits());
    assert!(a
        .network()
        .params
        .iter()
        .zip(&b.network().params)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn regression_reports_in_the_label_s_units() {
    // y = 1000 + 50·x₀² - 30·x₁: a non-linear target of large scale.
    let mut arena = TupleArena::new(2, 500);
    let mut w = Welford::default();
    for i in 0..500 {
        let (x0, x1) = (
            ((i * 37) % 100) as f64 / 50.0 - 1.0,
            ((i * 53) % 100) as f64 / 50.0 - 1.0,
        );
        let y = 1000.0 + 50.0 * x0 * x0 - 30.0 * x1;
        w.push(y);
        arena.push(y, &[x0, x1]);
    }
    let (mean, std) = w.mean_std();
    let net = Network::new(&[2, 32, 1], Activation::Tanh, Head::SQUARED, 4).unwrap();
    let mut t = NetworkTrainer::try_new(
        net,
        OptimizerKind::Adam,
        0.01,
        0.0,
        16,
        Target::new(mean, std),
    )
    .unwrap();
    let mut stats = None;
    for epoch in 1..=150 {
        t.start_epoch(epoch);
        t.train_buffer(&arena, None).unwrap();
        stats = Some(t.finish_epoch());
    }
    let stats = stats.unwrap();
    assert!(stats.r2.unwrap() > 0.98, "{stats:?}");
    assert_eq!(stats.accuracy, None);
    // Half the mean squared error in the label's units: small next to its variance.
    assert!(stats.loss < 0.02 * std * std, "{stats:?}");
}

#[test]
fn a_huge_learning_rate_diverges_into_an_error() {
    let arena = rings(64);
    let net = Network::new(&[2, 8, 2], Activation::Relu, Head::SOFTMAX, 2).unwrap();
    let mut t = NetworkTrainer::try_new(
        net,
        OptimizerKind::Sgd { momentum: 0.9 },
        1e300,
        0.0,
        8,
        Target::new(0.0, 1.0),
    )
    .unwrap();
    t.start_epoch(1);
    assert_eq!(
        t.train_buffer(&arena, None),
        Err(TrainError::Diverged { epoch: 1 })
    );
}

#[test]
fn an_interrupt_stops_between_batches() {
    let arena = rings(64);
    let net = Network::new(&[2, 8, 2], Activation::Relu, Head::SOFTMAX, 2).unwrap();
    let mut t = NetworkTrainer::adam_for_tests(net, 8);
    t.set_interrupt(Some(Box::new(|| true)));
    t.start_epoch(1);
    assert_eq!(t.train_buffer(&arena, None), Err(TrainError::Interrupted));
}

#[test]
fn standardizing_on_the_way_in_equals_training_on_standardized_rows_bit_for_bit() {
    let arena = rings(120);
    // Centered and scaled; the second feature beyond the standardizer passes through.
    for s in [
        Standardizer {
            mean: vec![0.3, -0.2],
            scale: vec![1.7, 0.6],
            center: true,
        },
        Standardizer {
            mean: vec![0.0],
            scale: vec![2.5],
            center: false,
        },
    ] {
        let mut standardized = TupleArena::new(2, 120);
        let mut values = Vec::new();
        for i in 0..120 {
            if let Row::Dense(x) = arena.row(i) {
                s.apply_dense(x, &mut values);
                standardized.push(arena.label(i), &values);
            }
        }
        let order: Vec<u32> = (0..120u32).map(|i| (i * 37) % 120).collect();
        let run = |a: &TupleArena, s: Option<Standardizer>| {
            let net = Network::new(&[2, 8, 2], Activation::Relu, Head::SOFTMAX, 6).unwrap();
            let mut t = NetworkTrainer::adam_for_tests(net, 16);
            t.set_standardizer(s);
            for epoch in 1..=2 {
                t.start_epoch(epoch);
                t.train_buffer(a, Some(&order)).unwrap();
            }
            t.into_network().params
        };
        let (a, b) = (run(&arena, Some(s.clone())), run(&standardized, None));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}

#[test]
fn the_buffer_order_is_followed() {
    // Training on a permutation equals training on the arena stored in that order.
    let arena = rings(50);
    let order: Vec<u32> = (0..50u32).rev().collect();
    let mut reordered = TupleArena::new(2, 50);
    for &i in &order {
        if let Row::Dense(x) = arena.row(i as usize) {
            reordered.push(arena.label(i as usize), x);
        }
    }
    let run = |a: &TupleArena, o: Option<&[u32]>| {
        let net = Network::new(&[2, 8, 2], Activation::Tanh, Head::SOFTMAX, 5).unwrap();
        let mut t = NetworkTrainer::adam_for_tests(net, 7);
        t.start_epoch(1);
        t.train_buffer(a, o).unwrap();
        t.into_network().params
    };
    assert_eq!(run(&arena, Some(&order)), run(&reordered, None));
}
