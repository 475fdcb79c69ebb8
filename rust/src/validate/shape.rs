//! [`Shape`]: a JSON value read in the same pass as its container, in the shape
//! validation expects (a string decoded in place, an object read into a struct of the
//! fields validation wants), or else the kind of value that came instead.
//!
//! Input items are the bulk of a request's bytes. Reading them into shapes decodes each
//! text once, in one pass over the input, instead of first skipping every nested value as
//! a raw slice and then decoding it again (five passes for a text in a list of parts).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::field::{invalid_value, string_above_max_length, type_error};
use super::path::Path;
use crate::error::Result;

pub enum Shape<'a, T> {
    /// A string, borrowed from the frame when it had no escapes.
    Str(Cow<'a, str>),
    /// An object, read into `T`.
    Object(T),
    Array(Vec<Shape<'a, T>>),
    /// null, a boolean or a number: only its kind is kept.
    Other(&'static str),
}

impl<'a, T> Shape<'a, T> {
    /// "a string", "an object", ... for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Shape::Str(_) => "a string",
            Shape::Object(_) => "an object",
            Shape::Array(_) => "an array",
            Shape::Other(kind) => kind,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Shape::Other("null"))
    }

    /// A string of at most `max_bytes`.
    pub fn text(self, path: &Path, max_bytes: usize) -> Result<Cow<'a, str>> {
        match self {
            Shape::Str(s) if s.len() > max_bytes => Err(string_above_max_length(path, s.len(), max_bytes)),
            Shape::Str(s) => Ok(s),
            other => Err(type_error(path, "a string", other.kind())),
        }
    }

    pub fn object(self, path: &Path) -> Result<T> {
        match self {
            Shape::Object(t) => Ok(t),
            other => Err(type_error(path, "an object", other.kind())),
        }
    }
}

/// Read a whole JSON text as a shape; syntax errors cannot happen on a slice of a frame
/// that already parsed, but a duplicate key inside an object can.
pub fn read<'a, T: Deserialize<'a>>(json: &'a str, path: &Path) -> Result<Shape<'a, T>> {
    serde_json::from_str(json).map_err(|e| invalid_value(path, format!("Invalid '{path}': {e}.")))
}

impl<'de: 'a, 'a, T: Deserialize<'de>> Deserialize<'de> for Shape<'a, T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_any(ShapeVisitor(PhantomData))
    }
}

struct ShapeVisitor<'a, T>(PhantomData<(Cow<'a, str>, T)>);

impl<'de: 'a, 'a, T: Deserialize<'de>> Visitor<'de> for ShapeVisitor<'a, T> {
    type Value = Shape<'a, T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Str(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Str(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Str(Cow::Owned(s)))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> std::result::Result<Self::Value, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map)).map(Shape::Object)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Self::Value, A::Error> {
        let mut elements = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(element) = seq.next_element()? {
            elements.push(element);
        }
        Ok(Shape::Array(elements))
    }

    fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Other("null"))
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Other("a boolean"))
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Other("a number"))
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Other("a number"))
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<Self::Value, E> {
        Ok(Shape::Other("a number"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IgnoredAny;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Pair<'a> {
        #[serde(borrow)]
        a: Option<Shape<'a, IgnoredAny>>,
    }

    #[test]
    fn strings_borrow_unless_escaped() {
        let p = Path::root("x");
        let plain: Shape<IgnoredAny> = read(r#""abc""#, &p).unwrap();
        assert!(matches!(plain.text(&p, 10).unwrap(), Cow::Borrowed("abc")));
        let escaped: Shape<IgnoredAny> = read(r#""a\"b""#, &p).unwrap();
        assert_eq!(escaped.text(&p, 10).unwrap(), "a\"b");
    }

    #[test]
    fn kinds_and_objects() {
        let p = Path::root("x");
        let shapes: Shape<Pair> = read(
            r#"[{"a":"s","b":[1,{"c":2}]}, 3, null, true, [], {"a":null}]"#,
            &p,
        )
        .unwrap();
        let Shape::Array(elements) = shapes else {
            panic!("not an array")
        };
        let kinds: Vec<_> = elements.iter().map(Shape::kind).collect();
        assert_eq!(
            kinds,
            [
                "an object",
                "a number",
                "null",
                "a boolean",
                "an array",
                "an object"
            ]
        );
        let mut elements = elements.into_iter();
        let first = elements.next().unwrap().object(&p).unwrap();
        assert_eq!(first.a.unwrap().text(&p, 5).unwrap(), "s");
        assert_eq!(
            elements.next().unwrap().object(&p).err().unwrap().code,
            crate::Code::InvalidType
        );
        let e = read::<Pair>(r#"{"a":1,"a":2}"#, &p).err().unwrap();
        assert_eq!(e.code, crate::Code::InvalidValue);
    }
}
