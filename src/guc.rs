//! Server settings.

use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

/// Upper bound, in kB, on the tuple-buffer memory of one training (both buffers together when
/// double-buffered). Superuser-only so that an ordinary role cannot raise its own limit.
pub static MAX_BUFFER_MEMORY_KB: GucSetting<i32> = GucSetting::<i32>::new(512 * 1024);

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
}

pub fn max_buffer_bytes() -> u64 {
    MAX_BUFFER_MEMORY_KB.get().max(0) as u64 * 1024
}
