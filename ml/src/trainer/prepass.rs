//! What the statistics pass before training settles, the same for one process, parallel
//! workers and the shards of a table: the features' scaling, and for classifiers the two label
//! values of a binary model and the class weights asked for.

use crate::model::ModelKind;
use crate::params::{ClassWeight, ParamError};
use crate::standardize::Standardizer;
use crate::stats::FeatureStats;

/// The scaling `normalize` asks for: sparse rows are scaled by max |value| and never centered
/// (zeros stay zeros); dense rows standardized, centered only with an intercept (which
/// centering would otherwise bring back).
pub fn normalizing_scaler(stats: &FeatureStats, sparse: bool, fit_intercept: bool) -> Standardizer {
    if sparse {
        stats.max_abs_scaler()
    } else {
        stats.standardizer(fit_intercept)
    }
}

/// Why a classifier's labels cannot be settled.
#[derive(Clone, Debug, PartialEq)]
pub enum LabelsError {
    /// A binary kind over a label column of another number of distinct values.
    NotTwoClasses { found: usize },
    /// The class_weight param does not fit the labels.
    ClassWeight(ParamError),
}

/// A classifier's labels as the statistics pass found them.
#[derive(Clone, Debug, PartialEq)]
pub struct SettledLabels {
    /// Binary kinds: the label values mapped to -1 and +1 (the smaller is -1).
    pub label_values: Option<(f64, f64)>,
    /// Per class (binary: [negative, positive]; one output per class: by class index).
    pub class_weights: Option<Vec<f64>>,
}

/// Settles a classifier's labels from `counts` ((trainer label, rows), ascending: label values,
/// or class indices) and the class_weight param; `label_text` shows a trainer label as the
/// table holds it (how class_weight names it).
pub fn settle_labels(
    kind: ModelKind,
    counts: &[(f64, u64)],
    class_weight: Option<&ClassWeight>,
    label_text: &dyn Fn(f64) -> String,
) -> Result<SettledLabels, LabelsError> {
    let binary = kind.is_binary();
    if binary && counts.len() != 2 {
        return Err(LabelsError::NotTwoClasses {
            found: counts.len(),
        });
    }
    let label_values = binary.then(|| (counts[0].0, counts[1].0));
    let Some(class_weight) = class_weight else {
        return Ok(SettledLabels {
            label_values,
            class_weights: None,
        });
    };
    // Weights by class position: binary [negative, positive]; by class index otherwise.
    let k = if binary {
        2
    } else {
        counts.iter().map(|c| c.0 as usize + 1).max().unwrap_or(0)
    };
    let mut rows = vec![0u64; k];
    for (position, (label, count)) in counts.iter().enumerate() {
        rows[if binary { position } else { *label as usize }] = *count;
    }
    let labels: Vec<String> = (0..k)
        .map(|position| {
            let trainer_label = if binary {
                counts[position].0
            } else {
                position as f64
            };
            label_text(trainer_label)
        })
        .collect();
    let weights = class_weight
        .resolve(&labels, &rows)
        .map_err(LabelsError::ClassWeight)?;
    Ok(SettledLabels {
        label_values,
        class_weights: Some(weights),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: f64) -> String {
        format!("{v}")
    }

    #[test]
    fn binary_labels_map_the_smaller_value_to_negative() {
        let counts = [(-1.0, 30), (4.0, 10)];
        let s = settle_labels(ModelKind::Svm, &counts, None, &text).unwrap();
        assert_eq!(s.label_values, Some((-1.0, 4.0)));
        assert_eq!(s.class_weights, None);
        let balanced = settle_labels(
            ModelKind::Logistic,
            &counts,
            Some(&ClassWeight::Balanced),
            &text,
        )
        .unwrap();
        assert_eq!(balanced.class_weights, Some(vec![40.0 / 60.0, 40.0 / 20.0]));
    }

    #[test]
    fn binary_needs_two_classes() {
        let counts = [(0.0, 3), (1.0, 3), (2.0, 3)];
        assert_eq!(
            settle_labels(ModelKind::Svm, &counts, None, &text),
            Err(LabelsError::NotTwoClasses { found: 3 })
        );
    }

    #[test]
    fn class_outputs_weigh_by_class_index_and_name_classes_by_their_labels() {
        // Class 1 never occurs: it keeps weight 1 (balanced) and its row count 0.
        let counts = [(0.0, 20), (2.0, 5)];
        let named = |v: f64| ["a", "b", "c"][v as usize].to_string();
        let map = ClassWeight::Map([("c".to_string(), 3.0)].into_iter().collect());
        let s = settle_labels(ModelKind::Softmax, &counts, Some(&map), &named).unwrap();
        assert_eq!(s.label_values, None);
        assert_eq!(s.class_weights, Some(vec![1.0, 1.0, 3.0]));
        let unknown = ClassWeight::Map([("z".to_string(), 3.0)].into_iter().collect());
        assert!(matches!(
            settle_labels(ModelKind::Softmax, &counts, Some(&unknown), &named),
            Err(LabelsError::ClassWeight(_))
        ));
    }
}
