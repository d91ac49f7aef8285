//! Server settings. All are superuser-only, so an ordinary role cannot raise its own limit.

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Upper bound, in kB, on the tuple-buffer memory of one training (both buffers together when
/// double-buffered).
pub static MAX_BUFFER_MEMORY_KB: GucSetting<i32> = GucSetting::<i32>::new(512 * 1024);

/// Upper bound, in kB, on the memory of one model while it trains (see
/// `corgipile_ml::limits::model_memory_bytes` for what is counted).
pub static MAX_MODEL_MEMORY_KB: GucSetting<i32> = GucSetting::<i32>::new(512 * 1024);

/// Upper bound, in kB, on one exported model (corgipile_export_sql's text, corgipile_export_onnx's
/// bytes).
pub static MAX_EXPORT_SIZE_KB: GucSetting<i32> = GucSetting::<i32>::new(64 * 1024);

pub fn register() {
    GucRegistry::define_int_guc(
        c"corgipile.max_buffer_memory",
        c"Maximum memory for the tuple buffers of one corgipile training.",
        c"An explicit buffer_size above this is an error; the default buffer_size is clamped to it.",
        &MAX_BUFFER_MEMORY_KB,
        64,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"corgipile.max_model_memory",
        c"Maximum memory for the model of one corgipile training.",
        c"A model whose features x classes would need more (n_features, the largest sparse index, the number of softmax classes) is an error before it is allocated.",
        &MAX_MODEL_MEMORY_KB,
        64,
        i32::MAX,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
    GucRegistry::define_int_guc(
        c"corgipile.max_export_size",
        c"Maximum size of one model exported by corgipile_export_sql (its text) or corgipile_export_onnx (its bytes).",
        c"An export that would be larger (estimated from the model's parameters and categories before it is built) is an error.",
        &MAX_EXPORT_SIZE_KB,
        1,
        1024 * 1024,
        GucContext::Suset,
        GucFlags::UNIT_KB,
    );
}

pub fn max_buffer_bytes() -> u64 {
    MAX_BUFFER_MEMORY_KB.get().max(0) as u64 * 1024
}

pub fn max_export_bytes() -> u64 {
    MAX_EXPORT_SIZE_KB.get().max(0) as u64 * 1024
}

pub fn max_model_bytes() -> u64 {
    MAX_MODEL_MEMORY_KB.get().max(0) as u64 * 1024
}

/// The most a shard's request or reply may take to parse: four times corgipile.max_model_memory
/// (it carries one model, or the statistics of its features: four numbers a feature, where
/// the model counts 72 bytes a feature; see `corgipile_ml::wire` for what parsing is charged).
pub fn max_wire_bytes() -> u64 {
    max_model_bytes().saturating_mul(4)
}

/// The share of corgipile.max_model_memory of each model a training holds: every process (the
/// leader and each of its `workers`) holds its own copy, and a search one model per
/// configuration (`models`); the setting bounds the training, whatever its processes.
pub fn model_bytes_for(workers: u32, models: usize) -> u64 {
    max_model_bytes() / (u64::from(workers) + 1) / (models.max(1) as u64)
}

/// A model's training size against `limit_bytes` and the catalog's bound (ERROR 54000 with what
/// to do), before any of it is allocated.
pub fn check_training_size(size: &corgipile_ml::learner::TrainingSize, limit_bytes: u64) {
    use corgipile_ml::limits::{pretty_pair, MAX_STORED_WEIGHTS};
    use pgrx::PgSqlErrorCode;
    if size.bytes > limit_bytes {
        let needed = pretty_pair(size.bytes, limit_bytes).0;
        let what = limit_text(size.bytes, limit_bytes);
        crate::pg::error::raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("{} needs {needed} of memory to train (parameters, optimizer state and a batch's activations), more than {what}", size.what),
            Some(format!("{}, a smaller \"batch_size\", fewer features, fewer \"workers\" or \"search\" configurations, or ask a superuser to raise corgipile.max_model_memory.", size.hint)),
        );
    }
    if size.n_params > MAX_STORED_WEIGHTS {
        crate::pg::error::raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "{} has {} weights; corgipile can store at most {MAX_STORED_WEIGHTS}",
                size.what, size.n_params
            ),
            Some(format!(
                "A float8[] in corgipile.models holds at most 1 GB. {}.",
                size.hint
            )),
        );
    }
}

