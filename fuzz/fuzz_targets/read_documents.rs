//! The YAML/JSON reader of `review` and `--caches`: any text, no panic, no hang, bounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(documents) = modelgate::documents::read_documents("fuzz", text) {
            for d in documents {
                // Every document is an object (Lists are flattened into their items).
                assert!(d.value.is_object(), "{}: not an object", d.origin);
            }
        }
    }
});
