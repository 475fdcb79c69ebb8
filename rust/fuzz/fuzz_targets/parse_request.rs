//! An HTTP `POST /v1/responses` body, any bytes: `parse_request` never panics, and
//! what it accepts satisfies the boundary invariant.
#![no_main]

use hotloop_core::validate::{parse_request, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    if let Ok(request) = parse_request(body, &Limits::default()) {
        let text = std::str::from_utf8(body).expect("an accepted body is UTF-8");
        hotloop_fuzz::assert_accepted_request(text, &request);
    }
});
