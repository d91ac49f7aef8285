//! Training on standardized features (dense and sparse), folded back to the table's units.

use super::*;

fn random_rows(d: usize, n: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| (0..d).map(|_| uniform(&mut rng) * 10.0 - 3.0).collect())
        .collect()
}

#[test]
fn standardized_training_folds_to_original_units() {
    let d = 4;
    // Features on very different scales and offsets.
    let scales = [1000.0, 0.001, 1.0, 50.0];
    let offsets = [5000.0, -0.01, 3.0, 0.0];
    for kind in ModelKind::ALL.into_iter().filter(|&k| linear_kind(k)) {
        let base = dataset(kind, 200, d, 1.0, 13);
        let data: Data = base
            .iter()
            .map(|(y, x)| {
                let x = (0..d).map(|j| x[j] * scales[j] + offsets[j]).collect();
                (*y, x)
            })
            .collect();
        let mut stats = FeatureStats::new(d, kind.is_classifier());
        for (y, x) in &data {
            stats.push(Row::Dense(x), *y);
        }
        for center in [true, false] {
            let s = stats.standardizer(center);
            let c = TrainConfig {
                standardizer: Some(s.clone()),
                // Uncentered offsets make rows long: smaller steps.
                ..config(kind, if center { 0.05 } else { 0.002 }, 0.001, 0.0, 2)
            };
            let (m, st) = train(c, d, &[dense_arena(&data, d)], 5);
            assert!(st.iter().all(|s| s.loss.is_finite()));
            let folded = m.fold_standardizer(&s);
            let mut buf = Vec::new();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for x in random_rows(d, 50, 14) {
                s.apply_dense(&x, &mut buf);
                m.scores(Row::Dense(&buf), &mut a);
                folded.scores(Row::Dense(&x), &mut b);
                for (p, q) in a.iter().zip(&b) {
                    assert!(
                        (p - q).abs() <= 1e-9 * (1.0 + p.abs()),
                        "{kind:?} center={center}: {p} vs {q}"
                    );
                }
                if kind.is_classifier() {
                    assert_eq!(m.predict(Row::Dense(&buf)), folded.predict(Row::Dense(&x)));
                }
            }
        }
    }
}

#[test]
fn standardized_sparse_training_keeps_sparsity_and_folds() {
    let d = 12;
    let data: Data = dataset(ModelKind::Logistic, 150, d, 0.3, 15)
        .into_iter()
        .map(|(y, x)| {
            (
                y,
                x.iter()
                    .enumerate()
                    .map(|(j, v)| v * (j + 1) as f64 * 10.0)
                    .collect(),
            )
        })
        .collect();
    let sparse = sparse_arena(&data);
    let mut stats = FeatureStats::new(0, true);
    for i in 0..sparse.len() {
        stats.push(sparse.row(i), sparse.label(i));
    }
    let s = stats.standardizer(false);
    let c = TrainConfig {
        standardizer: Some(s.clone()),
        ..config(ModelKind::Logistic, 0.05, 0.01, 0.001, 3)
    };
    // Sparse lazy training on scaled rows equals dense eager training on them.
    let (ms, _) = train(c.clone(), 0, std::slice::from_ref(&sparse), 3);
    let (md, _) = train(c, d, &[dense_arena(&data, d)], 3);
    assert_models_close(&md, &ms, 1e-12, "standardized sparse");
    let folded = ms.fold_standardizer(&s);
    for i in 0..sparse.len() {
        let Row::Sparse { indices, values } = sparse.row(i) else {
            unreachable!()
        };
        let mut buf = Vec::new();
        s.apply_sparse(indices, values, &mut buf);
        let p = ms.decision(Row::Sparse {
            indices,
            values: &buf,
        });
        let q = folded.decision(sparse.row(i));
        assert!((p - q).abs() <= 1e-9 * (1.0 + p.abs()), "{p} vs {q}");
    }
}

#[test]
fn sparse_training_with_growing_dimension_and_preset_dimension_agree() {
    // Later buffers have larger indices; the model grows mid-batch.
    let d = 20;
    let mut data = dataset(ModelKind::Softmax, 90, d, 0.3, 16);
    for (i, (_, x)) in data.iter_mut().enumerate() {
        // First third only uses features < 7, second < 14.
        let limit = if i < 30 {
            7
        } else if i < 60 {
            14
        } else {
            d
        };
        x.iter_mut().skip(limit).for_each(|v| *v = 0.0);
        x[limit - 1] = 1.0;
    }
    let buffers: Vec<TupleArena> = [0, 30, 60, 90]
        .windows(2)
        .map(|w| sparse_arena(&data[w[0]..w[1]]))
        .collect();
    for batch in [1usize, 4, 7] {
        let c = config(ModelKind::Softmax, 0.1, 0.01, 0.002, batch);
        let (grown, _) = train(c.clone(), 0, &buffers, 3);
        let (preset, _) = train(c.clone(), d, &buffers, 3);
        let (dense, _) = train(c, d, &[dense_arena(&data, d)], 3);
        assert_models_close(&grown, &preset, 0.0, &format!("batch {batch}"));
        assert_models_close(&grown, &dense, 1e-12, &format!("batch {batch} dense"));
    }
}
