//! The keyed `tools/call`: effectively-once through the library's agent gateway.
//!
//! A call whose `params._meta` carries `io.idemdb/task` and `io.idemdb/step` (a string, or a
//! step number as a number or its decimal string) is keyed by (task, step, tool) under the
//! gateway's tenant, and one that carries a ready `io.idemdb/key` by that key; nothing is read
//! from `arguments`. The claim is durable before the call is
//! forwarded, with `_meta["io.idemdb/key"]` added so the tool can pass the key on. The
//! upstream's result (an `isError` result too: that is the tool's outcome) is stored and
//! replayed to every retry, reworded or not, with `io.idemdb/replayed` and
//! `io.idemdb/argumentsChanged` in its `_meta`. A JSON-RPC error from the upstream releases the
//! key. An upstream that ends mid-call leaves the outcome unknown: the claim stays in progress
//! as an orphan (the store never takes it over by itself), and retries are told so at once
//! until it is resolved; for an upstream that honours the key, a retry forwards the call again
//! under the same key. A call in flight renews its lease every third of it.

use crate::message;
use crate::report::Counted;
use idemdb::agent::{Gateway, Outcome, ToolCallKey};
use idemdb::{Attempt, Failure};
use serde_json::{json, Value};
use std::sync::mpsc;
use std::time::Duration;

/// How the gateway keys calls: one for the whole gateway, shared by its sessions.
pub(crate) struct Keying {
    pub(crate) gateway: Gateway,
    /// Which tools are keyed, and which upstreams honour the key.
    pub(crate) rules: crate::rules::ToolRules,
    /// Strict mode: a call of a tool that is not read-only must be keyed, and a retry with
    /// other arguments is refused (the gateway's `ArgumentPolicy::Strict`) instead of replayed.
    pub(crate) strict: bool,
}

/// The `_meta` keys the gateway reads and writes.
pub(crate) const TASK: &str = "io.idemdb/task";
pub(crate) const STEP: &str = "io.idemdb/step";
pub(crate) const KEY: &str = "io.idemdb/key";
pub(crate) const REPLAYED: &str = "io.idemdb/replayed";
pub(crate) const ARGUMENTS_CHANGED: &str = "io.idemdb/argumentsChanged";

/// JSON-RPC codes of the gateway's own answers.
pub(crate) const INVALID_PARAMS: i64 = -32602;
pub(crate) const IN_PROGRESS: i64 = -32001;
pub(crate) const UNKNOWN_OUTCOME: i64 = -32002;
pub(crate) const STORE_FAILED: i64 = -32003;

/// The key of a `tools/call`'s params, if the harness gave one: `Ok(None)` for an unkeyed
/// call, `Err` (what is wrong) for a key given badly.
pub(crate) fn key_of(params: &Value) -> Result<Option<ToolCallKey>, String> {
    let meta = &params["_meta"];
    let (task, step) = (&meta[TASK], &meta[STEP]);
    let tool = params["name"].as_str();
    if let Some(given) = meta.get(KEY).filter(|k| !k.is_null()) {
        if !(task.is_null() && step.is_null()) {
            return Err(format!("give _meta.{KEY}, or {TASK} and {STEP}, not both"));
        }
        let given = given
            .as_str()
            .ok_or_else(|| format!("_meta.{KEY} must be a string"))?;
        let tool = tool.ok_or("a tools/call without a tool name")?;
        return ToolCallKey::given(given, tool)
            .map(Some)
            .map_err(|e| format!("_meta.{KEY}: {e}"));
    }
    if task.is_null() && step.is_null() {
        return Ok(None);
    }
    let task = match task {
        Value::String(s) if !s.is_empty() => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => {
            return Err(format!(
                "_meta.{TASK} must be a non-empty string or a number"
            ))
        }
    };
    let step = match step {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("_meta.{STEP} must be a non-negative integer, or its decimal string"))?;
    let tool = tool.ok_or("a tools/call without a tool name")?;
    Ok(Some(ToolCallKey::new(&task, step, tool)))
}

/// What the forwarded call came back with.
pub(crate) enum Upstream {
    /// The JSON-RPC response (a `result` or an `error`).
    Answered(Value),
    /// No answer: the upstream ended (or the gateway did) after the call was sent.
    Lost,
}

