//! [`KeptItem`]: an input item as its segment keeps it once rendered.
//!
//! A segment's tokens are final once rendered; its item is read again only when history
//! is re-rendered (a changed prefix, a grown last item) or a call's name is looked up.
//! Most of a long conversation's bytes besides its ids are the texts of its tool outputs
//! and messages (about 4 bytes a token): a text of at least [`PACK_FROM`] bytes is kept
//! deflated (about a quarter of its size on code and logs) and inflated when read. A
//! function call stays as it is (its name is looked up by call id).

use std::mem::size_of;
use std::sync::{Arc, Mutex};

use miniz_oxide::deflate::compress_to_vec;
use miniz_oxide::deflate::core::{
    compress, create_comp_flags_from_zip_params, CompressorOxide, TDEFLFlush, TDEFLStatus,
};
use miniz_oxide::inflate::decompress_to_vec;

use crate::item::{Item, ItemKind};

/// Texts shorter than this stay as they are: deflating them saves little.
pub(crate) const PACK_FROM: usize = 512;

/// Deflate's fastest level: a turn's tool output of a few KB costs tens of microseconds.
const LEVEL: u8 = 1;

/// The process's deflate state, reset for each text: a new one allocates and zeroes
/// about 300 KB, more than deflating a turn's few KB takes (3 KB of Python source: 39 us
/// with a new one, 16 us reused; 87 and 31 us with the CPU's caches emptied). One for
/// the process, not one a thread: a render that finds it taken (another thread's, at the
/// same moment) deflates with a new one, as every render did before.
static DEFLATE: Mutex<Option<CompressorOxide>> = Mutex::new(None);

/// `text` deflated (raw deflate, as `miniz_oxide::deflate::compress_to_vec` writes it).
fn deflate(text: &[u8]) -> Box<[u8]> {
    match DEFLATE.try_lock() {
        Ok(mut kept) => {
            let compressor = kept.get_or_insert_with(|| {
                CompressorOxide::new(create_comp_flags_from_zip_params(LEVEL.into(), 0, 0))
            });
            compressor.reset();
            deflate_with(compressor, text)
        }
        Err(_) => compress_to_vec(text, LEVEL).into_boxed_slice(),
    }
}

fn deflate_with(compressor: &mut CompressorOxide, mut text: &[u8]) -> Box<[u8]> {
    let mut out = vec![0; text.len() / 2 + 64];
    let mut at = 0;
    loop {
        let (status, read, written) = compress(compressor, text, &mut out[at..], TDEFLFlush::Finish);
        at += written;
        match status {
            TDEFLStatus::Done => break,
            TDEFLStatus::Okay => {
                text = &text[read..];
                if out.len() - at < 64 {
                    out.resize(2 * out.len(), 0);
                }
            }
            _ => unreachable!("deflating into a buffer with room cannot fail"),
        }
    }
    out.truncate(at);
    out.into_boxed_slice()
}

#[derive(Clone)]
pub(crate) enum KeptItem {
    Plain(Arc<Item>),
    Packed(Arc<Packed>),
}

/// An item whose text is deflated: the item with that text emptied, and the text.
pub(crate) struct Packed {
    shell: Item,
    text: Box<[u8]>,
}

/// The text an item may be kept deflated by (not a function call's arguments).
fn text_of(item: &mut Item) -> Option<&mut String> {
    match item {
        Item::Message { text, .. } | Item::Reasoning { text } => Some(text),
        Item::FunctionCallOutput { output, .. } => Some(output),
        Item::FunctionCall { .. } => None,
    }
}

impl KeptItem {
    /// `item` kept: its text deflated when it is long.
    pub fn new(item: Arc<Item>) -> KeptItem {
        let mut shell = Arc::unwrap_or_clone(item);
        match text_of(&mut shell) {
            Some(text) if text.len() >= PACK_FROM => {
                let text = deflate(std::mem::take(text).as_bytes());
                KeptItem::Packed(Arc::new(Packed { shell, text }))
            }
            _ => KeptItem::Plain(Arc::new(shell)),
        }
    }

