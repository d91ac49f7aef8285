//! The Newton passes and the tests against references computed with numpy and scipy (the
//! numbers below; see tests/test_inference.py for the same against the extension).

use super::*;

fn close(a: f64, b: f64, rel: f64) {
    assert!(
        (a - b).abs() <= rel * b.abs(),
        "{a} vs {b} (relative {})",
        ((a - b) / b).abs()
    );
}

/// Newton passes over `rows` until the step is below the tolerance.
fn fit(
    family: Likelihood,
    rows: &[(Vec<f64>, f64)],
    l2: f64,
) -> Result<(Information, Inference), InferenceError> {
    let d = rows[0].0.len();
    let mut info = Information::try_new(family, &vec![0.0; d], 0.0, true).unwrap();
    for _ in 0..MAX_PASSES {
        info.start_pass();
        for (x, y) in rows {
            info.push(Row::Dense(x), *y);
        }
        let step = info.newton_step(l2, &mut || {})?;
        if step < TOLERANCE || info.solved() {
            let out = info.finish(&mut || {})?;
            return Ok((info, out));
        }
    }
    Err(InferenceError::NotConverged { step: 1.0 })
}

#[test]
fn ordinary_least_squares() {
    let x = [
        [0., 1.],
        [1., 0.],
        [2., 1.],
        [3., 3.],
        [4., 2.],
        [5., 5.],
        [6., 4.],
    ];
    let y = [1., 3., 2., 5., 4., 7., 6.];
    let rows: Vec<_> = x.iter().zip(y).map(|(x, y)| (x.to_vec(), y)).collect();
    let (info, out) = fit(Likelihood::Linear, &rows, 0.0).unwrap();
    let (w, b) = info.coefficients();
    close(w[0], 0.4563492063492053, 1e-10);
    close(w[1], 0.6111111111111129, 1e-10);
    close(b, 1.234126984126983, 1e-10);
    for (got, want) in out.std_error.iter().flatten().zip([
        0.35602780075516144,
        0.42740784870636456,
        0.663262520101907,
    ]) {
        close(*got, want, 1e-9);
    }
    for (got, want) in out.p_value.iter().flatten().zip([
        0.26917303244834956,
        0.22599421406930884,
        0.1362912889221159,
    ]) {
        close(*got, want, 1e-8);
    }
    for (got, want) in out.ci_low.iter().flatten().zip([
        -0.532142438371798,
        -0.575563318352792,
        -0.6073849932711097,
    ]) {
        close(*got, want, 1e-8);
    }
    assert_eq!(out.df, Some(4.0));
    assert_eq!(out.test, "t");
}

#[test]
fn logistic_maximum_likelihood() {
    let x = [
        0.5, 1.2, -0.3, 2.0, -1.5, 0.1, 1.8, -0.7, 0.9, -2.2, 1.1, 0.3,
    ];
    let y = [1., 0., 0., 1., 0., 1., 1., 0., 0., 0., 1., 1.];
    let rows: Vec<_> = x.iter().zip(y).map(|(&x, y)| (vec![x], y)).collect();
    let (info, out) = fit(Likelihood::Logistic, &rows, 0.0).unwrap();
    let (w, b) = info.coefficients();
    close(w[0], 1.3723756931717033, 1e-9);
    close(b, -0.479783790303125, 1e-9);
    close(out.std_error[0].unwrap(), 0.8333709216311355, 1e-8);
    close(out.std_error[1].unwrap(), 0.8003193176869224, 1e-8);
    close(out.p_value[0].unwrap(), 0.09960398257276404, 1e-7);
    close(out.p_value[1].unwrap(), 0.5488458745962715, 1e-7);
    close(
        out.ci_high[0].unwrap(),
        1.3723756931717033 + Z_975 * 0.8333709216311355,
        1e-8,
    );
    assert_eq!(out.test, "z");
    assert!(out.log_likelihood.unwrap() < 0.0);
}

