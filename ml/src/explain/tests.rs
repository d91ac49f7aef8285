use super::*;
use crate::model::Head;
use crate::model::{LinearModel, ModelKind};
use crate::network::{Activation, Network, NetworkModel};
use crate::preprocess::{ColumnOptions, ColumnPlan, Encode, EncodedRow, Source, StatsBuilder};

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
}

/// A small deterministic pseudo-random sequence in [-2, 2).
fn values(seed: u64, n: usize) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
        })
        .collect()
}

fn network(sizes: &[usize], activation: Activation, seed: u64) -> Model {
    let head = Head::SOFTMAX;
    let net = Network::new(sizes, activation, head, seed).unwrap();
    Model::new(NetworkModel::new(ModelKind::Mlp, net))
}

#[test]
fn a_linear_models_shares_are_its_weights_times_the_distance_from_the_baseline() {
    let m = Model::new(LinearModel {
        kind: ModelKind::Softmax,
        n_features: 3,
        n_outputs: 2,
        weights: vec![0.5, -1.0, 2.0, 3.0, 0.25, -0.5],
        bias: vec![0.1, -0.2],
    });
    let (x, x0) = ([1.0, 2.0, -3.0], [0.5, 0.0, 1.0]);
    let a = attribute(&m, &x, &x0, 1).unwrap();
    assert_eq!(a.per_feature, vec![3.0 * 0.5, 0.25 * 2.0, -0.5 * -4.0]);
    assert!(close(a.value, 3.0 + 0.5 + 1.5 - 0.2, 1e-15));
    assert!(close(a.baseline, 1.5 - 0.5 - 0.2, 1e-15));
    assert!(a.residual.abs() < 1e-12);
}

#[test]
fn relu_networks_are_integrated_exactly_piece_by_piece() {
    for seed in 1..6 {
        let m = network(&[6, 16, 8, 3], Activation::Relu, seed);
        let (x, x0) = (values(seed, 6), values(seed + 100, 6));
        for k in 0..3 {
            let a = attribute(&m, &x, &x0, k).unwrap();
            let span = (a.value - a.baseline).abs().max(1e-3);
            assert!(a.residual.abs() <= 1e-10 * span, "seed {seed}: {a:?}");
            // Against a fine midpoint Riemann sum of the gradient (finite differences).
            let nm = &m;
            let steps = 500;
            let mut riemann = [0.0; 6];
            for s in 0..steps {
                let t = (s as f64 + 0.5) / steps as f64;
                for i in 0..6 {
                    let h = 1e-6;
                    let at = |d: f64| {
                        let p: Vec<f64> = (0..6)
                            .map(|j| x0[j] + t * (x[j] - x0[j]) + if j == i { d } else { 0.0 })
                            .collect();
                        let mut out = Vec::new();
                        nm.scores(Row::Dense(&p), &mut out);
                        out[k]
                    };
                    riemann[i] += (at(h) - at(-h)) / (2.0 * h) * (x[i] - x0[i]) / steps as f64;
                }
            }
            for (r, c) in riemann.iter().zip(&a.per_feature) {
                assert!(
                    (r - c).abs() < 1e-2 * (1.0 + span),
                    "seed {seed}: {r} vs {c}"
                );
            }
        }
    }
}

#[test]
fn tanh_networks_meet_the_sum_rule_by_quadrature() {
    for seed in 1..10 {
        let m = network(&[5, 12, 12, 4], Activation::Tanh, seed);
        let (x, x0) = (values(seed, 5), values(seed + 7, 5));
        let a = attribute(&m, &x, &x0, 2).unwrap();
        let span = (a.value - a.baseline).abs().max(1e-3);
        assert!(a.residual.abs() <= 1e-9 * span, "seed {seed}: {a:?}");
    }
}

#[test]
fn a_feature_at_its_baseline_gets_nothing() {
    for activation in [Activation::Relu, Activation::Tanh] {
        let m = network(&[4, 8, 2], activation, 3);
        let x0 = values(5, 4);
        let mut x = values(6, 4);
        x[2] = x0[2];
        let a = attribute(&m, &x, &x0, 0).unwrap();
        assert_eq!(a.per_feature[2], 0.0);
        let same = attribute(&m, &x0, &x0, 1).unwrap();
        assert!(same.per_feature.iter().all(|&c| c == 0.0));
        assert_eq!(same.value, same.baseline);
    }
}

fn plan(name: &str, source: Source, options: Option<ColumnOptions>) -> ColumnPlan {
    ColumnPlan::resolve(name, source, options.as_ref(), true).unwrap()
}

