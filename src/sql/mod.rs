//! The SQL functions users call: training (with EXPLAIN and trace), evaluation, model
//! management. Prediction is `crate::predict`, the table shuffle `crate::shuffle_table`, a shard
//! server's round `crate::shard::serve`.

pub mod evaluate;
pub mod importance;
pub mod manage;
pub mod tables;
pub mod train;