#[test]
fn collinear_columns_are_singular() {
    // The second column is twice the first.
    let rows: Vec<_> = (0..20)
        .map(|i| (vec![i as f64, 2.0 * i as f64], (i % 3) as f64))
        .collect();
    assert_eq!(
        fit(Likelihood::Linear, &rows, 0.0).unwrap_err(),
        InferenceError::Singular { column: 1 }
    );
    // A constant column is the intercept's twin.
    let rows: Vec<_> = (0..20)
        .map(|i| (vec![i as f64, 3.0], (i % 3) as f64))
        .collect();
    assert!(matches!(
        fit(Likelihood::Linear, &rows, 0.0),
        Err(InferenceError::Singular { .. })
    ));
    // A penalty makes it regular.
    assert!(fit(Likelihood::Linear, &rows, 0.1).is_ok());
}

#[test]
fn separable_classes_do_not_converge() {
    let rows: Vec<_> = (0..20)
        .map(|i| (vec![i as f64], (i >= 10) as u8 as f64))
        .collect();
    assert!(fit(Likelihood::Logistic, &rows, 0.0).is_err());
}

#[test]
fn too_few_rows_for_a_t_test() {
    let rows = vec![(vec![1.0], 1.0), (vec![2.0], 3.0)];
    assert_eq!(
        fit(Likelihood::Linear, &rows, 0.0).unwrap_err(),
        InferenceError::TooFewRows {
            rows: 2,
            coefficients: 2
        }
    );
}

#[test]
fn sparse_rows_equal_dense_ones() {
    let mut a = Information::try_new(Likelihood::Logistic, &[0.1, -0.2, 0.3], 0.05, true).unwrap();
    let mut b = Information::try_new(Likelihood::Logistic, &[0.1, -0.2, 0.3], 0.05, true).unwrap();
    a.push(Row::Dense(&[0.0, 2.0, 0.0]), 1.0);
    b.push(
        Row::Sparse {
            indices: &[1],
            values: &[2.0],
        },
        1.0,
    );
    assert_eq!(a.h, b.h);
    assert_eq!(a.g, b.g);
    assert!(Information::bytes(3, true) >= 16 * 8);
}

/// The factorisation and the tests ask the caller's interrupt check once per column: a cancel
/// is answered within one column's O(p²) work, whatever p.
#[test]
fn the_interrupt_check_runs_once_per_column() {
    let rows: Vec<(Vec<f64>, f64)> = (0..40)
        .map(|i| {
            let x: Vec<f64> = (0..5).map(|j| ((i * 7 + j * 3) % 11) as f64).collect();
            let y = x.iter().sum::<f64>() + (i % 3) as f64;
            (x, y)
        })
        .collect();
    let mut info = Information::try_new(Likelihood::Linear, &[0.0; 5], 0.0, true).unwrap();
    for (x, y) in &rows {
        info.push(Row::Dense(x), *y);
    }
    let mut calls = 0;
    info.newton_step(0.0, &mut || calls += 1).unwrap();
    assert_eq!(calls, 6, "5 features and the intercept");
    calls = 0;
    info.finish(&mut || calls += 1).unwrap();
    assert_eq!(calls, 6);
}

/// Rows of a numeric feature and a category of three levels (one-hot: features 1, 2, 3, the
/// third one "(other)"), level `k` of row i given by `level`.
fn categorical_rows(level: impl Fn(usize) -> usize, logistic: bool) -> Vec<(Vec<f64>, f64)> {
    (0..60)
        .map(|i| {
            let a = ((i * 37) % 17) as f64 / 4.0 - 2.0;
            let k = level(i);
            let mut x = vec![a, 0.0, 0.0, 0.0];
            x[1 + k] = 1.0;
            let z = 0.3 + 0.8 * a + [0.0, 0.7, -0.5][k] + ((i * 13) % 7) as f64 / 3.0 - 1.0;
            let y = if logistic { (z > 0.2) as u8 as f64 } else { z };
            (x, y)
        })
        .collect()
}

