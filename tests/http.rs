//! The HTTP layer end to end: an axum server on 127.0.0.1 and a real HTTP client.

#![cfg(feature = "http")]

use axum::routing::post;
use axum::Router;
use idemdb::http::IdempotencyLayer;
use idemdb::Store;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

fn serve(app: Router) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), rt)
}

#[test]
fn smoke_a_retry_replays_the_first_response() {
    let charges = Arc::new(AtomicU32::new(0));
    let c = charges.clone();
    let layer = IdempotencyLayer::builder(Store::in_memory().unwrap(), |parts| {
        parts
            .headers
            .get("x-api-key")?
            .to_str()
            .ok()
            .map(str::to_owned)
    })
    .build();
    let app = Router::new()
        .route(
            "/v1/payments",
            post(move |body: String| {
                let c = c.clone();
                async move {
                    let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                    (
                        axum::http::StatusCode::CREATED,
                        [("content-type", "application/json")],
                        format!(r#"{{"charge":{n},"body":{body}}}"#),
                    )
                }
            }),
        )
        .layer(layer);
    let (base, _rt) = serve(app);
    let agent = ureq::Agent::new_with_defaults();
    let send = || {
        agent
            .post(&format!("{base}/v1/payments"))
            .header("x-api-key", "tenant-a")
            .header("idempotency-key", "\"k-1\"")
            .header("content-type", "application/json")
            .config()
            .http_status_as_error(false)
            .build()
            .send(r#"{"amount":5000}"#)
            .unwrap()
    };
    let mut first = send();
    assert_eq!(first.status(), 201);
    let first_body = first.body_mut().read_to_string().unwrap();
    let mut second = send();
    assert_eq!(second.status(), 201);
    assert_eq!(second.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(second.body_mut().read_to_string().unwrap(), first_body);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}
