//! One question to the backend: the signed POST, and what its answer
//! means. Only `200` with `{"allow":true}` lets anyone in; every other
//! answer is a refusal, and no answer (none in time, no connection) is
//! `unavailable`: the policy fails closed.

use std::time::Duration;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::cache::{Grant, Kept};
use super::Verdict;

/// Bytes of an answer beyond its state that are read at most: an answer
/// is `{"allow":true,"state":...}`, and a backend's framework may pretty
/// print it.
const ANSWER_SLACK_BYTES: usize = 16 * 1024;

/// What a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// `200` with `{"allow":true}`.
    Allowed,
    /// `200` with `{"allow":false}`, or a 4xx.
    Refused,
    /// Another status.
    Failed,
    /// A `200` whose body is not an answer (or whose state is not a JSON
    /// object within the limit).
    Invalid,
    /// No answer within the timeout.
    Timeout,
    /// No connection, or it broke before the answer.
    Unreachable,
}

impl Outcome {
    /// Its `outcome` label (`crate::metrics::ROOM_JOIN_OUTCOMES`).
    pub(super) fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
            Outcome::Invalid => "invalid",
            Outcome::Timeout => "timeout",
            Outcome::Unreachable => "unreachable",
        }
    }
}

/// An answer, read.
#[derive(Debug)]
pub(super) struct Answer {
    /// What it came to.
    pub outcome: Outcome,
    /// What it decides.
    pub verdict: Verdict,
    /// How long the answer may be kept, by its `Cache-Control`: `None`
    /// when it said nothing.
    pub max_age: Option<Duration>,
}

/// The body of a backend's answer.
#[derive(Deserialize)]
struct Reply {
    /// Let in or not.
    allow: bool,
    /// The state that replaces the device's own.
    #[serde(default)]
    state: Option<Box<RawValue>>,
}

/// What went wrong on the way.
enum Failure {
    /// No connection, or it broke.
    Unreachable(String),
    /// The body is larger than the limit.
    TooLarge,
}

/// POSTs `body` to `url`, signed with `secret`, and reads the answer
/// within `timeout`; a state in it is at most `max_state_bytes`.
pub(super) async fn ask(
    client: &reqwest::Client,
    url: &str,
    secret: &[u8],
    body: String,
    timeout: Duration,
    max_state_bytes: usize,
    asked_at: i64,
) -> Answer {
    let request = crate::webhooks::signed_post(client, url, secret, body);
    let limit = max_state_bytes + ANSWER_SLACK_BYTES;
    let exchange = async {
        let mut res = request
            .send()
            .await
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        let status = res.status();
        let max_age = max_age(res.headers());
        let mut body = Vec::new();
        while let Some(chunk) = res
            .chunk()
            .await
            .map_err(|e| Failure::Unreachable(e.to_string()))?
        {
            if body.len() + chunk.len() > limit {
                return Err(Failure::TooLarge);
            }
            body.extend_from_slice(&chunk);
        }
        Ok((status, max_age, body))
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => unavailable(
            Outcome::Timeout,
            format!("no answer within {} ms", timeout.as_millis()),
        ),
        Ok(Err(Failure::Unreachable(e))) => {
            unavailable(Outcome::Unreachable, format!("cannot reach it: {e}"))
        }
        Ok(Err(Failure::TooLarge)) => refused(
            Outcome::Invalid,
            format!("its answer is over {limit} bytes"),
            None,
        ),
        Ok(Ok((status, max_age, body))) => read(status, max_age, &body, max_state_bytes, asked_at),
    }
}

