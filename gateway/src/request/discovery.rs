//! Which Kubernetes discovery document a path names (`/api`, `/api/VERSION`, `/apis`,
//! `/apis/GROUP`, `/apis/GROUP/VERSION`), and whether a set of merged kinds shows in it: how
//! `decide` classifies a fleet-view discovery request. The document is asked of a member and
//! filtered by `fleet::discovery`.

/// Which discovery document a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Document<'a> {
    /// `/api`: APIVersions.
    Versions,
    /// `/apis`: APIGroupList.
    Groups,
    /// `/apis/GROUP`: APIGroup.
    Group(&'a str),
    /// `/api/VERSION` (group empty) or `/apis/GROUP/VERSION`: APIResourceList.
    Resources { group: &'a str, version: &'a str },
    /// Under `/api` or `/apis`, but no document kube serves: a 404, no member asked.
    Nothing,
}

/// A merged kind as discovery sees it: group, version, plural resource.
pub type MergedKind<'a> = (&'a str, &'a str, &'a str);

impl<'a> Document<'a> {
    /// The document `rest` (a kube path, one trailing `/` allowed) names, if it is under `/api`
    /// or `/apis`.
    pub fn of(rest: &'a [u8]) -> Option<Document<'a>> {
        let path = std::str::from_utf8(rest).ok()?;
        let path = path.strip_suffix('/').unwrap_or(path);
        let mut parts = path.strip_prefix('/')?.split('/');
        let top = parts.next()?;
        if top != "api" && top != "apis" {
            return None;
        }
        let segments: Vec<&str> = parts.collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Some(Document::Nothing);
        }
        Some(match (top, segments.as_slice()) {
            ("api", []) => Document::Versions,
            ("api", [version]) => Document::Resources { group: "", version },
            ("apis", []) => Document::Groups,
            ("apis", [group]) => Document::Group(group),
            ("apis", [group, version]) => Document::Resources { group, version },
            _ => Document::Nothing,
        })
    }

    /// Whether any of `kinds` shows in this document (else it is a 404 without asking).
    pub fn shows_any(&self, kinds: &[MergedKind<'_>]) -> bool {
        match *self {
            Document::Versions => kinds.iter().any(|(g, _, _)| g.is_empty()),
            Document::Groups => kinds.iter().any(|(g, _, _)| !g.is_empty()),
            Document::Group(group) => kinds.iter().any(|(g, _, _)| *g == group),
            Document::Resources { group, version } => {
                kinds.iter().any(|(g, v, _)| *g == group && *v == version)
            }
            Document::Nothing => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn paths_name_their_documents() {
        fn of(p: &str) -> Option<Document<'_>> {
            Document::of(p.as_bytes())
        }
        assert_eq!(of("/api"), Some(Document::Versions));
        assert_eq!(of("/api/"), Some(Document::Versions));
        assert_eq!(
            of("/api/v1"),
            Some(Document::Resources {
                group: "",
                version: "v1"
            })
        );
        assert_eq!(of("/apis"), Some(Document::Groups));
        assert_eq!(of("/apis/apps"), Some(Document::Group("apps")));
        assert_eq!(
            of("/apis/apps/v1"),
            Some(Document::Resources {
                group: "apps",
                version: "v1"
            })
        );
        for nothing in ["/apis//v1", "/api//", "/apis/a/b/c", "/api/v1/x"] {
            assert_eq!(of(nothing), Some(Document::Nothing), "{nothing}");
        }
        for other in ["/version", "/openapi/v2", "/apix", "", "/", "/healthz"] {
            assert_eq!(of(other), None, "{other}");
        }
    }

    proptest! {
        // Any path a client sends: no panic, nothing outside /api and /apis named a document,
        // and a named group or version is a whole segment of the path.
        #[test]
        fn hostile_paths_name_no_document_they_do_not_spell(
            path in proptest::collection::vec(
                prop_oneof![Just(b'/'), Just(b'a'), Just(b'p'), Just(b'i'), Just(b's'), any::<u8>()],
                0..24,
            ),
        ) {
            let text = String::from_utf8_lossy(&path);
            match Document::of(&path) {
                None => {}
                Some(document) => {
                    prop_assert!(text.starts_with("/api"), "{text}");
                    let segments: Vec<&str> = text.split('/').collect();
                    match document {
                        Document::Group(group) => prop_assert!(segments.contains(&group)),
                        Document::Resources { group, version } => {
                            prop_assert!(group.is_empty() || segments.contains(&group));
                            prop_assert!(segments.contains(&version));
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