/// How many models of `bytes` the whole setting (`total`) holds.
fn total_fit(bytes: u64, total: u64) -> String {
    match total / bytes.max(1) {
        0 => "not even one such model fits".to_string(),
        1 => "one such model fits".to_string(),
        n => format!("{n} such models fit"),
    }
}

/// What a training of `bytes` exceeds: corgipile.max_model_memory, or (`limit` below it) a
/// parallel training's share of it, total / (workers + 1) rounded down.
fn limit_text(bytes: u64, limit: u64) -> String {
    use corgipile_ml::limits::pretty_pair;
    let total = max_model_bytes();
    let copies = total / limit.max(1);
    if copies >= 2 {
        let fit = total_fit(bytes, total);
        let (share, total) = pretty_pair(limit, total);
        format!("its share of corgipile.max_model_memory ({share} of {total}: the training holds {copies} models, one per process and search configuration; {fit})")
    } else {
        format!(
            "corgipile.max_model_memory ({})",
            pretty_pair(bytes, limit).1
        )
    }
}

/// [`check_model_size`] for a model whose kept categories (their names and lookup entries,
/// `dictionary_bytes`) count against the same limit: the ERROR names both parts and the limit
/// itself, not what the dictionaries left of it.
pub fn check_model_and_dictionaries(
    n_features: u64,
    n_outputs: u64,
    dictionary_bytes: u64,
    limit_bytes: u64,
    source: &str,
) {
    use corgipile_ml::limits::{model_memory_bytes, pretty_bytes};
    let model = model_memory_bytes(n_features, n_outputs);
    if dictionary_bytes > 0 && model.saturating_add(dictionary_bytes) > limit_bytes {
        let together = model.saturating_add(dictionary_bytes);
        crate::pg::error::raise(
            pgrx::PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!(
                "a model of {n_features} features ({source}) needs {} of memory to train and its category dictionaries {}, together {}, more than {}",
                pretty_bytes(model),
                pretty_bytes(dictionary_bytes),
                pretty_bytes(together),
                limit_text(together, limit_bytes)
            ),
            Some("Use a smaller \"max_categories\", hash the columns of many distinct values (\"encode\": \"hash\"), or ask a superuser to raise corgipile.max_model_memory.".into()),
        );
    }
    check_model_size(
        n_features,
        n_outputs,
        limit_bytes.saturating_sub(dictionary_bytes),
        source,
    );
}

pub fn check_model_size(n_features: u64, n_outputs: u64, limit_bytes: u64, source: &str) {
    use corgipile_ml::limits::{check_model_size, pretty_pair, ModelSizeError, MAX_STORED_WEIGHTS};
    use pgrx::PgSqlErrorCode;
    let shape = if n_outputs > 1 {
        format!("{n_features} features x {n_outputs} classes")
    } else {
        format!("{n_features} features")
    };
    match check_model_size(n_features, n_outputs, limit_bytes) {
        Ok(()) => {}
        Err(ModelSizeError::Memory { bytes, limit }) => {
            let what = limit_text(bytes, limit);
            let bytes = pretty_pair(bytes, limit).0;
            crate::pg::error::raise(
                PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
                format!("a model of {shape} ({source}) needs {bytes} of memory to train, more than {what}"),
                Some("Use fewer features (a smaller n_features, smaller sparse indices) or fewer classes, fewer \"workers\" or \"search\" configurations, or ask a superuser to raise corgipile.max_model_memory.".into()),
            )
        }
        Err(ModelSizeError::Weights { weights }) => crate::pg::error::raise(
            PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            format!("a model of {shape} ({source}) has {weights} weights; corgipile can store at most {MAX_STORED_WEIGHTS} (whatever corgipile.max_model_memory allows)"),
            Some("A float8[] in corgipile.models holds at most 1 GB. Use fewer features or fewer classes.".into()),
        ),
    }
}
