//! The types every part of a pipeline shares — the config each node carries in its plan, the
//! mode, the validation split, how rows are decoded (label kinds, class values), what a pass
//! read, what a training produces, and what a shard coordinator and a shard server send each
//! other (`protocol`). They import nothing of this crate but `pg`, so every other layer can
//! depend on them. (Planning the nodes into a tree and running it is `crate::exec`'s:
//! `exec::plan`, `exec::run`.)

pub mod mark;
pub mod protocol;
pub mod protocol_parts;

use corgipile_ml::capabilities::{used, Use};
use corgipile_ml::model::ModelKind;
use corgipile_ml::params::{TrainParams, Validation};
use corgipile_ml::preprocess::{ColumnPlan, Preprocessor};
use corgipile_ml::standardize::Standardizer;
use corgipile_ml::trained::{Model, ModelParts};
use corgipile_ml::trainer::TrainConfig;

use pgrx::{pg_sys, PgSqlErrorCode};
use serde::{Deserialize, Serialize};
use std::ffi::{CStr, CString};

/// Everything the three nodes need to know, carried in each node's `custom_private` as JSON
/// so that every node is self-contained.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PipelineConfig {
    pub mode: Mode,
    pub model: ModelKind,
    /// Effective params; `seed` is always filled in.
    pub params: TrainParams,
    pub layout: FeatureLayout,
    pub label: LabelCoding,
    pub validation_split: ValidationSplit,
    /// Classes known before the scan (evaluation of a stored classifier).
    pub known_classes: Vec<ClassValue>,
    pub max_buffer_bytes: u64,
    /// corgipile.max_model_memory, in bytes.
    pub max_model_bytes: u64,
    /// Catalog name of the relation, for messages.
    pub relation: String,
    /// Column lists (`FeatureLayout::Tabular`): how the columns become features.
    pub preprocess: Option<PreprocessSpec>,
    /// A local partition of a sharded table, read through the partitioned table: BlockShuffle
    /// reads this leaf only, with the privileges and row-level security of the parent (as a
    /// SELECT on the parent reads its partitions), never the partition's own.
    #[serde(default)]
    pub leaf: Option<u32>,
    /// `"group_by"` (a training): where the group columns are in the query.
    #[serde(default)]
    pub groups: Option<GroupColumns>,
    /// `"since"`: read the pages from `pages` on, and a `replay` sample of the older blocks.
    #[serde(default)]
    pub read_from: Option<ReadFrom>,
}

/// An incremental training's share of the table (see `request::since`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ReadFrom {
    /// The first page added since the model it continues was trained.
    pub pages: u32,
    /// The fraction of the older blocks read again, a fresh sample each epoch.
    pub replay: f64,
}

/// The group columns of a training's query: its last columns, from `first` on, with their
/// types (oids).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupColumns {
    pub first: usize,
    pub types: Vec<u32>,
    /// Evaluation of a stored family: the keys of its groups' models, in the order of their
    /// numbers (a training finds its groups instead).
    #[serde(default)]
    pub known: Option<Vec<String>>,
}

/// The preprocessing of a column list.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum PreprocessSpec {
    /// Learned by the statistics pass of a training.
    Learn {
        plans: Vec<ColumnPlan>,
        max_categories: u32,
    },
    /// A stored model's (evaluation).
    Fixed(Preprocessor),
}

/// One process's part of a parallel training: of every epoch's block order, the blocks at
/// positions `rank`, `rank + processes`, … (rank 0 is the leader).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BlockShare {
    pub rank: u32,
    pub processes: u32,
}

impl BlockShare {
    pub const ALL: BlockShare = BlockShare {
        rank: 0,
        processes: 1,
    };
}

/// A training split between processes or servers, whose trainers must agree on the model's
/// shape and the labels' meaning before they start.
#[derive(Clone, Copy, PartialEq)]
pub enum Distributed {
    /// Parallel workers (`"workers"`).
    Workers,
    /// Shard servers (a table with postgres_fdw partitions).
    Shards,
}

