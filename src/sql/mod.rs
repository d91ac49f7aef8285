//! The SQL functions users call (training, evaluation, EXPLAIN, trace, model management);
//! prediction is `crate::predict`, the table shuffle `crate::shuffle_table`.

pub mod manage;
