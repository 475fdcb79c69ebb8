//! A WebSocket frame, any bytes: `parse_event` never panics, and what it accepts
//! satisfies the boundary invariant.
#![no_main]

use hotloop_core::validate::{parse_event, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|frame: &[u8]| {
    if let Ok(event) = parse_event(frame, &Limits::default()) {
        let text = std::str::from_utf8(frame).expect("an accepted frame is UTF-8");
        hotloop_fuzz::assert_accepted_event(text, &event);
    }
});
