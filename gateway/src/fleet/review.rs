//! A SelfSubjectAccessReview through the fleet view (`kubectl --context fleet auth can-i VERB
//! RESOURCE`): the client's review, as it sent it (JSON or protobuf, as kubectl does), is created
//! in every cluster the user may reach, as the user (impersonated as for any request; at most
//! `spec.fleet.membersAtOnce` at a time), each answer asked for as JSON so it can be read here.
//!
//! The fleet allows what every one of its clusters allows: the answer is a member's review with
//! `status.allowed` true only when every member answered true, and a member that could not
//! answer counts as a denial. When the clusters do not agree, a `Warning` names which allowed,
//! which denied and which did not answer, and the review's `status.reason` says the same when
//! the denying member gave no reason of its own (kubectl prints `no - REASON`). No member
//! answering at all is a 503 naming why.
//!
//! Called by the pipeline (`handle`) with the request body the front-end read whole, at most
//! [`MAX_REVIEW_BYTES`]. Rules reviews and SelfSubjectReviews never come here:
//! `request::decide` refuses the first and sends the second to one member.

use bytes::Bytes;
use futures_util::future::join_all;
use serde_json::Value;

use super::{FleetClient, View};
use crate::errors::GatewayError;
use crate::exchange::Failure;
use crate::member::ask::{post_as, Asked, Missed, Posted};
use crate::request::FleetReview;

/// The largest review body the fleet view reads (a review is well under a KiB; the body is held
/// while the members are asked).
pub const MAX_REVIEW_BYTES: usize = 64 << 10;

/// What a front-end answers a review body larger than [`MAX_REVIEW_BYTES`] with.
pub fn too_large() -> GatewayError {
    GatewayError::BadRequest {
        reason: "a review through the fleet view is larger than 64 KiB",
    }
}

/// Asks every member of `review` for the client's `body` and answers with the fleet's review.
pub(crate) async fn serve(
    view: &View<'_>,
    review: &FleetReview<'_>,
    body: &[u8],
    client: &mut impl FleetClient,
) -> Result<(), Failure> {
    let (ctx, client_request) = (view.ctx, &view.client_request);
    let content_type = client_request
        .header(b"content-type")
        .unwrap_or(b"application/json");
    let asked = Asked {
        rest: review.rest,
        query: review.query,
        verb: review.verb,
    };
    let posted = Posted { body, content_type };
    let mut answers = Vec::with_capacity(review.members.len());
    for batch in review
        .members
        .chunks(review.settings.members_at_once.max(1))
    {
        let asking = batch.iter().map(|(cluster, identity)| {
            post_as(ctx, &asked, posted, client_request, cluster, identity)
        });
        answers.extend(join_all(asking).await);
    }
    let answered = review
        .members
        .iter()
        .zip(answers)
        .map(|((cluster, _), answer)| (cluster.name.as_ref(), read(answer)));
    let merged = merge(answered)?;
    let warnings: Vec<String> = merged.warning.into_iter().collect();
    client.head("application/json", &warnings).await?;
    client.body(Bytes::from(merged.body)).await?;
    client.end().await
}

/// One member's answer: its review and whether it allows, or why there is none.
enum Answered {
    Review(Value, bool),
    Missing(String),
}

fn read(answer: Result<Vec<u8>, Missed>) -> Answered {
    let body = match answer {
        Ok(body) => body,
        Err(Missed::Answered(code, message)) => {
            return Answered::Missing(format!("it answered {code}: {message}"))
        }
        Err(Missed::Failed(reason)) => return Answered::Missing(reason),
    };
    let review = serde_json::from_slice::<Value>(&body).ok();
    let allowed = review
        .as_ref()
        .and_then(|r| r.pointer("/status/allowed"))
        .and_then(Value::as_bool);
    match (review, allowed) {
        (Some(review), Some(allowed)) => Answered::Review(review, allowed),
        _ => Answered::Missing("its answer is not an access review".into()),
    }
}

/// The fleet's review (JSON) and the warning naming where the clusters differ.
struct Merged {
    body: Vec<u8>,
    warning: Option<String>,
}

