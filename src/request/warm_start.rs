//! `"warm_start"`: a training that continues from a stored model's parameters instead of
//! zeros. The stored model must be of the same kind and read the same features (a column list
//! keeps its stored preprocessing: the same encoded features), and a network or factorization
//! machine has the same layers and activation, or factors; its classes are the training's
//! known classes, so class indices and the binary label mapping stay the model's. Its
//! parameters are in the table's units: each learner unfolds them into its own standardized
//! rows and target (`Learn::start_from`), so the first step starts from the stored function.
//!
//! Here a warm start is loaded for a request and checked against it; the type, and what the
//! training takes from the stored model, is `crate::catalog::warm_start`'s.

use crate::catalog::grants::{may_manage, model_name, model_owner, quote_owner};
use crate::catalog::warm_start::WarmStart;
use crate::catalog::{caller, load_model_ref, ModelRef};
use crate::pg::error::raise;
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::search::configuration_kind;
use corgipile_ml::params::{ModelKey, TrainParams};
use pgrx::PgSqlErrorCode;

fn refuse(code: PgSqlErrorCode, message: String, hint: &str) -> ! {
    raise(code, message, Some(hint.into()))
}

/// The name a training continuing model `id` (one the caller may use) makes the next version
/// of when its params give none: the model's name, of the model's owner. Another role's name
/// (a model used through a grant) is written `owner.name`, and needs `manage` on it as
/// `"name": "owner.name"` would: else ERROR 42501 before any work, never a version of the
/// caller's own name of the same text (another, unrelated family, which the caller's
/// predictions by that name would then use). None for a model without a name.
fn continued_name(id: i64, param: &str) -> Option<String> {
    let (owner, name) = model_owner(id)?;
    let name = name?;
    if owner == caller().1 {
        return Some(name);
    }
    let qualified = format!("{}.{name}", quote_owner(&owner));
    let grant = format!(
        "corgipile_grant({}, {}, 'manage')",
        pgrx::spi::quote_literal(&name),
        pgrx::spi::quote_literal(&caller().1)
    );
    let hint = format!(
        "Give \"name\" to store the continued model as a version of a name of your own, e.g. {{\"{param}\": {id}, \"name\": \"my_{name}\"}}; or ask role {owner} for \"manage\" on its name: {grant}."
    );
    if !may_manage(&owner, Some(&name), None) {
        refuse(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!(
                "permission denied to train a new version of model \"{qualified}\": \"{param}\" continues model {id}, a version of role {owner}'s name \"{name}\""
            ),
            &hint,
        );
    }
    // The text must name the owner's name: a name of the caller's own spelled "owner.name"
    // would take it.
    let resolved = model_name(&qualified);
    if resolved.owner != owner || resolved.name != name {
        refuse(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!(
                "\"{param}\": model {id} is a version of role {owner}'s name \"{name}\", and a model of yours is named \"{qualified}\""
            ),
            &hint,
        );
    }
    Some(qualified)
}

impl WarmStart {
    /// Loads the model `key` names (one the caller may use) for a training of `kind`, and fills
    /// in what the training takes from it unless the params say otherwise: its features and
    /// label columns, a sparse model's dimension, and its name (the result is its next
    /// version, of its owner: see [`continued_name`]).
    pub fn load(key: &ModelKey, kind: ModelKind, params: &mut serde_json::Value) -> WarmStart {
        let stored = load_model_ref(match key {
            ModelKey::Id(id) => ModelRef::Id(*id),
            ModelKey::Name(name) => ModelRef::Name(name),
        });
        let id = stored.id;
        if stored.kind() != kind {
            refuse(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("\"warm_start\": model {id} is a {} model, not {}", stored.kind().name(), kind.name()),
                "A warm start continues a model of the same kind: train with its kind, or start from zeros.",
            );
        }
        if stored.groups.is_some() {
            refuse(
                PgSqlErrorCode::ERRCODE_FEATURE_NOT_SUPPORTED,
                format!("\"warm_start\": model {id} has a model per group"),
                "Warm-start from one group's model (its id in corgipile.group_models) or from a model without groups.",
            );
        }
        let map = params
            .as_object_mut()
            .expect("params were checked to be an object");
        map.entry("features")
            .or_insert_with(|| stored.features.clone());
        map.entry("label")
            .or_insert_with(|| serde_json::json!(stored.label_column));
        // A network's layers and activation, a factorization machine's factors: the stored
        // model's unless the params ask for others (then refused, see `check_shape`).
        for (key, value) in kind.family().shape_params(&stored.model) {
            map.entry(key).or_insert(value);
        }
        if stored.features.get("indices").is_some() {
            map.entry("n_features")
                .or_insert_with(|| serde_json::json!(stored.n_features()));
            map.entry("index_base")
                .or_insert_with(|| serde_json::json!(stored.index_base));
        }
        // "since" continues its model as a warm start (unless "warm_start" names another).
        let param = if map.contains_key("warm_start") {
            "warm_start"
        } else {
            "since"
        };
        if !map.contains_key("name") {
            if let Some(name) = continued_name(id, param) {
                map.insert("name".into(), serde_json::json!(name));
            }
        }
        // Stored as the id it started from, whatever named it.
        map.insert("warm_start".into(), serde_json::json!(id));
        WarmStart { stored }
    }

    /// The training (every configuration of a search) trains a model of the stored model's
    /// kind and shape: its layers and activation, or its factors (see
    /// `ModelKind::shape_mismatch`), else an ERROR naming both, before any row is read.
    pub fn check_shape(&self, kind: ModelKind, params: &TrainParams) {
        // A search's configurations that are not params are the parse's ERROR, raised there.
        let Ok(configurations) = params.configurations(kind) else {
            return;
        };
        let id = self.stored.id;
        for (configuration, p) in &configurations {
            let own = configuration_kind(configuration, kind);
            let Some((key, asked, stored)) = own.shape_mismatch(p, &self.stored.model) else {
                continue;
            };
            let which = if configuration.is_empty() {
                "this training asks for".to_owned()
            } else {
                format!(
                    "the search's configuration {} asks for",
                    serde_json::Value::Object(configuration.clone())
                )
            };
            refuse(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("\"warm_start\": model {id} has \"{key}\" {stored}, {which} {asked}"),
                &format!("A warm start continues a model of the same shape: leave \"{key}\" out to take the model's, or train without \"warm_start\" to start from scratch."),
            );
        }
    }

    /// The training reads the same features as the stored model (`features`: as the catalog
    /// stores them), else an ERROR naming both.
    pub fn check_features(&self, features: &serde_json::Value) {
        if *features != self.stored.features {
            refuse(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!(
                    "\"warm_start\": model {} reads the features {}, this training reads {}",
                    self.stored.id, self.stored.features, features
                ),
                "A warm start continues a model on the same features: leave \"features\" out to read the model's.",
            );
        }
    }

    /// A warm start whose model does not fit the rows of `relation` (another width, or
    /// classes it never saw): `n_features` and `classes` are the rows'.
    pub fn raise_misfit(&self, relation: &str, n_features: usize, classes: usize) -> ! {
        let stored = &self.stored;
        refuse(
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            format!(
                "\"warm_start\": model {} has {} features and {} outputs; the rows of {relation} give {n_features} features and the classes {classes}",
                stored.id,
                stored.n_features(),
                corgipile_ml::model::Predictor::n_outputs(&stored.model),
            ),
            "A warm start continues a model on rows of the same shape: the same feature width and no class the model never saw.",
        )
    }
}