/// Newton passes with the references of `groups` dropped after the first pass.
fn fit_dropping(
    family: Likelihood,
    rows: &[(Vec<f64>, f64)],
    groups: &[OneHotGroup],
    intercept: bool,
) -> Result<(Information, Inference), InferenceError> {
    let d = rows[0].0.len();
    let mut info = Information::try_new(family, &vec![0.1; d], 0.2, intercept).unwrap();
    for pass in 0..MAX_PASSES {
        info.start_pass();
        for (x, y) in rows {
            info.push(Row::Dense(x), *y);
        }
        if pass == 0 {
            info.drop_references(groups, &|j| format!("f{j}"));
        }
        let step = info.newton_step(0.0, &mut || {})?;
        if step < TOLERANCE || info.solved() {
            let out = info.finish(&mut || {})?;
            return Ok((info, out));
        }
    }
    Err(InferenceError::NotConverged { step: 1.0 })
}

fn group() -> OneHotGroup {
    OneHotGroup {
        column: "s".into(),
        features: 1..4,
        named: 2,
    }
}

/// Dropping the reference is fitting without its column: the same coefficients and tests as
/// the design without it, for both families; the reference's coefficient is 0, with no test.
#[test]
fn a_reference_level_is_the_design_without_its_column() {
    // Level 1 is the most frequent named one (level 2, "(other)", is more frequent still).
    let level = |i: usize| [0, 1, 1, 2, 2, 2][i % 6];
    for family in [Likelihood::Linear, Likelihood::Logistic] {
        let rows = categorical_rows(level, family == Likelihood::Logistic);
        // With all three levels and an intercept: singular.
        assert!(matches!(
            fit(family, &rows, 0.0),
            Err(InferenceError::Singular { .. })
        ));
        let (info, out) = fit_dropping(family, &rows, &[group()], true).unwrap();
        assert_eq!(
            out.reference,
            vec![Reference {
                column: "s".into(),
                feature: "f2".into(),
                feature_index: 3,
                rows: 20
            }]
        );
        // The same rows without feature 2 (the reference).
        let without: Vec<_> = rows
            .iter()
            .map(|(x, y)| (vec![x[0], x[1], x[3]], *y))
            .collect();
        let (want_info, want) = fit(family, &without, 0.0).unwrap();
        let (w, b) = info.coefficients();
        let (ww, wb) = want_info.coefficients();
        assert_eq!(w[2], 0.0);
        for (got, want) in [w[0], w[1], w[3], b].iter().zip([ww[0], ww[1], ww[2], wb]) {
            close(*got, want, 1e-8);
        }
        assert_eq!(out.std_error[2], None);
        assert_eq!(out.p_value[2], None);
        assert_eq!(out.ci_low[2], None);
        for (i, k) in [(0, 0), (1, 1), (3, 2), (4, 3)] {
            close(out.std_error[i].unwrap(), want.std_error[k].unwrap(), 1e-7);
            close(out.p_value[i].unwrap(), want.p_value[k].unwrap(), 1e-6);
        }
        assert_eq!(out.df, want.df);
        let json = serde_json::to_value(&out).unwrap();
        assert!(json["std_error"][2].is_null());
        assert_eq!(json["reference"][0]["feature"], "f2");
    }
}

/// Ties go to the first level; a column whose named levels were never seen falls back on its
/// other ones; without an intercept, or when a row has none of the group's features, nothing is
/// dropped.
#[test]
fn which_reference_is_dropped() {
    let reference = |level: &dyn Fn(usize) -> usize, named: usize, intercept: bool| {
        let rows = categorical_rows(level, false);
        let mut info = Information::try_new(Likelihood::Linear, &[0.0; 4], 0.0, intercept).unwrap();
        for (x, y) in &rows {
            info.push(Row::Dense(x), *y);
        }
        let g = OneHotGroup { named, ..group() };
        info.drop_references(&[g], &|j| format!("f{j}"))
            .iter()
            .map(|r| r.feature_index)
            .collect::<Vec<_>>()
    };
    // Levels 0 and 1 as frequent: the first.
    assert_eq!(reference(&|i| i % 3, 2, true), vec![2]);
    assert_eq!(reference(&|i| [1, 0, 2][i % 3], 2, true), vec![2]);
    // The most frequent named one, not "(other)".
    assert_eq!(reference(&|i| [0, 1, 1, 2, 2, 2][i % 6], 2, true), vec![3]);
    // No named level: "(other)".
    assert_eq!(reference(&|_| 2, 0, true), vec![4]);
    // No intercept: nothing to drop.
    assert!(reference(&|i| i % 3, 2, false).is_empty());
    // A row with none of the features: the group does not add up to the intercept.
    let mut info = Information::try_new(Likelihood::Linear, &[0.0; 4], 0.0, true).unwrap();
    info.push(Row::Dense(&[1.0, 1.0, 0.0, 0.0]), 1.0);
    info.push(Row::Dense(&[2.0, 0.0, 0.0, 0.0]), 2.0);
    assert!(info
        .drop_references(&[group()], &|j| format!("f{j}"))
        .is_empty());
}

