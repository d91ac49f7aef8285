//! Unit tests of the tuple arena and sparse row validation (some read private capacities).

// The table of bad rows spells out its tuple type.
#![allow(clippy::type_complexity)]

use super::*;

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
