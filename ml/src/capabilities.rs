//! What combines with what, in one place: every combination of where a training runs, what it
//! is asked for and what it reads that corgipile refuses (not yet built, or not right), with
//! the ERROR's message and what to do instead. Every check reads this table (an ERROR 0A000
//! before any work), and the reference page's table is generated from it (see
//! [`reference_table`]; a unit test keeps docs/reference.md in step).

use crate::model::ModelKind;

/// Something a training (or a function over a stored model) uses: where it runs, a param, what
/// it reads or trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// `"workers"`: parallel workers.
    Workers,
    /// A partitioned table with postgres_fdw partitions.
    Shards,
    Search,
    Folds,
    GroupBy,
    /// `"validation"` of any form.
    Validation,
    /// `"validation": {"relation": ...}`.
    ValidationRelation,
    /// `"tolerance"` above 0.
    Tolerance,
    WarmStart,
    Since,
    Inference,
    /// `"shuffle"`: `"sliding_window"` or `"mrs"`.
    StreamingShuffle,
    /// A sparse pair of index and value arrays.
    SparseFeatures,
    /// A list of feature columns, or `"*"`.
    ColumnList,
    /// A text (or boolean, date) label of a classifier.
    TextLabel,
    /// The linear kind with one output per class: `softmax`.
    Softmax,
    /// A kind sized by the statistics pass (its outputs are the classes that pass numbered):
    /// a network (`mlp`, `mlp_regression`) or a factorization machine (`fm`, `fm_regression`).
    Network,
    /// `"deploy": "if_better"`: the new version and the deployed one scored on exactly the
    /// rows the training held out.
    Gate,
    /// A view over the table it is asked with: on one server, read through its base table's
    /// pages (a projection and a filter of one table); on shards, a training rewrites a view of
    /// the table's own columns and a `WHERE` into the table's terms (see `Use::name`).
    View,
    /// A `"search"` whose configurations differ in `"model"`.
    SearchedModel,
    /// A `"search"` whose configurations differ in `"class_weight"`.
    SearchedClassWeight,
    /// `"group_by"` of a network or factorization machine (`Use::Network`).
    GroupedNetwork,
}

impl Use {
    /// How the reference page names it.
    pub fn name(self) -> &'static str {
        match self {
            Use::Workers => "`\"workers\"`",
            Use::Shards => "a sharded table",
            Use::Search => "`\"search\"`",
            Use::Folds => "`\"folds\"`",
            Use::GroupBy => "`\"group_by\"`",
            Use::Validation => "`\"validation\"`",
            Use::ValidationRelation => "a validation relation",
            Use::Tolerance => "`\"tolerance\"`",
            Use::WarmStart => "`\"warm_start\"`",
            Use::Since => "`\"since\"`",
            Use::Inference => "`\"inference\"`",
            Use::StreamingShuffle => "`\"shuffle\"`: `\"sliding_window\"`, `\"mrs\"`",
            Use::SparseFeatures => "sparse features",
            Use::ColumnList => "a list of feature columns",
            Use::TextLabel => "a text label",
            Use::Softmax => "`softmax`",
            Use::Network => "`mlp`, `mlp_regression`, `fm`, `fm_regression`",
            Use::Gate => "`\"deploy\": \"if_better\"`",
            Use::View => "a view over it other than its columns and a `WHERE`",
            Use::SearchedModel => "a `\"search\"` of `\"model\"`",
            Use::SearchedClassWeight => "a `\"search\"` of `\"class_weight\"`",
            Use::GroupedNetwork => {
                "`\"group_by\"` of `mlp`, `mlp_regression`, `fm`, `fm_regression`"
            }
        }
    }
}

/// One refused combination: `a` with `b`.
#[derive(Debug)]
pub struct Refused {
    pub a: Use,
    pub b: Use,
    /// The ERROR's message.
    pub message: &'static str,
    /// What to do instead (the ERROR's hint).
    pub hint: &'static str,
}

const fn refused(a: Use, b: Use, message: &'static str, hint: &'static str) -> Refused {
    Refused {
        a,
        b,
        message,
        hint,
    }
}

