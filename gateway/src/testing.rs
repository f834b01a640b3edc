//! What the unit tests of several stations share, a leaf that imports no station (so a low
//! station's tests need not reach up to a higher one): a routing table built from YAML, and the
//! corpora of byte strings (`tests/fixtures/cases`) that parsers' tests feed them.

use fleetgate_config_watcher::RouteTable;

/// A routing table of a minimal Gateway and the `clusters` objects (YAML), for unit tests.
pub(crate) fn test_table(clusters: &str) -> RouteTable {
    let yaml = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata: {{name: g}}\nspec:\n  \
         listeners: [{{name: http, address: \"127.0.0.1:0\", tls: false}}]\n---\n{clusters}"
    );
    let files = [(std::path::PathBuf::from("/t/c.yaml"), yaml)];
    let config = fleetgate_config_watcher::load_texts(std::path::Path::new("/t"), &files).unwrap();
    RouteTable::build(&config).unwrap()
}

/// The byte strings of `tests/fixtures/cases/{name}.txt`: a corpus of inputs one parser's unit
/// test feeds it (hostile or cut-short ones), kept as data beside the recorded fixtures.
///
/// One case a line, written as a double-quoted string with the escapes `\r`, `\n`, `\t`, `\\`,
/// `\"` and `\xNN` (any byte); `""` is the empty input. Blank lines and lines that start with `#`
/// are passed over. A malformed line, or a file without a case, fails the test that reads it.
pub(crate) fn byte_cases(name: &str) -> Vec<Vec<u8>> {
    let path = format!(
        "{}/tests/fixtures/cases/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let cases: Vec<Vec<u8>> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|(at, line)| {
            unquote(line).unwrap_or_else(|| panic!("{path}:{}: not a quoted case", at + 1))
        })
        .collect();
    assert!(!cases.is_empty(), "{path} holds no case");
    cases
}

/// The bytes of one quoted case line, or `None` if it is not one.
fn unquote(line: &str) -> Option<Vec<u8>> {
    let inner = line.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = Vec::with_capacity(inner.len());
    let mut bytes = inner.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'"' => return None,
            b'\\' => out.push(match bytes.next()? {
                b'r' => b'\r',
                b'n' => b'\n',
                b't' => b'\t',
                b'\\' => b'\\',
                b'"' => b'"',
                b'x' => {
                    let hex = [bytes.next()?, bytes.next()?];
                    u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?
                }
                _ => return None,
            }),
            b => out.push(b),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::unquote;

    #[test]
    fn case_lines_unquote_with_their_escapes() {
        assert_eq!(unquote(r#""""#), Some(vec![]));
        assert_eq!(unquote(r#""5;a\x01\r\n""#), Some(b"5;a\x01\r\n".to_vec()));
        assert_eq!(unquote(r#""{\"k\":\\}\t""#), Some(b"{\"k\":\\}\t".to_vec()));
        assert_eq!(unquote(r#""\xff\xfe""#), Some(vec![0xff, 0xfe]));
        for bad in [
            r#"abc"#,
            r#""a"b""#,
            r#""\q""#,
            r#""\x4""#,
            r#""\xzz""#,
            r#""\""#,
        ] {
            assert_eq!(unquote(bad), None, "{bad}");
        }
    }
}
