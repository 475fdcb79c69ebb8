//! A `tools` list (with schemas) in an otherwise valid request: checking it, echoing it
//! and rendering it into a harmony prompt never panic, and what is accepted satisfies
//! the boundary invariant.
#![no_main]

use std::sync::{Arc, OnceLock};

use hotloop_core::format::harmony::Harmony;
use hotloop_core::format::ChatFormat;
use hotloop_core::prompt_chain::{Conversation, SegmentBuilder};
use hotloop_core::validate::{parse_event, ClientEvent, Limits};
use libfuzzer_sys::fuzz_target;

/// Built once: the harmony tokenizer takes far longer to load than one run.
fn harmony() -> Arc<dyn ChatFormat> {
    static FORMAT: OnceLock<Arc<dyn ChatFormat>> = OnceLock::new();
    Arc::clone(FORMAT.get_or_init(|| Arc::new(Harmony::new())))
}

fuzz_target!(|tools: &[u8]| {
    let Ok(tools) = std::str::from_utf8(tools) else {
        return;
    };
    let frame = format!(r#"{{"type":"response.create","input":"hi","tools":{tools},"tool_choice":"auto"}}"#);
    let Ok(ClientEvent::Create(request)) = parse_event(frame.as_bytes(), &Limits::default()) else {
        return;
    };
    hotloop_fuzz::assert_accepted_request(&frame, &request);
    if request.error.is_none() {
        let mut conversation = Conversation::new(SegmentBuilder::new(harmony()), 1 << 20);
        let _ = conversation.extend_request(&request, None);
    }
});
