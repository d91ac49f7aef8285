//! Unit tests of the tuple arena and sparse row validation (some read private capacities).

// The table of bad rows spells out its tuple type.
#![allow(clippy::type_complexity)]

use super::*;
use crate::shuffle::TupleShuffler;

#[test]
fn push_and_read_back() {
    let mut a = TupleArena::new(3, 4);
    assert!(a.is_empty());
    a.push(1.0, &[1.0, 2.0, 3.0]);
    a.push_f32(-1.0, &[4.5f32, 5.0, 6.0]);
    assert_eq!(a.len(), 2);
    assert_eq!(a.n_features(), 3);
    assert_eq!(a.features(0), &[1.0, 2.0, 3.0]);
    assert_eq!(a.features(1), &[4.5, 5.0, 6.0]);
    assert_eq!(a.row(1), Row::Dense(&[4.5, 5.0, 6.0]));
    assert_eq!(a.label(1), -1.0);
    assert!(!a.is_sparse());
    assert_eq!(a.nnz(), 6);
    assert_eq!(a.bytes_used(), 2 * TupleArena::bytes_per_tuple(3));
}

#[test]
fn clear_keeps_allocation() {
    let mut a = TupleArena::new(2, 100);
    for i in 0..100 {
        a.push(i as f64, &[1.0, 2.0]);
    }
    let cap = a.values.capacity();
    a.clear();
    assert!(a.is_empty());
    assert_eq!(a.values.capacity(), cap);
}

#[test]
fn zero_features() {
    let mut a = TupleArena::new(0, 2);
    a.push(1.0, &[]);
    assert_eq!(a.len(), 1);
    assert_eq!(a.features(0), &[] as &[f64]);
    assert_eq!(TupleArena::bytes_per_tuple(0), 8);
    assert_eq!(TupleArena::bytes_per_tuple(9), 80);
}

#[test]
fn try_push_sparse_checks_and_leaves_the_arena_on_errors() {
    let mut a = TupleArena::new_sparse(4, 16);
    a.try_push_sparse(1.0, &[1i32, 3], 1, Some(5), &[1.0f64, 2.0])
        .unwrap();
    let before = (a.len(), a.nnz(), a.n_features());
    let bad: [(&[i32], &[f64], i64, Option<usize>); 8] = [
        (&[1, 2], &[1.0], 1, None),                 // lengths differ
        (&[0, 2], &[1.0, 2.0], 1, None),            // below the base
        (&[2, 6], &[1.0, 2.0], 1, Some(5)),         // out of range
        (&[1, 9, 3], &[1.0, 2.0, 3.0], 1, Some(5)), // out of range between valid ends
        (&[3, 2], &[1.0, 2.0], 1, None),            // unsorted
        (&[2, 2], &[1.0, 2.0], 1, None),            // duplicate
        (&[-1], &[1.0], 0, None),                   // negative
        (&[i32::MIN, 1], &[1.0, 2.0], 1, None),     // far below the base
    ];
    for (indices, values, base, n) in bad {
        let expected = validate_sparse(indices, values.len(), base, n).unwrap_err();
        assert_eq!(
            a.try_push_sparse(2.0, indices, base, n, values),
            Err(SparsePushError::Index(expected))
        );
        assert_eq!((a.len(), a.nnz(), a.n_features()), before);
    }
    for v in [f64::NAN, f64::INFINITY] {
        assert_eq!(
            a.try_push_sparse(2.0, &[1i32, 2], 1, None, &[0.5, v]),
            Err(SparsePushError::NotFinite)
        );
        assert_eq!((a.len(), a.nnz(), a.n_features()), before);
    }
    let extreme = [i64::MIN, i64::MAX];
    assert_eq!(
        a.try_push_sparse(2.0, &extreme, 1, None, &[1.0, 2.0]),
        Err(SparsePushError::Index(
            validate_sparse(&extreme, 2, 1, None).unwrap_err()
        ))
    );
    assert_eq!((a.len(), a.nnz(), a.n_features()), before);
    // An index problem is reported before a non-finite value.
    assert!(matches!(
        a.try_push_sparse(2.0, &[2i32, 1], 1, None, &[f64::NAN, 1.0]),
        Err(SparsePushError::Index(_))
    ));
    a.try_push_sparse(3.0, &[2i64, 5], 1, Some(5), &[0.5f32, 1.5])
        .unwrap();
    assert_eq!(
        a.row(1),
        Row::Sparse {
            indices: &[1, 4],
            values: &[0.5, 1.5]
        }
    );
}

