//! A text cut at a line start (`pretokenizer::line_cut`) splits, part by part, into the
//! pieces of the whole, for every split that claims it (`cuts_at_lines`: the cut that
//! parallel encoding makes), and a SentencePiece vocabulary whose tokens span no line
//! start encodes it, part by part, to the ids of the whole; the first byte picks which.
//! It also picks a SentencePiece vocabulary's BPE on the text as one piece, cut where no
//! token joins the bytes beside the cut (`BpeModel::assert_piece_cuts_exact`: the cut
//! that bounds the merge loop on long pieces), parts at least as long as the first byte
//! says, against the uncut piece.
#![no_main]

use std::sync::LazyLock;

use hotloop_core::tokenizer::bpe_model::{tiny_spm, BpeModel};
use hotloop_core::tokenizer::pretokenizer::{assert_line_cuts_exact, PreTokenizer};
use hotloop_core::tokenizer::{assert_line_cut_ids_exact, openai};
use libfuzzer_sys::fuzz_target;

static SPLITS: LazyLock<Vec<PreTokenizer>> = LazyLock::new(|| {
    ["llama-bpe", "qwen2", "deepseek-v3", "tekken"]
        .iter()
        .map(|name| PreTokenizer::from_llama_pre(name).expect("known").expect("known"))
        .collect()
});

static SENTENCEPIECE: LazyLock<BpeModel> = LazyLock::new(tiny_spm);

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let pick = which as usize % (SPLITS.len() + 3);
    match SPLITS.get(pick) {
        Some(split) => assert_line_cuts_exact(
            |t| {
                let mut out = Vec::new();
                split.split(t, 0..t.len(), &mut |r| out.push(&t[r]));
                out
            },
            text,
        ),
        None if pick == SPLITS.len() => assert_line_cut_ids_exact(&*SENTENCEPIECE, text),
        None if pick == SPLITS.len() + 1 => {
            SENTENCEPIECE.assert_piece_cuts_exact(text, which as usize / 8 + 1)
        }
        None => {
            let o200k = openai::by_name("o200k_base").expect("embedded");
            assert_line_cuts_exact(|t| o200k.pieces(t).collect(), text);
        }
    }
});
