//! The golden ids of `tests/golden/tokenizers/` (each family's reference encoder, written
//! once by `tests/golden/make_tokenizer_golden.py`), checked against the core directly.
//! The vocabularies come from `make native`'s cache and the test extra's packages.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hotloop_core::tokenizer::{self, Tokenizer};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `python/hotloop/native_deps.py`'s `cache_root`.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("HOTLOOP_NATIVE_CACHE") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    base.join("hotloop").join("native")
}

/// The worktree's virtualenv site-packages (the test extra's packages).
fn site_packages() -> PathBuf {
    let lib = repo().join(".venv").join("lib");
    std::fs::read_dir(&lib)
        .unwrap_or_else(|e| panic!("{}: {e}; run `make develop`", lib.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .expect("a python*/site-packages under .venv/lib")
}

fn load(source: &serde_json::Map<String, serde_json::Value>) -> Arc<dyn Tokenizer> {
    let (kind, where_) = source.iter().next().expect("one source");
    let path = where_
        .as_str()
        .unwrap()
        .replace("<cache>", cache_root().to_str().unwrap())
        .replace("<site>", site_packages().to_str().unwrap());
    let read = || std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}; run `make native`"));
    match kind.as_str() {
        "gguf" => tokenizer::from_gguf(Path::new(&path)),
        "tekken" => tokenizer::from_tekken(&read()),
        "sentencepiece" => tokenizer::from_sentencepiece_model(&read()),
        _ => tokenizer::from_tokenizer_json(&read()),
    }
    .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn golden_ids() {
    let dir = repo().join("tests/golden/tokenizers");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "{files:?}");
    for file in files {
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        let tok = load(doc["source"].as_object().unwrap());
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() > 50);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as u32)
                .collect();
            let mut ids = Vec::new();
            tok.encode(text, &mut ids);
            assert_eq!(
                ids,
                want,
                "{}: {:?}",
                file.display(),
                text.chars().take(80).collect::<String>()
            );
        }
    }
}