#[test]
fn sparse_push_and_read_back() {
    let mut a = TupleArena::new_sparse(4, 16);
    assert!(a.is_sparse() && a.is_empty());
    a.push_sparse(1.0, &[0, 5, 9], &[1.0, 2.0, 3.0]);
    a.push_sparse(2.0, &[], &[]);
    a.try_push_sparse(3.0, &[2i32, 4], 1, None, &[0.5f32, -1.5])
        .unwrap();
    a.try_push_sparse(4.0, &[7i64], 0, Some(8), &[8.0f64])
        .unwrap();
    assert_eq!(a.len(), 4);
    assert_eq!(a.nnz(), 6);
    assert_eq!(a.n_features(), 10);
    assert_eq!(
        a.row(0),
        Row::Sparse {
            indices: &[0, 5, 9],
            values: &[1.0, 2.0, 3.0]
        }
    );
    assert_eq!(
        a.row(1),
        Row::Sparse {
            indices: &[],
            values: &[]
        }
    );
    assert_eq!(
        a.row(2),
        Row::Sparse {
            indices: &[1, 3],
            values: &[0.5, -1.5]
        }
    );
    assert_eq!(a.label(3), 4.0);
    assert_eq!(
        a.bytes_used(),
        (0..4)
            .map(|i| TupleArena::bytes_per_sparse_tuple(a.row(i).nnz()))
            .sum::<usize>()
    );
    let cap = (a.values.capacity(), a.indices.capacity());
    a.clear();
    assert!(a.is_empty());
    assert_eq!(a.n_features(), 0);
    assert_eq!((a.values.capacity(), a.indices.capacity()), cap);
    a.push_sparse(1.0, &[2], &[1.0]);
    assert_eq!(a.n_features(), 3);
    assert_eq!(a.row(0).dim(), 3);
}

#[test]
#[should_panic(expected = "sparse arena; use row()")]
fn features_of_sparse_panics() {
    let mut a = TupleArena::new_sparse(1, 1);
    a.push_sparse(1.0, &[0], &[1.0]);
    a.features(0);
}

#[test]
fn validate_sparse_errors() {
    assert_eq!(validate_sparse(&[1i64, 2, 5], 3, 1, Some(5)), Ok(()));
    assert_eq!(validate_sparse::<i32>(&[], 0, 1, None), Ok(()));
    assert_eq!(validate_sparse(&[0i32, 4], 2, 0, Some(5)), Ok(()));
    let cases: Vec<(Result<(), SparseError>, &str)> = vec![
        (
            validate_sparse(&[1i64, 2], 3, 1, None),
            "sparse row has 2 indices but 3 values",
        ),
        (
            validate_sparse(&[1i64, 0], 2, 1, None),
            "sparse index 0 at position 2 is below the index base 1",
        ),
        (
            validate_sparse(&[-3i32], 1, 0, None),
            "sparse index -3 at position 1 is below the index base 0",
        ),
        (
            validate_sparse(&[1i64, 6], 2, 1, Some(5)),
            "sparse index 6 at position 2 is out of range: the largest valid index is 5 (5 features, index base 1)",
        ),
        (
            validate_sparse(&[5i64], 1, 0, Some(5)),
            "sparse index 5 at position 1 is out of range: the largest valid index is 4 (5 features, index base 0)",
        ),
        (
            validate_sparse(&[i64::from(i32::MAX)], 1, 0, None),
            "sparse index 2147483647 at position 1 is out of range: the largest valid index is 2147483646 (2147483647 features, index base 0)",
        ),
        (
            validate_sparse(&[3i64, 2], 2, 1, None),
            "sparse indices must be in increasing order: 2 at position 2 follows 3",
        ),
        (
            validate_sparse(&[1i64, 3, 3], 3, 1, None),
            "sparse index 3 appears twice (positions 2 and 3)",
        ),
    ];
    for (r, msg) in cases {
        assert_eq!(r.unwrap_err().to_string(), msg);
    }
    assert!(matches!(
        validate_sparse(&[2i32, 2], 2, 1, None),
        Err(SparseError::Duplicate {
            position: 1,
            index: 2
        })
    ));
    assert!(matches!(
        validate_sparse(&[2i32, 1], 2, 1, None),
        Err(SparseError::Unsorted { .. })
    ));
    assert!(matches!(
        validate_sparse(&[2i32], 2, 1, None),
        Err(SparseError::LengthMismatch { .. })
    ));
}

/// Row k of a test: label k, features [k, k + 0.5, ...] (so a row is recognisable anywhere).
fn test_row(k: usize, n: usize) -> (f64, Vec<f64>) {
    (
        k as f64,
        (0..n).map(|j| k as f64 + j as f64 * 0.5).collect(),
    )
}