/// income (number), state (one-hot, 2 kept + other + null), url (hashed), xy (array).
fn preprocessor() -> Preprocessor {
    let hashed = ColumnOptions {
        encode: Some(Encode::Hash),
        buckets: Some(8),
        ..Default::default()
    };
    let plans = vec![
        plan("income", Source::Number, None),
        plan("state", Source::Text, None),
        plan("url", Source::Text, Some(hashed)),
        plan("xy", Source::NumberArray, None),
    ];
    let mut s = StatsBuilder::new(plans, 1 << 20, 1000).unwrap();
    type R<'a> = (Option<f64>, Option<&'a str>, &'a str, [f64; 2]);
    let rows: [R; 5] = [
        (Some(10.0), Some("KS"), "a", [1.0, 2.0]),
        (Some(20.0), Some("KS"), "b", [3.0, 2.0]),
        (None, Some("NY"), "c", [5.0, 2.0]),
        (Some(30.0), None, "d", [7.0, 2.0]),
        (Some(40.0), Some("CA"), "e", [9.0, 2.0]),
    ];
    for (income, state, url, xy) in rows {
        s.begin_row();
        s.number(0, income).unwrap();
        s.text(1, state.map(str::as_bytes)).unwrap();
        s.text(2, Some(url.as_bytes())).unwrap();
        s.array(3, Some(&xy)).unwrap();
    }
    s.finish(2).unwrap()
}

fn encode(
    p: &Preprocessor,
    income: Option<f64>,
    state: Option<&str>,
    url: Option<&str>,
) -> Vec<f64> {
    let mut row = EncodedRow::default();
    p.number(0, income, &mut row).unwrap();
    p.text(1, state.map(str::as_bytes), &mut row);
    p.text(2, url.map(str::as_bytes), &mut row);
    p.array(3, Some(&[4.0, 2.0]), &mut row).unwrap();
    let sparse = Row::Sparse {
        indices: &row.indices,
        values: &row.values,
    };
    densify(sparse, p.n_features).unwrap()
}

#[test]
fn the_baseline_is_the_means_and_the_most_frequent_categories() {
    let p = preprocessor();
    let x0 = baseline(&p).unwrap();
    // income 25 (the mean of the non-NULL values); state=KS; (other), (null) off; no bucket;
    // xy at its means.
    let mut expected = vec![0.0; p.n_features];
    expected[0] = 25.0;
    expected[1] = 1.0;
    let xy = p.columns[3].offset;
    expected[xy] = 5.0;
    expected[xy + 1] = 2.0;
    assert_eq!(x0, expected);
    let names: Vec<_> = by_column(&p, &x0, &vec![0.0; p.n_features])
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.value))
        .collect();
    assert_eq!(
        names,
        [
            ("income", "25"),
            ("state", "KS"),
            ("url", "(null)"),
            ("xy", "{5,2}")
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
}

#[test]
fn columns_sum_their_features_and_say_what_the_model_read() {
    let p = preprocessor();
    let x0 = baseline(&p).unwrap();
    let n = p.n_features;
    let m = Model::new(LinearModel::single(
        ModelKind::Logistic,
        (0..n).map(|j| j as f64 * 0.5 - 1.0).collect(),
        0.3,
    ));
    // NULL income (imputed by the mean), an unseen state (pooled into (other)).
    let x = encode(&p, None, Some("TX"), Some("zz"));
    let a = attribute(&m, &x, &x0, 0).unwrap();
    let cols = by_column(&p, &x, &a.per_feature).unwrap();
    let total: f64 = cols.iter().map(|c| c.contribution).sum();
    assert!(close(total, a.value - a.baseline, 1e-12));
    assert_eq!(cols[0].value, "25");
    assert_eq!(cols[0].contribution, 0.0);
    assert_eq!(cols[1].value, "(other)");
    let w = |j: usize| j as f64 * 0.5 - 1.0;
    let off = p.columns[1].offset;
    assert!(close(cols[1].contribution, w(off + 2) - w(off), 1e-15));
    assert!(cols[2].value.starts_with('#'));
    assert_eq!(cols[3].value, "{4,2}");
    // A NULL state is its (null) category.
    let x = encode(&p, Some(12.0), None, None);
    let cols = by_column(&p, &x, &attribute(&m, &x, &x0, 0).unwrap().per_feature).unwrap();
    assert_eq!(
        (cols[0].value.as_str(), cols[1].value.as_str()),
        ("12", "(null)")
    );
    assert_eq!(
        (cols[2].value.as_str(), cols[2].contribution),
        ("(null)", 0.0)
    );
}

#[test]
fn ranking_keeps_the_top_and_sums_the_rest() {
    let mut v = by_feature(&[1.0, 2.0, 3.0, 4.0], &[0.5, -3.0, 0.5, 1.0], |j| {
        format!("f[{}]", j + 1)
    })
    .unwrap();
    rank(&mut v, None);
    let names: Vec<_> = v.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["f[2]", "f[4]", "f[1]", "f[3]"]);
    rank(&mut v, Some(2));
    assert_eq!(v.len(), 3);
    assert_eq!(
        (v[2].name.as_str(), v[2].value.as_str(), v[2].contribution),
        (REST, "2 more", 1.0)
    );
    let mut all = v.clone();
    rank(&mut all, Some(10));
    assert_eq!(all.len(), 3);
}
