//! Classes over shards: one numbering of every shard's classes (a sharded training's label
//! numbered by class), and the checks of a class list another server sent.

use super::MAX_CLASS_TEXT;
use crate::pipeline::ClassValue;

/// The order a sharded training numbers classes in: numbers ascending, texts by their bytes
/// (a label column holds one or the other).
fn class_order(a: &ClassValue, b: &ClassValue) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (ClassValue::Number(x), ClassValue::Number(y)) => x.total_cmp(y),
        (ClassValue::Text(x), ClassValue::Text(y)) => x.as_bytes().cmp(y.as_bytes()),
        (ClassValue::Number(_), ClassValue::Text(_)) => Ordering::Less,
        (ClassValue::Text(_), ClassValue::Number(_)) => Ordering::Greater,
    }
}

/// -0.0 and 0.0 are one class (as `ClassDictionary` has them).
fn normalized(c: &ClassValue) -> ClassValue {
    match c {
        ClassValue::Number(v) if *v == 0.0 => ClassValue::Number(0.0),
        other => other.clone(),
    }
}

/// The classes of every shard (each list in its shard's numbering) as one numbering: every
/// class of any shard, once, in [`class_order`]. The same lists give the same numbering
/// whatever the shards' order.
pub fn merge_classes<'a>(lists: impl IntoIterator<Item = &'a [ClassValue]>) -> Vec<ClassValue> {
    let mut all: Vec<ClassValue> = lists.into_iter().flatten().map(normalized).collect();
    all.sort_by(class_order);
    all.dedup_by(|a, b| class_order(a, b).is_eq());
    all
}

/// Where `class` is in `merged` (a [`merge_classes`] numbering).
pub fn merged_index(merged: &[ClassValue], class: &ClassValue) -> Option<usize> {
    merged
        .binary_search_by(|c| class_order(c, &normalized(class)))
        .ok()
}

/// Why a class list (from another server) cannot number classes: more than MAX_CLASSES, a
/// number that is not finite, a text longer than MAX_CLASS_TEXT, numbers and texts mixed, a
/// class twice.
pub fn check_classes(classes: &[ClassValue]) -> Result<(), String> {
    if classes.len() > corgipile_ml::trainer::MAX_CLASSES {
        return Err(format!("{} classes", classes.len()));
    }
    for c in classes {
        match c {
            ClassValue::Number(v) if !v.is_finite() => {
                return Err("a class that is not a finite number".into())
            }
            ClassValue::Text(t) if t.len() > MAX_CLASS_TEXT => {
                return Err(format!("a class name of {} bytes", t.len()))
            }
            _ => {}
        }
    }
    let texts = classes
        .iter()
        .filter(|c| matches!(c, ClassValue::Text(_)))
        .count();
    if texts != 0 && texts != classes.len() {
        return Err("classes of numbers and of texts mixed".into());
    }
    if merge_classes([classes]).len() != classes.len() {
        return Err("a class listed twice".into());
    }
    Ok(())
}

pub(super) fn class_list<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Vec<ClassValue>, D::Error> {
    corgipile_ml::wire::seq_at_most(d, corgipile_ml::trainer::MAX_CLASSES)
}