/// Fills a fresh arena of `capacity` rows (3 features) with `pushed` rows in arrival order
/// and draws its visiting order as a training buffer's (see `TupleShuffle`).
fn shuffled(capacity: usize, pushed: usize, seed: u64) -> (TupleArena, Vec<u32>) {
    let mut a = TupleArena::new(3, capacity);
    let plan = a.shuffle_plan(capacity);
    assert!(matches!(plan, BufferShuffle::Bucketed { .. }));
    for k in 0..pushed {
        let (label, x) = test_row(k, 3);
        if k % 2 == 0 {
            a.push(label, &x);
        } else {
            let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            a.push_f32(label, &x32);
        }
        assert_eq!(a.len(), k + 1);
    }
    let mut order = vec![7, 7, 7];
    TupleShuffler::new(seed, 1).visiting_order(plan, pushed, &mut order);
    (a, order)
}

/// The rows (by arrival) in the order 0.4.0 visited a dense buffer planned for `capacity`
/// rows in `buckets` buckets that got `pushed` rows: it filled the buffer scattered (the k-th
/// row at position `slots[k]`) and visited bucket after bucket, each in random order; with
/// fewer rows than planned, it compacted them in position order and permuted them whole.
/// Kept here to show that `visiting_order` gives the same order: a seed trains on the rows in
/// the same order as before.
fn visit_of_a_scattered_fill(
    capacity: usize,
    buckets: usize,
    pushed: usize,
    seed: u64,
) -> Vec<u32> {
    let mut shuffler = TupleShuffler::new(seed, 1);
    let (mut slots, mut starts) = (Vec::new(), Vec::new());
    shuffler.bucket_slots(capacity, buckets, &mut slots, &mut starts);
    let mut at = vec![u32::MAX; capacity]; // position → row
    for (k, &slot) in slots[..pushed].iter().enumerate() {
        at[slot as usize] = k as u32;
    }
    let mut order: Vec<u32> = Vec::new();
    if pushed == capacity {
        order.extend(0..capacity as u32);
        shuffler.shuffle_buckets(&starts, &mut order);
        order.iter().map(|&p| at[p as usize]).collect()
    } else {
        let compacted: Vec<u32> = at.into_iter().filter(|&r| r != u32::MAX).collect();
        shuffler.permutation(pushed, &mut order);
        order.iter().map(|&p| compacted[p as usize]).collect()
    }
}

/// (planned rows, rows that came) of buffers of 3 features (32 bytes a row, so 2 MB buckets
/// hold 65,536 rows: 200,000 planned rows make 4 buckets), full and partial.
const BUFFERS: [(usize, usize); 5] = [
    (200_000, 200_000),
    (200_000, 123_457),
    (1000, 1000),
    (1000, 1),
    (5, 3),
];

#[test]
fn visiting_order_is_that_of_a_scattered_fill() {
    for (capacity, pushed) in BUFFERS {
        let BufferShuffle::Bucketed { rows, buckets } =
            TupleArena::new(3, capacity).shuffle_plan(capacity)
        else {
            panic!("a dense arena with room is bucketed");
        };
        assert_eq!(
            (rows, buckets),
            (capacity, (capacity * 32).div_ceil(2 << 20))
        );
        for seed in [1, 42] {
            let mut order = Vec::new();
            TupleShuffler::new(seed, 1).visiting_order(
                BufferShuffle::Bucketed { rows, buckets },
                pushed,
                &mut order,
            );
            assert_eq!(
                order,
                visit_of_a_scattered_fill(capacity, buckets, pushed, seed),
                "{capacity} {pushed}"
            );
        }
    }
}

/// Every pushed row is there exactly once with its own label, and `order` visits each once.
fn assert_rows_kept(a: &TupleArena, order: &[u32], pushed: usize) {
    assert_eq!(a.len(), pushed);
    assert_eq!(a.nnz(), pushed * 3);
    let mut seen = vec![false; pushed];
    for &i in order {
        let label = a.label(i as usize);
        let k = label as usize;
        assert_eq!(
            a.features(i as usize),
            test_row(k, 3).1.as_slice(),
            "row {k}"
        );
        assert!(!std::mem::replace(&mut seen[k], true), "row {k} twice");
    }
    assert!(seen.iter().all(|&s| s), "a row is missing");
}

#[test]
fn a_shuffled_buffer_visits_every_row_once_full_and_partial() {
    for (capacity, pushed) in BUFFERS {
        let (a, order) = shuffled(capacity, pushed, 42);
        assert_rows_kept(&a, &order, pushed);
    }
}

