//! Label and field selectors as kube-apiserver reads them, so a shared watch filters each
//! client's events in the gateway exactly as the member would have.
//!
//! - Label selectors: the whole grammar of `k8s.io/apimachinery/pkg/labels` (`key`, `!key`,
//!   `=`, `==`, `!=`, `in (...)`, `notin (...)`, `>` and `<` with whole numbers, requirements
//!   joined by commas, blanks between tokens), with its key and value syntax checks.
//! - Field selectors: kube's grammar (`k8s.io/apimachinery/pkg/fields`: requirements joined by
//!   commas, `field=value`, `field==value`, `field!=value`, values with kube's escapes `\,`,
//!   `\=`, `\\`; nothing trimmed). [`FieldSelector`] serves `metadata.name` and
//!   `metadata.namespace`, the fields every shared watch can answer from an event's metadata.
//! - Any field ([`parse_any`], in `any_field`): the same grammar with each field a path into
//!   the object's JSON, and (`member`) the fields kube-apiserver itself serves per resource
//!   ([`member::member_supports`]) and how it reads them; `lazy` ([`AnyFields`]) applies such a
//!   selector to an object kept as its JSON bytes, decoding only the fields it names. Served over
//!   resources in `spec.cache` (docs/cache.md), whose hubs hold every object of their key.
//!
//! [`FieldFilter`] is what a shared watch or a cached LIST applies: the metadata fast path or
//! any fields. Anything [`LabelSelector`] cannot read, or a field selector kube's grammar
//! refuses, is not served (`watch::plan` says None): the request goes to the member as it came,
//! so the member's own answer (a 400 for a bad selector) reaches the client unchanged. So does a
//! field other than name and namespace over a resource not cached.
//! Never panics on any input; the parsers are linear in the input's length (field terms are
//! sorted, as kube sorts them). Called by `watch::plan` once per client watch or LIST; the
//! matchers per delivered event or listed object.

use std::collections::BTreeMap;

/// A selector this module does not serve: the watch goes to the member unshared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported;

/// The labels of one object.
pub type Labels = BTreeMap<Box<str>, Box<str>>;

/// What a label selector reads of an object's labels: the value of a key.
pub trait LabelValues {
    fn value(&self, key: &str) -> Option<&str>;
}

impl LabelValues for Labels {
    fn value(&self, key: &str) -> Option<&str> {
        self.get(key).map(|v| &**v)
    }
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Exists,
    NotExists,
    In(Vec<String>),
    NotIn(Vec<String>),
    Greater(i64),
    Less(i64),
}

