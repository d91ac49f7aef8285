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
    for (got, want) in
        out.std_error
            .iter()
            .zip([0.35602780075516144, 0.42740784870636456, 0.663262520101907])
    {
        close(*got, want, 1e-9);
    }
    for (got, want) in
        out.p_value
            .iter()
            .zip([0.26917303244834956, 0.22599421406930884, 0.1362912889221159])
    {
        close(*got, want, 1e-8);
    }
    for (got, want) in
        out.ci_low
            .iter()
            .zip([-0.532142438371798, -0.575563318352792, -0.6073849932711097])
    {
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
    close(out.std_error[0], 0.8333709216311355, 1e-8);
    close(out.std_error[1], 0.8003193176869224, 1e-8);
    close(out.p_value[0], 0.09960398257276404, 1e-7);
    close(out.p_value[1], 0.5488458745962715, 1e-7);
    close(
        out.ci_high[0],
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