const WORKERS_HINT: &str = "Set \"workers\": 0 (the default) to train in one process.";
const INFERENCE_HINT: &str = "Standard errors are computed for one model trained on every row of a table, read by block: train that model alone (an array column or a list of feature columns), then compare or search without \"inference\".";
const SINCE_HINT: &str = "An incremental training continues one model; per-group models and cross-validation train from zeros.";
const WARM_START_HINT: &str =
    "Warm-start one model at a time; per-group models and cross-validation train from zeros.";

/// Every refused combination. A check asks about the uses it knows at its point of the call,
/// and the first row that matches (in this order) is its ERROR.
pub const REFUSED: &[Refused] = &[
    // A sharded table: every shard trains one model in one process, from the coordinator's
    // statistics (round 0), holding out its own validation rows (kept, with their ids for a
    // gate, until the gate has scored); a validation relation is read by the coordinator;
    // per-group models are learners of every round, their groups numbered by the coordinator
    // from every shard's (round 0).
    refused(Use::Shards, Use::Workers, "\"workers\" cannot train on a sharded table yet", "Leave out \"workers\": every shard trains at once, each in one process."),
    // Classes (a softmax's, a network's, a text label's) are numbered once, by the
    // coordinator from every shard's classes (round 0), and every shard takes its numbering;
    // a list of feature columns' preprocessing is merged once from every shard's statistics
    // (round 0), and every shard encodes with it; "inference"'s Newton passes are rounds in
    // which every shard sums its rows' part of the information matrix, merged by the
    // coordinator.
    // The shards read their own tables by block: a training rewrites a view of the sharded
    // table's own columns and a WHERE into the table's terms (its WHERE the training's
    // "where"); any other view (and a stored model's functions on any view) is refused, the
    // ERROR's detail saying what the view has.
    refused(Use::Shards, Use::View, "this view over a sharded table cannot be read on its shards yet", "The shards train on a view that selects the sharded table's own columns (renamed or not), with or without a WHERE, and nothing else (no joins, aggregates, DISTINCT, LIMIT, computed columns or subqueries): define the view so, or name the sharded table itself, with \"where\" for the rows and \"features\" for the columns."),
    // A search's learners train side by side in every round on each shard's one plan, whose
    // rows are decoded for one kind (a binary kind's two labels, a network's or a softmax's
    // classes), and whose labels' weights the statistics round settles once for every learner
    // (a network's search, its folds: each learner keeps its own optimizer state on every shard).
    refused(Use::Shards, Use::SearchedModel, "a \"search\" on a sharded table cannot search \"model\" yet", "Search each model kind with its own corgipile_train: every shard decodes a round's rows for one kind."),
    refused(Use::Shards, Use::SearchedClassWeight, "a \"search\" on a sharded table cannot search \"class_weight\" yet", "Search with one \"class_weight\" (the statistics round settles the labels' weights once for every configuration), or on one shard's table."),
    // Per-group learners of a network: each would keep its own optimizer state on a shard,
    // keyed by its group, as a search's do, but they are not yet compared with one server's.
    refused(Use::Shards, Use::GroupedNetwork, "per-group networks and factorization machines cannot train on a sharded table yet", "Train per-group networks on one server's copy of the rows, or per-group linear models (svm, logistic, linear, softmax) on the shards."),
    // Parallel workers: the leader's statistics pass numbers the classes (a network's, a
    // softmax's, a text label's) and every process takes its numbering.
    refused(Use::Workers, Use::Inference, "\"workers\" cannot be used with \"inference\" yet", WORKERS_HINT),
    // "inference": one model, every row of a table read by block, then its Newton passes.
    refused(Use::Inference, Use::Search, "\"inference\" cannot be used with search yet", INFERENCE_HINT),
    refused(Use::Inference, Use::GroupBy, "\"inference\" cannot be used with group_by yet", INFERENCE_HINT),
    refused(Use::Inference, Use::Folds, "\"inference\" cannot be used with folds yet", INFERENCE_HINT),
    refused(Use::Inference, Use::Since, "\"inference\" cannot be used with since yet", INFERENCE_HINT),
    refused(Use::Inference, Use::Validation, "\"inference\" cannot be used with validation yet", INFERENCE_HINT),
    refused(Use::Inference, Use::SparseFeatures, "\"inference\" cannot be used with sparse features yet", INFERENCE_HINT),
    refused(Use::Inference, Use::StreamingShuffle, "\"inference\" cannot be used with shuffle \"sliding_window\" or \"mrs\" yet", INFERENCE_HINT),
    // Per-group models train every epoch, side by side on the same buffers.
    refused(Use::GroupBy, Use::Search, "\"group_by\" cannot be used with \"search\" yet", "Leave \"search\" out: every group's model trains every epoch, side by side on the same buffers."),
    refused(Use::GroupBy, Use::Folds, "\"group_by\" cannot be used with \"folds\" yet", "Leave \"folds\" out: every group's model trains every epoch, side by side on the same buffers."),
    refused(Use::GroupBy, Use::Validation, "\"group_by\" cannot be used with \"validation\" yet", "Leave \"validation\" out: every group's model trains every epoch, side by side on the same buffers."),
    refused(Use::GroupBy, Use::Tolerance, "\"group_by\" cannot be used with \"tolerance\" yet", "Leave \"tolerance\" out: every group's model trains every epoch, side by side on the same buffers."),
    // The gate scores the new version and the deployed one on exactly the rows the training
    // held out, which one backend keeps: one model trained in one process, with held-out rows.
    refused(Use::Gate, Use::Workers, "\"deploy\": \"if_better\" cannot be used with \"workers\" yet", "Parallel workers may each hold a share of the held-out rows: leave \"workers\" out of a gated training."),
    refused(Use::Gate, Use::GroupBy, "\"deploy\": \"if_better\" cannot be used with \"group_by\" yet", "Per-group models hold out no rows: train them without \"deploy\" and compare with corgipile_evaluate."),
    refused(Use::Gate, Use::Folds, "\"deploy\": \"if_better\" cannot be used with \"folds\" yet", "Cross-validation holds out no rows from the stored model: use \"validation\" instead of \"folds\"."),
    // A warm start continues one model.
    refused(Use::WarmStart, Use::Folds, "\"warm_start\" cannot be combined with \"folds\" yet", WARM_START_HINT),
    refused(Use::WarmStart, Use::GroupBy, "\"warm_start\" cannot be combined with \"group_by\" yet", WARM_START_HINT),
    refused(Use::WarmStart, Use::ValidationRelation, "\"warm_start\" cannot be combined with a validation relation yet", "Hold out rows of the training relation instead: {\"fraction\": 0.1} or {\"predicate\": ...}."),
    // "since" continues its model as a warm start does.
    refused(Use::Since, Use::Folds, "\"since\" cannot be combined with \"folds\" yet", SINCE_HINT),
    refused(Use::Since, Use::GroupBy, "\"since\" cannot be combined with \"group_by\" yet", SINCE_HINT),
    refused(Use::Since, Use::ValidationRelation, "\"since\" cannot be combined with a validation relation yet", "Hold out rows of the training relation instead: {\"fraction\": 0.1} or {\"predicate\": ...}."),
];