/// Two categorical columns: one reference each, the design without both columns.
#[test]
fn one_reference_per_column() {
    let rows: Vec<(Vec<f64>, f64)> = (0..80)
        .map(|i| {
            let a = ((i * 29) % 13) as f64 - 6.0;
            let (k, m) = (i % 3, (i / 5) % 2);
            let mut x = vec![0.0; 6];
            x[0] = a;
            x[1 + k] = 1.0;
            x[4 + m] = 1.0;
            let y = 0.5 * a + [0.0, 1.0, -1.0][k] + 2.0 * m as f64 + ((i * 7) % 5) as f64;
            (x, y)
        })
        .collect();
    let groups = [
        group(),
        OneHotGroup {
            column: "t".into(),
            features: 4..6,
            named: 2,
        },
    ];
    let (info, out) = fit_dropping(Likelihood::Linear, &rows, &groups, true).unwrap();
    let dropped: Vec<_> = out.reference.iter().map(|r| r.feature_index - 1).collect();
    let keep: Vec<usize> = (0..6).filter(|j| !dropped.contains(j)).collect();
    assert_eq!(dropped.len(), 2);
    let without: Vec<_> = rows
        .iter()
        .map(|(x, y)| (keep.iter().map(|&j| x[j]).collect::<Vec<_>>(), *y))
        .collect();
    let (want_info, want) = fit(Likelihood::Linear, &without, 0.0).unwrap();
    let (w, b) = info.coefficients();
    for (k, &j) in keep.iter().enumerate() {
        close(w[j], want_info.coefficients().0[k], 1e-8);
        close(out.std_error[j].unwrap(), want.std_error[k].unwrap(), 1e-8);
    }
    close(b, want_info.coefficients().1, 1e-8);
    for &j in &dropped {
        assert_eq!((w[j], out.statistic[j]), (0.0, None));
    }
}

/// Pushes `rows` into a pass of a model at `weights`, `bias` (with an intercept).
fn pass_of(
    family: Likelihood,
    rows: &[(Vec<f64>, f64)],
    weights: &[f64],
    bias: f64,
) -> Information {
    let mut info = Information::try_new(family, weights, bias, true).unwrap();
    info.start_pass();
    for (x, y) in rows {
        info.push(Row::Dense(x), *y);
    }
    info
}

fn close_all(got: &[f64], want: &[f64], rel: f64) {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= rel * scale, "{g} vs {w}");
    }
}

/// The parts of a split of the rows (an empty shard among them), merged, are one pass over
/// every row; so is every part added into a pass.
#[test]
fn merged_parts_equal_one_pass() {
    for logistic in [true, false] {
        let family = if logistic {
            Likelihood::Logistic
        } else {
            Likelihood::Linear
        };
        let rows = categorical_rows(|i| [0, 1, 1, 2, 2][i % 5], logistic);
        let (weights, bias) = ([0.4, -0.2, 0.3, 0.1], 0.25);
        let whole = pass_of(family, &rows, &weights, bias).part();
        let splits = [&rows[..17], &rows[17..17], &rows[17..41], &rows[41..]];
        let parts: Vec<InformationPart> = splits
            .iter()
            .map(|s| pass_of(family, s, &weights, bias).part())
            .collect();
        let mut merged = parts[0].clone();
        for part in &parts[1..] {
            part.check(4, true).unwrap();
            merged.merge(part);
        }
        let mut added = Information::try_new(family, &weights, bias, true).unwrap();
        added.start_pass();
        for part in &parts {
            added.add_part(part);
        }
        for got in [merged, added.part()] {
            assert_eq!(got.h.len(), 15);
            close_all(&got.h, &whole.h, 1e-12);
            close_all(&got.g, &whole.g, 1e-12);
            close_all(&[got.loss], &[whole.loss], 1e-12);
            assert_eq!((got.rows, &got.counts), (whole.rows, &whole.counts));
        }
    }
}

