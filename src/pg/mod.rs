//! PostgreSQL glue: what every layer uses to talk to the server — ERRORs and NOTICEs, the
//! differences between majors, the settings, the progress line.

pub mod compat;
pub mod error;
pub mod fixed_output;
pub mod guc;
pub mod names;
pub mod prefetch;
pub mod progress;
pub mod thread;
