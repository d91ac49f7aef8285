//! Every output of the three users of the running mean/variance (feature statistics,
//! preprocessing statistics, regression metrics), pinned bit for bit: digests of the outputs
//! computed before the three copies became one [`corgipile_ml::moments::Welford`]. A change of
//! one bit of one mean, variance or JSON number changes a digest.

use corgipile_ml::hash::fnv1a;
use corgipile_ml::metrics::RegressionMetrics;
use corgipile_ml::preprocess::{ColumnPlan, Source, StatsBuilder};
use corgipile_ml::row::Row;
use corgipile_ml::stats::FeatureStats;

/// Seeded values of mixed magnitudes (splitmix64 → uniform → spread over decades).
struct Values(u64);

impl Values {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        corgipile_ml::hash::splitmix64_mix(self.0)
    }
    fn value(&mut self) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let scale = [1e-3, 1.0, 7.0, 1e3, 1e6][(self.next_u64() % 5) as usize];
        let offset = [0.0, 5.0, -1e4][(self.next_u64() % 3) as usize];
        offset + scale * (u - 0.3)
    }
}

#[derive(Default)]
struct Digest(Vec<u8>);

impl Digest {
    fn f(&mut self, v: f64) {
        self.0.extend(v.to_bits().to_le_bytes());
    }
    fn fs(&mut self, v: &[f64]) {
        v.iter().for_each(|&x| self.f(x));
    }
    fn text(&mut self, s: &str) {
        self.0.extend(s.as_bytes());
    }
    fn finish(&self) -> u64 {
        fnv1a(self.0.iter().copied())
    }
}

fn stats_digest(stats: &FeatureStats, d: &mut Digest) {
    d.fs(&stats.means());
    d.fs(&stats.variances());
    let (m, v) = stats.label_mean_variance();
    d.fs(&[m, v]);
    for center in [true, false] {
        let s = stats.standardizer(center);
        d.fs(&s.mean);
        d.fs(&s.scale);
    }
    d.fs(&stats.max_abs_scaler().scale);
    // The class counts travel as a map in hash order: digested sorted, apart from the rest.
    let mut json = serde_json::to_value(stats).unwrap();
    json.as_object_mut().unwrap().remove("classes");
    d.text(&json.to_string());
    for (value, count) in stats.class_counts() {
        d.fs(&[value, count as f64]);
    }
}

#[test]
fn feature_statistics_are_pinned() {
    let mut rng = Values(1);
    let mut d = Digest::default();
    // Dense: one pass, and three parts merged (through JSON) in two orders.
    let rows: Vec<(Vec<f64>, f64)> = (0..3_000)
        .map(|i| ((0..5).map(|_| rng.value()).collect(), (i % 3) as f64))
        .collect();
    let pass = |rows: &[(Vec<f64>, f64)]| {
        let mut s = FeatureStats::new(5, true);
        for (x, y) in rows {
            s.push(Row::Dense(x), *y);
        }
        s
    };
    stats_digest(&pass(&rows), &mut d);
    let parts = [
        pass(&rows[..1_111]),
        pass(&rows[1_111..1_112]),
        pass(&rows[1_112..]),
    ];
    for order in [[0, 1, 2], [2, 0, 1]] {
        let mut merged = FeatureStats::new(0, true);
        for i in order {
            let json = serde_json::to_string(&parts[i]).unwrap();
            merged.merge(&serde_json::from_str(&json).unwrap());
        }
        stats_digest(&merged, &mut d);
    }
    // Sparse: implicit zeros.
    let sparse: Vec<(Vec<u32>, Vec<f64>, f64)> = (0..2_000)
        .map(|_| {
            let idx: Vec<u32> = (0..40u32)
                .filter(|_| rng.next_u64().is_multiple_of(7))
                .collect();
            let val = idx.iter().map(|_| rng.value()).collect();
            (idx, val, rng.value())
        })
        .collect();
    let pass = |rows: &[(Vec<u32>, Vec<f64>, f64)]| {
        let mut s = FeatureStats::new(0, false);
        for (idx, val, y) in rows {
            s.push(
                Row::Sparse {
                    indices: idx,
                    values: val,
                },
                *y,
            );
        }
        s
    };
    stats_digest(&pass(&sparse), &mut d);
    let mut merged = pass(&sparse[..700]);
    merged.merge(&pass(&sparse[700..]));
    stats_digest(&merged, &mut d);
    assert_eq!(
        d.finish(),
        7872586100168578240,
        "feature statistics changed"
    );
}

#[test]
fn preprocessing_statistics_are_pinned() {
    let mut rng = Values(2);
    let plans = vec![
        ColumnPlan::resolve("a", Source::Number, None, true).unwrap(),
        ColumnPlan::resolve("v", Source::NumberArray, None, true).unwrap(),
        ColumnPlan::resolve("b", Source::Number, None, false).unwrap(),
    ];
    let mut s = StatsBuilder::new(plans, 1 << 20, 1 << 20).unwrap();
    for i in 0..4_000 {
        s.begin_row();
        s.number(0, (i % 11 != 0).then(|| rng.value())).unwrap();
        let arr: Vec<f64> = (0..4).map(|_| rng.value()).collect();
        s.array(1, (i % 13 != 0).then_some(&arr[..])).unwrap();
        s.number(2, Some(rng.value())).unwrap();
    }
    let p = s.finish(10).unwrap();
    let mut d = Digest::default();
    d.text(&p.to_json().to_string());
    let st = p.standardizer();
    d.fs(&st.mean);
    d.fs(&st.scale);
    // Empty and single-value columns.
    let plans = vec![ColumnPlan::resolve("e", Source::Number, None, true).unwrap()];
    let empty = StatsBuilder::new(plans.clone(), 1 << 20, 1 << 20).unwrap();
    d.text(&empty.finish(10).unwrap().to_json().to_string());
    let mut one = StatsBuilder::new(plans, 1 << 20, 1 << 20).unwrap();
    one.begin_row();
    one.number(0, Some(3.25)).unwrap();
    d.text(&one.finish(10).unwrap().to_json().to_string());
    assert_eq!(
        d.finish(),
        18301756332931392746,
        "preprocessing statistics changed"
    );
}

#[test]
fn regression_metrics_are_pinned() {
    let mut rng = Values(3);
    let rows: Vec<(f64, f64)> = (0..5_000)
        .map(|_| {
            let a = rng.value();
            (a + rng.value() * 1e-2, a)
        })
        .collect();
    let pass = |rows: &[(f64, f64)]| {
        let mut m = RegressionMetrics::new();
        for &(p, a) in rows {
            m.push(p, a);
        }
        m
    };
    let mut d = Digest::default();
    let report = |m: RegressionMetrics, d: &mut Digest| {
        d.text(&serde_json::to_string(&m).unwrap());
        let r = m.finish();
        d.fs(&[r.mse, r.rmse, r.mae, r.r2, r.n as f64]);
    };
    report(pass(&rows), &mut d);
    let parts = [pass(&rows[..2_345]), pass(&[]), pass(&rows[2_345..])];
    for order in [[0, 1, 2], [1, 2, 0], [2, 1, 0]] {
        let mut merged = RegressionMetrics::new();
        for i in order {
            let json = serde_json::to_string(&parts[i]).unwrap();
            merged.merge(&serde_json::from_str(&json).unwrap());
        }
        report(merged, &mut d);
    }
    assert_eq!(
        d.finish(),
        7962347110983250394,
        "regression metrics changed"
    );
}