/// What an answer with `status` and `body` decides.
fn read(
    status: reqwest::StatusCode,
    max_age: Option<Duration>,
    body: &[u8],
    max_state_bytes: usize,
    asked_at: i64,
) -> Answer {
    if status != reqwest::StatusCode::OK {
        let outcome = if status.is_client_error() {
            Outcome::Refused
        } else {
            Outcome::Failed
        };
        return refused(outcome, format!("it answered {status}"), max_age);
    }
    let reply: Reply = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return refused(
                Outcome::Invalid,
                format!("its answer is not {{\"allow\":true|false}}: {e}"),
                max_age,
            )
        }
    };
    if !reply.allow {
        return refused(Outcome::Refused, "it answered allow:false".into(), max_age);
    }
    match reply.state.as_deref().map(|s| state(s, max_state_bytes)) {
        None | Some(Ok(None)) => allowed(None, max_age, asked_at),
        Some(Ok(Some(state))) => allowed(Some(state), max_age, asked_at),
        Some(Err(why)) => refused(Outcome::Invalid, why, max_age),
    }
}

/// The state of an answer, serialized as a device's own would be: `None`
/// for `null`; an error unless it is a JSON object within the limit.
fn state(raw: &RawValue, max_state_bytes: usize) -> Result<Option<String>, String> {
    let value: serde_json::Value =
        serde_json::from_str(raw.get()).map_err(|e| format!("its state does not parse: {e}"))?;
    if value.is_null() {
        return Ok(None);
    }
    if !value.is_object() {
        return Err("its state is not a JSON object".into());
    }
    let text = value.to_string();
    if text.len() > max_state_bytes {
        return Err(format!(
            "its state is {} bytes; at most {max_state_bytes} are allowed (--max-room-state-bytes)",
            text.len()
        ));
    }
    Ok(Some(text))
}

fn allowed(state: Option<String>, max_age: Option<Duration>, asked_at: i64) -> Answer {
    Answer {
        outcome: Outcome::Allowed,
        verdict: Verdict::Allow(Grant {
            state: state.map(Into::into),
            asked_at,
        }),
        max_age,
    }
}

fn refused(outcome: Outcome, why: String, max_age: Option<Duration>) -> Answer {
    Answer {
        outcome,
        verdict: Verdict::Refuse(why.into()),
        max_age,
    }
}

fn unavailable(outcome: Outcome, why: String) -> Answer {
    Answer {
        outcome,
        verdict: Verdict::Unavailable(why.into()),
        max_age: None,
    }
}

/// How long an answer may be kept, by its `Cache-Control`: `no-store`
/// and `no-cache` say not at all, `max-age=<s>` that long (the least of
/// several); `None` when it says nothing of either.
fn max_age(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let mut least: Option<Duration> = None;
    for value in headers.get_all(reqwest::header::CACHE_CONTROL) {
        let Ok(value) = value.to_str() else {
            // Unreadable: as if it forbade keeping the answer.
            return Some(Duration::ZERO);
        };
        for directive in value.split(',') {
            let directive = directive.trim().to_ascii_lowercase();
            let age = match directive.split_once('=') {
                None if directive == "no-store" || directive == "no-cache" => Duration::ZERO,
                Some(("max-age", secs)) => secs
                    .trim()
                    .trim_matches('"')
                    .parse::<u64>()
                    .map_or(Duration::ZERO, Duration::from_secs),
                _ => continue,
            };
            least = Some(least.map_or(age, |l| l.min(age)));
        }
    }
    least
}

