//! Networks trained by several processes at once: each trainer adds its steps to one set of
//! shared parameters (`trainer::SharedModel`), as parallel workers do.

use super::{Activation, Network, NetworkModel, NetworkTrainer};

use crate::arena::TupleArena;
use crate::model::Head;
use crate::model::ModelKind;
use crate::row::Row;
use crate::trainer::{Gate, SharedModel};

static GATE: Gate = Gate::new();

/// Two rings around the origin (label = which ring); `mostly`: of every four rows, three of
/// this ring and one of the other.
fn rings(n: usize, mostly: Option<usize>) -> TupleArena {
    let mut arena = TupleArena::new(2, n);
    for i in 0..n {
        let class = match mostly {
            Some(c) if i % 4 == 3 => 1 - c,
            Some(c) => c,
            None => i % 2,
        };
        let angle = i as f64 * 0.7;
        let r = 1.0 + class as f64;
        arena.push(class as f64, &[r * angle.cos(), r * angle.sin()]);
    }
    arena
}

fn trainer() -> NetworkTrainer {
    let net = Network::new(&[2, 16, 2], Activation::Relu, Head::SOFTMAX, 4).unwrap();
    NetworkTrainer::adam_for_tests(net, 16)
}

fn accuracy(net: Network, arena: &TupleArena) -> f64 {
    let model = NetworkModel::new(ModelKind::Mlp, net);
    let correct = (0..arena.len())
        .filter(|&i| model.predict(arena.row(i)) == arena.label(i))
        .count();
    correct as f64 / arena.len() as f64
}

/// Memory for a shared model, 8-byte aligned.
fn shared_memory(n_values: usize) -> Vec<u64> {
    vec![0u64; SharedModel::bytes(n_values).div_ceil(8)]
}

#[test]
fn exchanging_networks_learn_from_both_shares() {
    // Each process's share is three quarters one class (the blocks of a label-clustered
    // table split in two): exchanging, they learn both rings as one process on all rows does.
    let (a_rows, b_rows) = (rings(8000, Some(0)), rings(8000, Some(1)));
    let (mut a, mut b) = (trainer(), trainer());
    let start = a.network().params.clone();
    assert_eq!(start, b.network().params, "one seed, one initial network");
    let mut memory = shared_memory(start.len());
    GATE.open();
    // SAFETY: `memory` is aligned, big enough and outlives both trainers; `set_values` runs
    // before the other handle exists.
    let (sa, sb) = unsafe {
        let at = memory.as_mut_ptr().cast::<u8>();
        let mut sa = SharedModel::create(at, start.len(), &GATE);
        sa.set_values(&start);
        (sa, SharedModel::attach(at, start.len(), &GATE).unwrap())
    };
    a.set_exchange(sa, 64);
    b.set_exchange(sb, 64);
    for epoch in 1..=10 {
        for t in [&mut a, &mut b] {
            t.start_epoch(epoch);
            t.exchange_at_next_batch();
        }
        // Interleave the two shares in chunks, as two processes would.
        for chunk in 0..16 {
            let part = |arena: &TupleArena| {
                let mut p = TupleArena::new(2, 250);
                for i in chunk * 250..(chunk + 1) * 250 {
                    if let Row::Dense(x) = arena.row(i) {
                        p.push(arena.label(i), x);
                    }
                }
                p
            };
            a.train_buffer(&part(&a_rows), None).unwrap();
            b.train_buffer(&part(&b_rows), None).unwrap();
        }
        a.exchange().unwrap();
        b.exchange().unwrap();
    }
    // The last exchange brings every process's steps into one network.
    a.exchange().unwrap();
    assert_eq!(a.network().params, b.network().params);
    let both = rings(400, None);
    let together = accuracy(a.into_network(), &both);
    assert!(together > 0.95, "{together}");
}

#[test]
fn one_process_exchanging_trains_as_it_would_alone() {
    // The shared parameters then only ever hold this trainer's own: its network is unchanged.
    let arena = rings(300, None);
    let mut alone = trainer();
    let mut shared = trainer();
    let start = shared.network().params.clone();
    let mut memory = shared_memory(start.len());
    GATE.open();
    // SAFETY: as above.
    unsafe {
        let mut s = SharedModel::create(memory.as_mut_ptr().cast(), start.len(), &GATE);
        s.set_values(&start);
        shared.set_exchange(s, 32);
    }
    for epoch in 1..=3 {
        for t in [&mut alone, &mut shared] {
            t.start_epoch(epoch);
            t.exchange_at_next_batch();
            t.train_buffer(&arena, None).unwrap();
            t.exchange().unwrap();
        }
    }
    let (x, y) = (alone.into_network().params, shared.into_network().params);
    let worst = x
        .iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max);
    // s + (l - b) with s == b is l up to rounding.
    assert!(worst < 1e-12, "{worst}");
}
