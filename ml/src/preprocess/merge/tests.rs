use super::*;
use crate::preprocess::{
    ColumnOptions, ColumnPlan, Encode, Encoding, Preprocessor, Source, TimeKind,
};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn plan(name: &str, source: Source, options: Option<ColumnOptions>) -> ColumnPlan {
    ColumnPlan::resolve(name, source, options.as_ref(), true).unwrap()
}

fn options(encode: Encode) -> Option<ColumnOptions> {
    Some(ColumnOptions {
        encode: Some(encode),
        ..Default::default()
    })
}

/// income (number, NULLs), city (one-hot), url (hashed), xy (array), day (date), score (ple,
/// continuous), stars (ple, 5 values).
fn plans() -> Vec<ColumnPlan> {
    vec![
        plan("income", Source::Number, None),
        plan("city", Source::Text, None),
        plan("url", Source::Text, options(Encode::Hash)),
        plan("xy", Source::NumberArray, None),
        plan("day", Source::Time(TimeKind::Date), None),
        plan("score", Source::Number, options(Encode::Ple)),
        plan("stars", Source::Number, options(Encode::Ple)),
    ]
}

struct Row {
    income: Option<f64>,
    city: Option<String>,
    url: String,
    xy: [f64; 2],
    day: f64,
    score: f64,
    stars: f64,
}

/// Rows whose mix changes along the table (sharded by range, each shard holds another mix);
/// "Zurich" is in the last fifth only.
fn rows(n: usize) -> Vec<Row> {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    (0..n)
        .map(|i| {
            let at = i as f64 / n as f64;
            let u = uniform(&mut rng);
            let city = match (u * 10.0) as u32 {
                0 => None,
                1..=3 => Some("Bern"),
                4 if at > 0.5 => Some("Geneva"),
                4..=6 => Some("Basel"),
                _ if at > 0.8 => Some("Zurich"),
                _ => Some("Lugano"),
            };
            Row {
                income: (uniform(&mut rng) > 0.1).then(|| 1000.0 * at + 50.0 * uniform(&mut rng)),
                city: city.map(str::to_owned),
                url: format!("u{}", rng.next_u64() % 50),
                xy: [uniform(&mut rng), at],
                day: (19_000.0 + (365.0 * at).floor()) * 86_400.0,
                score: (uniform(&mut rng) + at).powi(3),
                stars: (rng.next_u64() % 5) as f64,
            }
        })
        .collect()
}

fn builder(limit: usize) -> StatsBuilder {
    StatsBuilder::new(plans(), limit, 10_000).unwrap()
}

fn feed(s: &mut StatsBuilder, rows: &[Row]) {
    for r in rows {
        s.begin_row();
        s.number(0, r.income).unwrap();
        s.text(1, r.city.as_deref().map(str::as_bytes)).unwrap();
        s.text(2, Some(r.url.as_bytes())).unwrap();
        s.array(3, Some(&r.xy)).unwrap();
        s.time(4, Some(r.day)).unwrap();
        s.number(5, Some(r.score)).unwrap();
        s.number(6, Some(r.stars)).unwrap();
    }
}

/// Each shard's part, sent as JSON, merged in order into a builder that read no rows.
fn merged(shards: &[&[Row]], limit: usize) -> Result<StatsBuilder, MergeError> {
    let mut all = builder(limit);
    for rows in shards {
        let mut s = builder(limit);
        feed(&mut s, rows);
        let sent = serde_json::to_string(&s.part().unwrap()).unwrap();
        all.merge(&serde_json::from_str(&sent).unwrap())?;
    }
    Ok(all)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1.0)
}

/// Fraction of `sorted` below `v`.
fn rank(sorted: &[f64], v: f64) -> f64 {
    sorted.partition_point(|&s| s < v) as f64 / sorted.len() as f64
}

fn one_pass(rows: &[Row], max_categories: usize) -> Preprocessor {
    let mut s = builder(1 << 24);
    feed(&mut s, rows);
    s.finish(max_categories).unwrap()
}

