//! Configuration and team files (TOML): `WardenConfig::from_toml`, `TeamFile::from_toml`,
//! `warden config check`, and the located error messages they produce.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = warden_protocols::WardenConfig::from_toml(text).map_err(|e| e.to_string());
    let _ = warden::team::TeamFile::from_toml(text).map_err(|e| e.to_string());
    let _ = warden::team::check(text).map_err(|e| e.to_string());
    // The error locator, with a span taken from the input itself.
    if let Some((&a, rest)) = data.split_first() {
        if let Some((&b, _)) = rest.split_first() {
            let (start, end) = (usize::from(a), usize::from(b));
            let _ = warden_protocols::located(text, start..end, "m");
            let _ = warden_protocols::located(text, start..start + end, "m");
        }
    }
});
