//! An HTTP `POST /v1/responses` body, any bytes: `parse_request` never panics, and
//! what it accepts satisfies the boundary invariant. The same body sent again by a key
//! that was served it (its `input` elements recognized by their bytes, not parsed or
//! checked again) gets the same verdict and the same history.
#![no_main]

use hotloop_core::validate::{parse_request, parse_request_seen, Limits, SeenItems};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let limits = Limits::default();
    let Ok(request) = parse_request(body, &limits) else {
        return;
    };
    let text = std::str::from_utf8(body).expect("an accepted body is UTF-8");
    hotloop_fuzz::assert_accepted_request(text, &request);
    let mut seen = SeenItems::default();
    let first = parse_request_seen(body, &limits, Some(&seen)).expect("parsed without it");
    assert_eq!(first.error, request.error);
    if seen.remember(&first) {
        let again = parse_request_seen(body, &limits, Some(&seen)).expect("parsed without it");
        assert_eq!(again.error, request.error);
        let last = |r: &hotloop_core::validate::CreateRequest| r.history.chained(None).last().copied();
        assert_eq!(last(&again), last(&request));
    }
});
