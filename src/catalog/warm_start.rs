//! `"warm_start"`: the stored model a training continues from, and what the training takes from
//! it — its classes, a binary model's label values, its model (which each learner unfolds into
//! the training's units).
//! Loading one for a request and checking it against the request (`WarmStart::load`,
//! `WarmStart::check_features`) is `crate::request::warm_start`'s.

use crate::catalog::StoredModel;
use crate::pipeline::{ClassValue, LabelCoding};
use corgipile_ml::trained::Model;
use std::rc::Rc;

/// The stored model a training continues from.
#[derive(Clone)]
pub struct WarmStart {
    pub stored: Rc<StoredModel>,
}

impl WarmStart {
    /// The classes the rows are decoded into: the stored model's.
    pub fn classes(&self) -> Vec<ClassValue> {
        self.stored.classes.clone()
    }

    /// Binary kinds: the trainer labels of the stored model's negative and positive classes
    /// (fixed before the first row, so that no provisional mapping flips the weights).
    pub fn label_values(&self, coding: LabelCoding) -> Option<(f64, f64)> {
        if !self.stored.kind().is_binary() || self.stored.classes.len() != 2 {
            return None;
        }
        match coding {
            LabelCoding::ClassOfText => Some((0.0, 1.0)),
            _ => Some((
                self.stored.classes[0].as_f64()?,
                self.stored.classes[1].as_f64()?,
            )),
        }
    }

    /// The model every learner starts from, on the table's units (each learner unfolds it into
    /// its own standardized rows and target: `Learn::start_from`).
    pub fn model(&self) -> &Model {
        &self.stored.model
    }
}