impl LabelSelector {
    /// Everything matches.
    pub fn everything() -> LabelSelector {
        LabelSelector::default()
    }

    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Reads `text` as kube-apiserver does (`labels.Parse`).
    pub fn parse(text: &str) -> Result<LabelSelector, Unsupported> {
        // kube's lexer reads a NUL byte as the end of the text: not worth imitating.
        if text.contains('\0') {
            return Err(Unsupported);
        }
        let mut lexer = Lexer::new(text);
        let mut requirements = Vec::new();
        // An empty (or blank) selector selects everything.
        if lexer.peek() == Token::End {
            return Ok(LabelSelector::everything());
        }
        loop {
            requirements.push(requirement(&mut lexer)?);
            match lexer.next() {
                Token::End => break,
                Token::Comma => {
                    // A trailing comma is an error, as kube's parser has it.
                    if lexer.peek() == Token::End {
                        return Err(Unsupported);
                    }
                }
                _ => return Err(Unsupported),
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &impl LabelValues) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.value(r.key.as_str());
            match &r.op {
                Op::Exists => value.is_some(),
                Op::NotExists => value.is_none(),
                Op::In(values) => value.is_some_and(|v| values.iter().any(|w| v == w)),
                Op::NotIn(values) => !value.is_some_and(|v| values.iter().any(|w| v == w)),
                Op::Greater(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                Op::Less(n) => value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    End,
    Ident(&'a str),
    Comma,
    OpenParen,
    CloseParen,
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    Greater,
    Less,
    In,
    NotIn,
}

/// kube's label lexer: identifiers are runs of anything but blanks and `!=,()<>`.
struct Lexer<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Lexer<'a> {
    fn new(text: &'a str) -> Self {
        Lexer { text, at: 0 }
    }

    fn peek(&mut self) -> Token<'a> {
        let at = self.at;
        let token = self.next();
        self.at = at;
        token
    }

    fn next(&mut self) -> Token<'a> {
        let bytes = self.text.as_bytes();
        while self.at < bytes.len() && is_blank(bytes[self.at]) {
            self.at += 1;
        }
        let Some(&first) = bytes.get(self.at) else {
            return Token::End;
        };
        let second = bytes.get(self.at + 1).copied();
        let (token, len) = match (first, second) {
            (b'=', Some(b'=')) => (Token::DoubleEquals, 2),
            (b'!', Some(b'=')) => (Token::NotEquals, 2),
            (b'=', _) => (Token::Equals, 1),
            (b'!', _) => (Token::Bang, 1),
            (b',', _) => (Token::Comma, 1),
            (b'(', _) => (Token::OpenParen, 1),
            (b')', _) => (Token::CloseParen, 1),
            (b'>', _) => (Token::Greater, 1),
            (b'<', _) => (Token::Less, 1),
            _ => {
                let start = self.at;
                let mut end = start;
                while end < bytes.len() && !is_blank(bytes[end]) && !is_special(bytes[end]) {
                    end += 1;
                }
                // Splits only at ASCII bytes: always a char boundary.
                let word = &self.text[start..end];
                let token = match word {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    word => Token::Ident(word),
                };
                (token, end - start)
            }
        };
        self.at += len;
        token
    }
}

fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(b: u8) -> bool {
    matches!(b, b'!' | b'=' | b',' | b'(' | b')' | b'<' | b'>')
}

fn requirement(lexer: &mut Lexer<'_>) -> Result<Requirement, Unsupported> {
    let negated = lexer.peek() == Token::Bang;
    if negated {
        lexer.next();
    }
    // Keys are read as values are: `in` and `notin` are names there.
    let key = match lexer.next() {
        Token::Ident(key) => key,
        Token::In => "in",
        Token::NotIn => "notin",
        _ => return Err(Unsupported),
    };
    check_key(key)?;
    let key = key.to_owned();
    if negated {
        // `!key` stands alone.
        return match lexer.peek() {
            Token::End | Token::Comma => Ok(Requirement {
                key,
                op: Op::NotExists,
            }),
            _ => Err(Unsupported),
        };
    }
    if matches!(lexer.peek(), Token::End | Token::Comma) {
        return Ok(Requirement {
            key,
            op: Op::Exists,
        });
    }
    let op = match lexer.next() {
        Token::Equals | Token::DoubleEquals => Op::In(vec![single_value(lexer)?]),
        Token::NotEquals => Op::NotIn(vec![single_value(lexer)?]),
        Token::In => Op::In(value_set(lexer)?),
        Token::NotIn => Op::NotIn(value_set(lexer)?),
        Token::Greater => Op::Greater(number(lexer)?),
        Token::Less => Op::Less(number(lexer)?),
        _ => return Err(Unsupported),
    };
    Ok(Requirement { key, op })
}

/// The value after `=`, `==` or `!=`: one identifier, or none (an empty value).
fn single_value(lexer: &mut Lexer<'_>) -> Result<String, Unsupported> {
    match lexer.peek() {
        Token::Ident(value) => {
            lexer.next();
            check_value(value)?;
            Ok(value.to_owned())
        }
        // `a=` and `a=,b`: the empty value.
        Token::End | Token::Comma => Ok(String::new()),
        // kube reads `in` and `notin` after an operator as values.
        Token::In => {
            lexer.next();
            Ok("in".into())
        }
        Token::NotIn => {
            lexer.next();
            Ok("notin".into())
        }
        _ => Err(Unsupported),
    }
}

/// `( v1, v2, ... )`: at least one value; empty values are allowed between commas.
fn value_set(lexer: &mut Lexer<'_>) -> Result<Vec<String>, Unsupported> {
    if lexer.next() != Token::OpenParen {
        return Err(Unsupported);
    }
    let mut values = Vec::new();
    loop {
        let value = match lexer.peek() {
            Token::Ident(value) => {
                lexer.next();
                check_value(value)?;
                value.to_owned()
            }
            Token::In => {
                lexer.next();
                "in".into()
            }
            Token::NotIn => {
                lexer.next();
                "notin".into()
            }
            Token::Comma | Token::CloseParen => String::new(),
            _ => return Err(Unsupported),
        };
        values.push(value);
        match lexer.next() {
            Token::Comma => continue,
            Token::CloseParen => break,
            _ => return Err(Unsupported),
        }
    }
    // `in ()` reads as the one empty value, as kube's parser has it.
    Ok(values)
}

fn number(lexer: &mut Lexer<'_>) -> Result<i64, Unsupported> {
    let Token::Ident(value) = lexer.next() else {
        return Err(Unsupported);
    };
    check_value(value)?;
    // Go's strconv.ParseInt: an optional sign, then decimal digits.
    let digits = value.strip_prefix(['+', '-']).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Unsupported);
    }
    value.parse::<i64>().map_err(|_| Unsupported)
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
fn check_key(key: &str) -> Result<(), Unsupported> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if !is_subdomain(prefix) {
                return Err(Unsupported);
            }
            name
        }
        None => key,
    };
    if name.is_empty() || name.len() > 63 || !is_qualified_name(name) {
        return Err(Unsupported);
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters of the qualified-name alphabet.
fn check_value(value: &str) -> Result<(), Unsupported> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 || !is_qualified_name(value) {
        return Err(Unsupported);
    }
    Ok(())
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`
fn is_qualified_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) if alnum(first) && alnum(last) => bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')),
        _ => false,
    }
}

/// A DNS-1123 subdomain: at most 253 characters, lower-case labels joined by dots.
fn is_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let bytes = label.as_bytes();
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) if alnum(first) && alnum(last) => bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-'),
                _ => false,
            }
        })
}

/// A parsed field selector on `metadata.name` and `metadata.namespace`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: Field,
    equal: bool,
    value: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
}

impl FieldSelector {
    /// Reads `text` as kube-apiserver does (`fields.ParseSelector`), for the two metadata
    /// fields every resource has; another field is [`Unsupported`].
    pub fn parse(text: &str) -> Result<FieldSelector, Unsupported> {
        let mut terms = Vec::new();
        for term in field_terms(text).map_err(|_| Unsupported)? {
            let field = match term.field {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                _ => return Err(Unsupported),
            };
            terms.push(FieldTerm {
                field,
                equal: term.equal,
                value: term.value,
            });
        }
        Ok(FieldSelector { terms })
    }

    pub fn is_everything(&self) -> bool {
        self.terms.is_empty()
    }

    /// Whether an object named `name` in `namespace` (empty: cluster-scoped) is selected.
    pub fn matches(&self, namespace: &str, name: &str) -> bool {
        self.terms.iter().all(|term| {
            let actual = match term.field {
                Field::Name => name,
                Field::Namespace => namespace,
            };
            (actual == term.value) == term.equal
        })
    }
}

/// `text` split at each `sep` not escaped by a backslash.
fn split_unescaped(text: &str, sep: u8) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut at = 0;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        while at < bytes.len() {
            match bytes[at] {
                b'\\' => at += 2,
                b if b == sep => {
                    let piece = &text[start..at];
                    at += 1;
                    start = at;
                    return Some(piece);
                }
                _ => at += 1,
            }
        }
        done = true;
        Some(&text[start.min(text.len())..])
    })
}

/// `field OP value` at the first operator (`!=`, `==` or `=`), escaped or not, as kube's
/// `splitTerm` has it; `equal` is false for `!=`.
fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    let bytes = term.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'!' if bytes.get(at + 1) == Some(&b'=') => {
                return Some((&term[..at], false, &term[at + 2..]))
            }
            b'=' if bytes.get(at + 1) == Some(&b'=') => {
                return Some((&term[..at], true, &term[at + 2..]))
            }
            b'=' => return Some((&term[..at], true, &term[at + 1..])),
            _ => at += 1,
        }
    }
    None
}

/// kube's `UnescapeValue`: `\\`, `\,` and `\=` only; any other escape, or a lone trailing
/// backslash, is an error; an unescaped `,` or `=` too. The errors carry kube's messages.
fn unescape(value: &str) -> Result<String, Refused> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(other) => {
                    return Err(Refused(format!(
                        "invalid field selector: invalid escape sequence: \\{other}"
                    )))
                }
                None => {
                    return Err(Refused(
                        "invalid field selector: invalid escape sequence: \\".into(),
                    ))
                }
            },
            // Go prints the rune with `%v`: its number.
            ',' | '=' => {
                return Err(Refused(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                )))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A field selector refused by kube's grammar (or by [`parse_any`]'s field paths), with the
/// message kube-apiserver would answer in its 400.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// One requirement of a field selector as kube's grammar reads it: the field exactly as written
/// (never trimmed, never unescaped), `=` / `==` (`equal`) or `!=`, and the unescaped value.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RawTerm<'a> {
    field: &'a str,
    equal: bool,
    value: String,
}

/// kube's `fields.ParseSelector` grammar: `text` cut at each comma no backslash escapes, empty
/// terms skipped (so `""`, `","` and `a=b,,c=d` are fine), each term cut at its first operator
/// (`!=`, `==`, `=`, tried in that order at each position), the value unescaped. The terms are
/// visited sorted, as kube's parser visits them, so the first error found is the one kube
/// reports. No blanks are trimmed anywhere: ` a=b` is the field ` a`.
fn field_terms(text: &str) -> Result<Vec<RawTerm<'_>>, Refused> {
    let mut pieces: Vec<&str> = split_unescaped(text, b',')
        .filter(|t| !t.is_empty())
        .collect();
    pieces.sort_unstable();
    pieces
        .into_iter()
        .map(|piece| {
            let (field, equal, value) = split_term(piece).ok_or_else(|| {
                Refused(format!(
                    "invalid selector: '{text}'; can't understand '{piece}'"
                ))
            })?;
            Ok(RawTerm {
                field,
                equal,
                value: unescape(value)?,
            })
        })
        .collect()
}

mod any_field;
mod field_text;
mod lazy;
pub mod member;

pub use any_field::{parse_any, AnyFieldSelector, FieldPath, FieldValues, Reading, MAX_DEPTH};
pub use field_text::FieldText;
pub use lazy::{AnyFields, Within};

/// The field selector a shared watch or a cached LIST applies to each object.
#[derive(Debug, Clone)]
pub enum FieldFilter {
    /// On `metadata.name` / `metadata.namespace` alone: an event's name and namespace answer it.
    Metadata(FieldSelector),
    /// On any fields of a cached resource, read from each object's JSON ([`AnyFields`]); built
    /// only where the hub holds every object of its key. `member_answers`: whether the member
    /// serves every field it names (then a LIST the cache cannot serve fresh enough is the
    /// member's, as it would answer it; otherwise only the cache can). `beside`: the fields are
    /// read from the JSON form's object of the same key, beside the Table form's rows, which
    /// carry only metadata (a LIST of kubectl's Tables: `watch::list`).
    Any {
        fields: Box<AnyFields>,
        member_answers: bool,
        beside: bool,
    },
}

impl Default for FieldFilter {
    fn default() -> Self {
        FieldFilter::Metadata(FieldSelector::default())
    }
}

impl FieldFilter {
    pub fn is_everything(&self) -> bool {
        match self {
            FieldFilter::Metadata(fields) => fields.is_everything(),
            FieldFilter::Any { fields, .. } => fields.selector().is_everything(),
        }
    }

    /// Whether an object named `name` in `namespace`, encoded as `json`, is selected.
    pub fn matches(&self, namespace: &str, name: &str, json: &[u8]) -> bool {
        match self {
            FieldFilter::Metadata(fields) => fields.matches(namespace, name),
            FieldFilter::Any { fields, .. } => fields.matches(json),
        }
    }

    /// Whether the selector reads fields an object's changes can change (anything but its name
    /// and namespace): a watch must then remember which objects its client holds.
    pub fn reads_changing_fields(&self) -> bool {
        matches!(self, FieldFilter::Any { .. })
    }

    /// Whether the fields are read from the JSON form's objects beside a Table's rows.
    pub fn reads_beside(&self) -> bool {
        matches!(self, FieldFilter::Any { beside: true, .. })
    }

    /// Whether the member would answer this selector itself.
    pub fn member_answers(&self) -> bool {
        match self {
            FieldFilter::Metadata(_) => true,
            FieldFilter::Any { member_answers, .. } => *member_answers,
        }
    }
}

#[cfg(test)]
mod tests;