/// What a distributed training does not do yet: an ERROR before any work (the capability
/// table's rows of workers or shards).
pub fn check_distributed(
    how: Distributed,
    kind: ModelKind,
    label: LabelCoding,
    layout: FeatureLayout,
    params: &TrainParams,
) {
    // Classes (softmax, text labels, a network's) are numbered once, by the leader's
    // statistics pass or by the coordinator from every shard's classes; validation is per
    // process; a column list's preprocessing is learned once, by the leader or merged by the
    // coordinator from every shard's statistics. The capability table says which of these
    // each refuses.
    let mut uses = used(&[
        (Use::Inference, params.inference),
        (Use::TextLabel, label == LabelCoding::ClassOfText),
        (Use::Validation, params.validation.is_some()),
        (
            Use::ValidationRelation,
            matches!(params.validation, Some(Validation::Relation(_))),
        ),
        (Use::ColumnList, layout == FeatureLayout::Tabular),
    ]);
    uses.extend(Use::of_kind(kind));
    let subject = match how {
        Distributed::Workers => Use::Workers,
        Distributed::Shards => Use::Shards,
    };
    crate::pg::error::refuse_combination(subject, &uses);
    if let FeatureLayout::Sparse {
        n_features: None, ..
    } = layout
    {
        crate::pg::error::raise(
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            match how {
                Distributed::Workers => "\"workers\" with sparse features needs \"n_features\"",
                Distributed::Shards => "a sharded table with sparse features needs \"n_features\"",
            },
            Some("Every trainer must train a model of the same width: give \"n_features\" (the largest index, plus one if index_base is 0).".into()),
        )
    }
}

/// What the SGD node does with the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Mode {
    Train,
    /// Score a stored model (corgipile_evaluate).
    Evaluate,
    /// Keep every row in memory (a validation relation).
    Collect,
    /// Record epoch 1's visiting order (corgipile_trace).
    Trace,
}

/// Which rows are held out of training for per-epoch validation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum ValidationSplit {
    None,
    /// A boolean query column (a validation predicate).
    Column(usize),
    /// A fixed fraction of rows, chosen by a hash of the ctid.
    Fraction(f64),
}

/// A row of a scan: its leaf table (0 for the scanned relation itself) and its tuple id, as
/// the validation split sees it (`decode::tid_fraction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RowId {
    leaf: u32,
    tid: u64,
}

impl RowId {
    pub fn of(tid: &pg_sys::ItemPointerData, table: Option<pg_sys::Oid>) -> RowId {
        let block = (u64::from(tid.ip_blkid.bi_hi) << 16) | u64::from(tid.ip_blkid.bi_lo);
        RowId {
            leaf: table.map_or(0, |t| t.to_u32()),
            tid: (block << 16) | u64::from(tid.ip_posid),
        }
    }
}

/// The rows a training held out and scored its model on, by [`RowId`] (sorted, each once): a
/// deploy gate (`"deploy": "if_better"`) scores the deployed version on exactly these.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeldOutRows(Vec<RowId>);

impl HeldOutRows {
    pub fn new(mut rows: Vec<RowId>) -> HeldOutRows {
        rows.sort_unstable();
        rows.dedup();
        HeldOutRows(rows)
    }

    pub fn contains(&self, row: RowId) -> bool {
        self.0.binary_search(&row).is_ok()
    }

    /// These rows and `other`'s (a sharded training's rounds each hold out a share).
    pub fn union(self, other: HeldOutRows) -> HeldOutRows {
        let mut rows = self.0;
        rows.extend(other.0);
        HeldOutRows::new(rows)
    }

    /// The memory the ids take.
    pub fn bytes(&self) -> usize {
        self.0.capacity() * std::mem::size_of::<RowId>()
    }
}

impl PipelineConfig {
    pub fn seed(&self) -> u64 {
        self.params.seed.unwrap_or(0)
    }