/// The first refused combination of `subject` with any of `uses` (None: they combine). Each
/// check asks about its subject (a sharded table, workers, a param) with what it knows the
/// training uses.
pub fn refusal(subject: Use, uses: &[Use]) -> Option<&'static Refused> {
    REFUSED
        .iter()
        .find(|r| r.a == subject && uses.contains(&r.b))
}

impl Use {
    /// What the kind itself brings to the table: `softmax`, or a network.
    pub fn of_kind(kind: ModelKind) -> Option<Use> {
        if kind.family().sized_by_statistics() {
            Some(Use::Network)
        } else if kind.has_class_outputs() {
            Some(Use::Softmax)
        } else {
            None
        }
    }
}

/// The uses among `candidates` that are `true`.
pub fn used(candidates: &[(Use, bool)]) -> Vec<Use> {
    candidates
        .iter()
        .filter(|(_, on)| *on)
        .map(|(u, _)| *u)
        .collect()
}

/// The reference page's table of what does not combine, as markdown (docs/reference.md holds
/// it between the markers `<!-- capabilities -->` and `<!-- /capabilities -->`).
pub fn reference_table() -> String {
    let mut out = String::from("| with | not yet | instead |\n|---|---|---|\n");
    for r in REFUSED {
        let hint = r.hint.replace('|', "\\|");
        out.push_str(&format!("| {} | {} | {hint} |\n", r.a.name(), r.b.name()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_combination_is_refused_by_its_subjects_first_row() {
        assert!(refusal(Use::Shards, &[]).is_none());
        assert!(refusal(Use::Search, &[Use::Folds, Use::Validation]).is_none());
        let r = refusal(Use::Shards, &[Use::Search, Use::Workers]).unwrap();
        // A search runs its configurations (and folds, or groups) side by side on the shards.
        assert!(refusal(Use::Shards, &[Use::Search, Use::Validation]).is_none());
        assert!(refusal(Use::Shards, &[Use::Search, Use::Folds]).is_none());
        // ... networks too (each learner's optimizer state its own on every shard), but not
        // kinds or class weights.
        assert!(refusal(Use::Shards, &[Use::Search, Use::Folds, Use::Network]).is_none());
        assert!(refusal(Use::Shards, &[Use::Search, Use::SearchedModel]).is_some());
        assert!(refusal(Use::Shards, &[Use::GroupBy, Use::ColumnList]).is_none());
        assert_eq!(r.message, "\"workers\" cannot train on a sharded table yet");
        let r = refusal(Use::GroupBy, &[Use::Tolerance]).unwrap();
        assert!(r.hint.starts_with("Leave \"tolerance\" out"));
        // Asked about its subject only: group_by's rows say nothing of a sharded table.
        assert!(refusal(Use::GroupBy, &[Use::Shards]).is_none());
    }

    #[test]
    fn workers_and_shards_number_classes_once() {
        assert!(refusal(Use::Workers, &[Use::TextLabel, Use::Softmax]).is_none());
        // On shards: the coordinator merges every shard's classes into one numbering.
        assert!(refusal(Use::Shards, &[Use::TextLabel, Use::Network]).is_none());
        assert!(refusal(Use::Shards, &[Use::TextLabel, Use::Softmax]).is_none());
        // ... and merges every shard's statistics of a list of feature columns.
        assert!(refusal(Use::Shards, &[Use::ColumnList, Use::Network]).is_none());
        assert_eq!(Use::of_kind(ModelKind::Softmax), Some(Use::Softmax));
        assert_eq!(Use::of_kind(ModelKind::Mlp), Some(Use::Network));
        assert_eq!(Use::of_kind(ModelKind::Logistic), None);
    }

    #[test]
    fn every_row_is_a_pair_of_two_uses_with_its_own_message_and_a_hint() {
        for (i, r) in REFUSED.iter().enumerate() {
            assert_ne!(r.a, r.b, "{r:?}");
            assert!(r.message.ends_with(" yet"), "{r:?}");
            assert!(!r.hint.is_empty() && r.hint.ends_with('.'), "{r:?}");
            // A message names one combination (`ParamError::not_supported` finds it by it).
            assert!(REFUSED[..i].iter().all(|o| o.message != r.message), "{r:?}");
        }
    }

    /// docs/reference.md shows the table this module holds (run with CORGIPILE_BLESS=1 to
    /// write it there).
    #[test]
    fn the_reference_page_shows_this_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference.md");
        let page = std::fs::read_to_string(path).expect("docs/reference.md");
        let (begin, end) = ("<!-- capabilities -->\n", "<!-- /capabilities -->");
        let start = page.find(begin).expect("the capabilities marker") + begin.len();
        let stop = page.find(end).expect("the capabilities end marker");
        let table = reference_table();
        if page[start..stop] != table && std::env::var_os("CORGIPILE_BLESS").is_some() {
            let page = format!("{}{table}{}", &page[..start], &page[stop..]);
            std::fs::write(path, page).expect("docs/reference.md written");
            return;
        }
        assert_eq!(
            page[start..stop],
            table,
            "docs/reference.md's capability table is not this module's: run CORGIPILE_BLESS=1 cargo test -p corgipile-ml capabilities"
        );
    }
}