impl Keying {
    /// How often a keyed call in flight renews its claim's lease: every third of it, so that
    /// a claim whose lease ran out was lost with its gateway, not merely slow.
    pub(crate) fn renew_every(&self) -> Duration {
        self.gateway.store().lease_duration() / 3
    }
}

/// Waits for a forwarded call's answer on `answer`, renewing `attempt`'s lease every `renew`.
/// The sender dropped unsent means the upstream was lost with the call.
pub(crate) fn await_answer(
    answer: &mpsc::Receiver<Value>,
    attempt: &Attempt,
    renew: Duration,
) -> Upstream {
    let lease = renew * 3;
    loop {
        match answer.recv_timeout(renew) {
            Ok(response) if message::is_lost(&response) => return Upstream::Lost,
            Ok(response) => return Upstream::Answered(response),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Upstream::Lost,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // A renewal that fails (the claim was resolved by an operator meanwhile)
                // shows at the completion, as LeaseLost.
                let _ = attempt.extend_lease(lease);
            }
        }
    }
}

/// Runs a keyed call of `tenant`'s (blocking: on a blocking thread). `forward` sends the call
/// upstream (with the key in its `_meta`) and waits for what comes back; it is called again
/// (same key) for a retry of a lost call whose upstream honours the key. Returns the JSON-RPC
/// response for the client's request `id`, and what became of the call.
pub(crate) fn call(
    keying: &Keying,
    tenant: &str,
    key: &ToolCallKey,
    id: &Value,
    params: &Value,
    mut forward: impl FnMut(&str, &Attempt) -> Upstream,
) -> (Value, Counted) {
    let arguments = params["arguments"].to_string();
    let mut run = || {
        keying
            .gateway
            .call(tenant, key, arguments.as_bytes(), |attempt| {
                match forward(key.as_str(), attempt) {
                    Upstream::Answered(response) => match response.get("error") {
                        Some(error) => Err(Failure::Transient(error.to_string().into_bytes())),
                        None => Ok(response["result"].to_string().into_bytes()),
                    },
                    Upstream::Lost => Err(Failure::Ambiguous(Vec::new())),
                }
            })
    };
    let mut outcome = run();
    if matches!(outcome, Ok(Outcome::Orphaned)) && keying.rules.honours_key(key.tool()) {
        // The upstream runs a key's side effect at most once itself: asking it again under
        // the same key settles the lost call with the upstream's own answer.
        outcome = keying.gateway.release_lost(tenant, key).and_then(|_| run());
    }
    match outcome {
        Ok(Outcome::Executed { result, .. }) => {
            (result_reply(id, &result, key, None), Counted::Executed)
        }
        Ok(Outcome::Replayed {
            result,
            arguments_changed,
        }) => (
            result_reply(id, &result, key, Some(arguments_changed)),
            Counted::Replayed,
        ),
        Ok(Outcome::InProgress { retry_after }) => (
            message::error_with(
                id,
                IN_PROGRESS,
                "this step is in progress in another call (one lost with another gateway \
             instance is listed by `idemdb list --state stale` once its lease ends)",
                json!({"key": key.as_str(), "retryAfterMs": retry_after.as_millis() as u64}),
            ),
            Counted::InProgress,
        ),
        Ok(Outcome::Released { error }) => {
            let error: Value = serde_json::from_slice(&error).unwrap_or(Value::Null);
            (
                json!({"jsonrpc": "2.0", "id": id, "error": error}),
                Counted::Released,
            )
        }
        Ok(Outcome::Unresolved { .. }) => (
            message::error_with(
                id,
                UNKNOWN_OUTCOME,
                "the upstream ended while this step ran: whether its side effect happened is \
             unknown, so it is not run again; `idemdb resolve` settles it",
                json!({"key": key.as_str()}),
            ),
            Counted::Unknown,
        ),
        Ok(Outcome::Orphaned) => (
            message::error_with(
                id,
                UNKNOWN_OUTCOME,
                "an earlier call of this step was lost mid-way (its upstream or gateway ended): \
                 whether its side effect happened is unknown, so it is not run again; \
                 `idemdb list --state orphan` shows it, `idemdb resolve` settles it",
                json!({"key": key.as_str()}),
            ),
            Counted::Unknown,
        ),
        Ok(Outcome::Mismatch { .. }) => (
            message::error_with(
                id,
                INVALID_PARAMS,
                "this step's key was used with other arguments",
                json!({"key": key.as_str()}),
            ),
            Counted::Refused,
        ),
        Ok(_) => (
            message::error_with(
                id,
                STORE_FAILED,
                "an outcome this gateway does not know",
                json!({}),
            ),
            Counted::Failed,
        ),
        Err(e) => (
            message::error_with(
                id,
                STORE_FAILED,
                &format!("the gateway's store failed: {e}"),
                json!({"key": key.as_str()}),
            ),
            Counted::Failed,
        ),
    }
}

