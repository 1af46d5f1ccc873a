//! Messages of any shape, from either side, never panic the proxy or the hub: a property test
//! over random JSON-RPC-like values (the gateway's untrusted input is JSON, already parsed; its
//! shapes, not its bytes, are what the code branches on). The values are biased toward the
//! members and methods the gateway reads, so that most reach its branches.

use crate::keyed::Keying;
use crate::link;
use crate::proxy::Proxy;
use crate::upstream::hub;
use proptest::prelude::*;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

const METHODS: &[&str] = &[
    "initialize",
    "notifications/initialized",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "completion/complete",
    "notifications/cancelled",
    "notifications/progress",
    "roots/list",
    "ping",
    "tasks/get",
    "logging/setLevel",
];
const MEMBERS: &[&str] = &[
    "id",
    "method",
    "params",
    "result",
    "error",
    "name",
    "arguments",
    "_meta",
    "requestId",
    "uri",
    "ref",
    "tools",
    "prompts",
    "resources",
    "cursor",
    "nextCursor",
    "annotations",
    "readOnlyHint",
    "progressToken",
    "capabilities",
    "protocolVersion",
    "io.idemdb/task",
    "io.idemdb/step",
    "io.idemdb/key",
    "code",
    "data",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (0u64..5).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(METHODS).prop_map(Value::from),
        prop::sample::select(&["a__b", "x", "", "tc1:t:1:x", "a__", "__"][..])
            .prop_map(Value::from),
        "[a-z_:/]{0,12}".prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(MEMBERS), inner), 0..6).prop_map(
                |members| {
                    Value::Object(
                        members
                            .into_iter()
                            .map(|(k, v)| (k.to_owned(), v))
                            .collect::<Map<_, _>>(),
                    )
                }
            ),
        ]
    })
}

/// An id: mostly one of a few, so that requests, answers and cancellations meet.
fn id() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => prop::sample::select(vec![json!(null), json!(0), json!(1), json!(2), json!("a")]),
        1 => value(),
    ]
}

/// A message: mostly an object with `jsonrpc`, an id, a method and params of odd shapes.
fn message() -> impl Strategy<Value = Value> {
    (
        prop::option::of(id()),
        prop::option::of(prop::sample::select(METHODS)),
        prop::option::of(prop_oneof![scalar(), value(), json_params()]),
        prop::option::of(value()),
        prop::option::of(value()),
        value(),
    )
        .prop_map(|(id, method, params, result, error, other)| {
            let mut m = Map::new();
            m.insert("jsonrpc".into(), json!("2.0"));
            if let Some(id) = id {
                m.insert("id".into(), id);
            }
            if let Some(method) = method {
                m.insert("method".into(), json!(method));
            }
            for (name, part) in [("params", params), ("result", result), ("error", error)] {
                if let Some(part) = part {
                    m.insert(name.into(), part);
                }
            }
            if m.len() == 1 {
                return other;
            }
            Value::Object(m)
        })
}

/// Params shaped like the ones the gateway reads: a request id to cancel, a keyed call.
fn json_params() -> impl Strategy<Value = Value> {
    (id(), scalar(), scalar(), prop::option::of(value())).prop_map(|(id, task, step, args)| {
        json!({"requestId": id, "name": "a__x",
               "_meta": {"io.idemdb/task": task, "io.idemdb/step": step}, "arguments": args})
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn no_message_panics_the_proxy_or_the_hub(
        script in prop::collection::vec((any::<u8>(), message()), 1..40)
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(async {
            // The proxy, keyed, in front of a hub of two upstreams the test speaks for.
            let (up_tx, _up) = mpsc::unbounded_channel();
            let (down_tx, _down) = mpsc::unbounded_channel();
            let keying = Arc::new(Keying {
                gateway: idemdb::agent::Gateway::new(idemdb::Store::in_memory().expect("a store")),
                rules: Default::default(),
                strict: false,
            });
            let proxy = Arc::new(Proxy::new(up_tx, down_tx, Some(keying), "t".into()));
            let (one, one_peer) = link::pair();
            let (two, two_peer) = link::pair();
            let (client, hub_task) = hub::start(vec![("a".into(), one), ("b".into(), two)]);
            let sent = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for (side, message) in &script {
                    match side % 5 {
                        0 => proxy.client_sent(message.clone()),
                        1 => proxy.server_sent(message.clone()),
                        2 => drop(client.outgoing.send(message.clone())),
                        3 => drop(one_peer.incoming.send(message.clone())),
                        _ => drop(two_peer.incoming.send(message.clone())),
                    }
                }
            }));
            // Keyed calls waiting for an answer hear it is lost, so the runtime can end.
            proxy.server_gone("the test ended");
            if let Err(panic) = sent {
                std::panic::resume_unwind(panic);
            }
            drop((client, one_peer, two_peer));
            let ended = tokio::time::timeout(std::time::Duration::from_secs(10), hub_task).await;
            assert!(
                !matches!(ended, Ok(Err(ref e)) if e.is_panic()),
                "the hub panicked: {ended:?}"
            );
        })));
        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }
}
