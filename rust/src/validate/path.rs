//! Where in a request a value sits, as the `param` of an error (`input[3].content[0].text`).
//!
//! A path is a chain of stack frames that is only rendered to a string when an error
//! needs it, so walking a valid request allocates nothing for locations.

use std::fmt;

#[derive(Clone, Copy)]
enum Segment<'a> {
    Root(&'a str),
    Key(&'a str),
    Index(usize),
}

/// A location in the request body. Build children with [`Path::key`] and [`Path::index`].
#[derive(Clone, Copy)]
pub struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    segment: Segment<'a>,
}

impl<'a> Path<'a> {
    /// A top-level field of the request, e.g. `input`.
    pub fn root(name: &'a str) -> Self {
        Path {
            parent: None,
            segment: Segment::Root(name),
        }
    }

    pub fn key(&'a self, name: &'a str) -> Path<'a> {
        Path {
            parent: Some(self),
            segment: Segment::Key(name),
        }
    }

    pub fn index(&'a self, index: usize) -> Path<'a> {
        Path {
            parent: Some(self),
            segment: Segment::Index(index),
        }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(parent) = self.parent {
            parent.fmt(f)?;
        }
        match self.segment {
            Segment::Root(name) => f.write_str(name),
            Segment::Key(name) => write!(f, ".{name}"),
            Segment::Index(i) => write!(f, "[{i}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_keys_and_indices() {
        let input = Path::root("input");
        let item = input.index(3);
        let content = item.key("content");
        let part = content.index(0);
        assert_eq!(part.key("text").to_string(), "input[3].content[0].text");
        assert_eq!(input.to_string(), "input");
    }
}
