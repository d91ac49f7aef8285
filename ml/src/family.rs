//! Which family each kind belongs to: the one place a kind is mapped to its [`Family`], and what
//! follows from it (the params only another family takes). The families: linear
//! (`learner/linear.rs`), network (`learner/network.rs`), factorization machine (`fm/`).
//!
//! Nothing names this module: the rest of the crate asks `kind.family()`.

use crate::fm::FmFamily;
use crate::learner::{Family, LinearFamily, NetworkFamily};
use crate::model::ModelKind;

impl ModelKind {
    /// The family that trains and stores the kind's models.
    pub fn family(self) -> &'static dyn Family {
        match self {
            ModelKind::Svm | ModelKind::Logistic | ModelKind::Linear | ModelKind::Softmax => {
                &LinearFamily
            }
            ModelKind::Mlp | ModelKind::MlpRegression => &NetworkFamily,
            ModelKind::Fm | ModelKind::FmRegression => &FmFamily,
        }
    }

    /// The keys some family takes that `kind`'s does not: (the key, the kinds that take it).
    pub fn foreign_key(self, given: &dyn Fn(&str) -> bool) -> Option<(&'static str, String)> {
        let own = self.family().own_keys();
        let key = ModelKind::ALL
            .iter()
            .flat_map(|k| k.family().own_keys())
            .find(|key| given(key) && !own.contains(key))?;
        let takers: Vec<&str> = ModelKind::ALL
            .iter()
            .filter(|k| k.family().own_keys().contains(key))
            .map(|k| k.name())
            .collect();
        let takers = match takers.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
            None => String::new(),
        };
        Some((key, takers))
    }
}

/// Every key some family owns (the params a linear model's JSON leaves out when unset).
pub fn family_keys() -> impl Iterator<Item = &'static str> {
    ModelKind::ALL
        .into_iter()
        .flat_map(|k| k.family().own_keys().iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_params_that_list_only_when_set_are_the_families_own() {
        let mut own: Vec<&str> = family_keys().collect();
        own.sort_unstable();
        own.dedup();
        let mut listed = crate::params::FAMILY_KEYS.to_vec();
        listed.sort_unstable();
        assert_eq!(own, listed);
    }
}