#[test]
fn the_visiting_order_is_deterministic_and_shuffles() {
    let (a, order) = shuffled(10_000, 10_000, 7);
    let (b, order_b) = shuffled(10_000, 10_000, 7);
    let visit =
        |a: &TupleArena, o: &[u32]| o.iter().map(|&i| a.label(i as usize)).collect::<Vec<_>>();
    assert_eq!(visit(&a, &order), visit(&b, &order_b));
    let (c, order_c) = shuffled(10_000, 10_000, 8);
    assert_ne!(
        visit(&a, &order),
        visit(&c, &order_c),
        "another seed, another order"
    );
    // Far from the arrival order: fewer than 1% of rows keep their place.
    let fixed = visit(&a, &order)
        .iter()
        .enumerate()
        .filter(|&(i, &l)| i as f64 == l)
        .count();
    assert!(fixed < 100, "{fixed} rows in place");
}

#[test]
fn the_visiting_order_is_uniform() {
    // 4 rows → 24 orders; full buffers and partial ones (3 of 5 planned, 6 orders) alike.
    for (capacity, pushed, orders) in [(4usize, 4usize, 24usize), (5, 3, 6)] {
        let mut counts = std::collections::HashMap::new();
        let trials = 24_000;
        for seed in 0..trials {
            let (a, order) = shuffled(capacity, pushed, seed);
            let visit: Vec<u64> = order.iter().map(|&i| a.label(i as usize) as u64).collect();
            *counts.entry(visit).or_insert(0usize) += 1;
        }
        assert_eq!(counts.len(), orders);
        let expected = trials as f64 / orders as f64;
        let chi2: f64 = counts
            .values()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        // 23 (5) degrees of freedom: p = 0.001 at 49.7 (20.5).
        assert!(
            chi2 < if orders == 24 { 49.7 } else { 20.5 },
            "chi2 {chi2} over {counts:?}"
        );
    }
}

#[test]
fn bucket_slots_deal_rows_to_buckets_in_arrival_order() {
    let mut shuffler = TupleShuffler::new(3, 1);
    let (mut slots, mut starts) = (Vec::new(), Vec::new());
    shuffler.bucket_slots(50_000, 7, &mut slots, &mut starts);
    assert_eq!(starts.len(), 8);
    assert_eq!((starts[0], starts[7]), (0, 50_000));
    let mut sorted = slots.clone();
    sorted.sort_unstable();
    assert!(
        sorted.iter().enumerate().all(|(i, &s)| i as u32 == s),
        "slots are a permutation"
    );
    // Rows of one bucket take its slots in arrival order.
    for b in starts.windows(2) {
        let mine: Vec<u32> = slots
            .iter()
            .copied()
            .filter(|&s| s >= b[0] && s < b[1])
            .collect();
        assert!(mine.windows(2).all(|w| w[0] < w[1]));
        assert!(
            (b[1] - b[0]) > 6000,
            "bucket sizes are about n / 7: {}",
            b[1] - b[0]
        );
    }
    let mut order: Vec<u32> = (0..50_000).collect();
    shuffler.shuffle_buckets(&starts, &mut order);
    for (pos, &i) in order.iter().enumerate() {
        let bucket = starts.partition_point(|&s| s as usize <= pos) - 1;
        assert!(i >= starts[bucket] && i < starts[bucket + 1]);
    }
}

#[test]
fn a_buffer_is_bucketed_only_when_dense_empty_and_with_room() {
    let whole = BufferShuffle::Whole;
    assert_eq!(TupleArena::new_sparse(10, 10).shuffle_plan(10), whole);
    let mut small = TupleArena::new(3, 10);
    assert_eq!(small.shuffle_plan(11), whole, "no room reserved");
    assert_eq!(small.shuffle_plan(0), whole);
    assert_eq!(
        small.shuffle_plan(10),
        BufferShuffle::Bucketed {
            rows: 10,
            buckets: 1
        }
    );
    small.push(1.0, &[1.0, 2.0, 3.0]);
    assert_eq!(small.shuffle_plan(5), whole, "not empty");
    small.clear();
    assert_eq!(
        small.shuffle_plan(5),
        BufferShuffle::Bucketed {
            rows: 5,
            buckets: 1
        }
    );
    // A whole permutation of what came.
    let mut order = Vec::new();
    TupleShuffler::new(1, 1).visiting_order(whole, 4, &mut order);
    order.sort_unstable();
    assert_eq!(order, [0, 1, 2, 3]);
}

