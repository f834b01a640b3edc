//! Field selectors on any field of an object: kube's grammar (the parent module's
//! `field_terms`), with each field read as a dot-separated path into the object's JSON instead of
//! one of the handful of fields a member serves: what LISTs and watches of a cached resource
//! select on (issue 34, docs/cache.md). `watch::plan` parses it once per request; `super::lazy`
//! applies it to objects kept as JSON bytes.
//!
//! How a field reads:
//! - a path is the field cut at each `.` (`status.phase`, `spec.nodeName`); `\.` is a dot inside
//!   one key, `\\` a backslash, `\,` a comma; any other backslash, an empty key (`a..b`, `.a`,
//!   `a.`) or more than [`MAX_DEPTH`] keys is refused;
//! - under `metadata.labels` and `metadata.annotations` the rest of the path is one key, dots
//!   and all: `metadata.annotations.example.com/owner` reads the annotation
//!   `example.com/owner` (those maps are flat, and their keys are full of dots);
//! - a key that is a decimal index (`0`, `12`) selects an element of an array;
//! - a string compares as itself, a number as serde_json prints it (`3`, `1.5`), a bool as
//!   `true` / `false`, a missing field or `null` as the empty string (so `spec.nodeName=`
//!   selects objects without one, as kube's own field sets do);
//! - an object or an array equals no value: `=` never selects it, `!=` always does.
//!
//! With [`Reading::Member`], a field the member itself serves for that resource reads as the
//! member reads it (`super::member`: a missing count is `0`, events' `source` falls back to
//! `reportingComponent`, ...), so such a selector selects exactly what the member would.
//! Never panics on any input; parsing is linear in the input's length.

use std::collections::BTreeMap;

use serde_json::Value;

use super::field_text::{walk, FieldText};
use super::member::member_field;
use super::{field_terms, Field, FieldSelector, FieldTerm, Refused};

/// The most keys a path may have: serde_json reads no document nested deeper than 128 levels,
/// so a longer path could only ever read a missing field.
pub const MAX_DEPTH: usize = 128;

/// A field of a selector as a path into an object's JSON.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FieldPath {
    /// The field as the selector wrote it (what the member's tables name).
    text: Box<str>,
    keys: Box<[Box<str>]>,
}

impl FieldPath {
    /// Reads `text` (a field as written in a selector) as a path.
    pub fn parse(text: &str) -> Result<FieldPath, Refused> {
        let refuse = |why: &str| Refused(format!("invalid field path {text:?}: {why}"));
        let mut keys = Vec::new();
        let mut key = String::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some(e @ ('.' | '\\' | ',')) => key.push(e),
                    _ => return Err(refuse("a backslash escapes only '.', '\\' and ','")),
                },
                '.' => {
                    keys.push(std::mem::take(&mut key));
                    if keys.len() >= MAX_DEPTH {
                        return Err(refuse("too deep"));
                    }
                }
                c => key.push(c),
            }
        }
        keys.push(key);
        if keys.iter().any(String::is_empty) {
            return Err(refuse("an empty key"));
        }
        // Labels and annotations: the rest of the path is one key.
        if keys.len() > 3 && keys[0] == "metadata" && matches!(&*keys[1], "labels" | "annotations")
        {
            let key = keys[2..].join(".");
            keys.truncate(2);
            keys.push(key);
        }
        Ok(FieldPath {
            text: text.into(),
            keys: keys.into_iter().map(String::into_boxed_str).collect(),
        })
    }

    /// The field as the selector wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The keys the path walks, unescaped.
    pub fn keys(&self) -> &[Box<str>] {
        &self.keys
    }

    /// This field of `object`, as JSON.
    pub fn read<'v>(&self, object: &'v Value) -> FieldText<'v> {
        FieldText::of(walk(object, self.keys.iter().map(|k| &**k)))
    }
}

/// How a selector's fields are read from an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading<'a> {
    /// Every field as a JSON path.
    Json,
    /// A field the member serves for this resource as the member reads it
    /// ([`super::member::member_field`]); any other as a JSON path.
    Member { group: &'a str, resource: &'a str },
}

impl Reading<'_> {
    /// `path` of `object`, read this way.
    pub fn read<'v>(&self, path: &FieldPath, object: &'v Value) -> FieldText<'v> {
        match self {
            Reading::Member { group, resource } => {
                match member_field(group, resource, path.as_str()) {
                    Some(field) => field.read(object),
                    None => path.read(object),
                }
            }
            Reading::Json => path.read(object),
        }
    }
}

/// A field selector on any fields: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnyFieldSelector {
    terms: Vec<AnyTerm>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct AnyTerm {
    path: FieldPath,
    equal: bool,
    value: Box<str>,
}

/// Reads `text` with kube's field-selector grammar, each field as a [`FieldPath`]: what a
/// cache can serve beyond the member's own fields. The errors carry kube's message where kube
/// refuses the text too.
pub fn parse_any(text: &str) -> Result<AnyFieldSelector, Refused> {
    let terms = field_terms(text)?
        .into_iter()
        .map(|term| {
            Ok(AnyTerm {
                path: FieldPath::parse(term.field)?,
                equal: term.equal,
                value: term.value.into_boxed_str(),
            })
        })
        .collect::<Result<_, Refused>>()?;
    Ok(AnyFieldSelector { terms })
}

impl AnyFieldSelector {
    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// The fields the selector reads (an index of cached objects keeps these).
    pub fn paths(&self) -> impl Iterator<Item = &FieldPath> {
        self.terms.iter().map(|t| &t.path)
    }

    /// The fast path: the same selector on `metadata.name` / `metadata.namespace` alone, which
    /// an object's namespace and name answer; `None` when it reads another field.
    pub fn metadata_only(&self) -> Option<FieldSelector> {
        let terms = self
            .terms
            .iter()
            .map(|t| {
                let field = match t.path.as_str() {
                    "metadata.name" => Field::Name,
                    "metadata.namespace" => Field::Namespace,
                    _ => return None,
                };
                Some(FieldTerm {
                    field,
                    equal: t.equal,
                    value: t.value.to_string(),
                })
            })
            .collect::<Option<_>>()?;
        Some(FieldSelector { terms })
    }

    /// Whether `object` satisfies every requirement, its fields read as `reading` says.
    pub fn matches(&self, reading: Reading<'_>, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|t| reading.read(&t.path, object).selected(t.equal, &t.value))
    }

    /// Whether an object whose fields were read into `values` satisfies every requirement; a
    /// path `values` lacks reads as missing.
    pub fn matches_values(&self, values: &FieldValues) -> bool {
        self.terms
            .iter()
            .all(|t| match values.get(t.path.as_str()) {
                Some(text) => text.selected(t.equal, &t.value),
                None => FieldText::of(None).selected(t.equal, &t.value),
            })
    }
}

/// An object's values for some fields, read once: what an index of cached objects keeps per
/// object instead of reading the object again for each selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldValues {
    values: BTreeMap<Box<str>, FieldText<'static>>,
}

impl FieldValues {
    /// `paths` of `object`, read as `reading` says.
    pub fn read<'p>(
        reading: Reading<'_>,
        object: &Value,
        paths: impl IntoIterator<Item = &'p FieldPath>,
    ) -> FieldValues {
        let values = paths
            .into_iter()
            .map(|path| {
                let text = reading.read(path, object).into_owned();
                (Box::from(path.as_str()), text)
            })
            .collect();
        FieldValues { values }
    }

    /// The value read for the field written `field`.
    pub fn get(&self, field: &str) -> Option<&FieldText<'static>> {
        self.values.get(field)
    }
}

#[cfg(test)]
mod tests;