#[test]
fn merged_parts_give_the_preprocessing_of_one_pass() {
    let rows = rows(20_000);
    let one = one_pass(&rows, 4);
    let (a, rest) = rows.split_at(3_000);
    let (b, c) = rest.split_at(12_000);
    let sharded = merged(&[a, b, c], 1 << 24).unwrap().finish(4).unwrap();
    assert_eq!(sharded.n_features, one.n_features);
    assert_eq!(sharded.rows, one.rows);
    let mut scores: Vec<f64> = rows.iter().map(|r| r.score).collect();
    scores.sort_by(f64::total_cmp);
    for (s, o) in sharded.columns.iter().zip(&one.columns) {
        assert_eq!((&s.name, s.offset, s.scaled), (&o.name, o.offset, o.scaled));
        match (&s.encoding, &o.encoding) {
            (
                Encoding::Number { fill, mean, std },
                Encoding::Number {
                    fill: f,
                    mean: m,
                    std: d,
                },
            )
            | (
                Encoding::Time {
                    fill, mean, std, ..
                },
                Encoding::Time {
                    fill: f,
                    mean: m,
                    std: d,
                    ..
                },
            ) => assert!(
                close(*fill, *f) && close(*mean, *m) && close(*std, *d),
                "{}",
                s.name
            ),
            (
                Encoding::Array { mean, std, fill },
                Encoding::Array {
                    mean: m,
                    std: d,
                    fill: f,
                },
            ) => {
                for k in 0..2 {
                    assert!(close(mean[k], m[k]) && close(std[k], d[k]) && close(fill[k], f[k]));
                }
            }
            (
                Encoding::Ple { edges, mean, .. },
                Encoding::Ple {
                    edges: e, mean: m, ..
                },
            ) => {
                assert!(close(*mean, *m));
                if s.name == "stars" {
                    // Five values: they are the edges, exactly.
                    assert_eq!(edges, &[0.0, 1.0, 2.0, 3.0, 4.0]);
                    assert_eq!(edges, e);
                } else {
                    assert_eq!(edges.len(), e.len());
                    assert_eq!((edges[0], edges[16]), (e[0], e[16]));
                    for (x, y) in edges.iter().zip(e) {
                        let error = (rank(&scores, *x) - rank(&scores, *y)).abs();
                        assert!(error < 0.01, "edge {x} vs {y}: rank error {error}");
                    }
                }
            }
            (s, o) => assert_eq!(s, o),
        }
    }
    // The kept categories (compared above): by rows over every shard, "Zurich" (on the last
    // shard only) among them, "Geneva" (rarer) pooled.
    let Encoding::OneHot {
        categories,
        other,
        null,
    } = &sharded.columns[1].encoding
    else {
        panic!()
    };
    assert!(categories.iter().any(|c| c == "Zurich"));
    assert!(!categories.iter().any(|c| c == "Geneva"));
    assert!(*other && *null);
    // Merged in another order: the same categories, the same moments up to rounding.
    let reversed = merged(&[c, b, a], 1 << 24).unwrap().finish(4).unwrap();
    assert_eq!(reversed.columns[1], sharded.columns[1]);
}

#[test]
fn categories_are_kept_by_summed_counts_ties_by_bytes() {
    let mut shards = Vec::new();
    for texts in [
        &["b", "a", "a", "a"][..],
        &["c", "b", "b", "c", "c", "d"][..],
    ] {
        let mut s = StatsBuilder::new(vec![plan("t", Source::Text, None)], 1 << 20, 10).unwrap();
        for t in texts {
            s.begin_row();
            s.text(0, Some(t.as_bytes())).unwrap();
        }
        shards.push(s.part().unwrap());
    }
    let mut all = StatsBuilder::new(vec![plan("t", Source::Text, None)], 1 << 20, 10).unwrap();
    for p in &shards {
        all.merge(p).unwrap();
    }
    // a, b and c have 3 rows each, d one: ties by their bytes, d pooled.
    assert_eq!(
        all.finish(3).unwrap().columns[0].encoding,
        Encoding::OneHot {
            categories: vec!["a".into(), "b".into(), "c".into()],
            other: true,
            null: false
        }
    );
}