#[test]
#[should_panic(expected = "rows in a buffer planned for")]
fn a_buffer_of_more_rows_than_planned_is_refused() {
    TupleShuffler::new(1, 1).visiting_order(
        BufferShuffle::Bucketed {
            rows: 2,
            buckets: 1,
        },
        3,
        &mut Vec::new(),
    );
}

#[test]
fn bucketed_visit_order_is_uniform_with_several_buckets() {
    // The arena's buckets are 2 MB, so small tests have one; the plan itself takes any count.
    for buckets in [2usize, 3, 4] {
        let mut counts = std::collections::HashMap::new();
        let trials = 24_000;
        for seed in 0..trials {
            let mut order = Vec::new();
            TupleShuffler::new(seed, 2).visiting_order(
                BufferShuffle::Bucketed { rows: 4, buckets },
                4,
                &mut order,
            );
            *counts.entry(order).or_insert(0usize) += 1;
        }
        assert_eq!(counts.len(), 24);
        let expected = trials as f64 / 24.0;
        let chi2: f64 = counts
            .values()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum();
        assert!(chi2 < 49.7, "{buckets} buckets: chi2 {chi2}");
    }
}

#[test]
fn a_grouped_arena_keeps_each_rows_group_with_it() {
    for (capacity, pushed) in [(200_000, 200_000), (200_000, 99_999), (10, 10), (10, 4)] {
        let mut a = TupleArena::new(3, capacity);
        a.set_grouped().unwrap();
        let plan = a.shuffle_plan(capacity);
        assert!(matches!(plan, BufferShuffle::Bucketed { .. }));
        for k in 0..pushed {
            let (label, x) = test_row(k, 3);
            a.set_next_group((k % 7) as u32);
            a.push(label, &x);
        }
        let mut order = Vec::new();
        TupleShuffler::new(3, 1).visiting_order(plan, pushed, &mut order);
        assert_rows_kept(&a, &order, pushed);
        for i in 0..a.len() {
            assert_eq!(a.group(i), (a.label(i) as usize % 7) as u32, "row {i}");
        }
        // Cleared and refilled in order, sparse rows too: the groups follow.
        a.clear();
        a.set_next_group(5);
        a.push(1.0, &[1.0, 2.0, 3.0]);
        assert_eq!((a.len(), a.group(0)), (1, 5));
    }
    let mut sparse = TupleArena::new_sparse(4, 8);
    sparse.set_grouped().unwrap();
    for g in [2, NO_GROUP, 9] {
        sparse.set_next_group(g);
        sparse.push_sparse(0.0, &[1], &[1.0]);
    }
    assert_eq!(
        (0..3).map(|i| sparse.group(i)).collect::<Vec<_>>(),
        [2, NO_GROUP, 9]
    );
    assert_eq!(TupleArena::new(2, 2).group(0), NO_GROUP, "no groups: none");
}

#[test]
fn move_rows_to_moves_the_tail_in_order_and_keeps_the_head() {
    let mut last = TupleArena::new(2, 8);
    let mut next = TupleArena::new(2, 8);
    last.set_grouped().unwrap();
    next.set_grouped().unwrap();
    for i in 0..5 {
        last.set_next_group(i);
        last.push(i as f64, &[i as f64, 10.0 * i as f64]);
    }
    next.push(99.0, &[9.0, 9.0]);
    next.clear();
    let room = next.values.capacity();
    last.move_rows_to(2, &mut next);
    assert_eq!(last.len(), 2);
    assert_eq!(last.features(1), &[1.0, 10.0]);
    assert_eq!(last.group(1), 1);
    assert_eq!(next.len(), 3);
    for (k, i) in (2..5).enumerate() {
        assert_eq!(next.features(k), &[i as f64, 10.0 * i as f64]);
        assert_eq!(next.label(k), i as f64);
        assert_eq!(next.group(k), i as u32);
    }
    assert_eq!(next.values.capacity(), room, "no new allocation");
    // Rows pushed after the moved ones follow them.
    next.set_next_group(7);
    next.push(7.0, &[7.0, 70.0]);
    assert_eq!(next.features(3), &[7.0, 70.0]);
    assert_eq!(next.group(3), 7);
}

#[test]
fn only_dense_unscaled_arenas_move_rows() {
    assert!(TupleArena::new(2, 2).can_move_rows());
    assert!(!TupleArena::new_sparse(2, 4).can_move_rows());
    let mut scaled = TupleArena::new(1, 2);
    let s = Standardizer {
        mean: vec![0.0],
        scale: vec![1.0],
        center: false,
    };
    scaled.push_standardized(1.0, &[1.0], &s);
    assert!(!scaled.can_move_rows());
}