/// How long an answer is kept: an allowed one for `cache` unless its
/// `Cache-Control` says less, a refusal only as long as its
/// `Cache-Control` says (and no longer than `cache`), no answer never.
pub(super) fn keep_for(answer: &Answer, cache: Duration) -> Option<(Kept, Duration)> {
    let (kept, default) = match &answer.verdict {
        Verdict::Allow(grant) => (Kept::Allowed(grant.clone()), cache),
        Verdict::Refuse(why) => (Kept::Refused(why.clone()), Duration::ZERO),
        Verdict::Unavailable(_) => return None,
    };
    Some((kept, answer.max_age.unwrap_or(default).min(cache)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue, CACHE_CONTROL};
    use reqwest::StatusCode;

    const MAX: usize = 64;

    fn grant(state: Option<&str>) -> Grant {
        Grant {
            state: state.map(Into::into),
            asked_at: 7,
        }
    }

    fn verdict(status: u16, body: &str) -> Verdict {
        read(
            StatusCode::from_u16(status).unwrap(),
            None,
            body.as_bytes(),
            MAX,
            7,
        )
        .verdict
    }

    #[test]
    fn only_a_200_that_allows_lets_in() {
        assert_eq!(
            verdict(200, r#"{"allow":true}"#),
            Verdict::Allow(grant(None))
        );
        assert_eq!(
            verdict(
                200,
                r#"{ "allow": true, "state": {"role": "mod"}, "x": 1 }"#
            ),
            Verdict::Allow(grant(Some(r#"{"role":"mod"}"#)))
        );
        assert_eq!(
            verdict(200, r#"{"allow":true,"state":null}"#),
            Verdict::Allow(grant(None))
        );
        for (status, body) in [
            (200, r#"{"allow":false}"#),
            (200, r#"{"allow":"yes"}"#),
            (200, r#"{}"#),
            (200, "allow"),
            (200, ""),
            (200, r#"{"allow":true,"state":[1]}"#),
            (200, r#"{"allow":true,"state":"x"}"#),
            (
                200,
                &format!(r#"{{"allow":true,"state":{{"a":"{}"}}}}"#, "x".repeat(MAX)),
            ),
            (201, r#"{"allow":true}"#),
            (204, ""),
            (302, r#"{"allow":true}"#),
            (403, r#"{"allow":true}"#),
            (500, r#"{"allow":true}"#),
        ] {
            assert!(
                matches!(verdict(status, body), Verdict::Refuse(_)),
                "{status} {body}"
            );
        }
    }

    #[test]
    fn each_answer_has_its_outcome() {
        let outcome = |status: u16, body: &str| {
            read(
                StatusCode::from_u16(status).unwrap(),
                None,
                body.as_bytes(),
                MAX,
                7,
            )
            .outcome
        };
        assert_eq!(outcome(200, r#"{"allow":true}"#), Outcome::Allowed);
        assert_eq!(outcome(200, r#"{"allow":false}"#), Outcome::Refused);
        assert_eq!(outcome(403, ""), Outcome::Refused);
        assert_eq!(outcome(500, ""), Outcome::Failed);
        assert_eq!(outcome(200, "{"), Outcome::Invalid);
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(CACHE_CONTROL, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn cache_control_says_how_long() {
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(max_age(&headers(&[])), None);
        assert_eq!(max_age(&headers(&["max-age=30"])), secs(30));
        assert_eq!(max_age(&headers(&["private, Max-Age=\"7\""])), secs(7));
        assert_eq!(max_age(&headers(&["max-age=30", "max-age=5"])), secs(5));
        assert_eq!(max_age(&headers(&["max-age=30, no-store"])), secs(0));
        assert_eq!(max_age(&headers(&["no-cache"])), secs(0));
        assert_eq!(max_age(&headers(&["max-age=soon"])), secs(0));
        assert_eq!(max_age(&headers(&["public"])), None);
    }

    #[test]
    fn refusals_are_kept_only_as_long_as_the_backend_says() {
        let cache = Duration::from_secs(60);
        let answer = |verdict, max_age| Answer {
            outcome: Outcome::Allowed,
            verdict,
            max_age,
        };
        let no = || Verdict::Refuse("no".into());
        let keep = |a: &Answer| keep_for(a, cache).map(|(_, d)| d);
        assert_eq!(
            keep(&answer(Verdict::Allow(grant(None)), None)),
            Some(cache)
        );
        assert_eq!(
            keep(&answer(
                Verdict::Allow(grant(None)),
                Some(Duration::from_secs(5))
            )),
            Some(Duration::from_secs(5))
        );
        assert_eq!(keep(&answer(no(), None)), Some(Duration::ZERO));
        assert_eq!(
            keep(&answer(no(), Some(Duration::from_secs(10)))),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            keep(&answer(no(), Some(Duration::from_secs(3_600)))),
            Some(cache)
        );
        assert_eq!(
            keep(&answer(Verdict::Unavailable("down".into()), None)),
            None
        );
    }
}