fn result_reply(
    id: &Value,
    stored: &Result<Vec<u8>, Vec<u8>>,
    key: &ToolCallKey,
    replay: Option<bool>,
) -> Value {
    let bytes = match stored {
        Ok(bytes) | Err(bytes) => bytes,
    };
    let mut result: Value = serde_json::from_slice(bytes).unwrap_or_else(|_| json!({}));
    // A result that is not an object (no tool's answer should be) is passed on as it came.
    if let Some(object) = result.as_object_mut() {
        let meta = object.entry("_meta").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        meta[KEY] = json!(key.as_str());
        if let Some(changed) = replay {
            meta[REPLAYED] = json!(true);
            meta[ARGUMENTS_CHANGED] = json!(changed);
        }
    }
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream's result that is not an object (a string, an array, null) panicked the
    /// keyed reply, which wrote `_meta` into it: the call was never answered. It is passed on
    /// as it came; an object gets the key (and the replay's marks) in its `_meta`.
    #[test]
    fn a_result_of_any_shape_is_answered_never_a_panic() {
        let key = ToolCallKey::new("t", 1, "x");
        for stored in [
            json!("text"),
            json!([1, 2]),
            json!(null),
            json!(7),
            json!({"_meta": 5}),
        ] {
            let bytes = stored.to_string().into_bytes();
            for replay in [None, Some(true)] {
                let reply = result_reply(&json!(1), &Ok(bytes.clone()), &key, replay);
                if stored.is_object() {
                    assert_eq!(reply["result"]["_meta"][KEY], key.as_str(), "{reply}");
                    assert_eq!(
                        reply["result"]["_meta"].get(REPLAYED).is_some(),
                        replay.is_some()
                    );
                } else {
                    assert_eq!(reply["result"], stored, "{reply}");
                }
            }
        }
    }

    #[test]
    fn keys_come_from_the_harness_meta_never_from_the_arguments() {
        let params = |meta: Value| json!({"name": "create_incident", "arguments": {"title": "x"}, "_meta": meta});
        let key = key_of(&params(json!({TASK: "task-7", STEP: 3})))
            .unwrap()
            .unwrap();
        assert_eq!(key.as_str(), "tc1:task-7:3:create_incident");
        // A step as its decimal string is the same step; a numeric task is its text.
        assert_eq!(
            key_of(&params(json!({TASK: "task-7", STEP: "3"}))).unwrap(),
            Some(key)
        );
        assert_eq!(
            key_of(&params(json!({TASK: 42, STEP: 0})))
                .unwrap()
                .unwrap()
                .as_str(),
            "tc1:42:0:create_incident"
        );
        assert_eq!(key_of(&params(json!({"progressToken": 1}))).unwrap(), None);
        // A key the harness minted, used as it is.
        let given = key_of(&params(json!({KEY: "run-1/call-9"})))
            .unwrap()
            .unwrap();
        assert_eq!(
            (given.as_str(), given.tool()),
            ("run-1/call-9", "create_incident")
        );
        assert_eq!(key_of(&json!({"name": "x"})).unwrap(), None);
        for bad in [
            json!({TASK: "t"}),
            json!({STEP: 1}),
            json!({TASK: "", STEP: 1}),
            json!({TASK: "t", STEP: -1}),
            json!({TASK: "t", STEP: "three"}),
            json!({KEY: "k", TASK: "t", STEP: 1}),
            json!({KEY: 7}),
            json!({KEY: "two words"}),
            json!({KEY: "tc1:t:1:create_incident"}),
        ] {
            assert!(key_of(&params(bad.clone())).is_err(), "{bad}");
        }
    }
}
