//! o200k's split, decided without the regex where the text is ASCII
//! (`tokenizer::scanner`), finds bpe-openai's regex pieces in any text.
#![no_main]

use hotloop_core::tokenizer::openai;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &[u8]| {
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let tokenizer = openai::by_name("o200k_base").expect("embedded");
    let ours: Vec<&str> = tokenizer.pieces(text).collect();
    let regex: Vec<&str> = bpe_openai::o200k_base().split(text).collect();
    assert_eq!(ours, regex, "{text:?}");
});