    /// The item as it was given.
    pub fn item(&self) -> Arc<Item> {
        match self {
            KeptItem::Plain(item) => Arc::clone(item),
            KeptItem::Packed(packed) => {
                let mut item = packed.shell.clone();
                let bytes = decompress_to_vec(&packed.text).expect("a text this module deflated");
                if let Some(text) = text_of(&mut item) {
                    *text = String::from_utf8(bytes).expect("a text this module deflated");
                }
                Arc::new(item)
            }
        }
    }

    /// The item when it is kept as it is (a function call always is).
    pub fn plain(&self) -> Option<&Item> {
        match self {
            KeptItem::Plain(item) => Some(item),
            KeptItem::Packed(_) => None,
        }
    }

    pub fn kind(&self) -> ItemKind {
        match self {
            KeptItem::Plain(item) => item.kind(),
            KeptItem::Packed(packed) => packed.shell.kind(),
        }
    }

    /// Heap bytes held (the item, its strings, the deflated text).
    pub fn heap_bytes(&self) -> usize {
        match self {
            KeptItem::Plain(item) => super::segment::item_bytes(item),
            KeptItem::Packed(packed) => {
                size_of::<Packed>() + super::segment::item_bytes(&packed.shell) + packed.text.len()
            }
        }
    }

    /// Both share their storage.
    pub fn same(&self, other: &KeptItem) -> bool {
        match (self, other) {
            (KeptItem::Plain(a), KeptItem::Plain(b)) => Arc::ptr_eq(a, b),
            (KeptItem::Packed(a), KeptItem::Packed(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::Role;

    fn text(len: usize) -> String {
        (0..len)
            .map(|i| char::from(b'a' + (i % 7 + i / 97 % 5) as u8))
            .collect()
    }

    #[test]
    fn a_long_text_is_kept_smaller_and_read_back_whole() {
        let items = [
            Item::Message {
                role: Role::User,
                text: text(5000),
            },
            Item::Reasoning {
                text: text(PACK_FROM),
            },
            Item::FunctionCallOutput {
                call_id: "c1".into(),
                output: format!("é{}", text(4000)),
            },
        ];
        for item in items {
            let item = Arc::new(item);
            let kept = KeptItem::new(Arc::clone(&item));
            assert!(kept.plain().is_none());
            assert!(kept.heap_bytes() < super::super::segment::item_bytes(&item));
            assert_eq!(kept.kind(), item.kind());
            assert_eq!(*kept.item(), *item);
        }
    }

    #[test]
    fn the_processs_deflate_state_writes_what_a_new_one_does() {
        // Texts of every size around the output's first room, one after another on the
        // same state, incompressible ones included.
        let mut noise = 0x9e37_79b9_u32;
        let random: Vec<u8> = (0..70_000)
            .map(|_| {
                noise ^= noise << 13;
                noise ^= noise >> 17;
                noise ^= noise << 5;
                noise as u8
            })
            .collect();
        for len in [0, 1, 100, PACK_FROM, 3000, 40_000, 70_000] {
            for bytes in [text(len).into_bytes(), random[..len].to_vec()] {
                let packed = deflate(&bytes);
                assert_eq!(
                    &*packed,
                    &miniz_oxide::deflate::compress_to_vec(&bytes, LEVEL)[..]
                );
                assert_eq!(decompress_to_vec(&packed).unwrap(), bytes);
            }
        }
    }

    #[test]
    fn short_texts_and_calls_stay_as_they_are() {
        let items = [
            Item::Message {
                role: Role::Assistant,
                text: text(PACK_FROM - 1),
            },
            Item::FunctionCall {
                call_id: "c1".into(),
                name: "exec".into(),
                arguments: text(5000),
            },
        ];
        for item in items {
            let item = Arc::new(item);
            let kept = KeptItem::new(Arc::clone(&item));
            assert_eq!(kept.plain(), Some(&*item));
            assert!(kept.same(&kept.clone()));
            assert!(Arc::ptr_eq(&kept.item(), &kept.item()));
        }
    }
}
