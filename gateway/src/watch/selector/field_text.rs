//! A field's value read out of an object's JSON value, as a field selector compares it: the
//! walk along a path (an object's member, or an array's element at a canonical decimal index)
//! and [`FieldText`], the value as text (a missing field or `null` is `""`, an object or array
//! equals no value). Shared by the any-field reading (`super::any_field`) and the member's own
//! fields (`super::member`); imports nothing of theirs.

use std::borrow::Cow;

use serde_json::Value;

/// The value at `keys` in `object`: an object's member, or an array's element at a decimal
/// index; `None` when missing.
pub(super) fn walk<'v, 'k>(
    object: &'v Value,
    keys: impl IntoIterator<Item = &'k str>,
) -> Option<&'v Value> {
    keys.into_iter().try_fold(object, |node, key| match node {
        Value::Object(members) => members.get(key),
        Value::Array(items) => index(key).and_then(|i| items.get(i)),
        _ => None,
    })
}

/// `0`, or digits without a leading zero.
fn index(key: &str) -> Option<usize> {
    let canonical =
        key.bytes().all(|b| b.is_ascii_digit()) && (key == "0" || !key.starts_with('0'));
    canonical.then(|| key.parse().ok()).flatten()
}

/// A field's value as a selector compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldText<'v> {
    /// A string as itself, a number or bool as its JSON text, missing or `null` as `""`.
    Text(Cow<'v, str>),
    /// An object or an array: equal to no value.
    Composite,
}

impl<'v> FieldText<'v> {
    /// `value` read as a selector compares it (`None`: missing).
    pub fn of(value: Option<&'v Value>) -> FieldText<'v> {
        match value {
            None | Some(Value::Null) => FieldText::Text(Cow::Borrowed("")),
            Some(Value::String(s)) => FieldText::Text(Cow::Borrowed(s)),
            Some(Value::Bool(b)) => {
                FieldText::Text(Cow::Borrowed(if *b { "true" } else { "false" }))
            }
            Some(Value::Number(n)) => FieldText::Text(Cow::Owned(n.to_string())),
            Some(Value::Object(_) | Value::Array(_)) => FieldText::Composite,
        }
    }

    /// Whether a requirement `= value` (`equal`) or `!= value` holds for this value.
    pub fn selected(&self, equal: bool, value: &str) -> bool {
        match self {
            FieldText::Text(text) => (text == value) == equal,
            FieldText::Composite => !equal,
        }
    }

    pub(super) fn into_owned(self) -> FieldText<'static> {
        match self {
            FieldText::Text(text) => FieldText::Text(Cow::Owned(text.into_owned())),
            FieldText::Composite => FieldText::Composite,
        }
    }
}
