//! Class labels as the table holds them (numbers or text) ↔ class indices 0..K-1, assigned in
//! order of first appearance. Used for softmax and for classifiers over a text label. (A class
//! value, as models store it, is `crate::pipeline::ClassValue`.)

use crate::pipeline::ClassValue;
use std::collections::HashMap;

#[derive(Default, Clone, Debug)]
pub struct ClassDictionary {
    by_number: HashMap<u64, u32>,
    /// The first few numeric classes (key, index), also in `by_number`: a binary label is
    /// looked up for every row, and scanning two keys costs less than hashing one.
    first_numbers: Vec<(u64, u32)>,
    by_text: HashMap<Vec<u8>, u32>,
    pub classes: Vec<ClassValue>,
    /// Evaluation: the model's classes only; a label outside them is `UNKNOWN_CLASS` and is
    /// not stored (a table of a billion distinct labels must not grow the dictionary).
    frozen: bool,
}

/// How many numeric classes are found by a scan before the map (see `first_numbers`).
const FIRST_NUMBERS: usize = 4;

/// The index of a label that is not one of a frozen dictionary's classes.
pub const UNKNOWN_CLASS: u32 = u32::MAX;

impl ClassDictionary {
    /// A dictionary of exactly a model's classes (evaluation).
    pub fn frozen(classes: &[ClassValue]) -> Self {
        let mut d = Self::with_classes(classes);
        d.frozen = true;
        d
    }

    /// A dictionary that already knows a model's classes (for evaluation).
    pub fn with_classes(classes: &[ClassValue]) -> Self {
        let mut d = ClassDictionary::default();
        for c in classes {
            match c {
                ClassValue::Number(v) => d.index_of_number(*v),
                ClassValue::Text(s) => d.index_of_text(s.as_bytes()),
            };
        }
        d
    }

    /// Index of a numeric label (-0.0 and 0.0 are one class).
    pub fn index_of_number(&mut self, v: f64) -> u32 {
        let key = if v == 0.0 {
            0.0f64.to_bits()
        } else {
            v.to_bits()
        };
        if let Some(&(_, i)) = self.first_numbers.iter().find(|&&(k, _)| k == key) {
            return i;
        }
        if self.frozen {
            return self.by_number.get(&key).copied().unwrap_or(UNKNOWN_CLASS);
        }
        let next = self.classes.len() as u32;
        *self.by_number.entry(key).or_insert_with(|| {
            self.classes.push(ClassValue::Number(v));
            if self.first_numbers.len() < FIRST_NUMBERS {
                self.first_numbers.push((key, next));
            }
            next
        })
    }

    /// Index of a text label; allocates only the first time a class is seen.
    pub fn index_of_text(&mut self, bytes: &[u8]) -> u32 {
        if let Some(&i) = self.by_text.get(bytes) {
            return i;
        }
        if self.frozen {
            return UNKNOWN_CLASS;
        }
        let i = self.classes.len() as u32;
        self.by_text.insert(bytes.to_vec(), i);
        self.classes.push(ClassValue::Text(
            String::from_utf8_lossy(bytes).into_owned(),
        ));
        i
    }

    pub fn len(&self) -> usize {
        self.classes.len()
    }
}