#[test]
fn the_merged_dictionary_is_bounded_as_one_pass() {
    let rows = rows(2_000);
    // Three cities in the first half, four in the last tenth, five in both.
    let (a, b) = (&rows[..1_000], &rows[1_700..]);
    let limit = 2 * super::super::quantiles::SKETCH_BYTES + 4 * (6 + CATEGORY_OVERHEAD);
    let mut one = builder(limit);
    let failed = a.iter().chain(b).find_map(|r| {
        one.begin_row();
        one.text(1, r.city.as_deref().map(str::as_bytes)).err()
    });
    assert!(matches!(
        failed,
        Some(PreprocessError::TooManyCategories { .. })
    ));
    // Each shard's cities fit; their union does not, as on one server.
    assert!(matches!(
        merged(&[a, b], limit).err(),
        Some(MergeError::Limit(PreprocessError::TooManyCategories { ref column, distinct: 4 })) if column == "city"
    ));
}

#[test]
fn sketches_of_sampled_shards_weigh_their_values() {
    // 400,000 values (the sketch keeps a sample: its stride doubles after 131,072) and
    // 40,000 values of another range: each shard's centroids weigh its values.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let big: Vec<f64> = (0..400_000).map(|_| uniform(&mut rng)).collect();
    let small: Vec<f64> = (0..40_000).map(|_| 1.0 + uniform(&mut rng)).collect();
    let plans = vec![plan("x", Source::Number, options(Encode::Ple))];
    let mut all = StatsBuilder::new(plans.clone(), 1 << 20, 10).unwrap();
    for values in [&big, &small] {
        let mut s = StatsBuilder::new(plans.clone(), 1 << 20, 10).unwrap();
        for &v in values.iter() {
            s.begin_row();
            s.number(0, Some(v)).unwrap();
        }
        all.merge(&s.part().unwrap()).unwrap();
    }
    let Encoding::Ple { edges, .. } = &all.finish(10).unwrap().columns[0].encoding else {
        panic!()
    };
    let mut sorted: Vec<f64> = big.iter().chain(&small).copied().collect();
    sorted.sort_by(f64::total_cmp);
    for (t, e) in edges.iter().enumerate() {
        let error = (rank(&sorted, *e) - t as f64 / 16.0).abs();
        assert!(error < 0.01, "edge {t} at {e}: rank error {error}");
    }
}

/// A valid part of the mixed plans, to damage.
fn part() -> StatsPart {
    let rows = rows(500);
    let mut s = builder(1 << 24);
    feed(&mut s, &rows);
    s.part().unwrap()
}

fn refused(damage: impl FnOnce(&mut StatsPart)) -> String {
    let mut p = part();
    damage(&mut p);
    match builder(1 << 24).merge(&p) {
        Err(MergeError::Invalid(why)) => why,
        other => panic!("merged: {other:?}"),
    }
}

fn categories(p: &mut StatsPart) -> Vec<(Category, u64)> {
    match &mut p.columns[1] {
        ColumnPart::Categories { counts, .. } => std::mem::take(counts),
        _ => unreachable!(),
    }
}

fn refused_sketch(damage: fn(&mut SketchPart)) -> String {
    refused(|p| match &mut p.columns[5] {
        ColumnPart::Ple { sketch, .. } => damage(sketch),
        _ => unreachable!(),
    })
}