/// The passes over shards' parts (each shard at the coordinator's coefficients) end where one
/// server's passes over every row end: the same coefficients, references and tests.
#[test]
fn newton_passes_over_parts_equal_one_server() {
    for logistic in [true, false] {
        let family = if logistic {
            Likelihood::Logistic
        } else {
            Likelihood::Linear
        };
        let rows = categorical_rows(|i| [0, 1, 1, 2, 2, 2][i % 6], logistic);
        let groups = [group()];
        let name = |j: usize| format!("f{j}");
        let start = |_: ()| Information::try_new(family, &[0.1; 4], 0.2, true).unwrap();
        let mut one = start(());
        let (one_tests, one_passes) = newton_passes(
            &mut one,
            0.0,
            (&groups, &name),
            &mut |info, _| rows.iter().for_each(|(x, y)| info.push(Row::Dense(x), *y)),
            &mut || {},
        )
        .unwrap();
        let mut coordinator = start(());
        let (tests, passes) = newton_passes(
            &mut coordinator,
            0.0,
            (&groups, &name),
            &mut |info, _| {
                let (w, b) = info.coefficients();
                let parts: Vec<InformationPart> = rows
                    .chunks(23)
                    .map(|shard| pass_of(family, shard, w, b).part())
                    .collect();
                for part in parts {
                    part.check(4, true).unwrap();
                    info.add_part(&part);
                }
            },
            &mut || {},
        )
        .unwrap();
        assert_eq!(passes, one_passes);
        assert_eq!(tests.reference, one_tests.reference);
        assert_eq!(tests.reference.len(), 1);
        let (w, b) = coordinator.coefficients();
        let (w1, b1) = one.coefficients();
        close_all(w, w1, 1e-10);
        close(b, b1, 1e-10);
        for (got, want) in tests.std_error.iter().zip(&one_tests.std_error) {
            match (got, want) {
                (Some(g), Some(w)) => close(*g, *w, 1e-10),
                (None, None) => {}
                _ => panic!("{got:?} vs {want:?}"),
            }
        }
    }
}

/// A part of another shape, with values that are not finite, a negative loss or diagonal, or
/// counts over its rows is refused before it is added.
#[test]
fn a_part_is_checked() {
    let rows = categorical_rows(|i| i % 3, true);
    let good = pass_of(Likelihood::Logistic, &rows, &[0.0; 4], 0.0).part();
    good.check(4, true).unwrap();
    assert!(good.check(3, true).is_err());
    assert!(good.check(4, false).is_err());
    let bad = |f: &dyn Fn(&mut InformationPart)| {
        let mut part = good.clone();
        f(&mut part);
        part.check(4, true).unwrap_err()
    };
    bad(&|p| p.h.pop().map(drop).unwrap());
    bad(&|p| p.g.push(0.0));
    bad(&|p| p.counts.truncate(2));
    bad(&|p| p.h[3] = f64::NAN);
    bad(&|p| p.g[0] = f64::INFINITY);
    bad(&|p| p.loss = -1.0);
    bad(&|p| p.h[2] = -1.0); // (1, 1): a diagonal value
    bad(&|p| p.counts[0] = p.rows + 1);
    assert_eq!(InformationPart::triangle(4, true), Some(15));
    assert_eq!(InformationPart::triangle(usize::MAX, true), None);
}