fn merge<'a>(answers: impl Iterator<Item = (&'a str, Answered)>) -> Result<Merged, GatewayError> {
    let (mut allowed, mut denied, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    // The review answered with: the first denial (its reason says why), else the first review.
    let mut chosen: Option<(Value, bool)> = None;
    for (cluster, answer) in answers {
        match answer {
            Answered::Review(review, allows) => {
                if allows {
                    allowed.push(cluster);
                } else {
                    denied.push(cluster);
                }
                if chosen
                    .as_ref()
                    .is_none_or(|(_, chosen_allows)| *chosen_allows && !allows)
                {
                    chosen = Some((review, allows));
                }
            }
            Answered::Missing(reason) => missing.push(format!("{cluster} ({reason})")),
        }
    }
    let Some((mut review, chosen_allows)) = chosen else {
        return Err(GatewayError::FleetReviewUnavailable {
            reasons: missing.join("; "),
        });
    };
    let agreed = missing.is_empty() && (allowed.is_empty() || denied.is_empty());
    let warning = (!agreed).then(|| {
        let mut parts = Vec::new();
        if !allowed.is_empty() {
            parts.push(format!("allowed on {}", allowed.join(", ")));
        }
        if !denied.is_empty() {
            parts.push(format!("denied on {}", denied.join(", ")));
        }
        if !missing.is_empty() {
            parts.push(format!("no answer from {}", missing.join(", ")));
        }
        parts.join("; ")
    });
    let allows = denied.is_empty() && missing.is_empty();
    if let Some(status) = review.get_mut("status").and_then(Value::as_object_mut) {
        status.insert("allowed".into(), Value::Bool(allows));
        if chosen_allows && !allows {
            // Denied for want of an answer, not by an authorizer.
            status.remove("denied");
        }
        let has_reason = status
            .get("reason")
            .and_then(Value::as_str)
            .is_some_and(|r| !r.is_empty());
        if let (Some(warning), false, false) = (&warning, has_reason, allows) {
            status.insert("reason".into(), Value::String(warning.clone()));
        }
    }
    Ok(Merged {
        body: serde_json::to_vec(&review).unwrap_or_default(),
        warning,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review(allowed: bool, reason: &str) -> Answered {
        let mut status = json!({"allowed": allowed});
        if !reason.is_empty() {
            status["reason"] = json!(reason);
        }
        Answered::Review(
            json!({"kind": "SelfSubjectAccessReview", "spec": {}, "status": status}),
            allowed,
        )
    }

    fn merged(answers: Vec<(&str, Answered)>) -> (Value, Option<String>) {
        let merged = merge(answers.into_iter()).unwrap_or_else(|e| panic!("{e}"));
        (
            serde_json::from_slice(&merged.body).unwrap(),
            merged.warning,
        )
    }

    #[test]
    fn the_fleet_allows_only_what_every_cluster_allows() {
        let (all, warning) = merged(vec![("m1", review(true, "")), ("m2", review(true, ""))]);
        assert_eq!(all["status"], json!({"allowed": true}));
        assert_eq!(warning, None);

        let (none, warning) = merged(vec![("m1", review(false, "")), ("m2", review(false, ""))]);
        assert_eq!(none["status"], json!({"allowed": false}));
        assert_eq!(warning, None);

        let (some, warning) = merged(vec![
            ("m1", review(true, "")),
            ("m2", review(false, "")),
            ("m3", review(true, "")),
        ]);
        let warning = warning.unwrap();
        assert_eq!(warning, "allowed on m1, m3; denied on m2");
        assert_eq!(some["status"], json!({"allowed": false, "reason": warning}));

        // A member's own reason is kept: it says why it denied.
        let (own, _) = merged(vec![
            ("m1", review(true, "")),
            ("m2", review(false, "RBAC")),
        ]);
        assert_eq!(own["status"], json!({"allowed": false, "reason": "RBAC"}));
    }

    #[test]
    fn a_cluster_that_does_not_answer_denies_and_is_named() {
        let (review_, warning) = merged(vec![
            ("m1", review(true, "")),
            ("m2", Answered::Missing("connect failed".into())),
        ]);
        let warning = warning.unwrap();
        assert_eq!(warning, "allowed on m1; no answer from m2 (connect failed)");
        assert_eq!(review_["status"]["allowed"], json!(false));
        let none = merge(
            vec![
                ("m1", Answered::Missing("a".into())),
                ("m2", Answered::Missing("b".into())),
            ]
            .into_iter(),
        );
        assert!(matches!(
            none,
            Err(GatewayError::FleetReviewUnavailable { reasons }) if reasons == "m1 (a); m2 (b)"
        ));
    }

    #[test]
    fn an_answer_that_is_not_a_review_is_no_answer() {
        assert!(matches!(
            read(Ok(br#"{"status":{}}"#.to_vec())),
            Answered::Missing(_)
        ));
        assert!(matches!(
            read(Ok(b"\x0a\x01".to_vec())),
            Answered::Missing(_)
        ));
        assert!(matches!(
            read(Err(Missed::Answered(403, "no".into()))),
            Answered::Missing(m) if m == "it answered 403: no"
        ));
    }
}
