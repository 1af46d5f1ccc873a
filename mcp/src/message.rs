//! A JSON-RPC 2.0 message as the gateway sees it: kept whole (a `serde_json` value, so fields
//! the gateway does not know pass through unchanged), classified by the members it has.

use serde_json::Value;

/// What a message is, by JSON-RPC 2.0's rules: a request has `method` and `id`, a notification
/// `method` alone, a response `id` and `result` or `error`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Request {
        id: Value,
        method: String,
    },
    Notification {
        method: String,
    },
    Response {
        id: Value,
    },
    /// Anything else (a batch array, a value without those members): passed on as it is.
    Other,
}

/// Classifies `message`.
pub(crate) fn kind(message: &Value) -> Kind {
    let Some(object) = message.as_object() else {
        return Kind::Other;
    };
    let method = object.get("method").and_then(Value::as_str);
    match (method, object.get("id")) {
        (Some(method), Some(id)) => Kind::Request {
            id: id.clone(),
            method: method.to_owned(),
        },
        (Some(method), None) => Kind::Notification {
            method: method.to_owned(),
        },
        (None, Some(id)) if object.contains_key("result") || object.contains_key("error") => {
            Kind::Response { id: id.clone() }
        }
        _ => Kind::Other,
    }
}

/// A JSON-RPC error response to `id`.
pub(crate) fn error(id: &Value, code: i64, message: &str) -> Value {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// A JSON-RPC error response to `id`, with `data` saying more.
pub(crate) fn error_with(id: &Value, code: i64, message: &str, data: Value) -> Value {
    let mut response = error(id, code, message);
    response["error"]["data"] = data;
    response
}

/// The request a `notifications/cancelled` names (its `params.requestId`, as JSON text, the form
/// the proxy's maps key ids by); `None` when its `params` is not an object with one.
pub(crate) fn cancelled_request(notification: &Value) -> Option<String> {
    notification
        .get("params")?
        .as_object()?
        .get("requestId")
        .map(Value::to_string)
}

/// The JSON-RPC code of a request whose upstream ended (or could not be reached) before it
/// answered.
pub(crate) const UPSTREAM_GONE: i64 = -32000;
/// The member of an error's `data` that says the request may have reached its upstream before
/// it was lost: a keyed call answered so has an unknown outcome, not a failure to release.
const LOST: &str = "io.idemdb/lost";

/// The error for a request that was sent to an upstream which then ended without answering:
/// whether it acted is unknown.
pub(crate) fn lost(id: &Value, why: &str) -> Value {
    error_with(id, UPSTREAM_GONE, why, serde_json::json!({LOST: true}))
}

/// Whether `response` is [`lost`]'s.
pub(crate) fn is_lost(response: &Value) -> bool {
    response["error"]["data"][LOST] == Value::Bool(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_are_told_apart_by_their_members() {
        for (message, expected) in [
            (
                json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}),
                Kind::Request {
                    id: json!(7),
                    method: "tools/call".into(),
                },
            ),
            (
                json!({"jsonrpc": "2.0", "method": "notifications/cancelled"}),
                Kind::Notification {
                    method: "notifications/cancelled".into(),
                },
            ),
            (
                json!({"jsonrpc": "2.0", "id": "a", "result": {}}),
                Kind::Response { id: json!("a") },
            ),
            (
                json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700}}),
                Kind::Response { id: json!(null) },
            ),
            (json!([1, 2]), Kind::Other),
            (json!({"jsonrpc": "2.0", "id": 1}), Kind::Other),
        ] {
            assert_eq!(kind(&message), expected, "{message}");
        }
    }

    #[test]
    fn a_lost_request_is_told_from_an_upstreams_own_error() {
        assert!(is_lost(&lost(&json!(3), "the upstream ended")));
        assert!(!is_lost(&error(
            &json!(3),
            UPSTREAM_GONE,
            "the upstream ended"
        )));
        assert!(!is_lost(
            &json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32000, "data": "lost"}})
        ));
    }
}
