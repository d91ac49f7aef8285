//! The pile shuffle's draws: reproducible, and a uniform permutation (chi-square on where each
//! input position lands, over many shuffles of a small table).

use corgipile_ml::shuffle::{pile_count, PileShuffler};

/// The two-pass shuffle of 0..n with `piles` piles, as corgipile_shuffle does it.
fn pile_shuffle(n: usize, piles: usize, seed: u64) -> Vec<usize> {
    let mut s = PileShuffler::new(seed);
    let mut by_pile: Vec<Vec<usize>> = vec![Vec::new(); piles];
    for i in 0..n {
        let p = s.pile(piles);
        by_pile[p].push(i);
    }
    let mut out = Vec::with_capacity(n);
    for (p, mut rows) in by_pile.into_iter().enumerate() {
        s.shuffle_pile(p as u64, &mut rows);
        out.extend(rows);
    }
    out
}

#[test]
fn same_seed_same_order_and_every_row_once() {
    let a = pile_shuffle(1000, 7, 42);
    assert_eq!(a, pile_shuffle(1000, 7, 42));
    assert_ne!(a, pile_shuffle(1000, 7, 43));
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
}

#[test]
fn positions_are_uniform() {
    // n = 12 positions, 3 piles, 24,000 shuffles: each (input, output) cell expects 2,000.
    let (n, trials) = (12usize, 24_000usize);
    let mut counts = vec![vec![0u32; n]; n];
    for t in 0..trials {
        for (pos, &row) in pile_shuffle(n, 3, t as u64).iter().enumerate() {
            counts[row][pos] += 1;
        }
    }
    let expected = trials as f64 / n as f64;
    let chi2: f64 = counts
        .iter()
        .flatten()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    // (n-1)^2 = 121 degrees of freedom: the 99.99th percentile is about 190.
    assert!(chi2 < 190.0, "chi-square {chi2}");
}

#[test]
fn pile_count_bounds() {
    assert_eq!(pile_count(0, 1 << 20, 1024), 1);
    assert_eq!(pile_count(10 << 20, 1 << 20, 1024), 20);
    assert_eq!(pile_count(u64::MAX, 1, 1024), 1024);
    // A large memory bound still gives cache-sized piles, not a few huge ones.
    assert_eq!(pile_count(1 << 30, 512 << 20, 4096), 256);
    assert_eq!(pile_count(3 << 20, 512 << 20, 4096), 1);
}