#[test]
fn parts_no_statistics_pass_gives_are_refused() {
    assert!(builder(1 << 24).merge(&part()).is_ok());
    assert!(refused(|p| {
        p.columns.pop();
    })
    .contains("6 feature columns, where the training has 7"));
    assert!(refused(|p| p.columns.swap(0, 4)).contains("another kind"));
    assert!(refused(|p| p.rows += 1).contains("rows"));
    assert!(refused(|p| p.rows = u64::MAX).contains("rows"));
    // A category twice, counted 0 times, counts that do not add up to the rows.
    assert!(refused(|p| {
        let mut c = categories(p);
        c.insert(1, c[0].clone());
        p.columns[1] = ColumnPart::Categories {
            counts: c,
            nulls: 0,
        };
    })
    .contains("one twice"));
    assert!(refused(|p| {
        let mut c = categories(p);
        c.push((Category::Text("zzz".into()), 0));
        p.columns[1] = ColumnPart::Categories {
            counts: c,
            nulls: 0,
        };
    })
    .contains("no rows"));
    assert!(refused(|p| {
        let c = categories(p);
        p.columns[1] = ColumnPart::Categories {
            counts: c,
            nulls: 10_000,
        };
    })
    .contains("counted in"));
    assert!(refused(|p| {
        let mut c = categories(p);
        c[0].1 = u64::MAX;
        p.columns[1] = ColumnPart::Categories {
            counts: c,
            nulls: 0,
        };
    })
    .contains("2^64"));
    // Moments of more values than rows, not finite, a negative M2.
    for moments in [
        Welford::from_parts(501, 1.0, 1.0),
        Welford::from_parts(5, f64::NAN, 1.0),
        Welford::from_parts(5, 1.0, -1.0),
        Welford::from_parts(0, 1.0, 0.0),
    ] {
        assert!(refused(|p| p.columns[0] = ColumnPart::Number { moments })
            .contains("impossible moments"));
    }
    // Arrays wider than a model may be, elements counted in other numbers of rows.
    assert!(refused(|p| {
        p.columns[3] = ColumnPart::Array {
            moments: Some(vec![Welford::default(); 10_001]),
        }
    })
    .contains("10001 elements"));
    assert!(refused(|p| {
        p.columns[3] = ColumnPart::Array {
            moments: Some(vec![Welford::from_parts(3, 0.0, 0.0), Welford::default()]),
        }
    })
    .contains("other numbers"));
    // Sketches: of other values than the moments, unsorted centroids, centroids that weigh
    // other than the values or lie outside the range, no range, exact values beyond bins + 1.
    assert!(refused_sketch(|s| s.values += 1).contains("other values"));
    for damage in [
        (|s: &mut SketchPart| s.centroids.reverse()) as fn(&mut SketchPart),
        |s| s.centroids[0][1] *= 2.0,
        |s| s.centroids[0][0] = s.range.unwrap()[0] - 1.0,
        |s| s.centroids[0][1] = -s.centroids[0][1],
        |s| s.range = Some([2.0, 1.0]),
    ] {
        assert!(refused_sketch(damage).contains("quantile sketch"));
    }
    assert!(refused_sketch(|s| s.range = None).contains("without their range"));
    assert!(refused(|p| match &mut p.columns[6] {
        ColumnPart::Ple { sketch, .. } => sketch.exact = Some((0..40).map(f64::from).collect()),
        _ => unreachable!(),
    })
    .contains("exact values"));
}

#[test]
fn forged_sketches_beyond_their_bounds_do_not_parse() {
    let mut p = serde_json::to_value(part()).unwrap();
    let centroids = &mut p["columns"][5]["sketch"]["centroids"];
    let one = centroids[0].clone();
    *centroids = serde_json::Value::Array(vec![one; 201]);
    let parsed: Result<StatsPart, _> = serde_json::from_value(p);
    assert!(parsed
        .unwrap_err()
        .to_string()
        .contains("more than 200 elements"));
}

#[test]
fn categories_of_other_encodings_keep_their_bytes() {
    let latin1 = [b'Z', 0xFC, b'r', b'i', b'c', b'h'];
    let mut s = StatsBuilder::new(vec![plan("t", Source::Text, None)], 1 << 20, 10).unwrap();
    for t in [&latin1[..], b"Zurich"] {
        s.begin_row();
        s.text(0, Some(t)).unwrap();
    }
    let sent = serde_json::to_string(&s.part().unwrap()).unwrap();
    let mut all = StatsBuilder::new(vec![plan("t", Source::Text, None)], 1 << 20, 10).unwrap();
    all.merge(&serde_json::from_str(&sent).unwrap()).unwrap();
    let Encoding::OneHot { categories, .. } = &all.finish(10).unwrap().columns[0].encoding else {
        panic!()
    };
    assert_eq!(categories.len(), 2);
}

#[test]
fn moments_that_overflow_when_merged_are_found() {
    let plans = vec![plan("income", Source::Number, None)];
    let mut all = StatsBuilder::new(plans.clone(), 1 << 20, 10).unwrap();
    for v in [-1.7e308, 1.7e308] {
        let mut s = StatsBuilder::new(plans.clone(), 1 << 20, 10).unwrap();
        s.begin_row();
        s.number(0, Some(v)).unwrap();
        let p = s.part().unwrap();
        all.merge(&p).unwrap();
    }
    assert_eq!(all.finish(10).unwrap().not_finite_column(), Some("income"));
    assert_eq!(
        one_pass(&rows(100), 4).not_finite_column(),
        None,
        "finite statistics"
    );
}