    /// A stored preprocessing the training encodes with (a warm start's column list; on a
    /// sharded table round 0 sends it every shard); None when the rows give it (or there is
    /// none).
    pub fn fixed_preprocessing(&self) -> Option<&Preprocessor> {
        match &self.preprocess {
            Some(PreprocessSpec::Fixed(p)) => Some(p),
            _ => None,
        }
    }

    /// A one-element List holding this config as a String node.
    /// The List is palloc'd in the current memory context.
    pub fn to_list(&self) -> *mut pg_sys::List {
        let json = CString::new(serde_json::to_string(self).expect("config serializes"))
            .expect("config JSON has no NUL");
        // SAFETY: FFI calls on the backend thread (planner or query memory context current);
        // pstrdup copies the NUL-terminated JSON, which outlives the call, into that context,
        // and lappend takes the String node just made.
        unsafe {
            let node = pg_sys::makeString(pg_sys::pstrdup(json.as_ptr()));
            pg_sys::lappend(std::ptr::null_mut(), node.cast())
        }
    }

    /// Reads back what `to_list` stored.
    ///
    /// # Safety
    /// `list` is null or a List made by `to_list` (a String node first), still allocated: a
    /// node's `custom_private`, read while its plan lives.
    pub unsafe fn from_list(list: *mut pg_sys::List) -> PipelineConfig {
        // SAFETY: only our own nodes are passed here, and they always carry a one-element
        // list whose element is a String node made by `to_list`.
        assert!(
            !list.is_null() && (*list).length >= 1,
            "corgipile node lost its config"
        );
        let json = CStr::from_ptr(crate::pg::compat::string_node_chars(
            (*(*list).elements).ptr_value,
        ))
        .to_str()
        .expect("config is UTF-8");
        serde_json::from_str(json).expect("config JSON round-trips")
    }
}

/// How the node decodes the features of a row.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum FeatureLayout {
    /// Column 1 is a float8[]/float4[]. `columns` = built from a column list: a NULL element
    /// means a NULL column, and the row is skipped rather than rejected.
    Dense { columns: bool },
    /// Columns 1 and 2 are int4[] indices and float8[]/float4[] values.
    Sparse {
        index_base: i64,
        n_features: Option<u32>,
    },
    /// Columns 1..=n are a column list's columns (float8, text or float8[] each, as the
    /// preprocessing says), encoded into sparse rows.
    Tabular,
}

/// How the label column is stored; decided once from the column type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LabelKind {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
}

impl LabelKind {
    /// Label column types we read directly. `numeric` is cast to float8 in the query instead.
    pub fn from_type(oid: pg_sys::Oid) -> Option<LabelKind> {
        Some(match oid {
            pg_sys::BOOLOID => LabelKind::Bool,
            pg_sys::INT2OID => LabelKind::Int2,
            pg_sys::INT4OID => LabelKind::Int4,
            pg_sys::INT8OID => LabelKind::Int8,
            pg_sys::FLOAT4OID => LabelKind::Float4,
            pg_sys::FLOAT8OID | pg_sys::NUMERICOID => LabelKind::Float8,
            _ => return None,
        })
    }

    /// The value of `datum`, a non-NULL value of the type this kind was derived from. Every
    /// such type is passed by value (a 64-bit build): only the datum's bits are read, so
    /// another datum gives a wrong number, never undefined behaviour.
    pub fn to_f64(self, datum: pg_sys::Datum) -> f64 {
        match self {
            LabelKind::Bool => (datum.value() & 0xff != 0) as u8 as f64,
            LabelKind::Int2 => datum.value() as i16 as f64,
            LabelKind::Int4 => datum.value() as i32 as f64,
            LabelKind::Int8 => datum.value() as i64 as f64,
            LabelKind::Float4 => f32::from_bits(datum.value() as u32) as f64,
            LabelKind::Float8 => f64::from_bits(datum.value() as u64),
        }
    }
}

/// How the node turns the label datum into the f64 the trainer sees.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum LabelCoding {
    /// The numeric value itself (binary classes by value, regression targets).
    Value(LabelKind),
    /// A class index, by the numeric value (softmax over numbers).
    ClassOfValue(LabelKind),
    /// A class index, by the text (any classifier over a text label).
    ClassOfText,
}

impl LabelCoding {
    pub fn uses_classes(self) -> bool {
        !matches!(self, LabelCoding::Value(_))
    }

    /// A boolean label column (its classes are named false / true).
    pub fn is_boolean(self) -> bool {
        matches!(
            self,
            LabelCoding::Value(LabelKind::Bool) | LabelCoding::ClassOfValue(LabelKind::Bool)
        )
    }

    /// A label value as class_weight and messages name it: a boolean false / true, as
    /// predictions say it; a number as itself.
    pub fn value_text(self, v: f64) -> String {
        match self {
            LabelCoding::Value(LabelKind::Bool) => (if v != 0.0 { "true" } else { "false" }).into(),
            _ => v.to_string(),
        }
    }
}

/// One class label value as stored with the model (a JSON number or string).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClassValue {
    Number(f64),
    Text(String),
}

impl ClassValue {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            ClassValue::Number(v) => Some(*v),
            ClassValue::Text(_) => None,
        }
    }
    pub fn to_text(&self) -> String {
        match self {
            ClassValue::Number(v) => format!("{v}"),
            ClassValue::Text(s) => s.clone(),
        }
    }
    /// The class as predictions name it: a boolean label's 0 / 1 as false / true.
    pub fn name(&self, boolean_label: bool) -> String {
        match self {
            ClassValue::Number(v) if boolean_label => {
                (if *v != 0.0 { "true" } else { "false" }).to_owned()
            }
            c => c.to_text(),
        }
    }
}

/// What the epoch's pass has read so far (in the workers' shared memory too: `repr(C)`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EpochCounts {
    /// Distinct training rows read (mrs hands SGD more tuples than that).
    pub rows: u64,
    /// Rows skipped (a NULL label or features).
    pub rows_skipped: u64,
    /// The wrapping sum of a hash of every counted row's tuple id (trained or skipped): the
    /// same whatever order the blocks and processes read the rows in, and, all but surely,
    /// different when a pass read as many rows as another but not the same ones (a filter
    /// that calls random() keeps about as many rows every pass).
    pub tids: u64,
}

impl EpochCounts {
    /// Every process's part of one pass, together.
    pub fn add(self, other: EpochCounts) -> EpochCounts {
        EpochCounts {
            rows: self.rows + other.rows,
            rows_skipped: self.rows_skipped + other.rows_skipped,
            tids: self.tids.wrapping_add(other.tids),
        }
    }

    /// Whether two passes read the same rows (as far as their counts tell).
    pub fn same_rows(&self, other: &EpochCounts) -> bool {
        self.rows + self.rows_skipped == other.rows + other.rows_skipped && self.tids == other.tids
    }
}

/// Per-epoch metrics on the held-out validation rows.
pub use corgipile_ml::scoring::ValidationStats;

pub use corgipile_ml::trainer::EpochRecord;

/// One configuration of a training (the only one, unless it searched): its searched values,
/// its params, its seconds of arithmetic (the scan is shared) and what it produced, or why it
/// was set aside (it diverged while others went on).
pub struct Trial {
    pub configuration: serde_json::Map<String, serde_json::Value>,
    pub params: TrainParams,
    pub seconds: f64,
    pub outcome: Result<TrainOutcome, corgipile_ml::trainer::TrainError>,
    /// The epochs it trained, when it was set aside (an outcome holds its own).
    pub epochs_before_failing: Vec<EpochRecord>,
    /// With "folds": each fold's model's score on the rows it held out (None: set aside).
    pub cv: Vec<Option<corgipile_ml::scoring::ValidationStats>>,
    /// Per-group models: the group's key and its rows counted by the statistics pass (None:
    /// the model of every row).
    pub group: Option<(String, u64)>,
    /// Per-group models, on the model of every row: the groups too small for a model of their
    /// own, and their rows.
    pub small_groups: Option<(u64, u64)>,
}

/// What a finished training produced; the caller stores it in the catalog.
pub struct TrainOutcome {
    /// In original feature units (a standardizer, if any, is folded in).
    pub model: Model,
    /// Classifiers: label values by class index (binary: [negative, positive]).
    pub classes: Vec<ClassValue>,
    /// Shared by the configurations of a search, as the preprocessing (their size follows the
    /// table's features: one copy, never one per configuration).
    pub standardizer: Option<std::rc::Rc<serde_json::Value>>,
    /// Column lists: the preprocessing (statistics, categories) predictions apply.
    pub preprocessing: Option<std::rc::Rc<Preprocessor>>,
    pub epochs: Vec<EpochRecord>,
    pub rows_trained: u64,
    pub rows_skipped: u64,
    pub seconds: f64,
    /// The statistics pass before the epochs, if there was one.
    pub statistics_seconds: Option<f64>,
    /// With "patience": the epoch whose model this is (the lowest validation loss).
    pub best_epoch: Option<u32>,
    /// Column lists: the profile of this model's predictions after training, written into its
    /// preprocessing's profile when stored (a search's models share one preprocessing).
    pub predictions: Option<corgipile_ml::preprocess::profile::ColumnProfile>,
    /// `"inference"`: the tests of every coefficient (`metrics->'inference'`).
    pub inference: Option<serde_json::Value>,
}

/// At most this many distinct groups: the statistics pass keeps every group's key (a sharded
/// training's coordinator, every shard's).
pub const MAX_GROUPS: usize = 100_000;
/// At most this many bytes in a group's key.
pub const MAX_KEY_BYTES: usize = 1000;
/// At most this many bytes in all the keys together (each is kept twice: in the list of
/// groups and in the map from key to group).
pub const MAX_KEYS_BYTES: usize = 16 << 20;

/// What the statistics pass found: the groups that get a model (key and rows, in the order of
/// their numbers), and how many groups and rows are left to the model of every row. Sent to
/// parallel workers, whose decoders number the same keys alike.
#[derive(Clone, Serialize, Deserialize)]
pub struct GroupsFound {
    pub kept: Vec<(String, u64)>,
    pub small: u64,
    pub small_rows: u64,
}

/// The data-dependent parts of the trainer's configuration, learned by a statistics pass (the
/// leader's, or the coordinator's from every shard's) and given to every parallel worker or
/// shard, so that they all train alike.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct LearnedStatistics {
    pub standardizer: Option<Standardizer>,
    pub class_weights: Option<Vec<f64>>,
    pub label_values: Option<(f64, f64)>,
    /// Networks: the label's mean and variance (a regression's target standardization) and
    /// the classes in the leader's numbering (the output layer's units).
    #[serde(default)]
    pub label_moments: Option<(f64, f64)>,
    #[serde(default)]
    pub classes: Option<Vec<ClassValue>>,
    /// Per-group models: the groups the leader's statistics pass found (every process trains
    /// a model for each, numbered alike).
    #[serde(default)]
    pub groups: Option<GroupsFound>,
    /// The leader's statistics pass read every row, so it holds every held-out validation row:
    /// the workers score none (their shares' would count twice).
    #[serde(default)]
    pub leader_holds_validation: bool,
    /// `"warm_start"`: the model every learner starts from, on the table's units (each
    /// learner unfolds it into the training's).
    #[serde(default)]
    pub warm_start: Option<ModelParts>,
}

impl LearnedStatistics {
    pub fn of(config: &TrainConfig) -> LearnedStatistics {
        LearnedStatistics {
            standardizer: config.standardizer.clone(),
            class_weights: config.class_weights.clone(),
            label_values: config.label_values,
            label_moments: None,
            classes: None,
            groups: None,
            leader_holds_validation: false,
            warm_start: None,
        }
    }

    pub fn apply(self, config: &mut TrainConfig) {
        config.standardizer = self.standardizer;
        config.class_weights = self.class_weights;
        config.label_values = self.label_values;
    }
}
