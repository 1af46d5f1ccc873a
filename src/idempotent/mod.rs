//! Idempotent functions: run a closure at most once per key, store what it returned, and hand
//! the stored result back to every later call with the key. This is the public API; the claim,
//! the wait for an in-flight duplicate and the settling of an outcome live once, in `once`,
//! and the agent gateway runs on them too.

mod attempt;
mod codec;
mod once;

pub use attempt::Attempt;
pub(crate) use once::{Once, Ran, Step};

#[cfg(feature = "serde")]
use codec::Json;
use codec::{Codec, Raw};

use crate::error::Result;
use crate::model::claim::Takeover;
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::store::Store;
use std::future::Future;
use std::time::Duration;

#[cfg(doc)]
use crate::error::Error;

/// The status of a stored success.
pub(crate) const STATUS_OK: u16 = 200;
/// The status of a stored deterministic failure.
pub(crate) const STATUS_FAILED: u16 = 422;

/// How a closure run by an [`IdempotentFn`] (or a tool run by [`crate::agent::Gateway::call`])
/// failed. The variant decides what happens to the key, by the same rules as the HTTP layer (5xx
/// and 429 released, 4xx stored) and the agent gateway.
///
/// ```
/// use idemdb::{CallOutcome, Failure, IdempotentFn, Scope, Store};
/// let send = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "send_invoice"));
/// let out = send.call("inv-7", b"", |_| Err(Failure::Transient(b"smtp: 421".to_vec())))?;
/// assert!(matches!(out, CallOutcome::Released { .. }));
/// // The key was released: the next call runs the closure again.
/// let out = send.call("inv-7", b"", |_| Ok(b"sent".to_vec()))?;
/// assert!(matches!(out, CallOutcome::Executed { result: Ok(_), .. }));
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure<E> {
    /// A failure of the moment that certainly did **not** perform the side effect (a refused
    /// connection, a 503 or 429 answered before any work): the key is released, and the next
    /// call runs the closure again. Nothing is stored.
    Transient(E),
    /// The side effect may or may not have happened (a timeout after the request was sent, a
    /// connection reset mid-response). Nothing is stored and the claim is left in progress:
    /// duplicates get [`CallOutcome::InProgress`] until its lease runs out, then the next call
    /// runs the closure with [`Attempt::takeover`] set, so it looks the effect up before
    /// repeating it; or [`Store::reap`] resolves it first. Never report an ambiguous failure as
    /// `Transient`: releasing would repeat the side effect.
    Ambiguous(E),
    /// A failure that belongs to the input (invalid arguments, a refused operation): stored,
    /// and replayed as `Err` to every later call with the key.
    Deterministic(E),
}

/// The outcome of a call of an [`IdempotentFn`]. Every variant is an expected answer; `Err` from
/// a call means the store failed.
///
/// ```
/// use idemdb::{CallOutcome, IdempotentFn, Scope, Store};
/// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "f"));
/// let first = f.call("k", b"in", |_| Ok(b"out".to_vec()))?;
/// let again = f.call("k", b"in", |_| unreachable!("it ran once"))?;
/// assert!(matches!(first, CallOutcome::Executed { .. }));
/// assert_eq!(again.into_result(), Some(Ok(b"out".to_vec())));
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum CallOutcome<T, E> {
    /// The closure ran in this call, and what it returned (a success, or a
    /// [`Failure::Deterministic`] as `Err`) is stored, durably.
    Executed {
        /// What the closure returned; every later call with the key replays it.
        result: std::result::Result<T, E>,
        /// `Some` when this call took over an abandoned attempt (its process died, its future
        /// was dropped, or it failed ambiguously) whose lease ran out: the closure ran with
        /// [`Attempt::takeover`] set.
        takeover: Option<Takeover>,
    },
    /// The closure had already run for this key: its stored result. The closure did not run.
    Replayed {
        /// The stored result.
        result: std::result::Result<T, E>,
    },
    /// Another call with this key is running now, and did not finish within
    /// [`IdempotentFnBuilder::wait_for_in_flight`]. Nothing ran.
    InProgress {
        /// When to try again.
        retry_after: Duration,
    },
    /// The key was used with a different input (fingerprint). Nothing ran, nothing changed.
    Mismatch {
        /// Whether the other input's call completed (`true`) or is in progress.
        completed: bool,
    },
    /// The closure failed with [`Failure::Transient`]: the key was released, so the next call
    /// runs it again.
    Released {
        /// What the closure returned.
        error: E,
    },
    /// The closure failed with [`Failure::Ambiguous`]: the claim stays in progress until its
    /// lease runs out (or [`Store::reap`] resolves it); the next call then reconciles.
    Unresolved {
        /// What the closure returned.
        error: E,
    },
    /// The store keeps stale claims ([`crate::StalePolicy::Keep`]) and the key is held by an
    /// attempt known gone (it failed ambiguously, panicked, or its process died): whether its
    /// side effect happened is unknown, and only [`Store::reap`] or [`Store::resolve`] (an
    /// operator's `idemdb resolve`) settles it. Answered at once, without waiting. Nothing ran.
    Orphaned,
}

impl<T, E> CallOutcome<T, E> {
    /// The result, executed now or replayed; `None` for every other outcome.
    ///
    /// ```
    /// use idemdb::{CallOutcome, Failure};
    /// let out: CallOutcome<u8, u8> = CallOutcome::Replayed { result: Err(4) };
    /// assert_eq!(out.into_result(), Some(Err(4)));
    /// ```
    pub fn into_result(self) -> Option<std::result::Result<T, E>> {
        match self {
            CallOutcome::Executed { result, .. } | CallOutcome::Replayed { result } => Some(result),
            _ => None,
        }
    }
}

/// A function made idempotent: [`IdempotentFn::call`] runs a closure at most once per key,
/// stores what it returned, and hands the stored result back to every later call with the key,
/// across threads, retries and restarts of the process (on a file store, the result is on disk
/// before the call returns). The Rust form of an "idempotent function" decorator.
///
/// The function's records live under one [`Scope`]: name the tenant the calls act for, and the
/// function as the endpoint (`Scope::new("acme", "charge_card")`), so that two functions never
/// share a record. The key names the logical operation (an event id, an order id). The input
/// is fingerprinted: the same key with another input is a [`CallOutcome::Mismatch`].
///
/// | the closure returns | the key | later calls get |
/// | --- | --- | --- |
/// | `Ok(value)` | completed, value stored | `Replayed { result: Ok(value) }` |
/// | `Err(Failure::Deterministic(e))` | completed, `e` stored | `Replayed { result: Err(e) }` |
/// | `Err(Failure::Transient(e))` | released | the closure runs again |
/// | `Err(Failure::Ambiguous(e))` | left in progress | `InProgress` until the lease ends, then a run with [`Attempt::takeover`] |
/// | a panic | released, then the panic resumes | the closure runs again |
///
/// ```
/// use idemdb::{CallOutcome, Failure, IdempotentFn, Scope, Store};
/// let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("events.idem"))?;
/// let credit = IdempotentFn::new(store, Scope::new("ledger", "credit"));
/// let mut balance = 0;
/// for _delivery in 0..3 {
///     // The same event, delivered three times: credited once.
///     let out = credit.call("evt_1", b"+50", |_attempt| {
///         balance += 50;
///         Ok(b"credited".to_vec())
///     })?;
///     assert_eq!(out.into_result(), Some(Ok(b"credited".to_vec())));
/// }
/// assert_eq!(balance, 50);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Concurrency
/// `IdempotentFn` is cheap to clone (a [`Store`] and a [`Scope`]) and `Send + Sync`: share it
/// across threads and tasks. Calls with one key run the closure once between them; the others
/// wait for its result or get [`CallOutcome::InProgress`]. A panic in the closure releases the
/// key and resumes; an async call dropped mid-closure leaves its claim to a reconciling
/// takeover. Each call method says so in detail.
#[derive(Debug, Clone)]
pub struct IdempotentFn {
    store: Store,
    scope: Scope,
    wait: Duration,
}

/// Configures an [`IdempotentFn`].
///
/// ```
/// use idemdb::{IdempotentFn, Scope, Store};
/// use std::time::Duration;
/// let f = IdempotentFn::builder(Store::in_memory()?, Scope::new("acme", "charge"))
///     .wait_for_in_flight(Duration::from_secs(5))
///     .build();
/// assert_eq!(f.scope().endpoint(), "charge");
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct IdempotentFnBuilder {
    function: IdempotentFn,
}

impl IdempotentFnBuilder {
    /// How long a call whose key another call is running waits for that call to finish (and
    /// then returns its replay) before answering [`CallOutcome::InProgress`]. The wait is woken
    /// by the completion itself ([`Store::wait`]), not by polling. Default: zero (answer at
    /// once).
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store};
    /// # use std::time::Duration;
    /// let f = IdempotentFn::builder(Store::in_memory()?, Scope::new("acme", "f"))
    ///     .wait_for_in_flight(Duration::from_millis(500))
    ///     .build();
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn wait_for_in_flight(mut self, bound: Duration) -> Self {
        self.function.wait = bound;
        self
    }

    /// The function.
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store};
    /// let f = IdempotentFn::builder(Store::in_memory()?, Scope::new("acme", "f")).build();
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn build(self) -> IdempotentFn {
        self.function
    }
}

impl IdempotentFn {
    /// A function whose records live in `store` under `scope`, with the defaults.
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store};
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "send_email"));
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn new(store: Store, scope: Scope) -> IdempotentFn {
        IdempotentFn::builder(store, scope).build()
    }

    /// A builder to change the defaults.
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store};
    /// let f = IdempotentFn::builder(Store::in_memory()?, Scope::new("acme", "f")).build();
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn builder(store: Store, scope: Scope) -> IdempotentFnBuilder {
        IdempotentFnBuilder {
            function: IdempotentFn {
                store,
                scope,
                wait: Duration::ZERO,
            },
        }
    }

    /// The store underneath (to reap, purge or inspect).
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store};
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "f"));
    /// assert_eq!(f.store().stats().acquired, 0);
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The scope the function's records live under.
    ///
    /// ```
    /// # use idemdb::{IdempotentFn, Scope, Store};
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "f"));
    /// assert_eq!(f.scope().tenant(), "acme");
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Runs `f` for `key` unless it already ran, with results as bytes. `input` is what the
    /// call is about (its SHA-256 is the fingerprint); the closure captures what it needs.
    ///
    /// The claim is durable before `f` runs; what `f` returned is stored and durable before
    /// this returns (see the table on [`IdempotentFn`]). Stored results are replayed until the
    /// store's TTL runs out.
    ///
    /// ```
    /// use idemdb::{CallOutcome, Failure, IdempotentFn, Scope, Store};
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "refund"));
    /// let out = f.call("ord-1", b"amount=5", |_| Err(Failure::Deterministic(b"already refunded".to_vec())))?;
    /// assert_eq!(out.into_result(), Some(Err(b"already refunded".to_vec())));
    /// // The failure is stored: the retry replays it, and the closure does not run.
    /// let out = f.call("ord-1", b"amount=5", |_| unreachable!())?;
    /// assert_eq!(out, CallOutcome::Replayed { result: Err(b"already refunded".to_vec()) });
    /// // The key with another input is refused.
    /// let out = f.call("ord-1", b"amount=9", |_| unreachable!())?;
    /// assert_eq!(out, CallOutcome::Mismatch { completed: true });
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// Concurrent calls with one key run `f` once: the others wait up to
    /// [`IdempotentFnBuilder::wait_for_in_flight`] and get its replay, or get
    /// [`CallOutcome::InProgress`]. If `f` panics, the key is released (as the HTTP layer
    /// releases a handler that panicked) and the panic resumes in this caller: a closure that
    /// may panic after its side effect should catch that itself and return
    /// [`Failure::Ambiguous`]. If the process dies while `f` runs, the claim stays in progress
    /// until its lease runs out (or [`Store::reap`] resolves it), then the next call runs `f`
    /// with [`Attempt::takeover`] set.
    ///
    /// # Errors
    /// The store's errors: [`Error::InvalidKey`] / [`Error::InvalidScope`] for bad input
    /// (nothing ran); [`Error::ResponseTooLarge`] if the result is larger than the store keeps
    /// (`f` ran; the error hands the ticket back, still holding the claim: release it, or drop
    /// it to leave the claim to a reconciling takeover); [`Error::LeaseLost`] if the claim was
    /// taken over or reaped while `f` ran (its result was not stored); I/O errors.
    pub fn call(
        &self,
        key: &str,
        input: &[u8],
        f: impl FnOnce(&Attempt) -> std::result::Result<Vec<u8>, Failure<Vec<u8>>>,
    ) -> Result<CallOutcome<Vec<u8>, Vec<u8>>> {
        self.run::<Raw, _, _>(key, Fingerprint::of(input), f)
    }

    /// [`IdempotentFn::call`] for async closures, without blocking the thread: the claim, the
    /// wait for a duplicate and the store's fsyncs are awaited. Any executor works.
    ///
    /// ```
    /// use idemdb::{CallOutcome, Failure, IdempotentFn, Scope, Store};
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "notify"));
    /// let out = f.call_async("evt-1", b"", |attempt| async move {
    ///     // ... await the side effect, passing attempt.fence() downstream ...
    ///     Ok(attempt.fence().to_string().into_bytes())
    /// }).await?;
    /// assert!(matches!(out, CallOutcome::Executed { result: Ok(_), .. }));
    /// # Ok::<(), idemdb::Error>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Concurrency
    /// As [`IdempotentFn::call`]; a panic while the closure's future is polled releases the key
    /// and resumes. If this future is dropped before its claim was received, nothing is held
    /// (the claim is withdrawn). If it is dropped while the closure's future runs (a timeout, a
    /// `select!`, a client that hung up), the closure may have performed its side effect, so
    /// the key is **not** released: the claim stays in progress as an orphan, exactly as if the
    /// process had crashed. [`Store::reap`] offers it at once; otherwise duplicates get
    /// [`CallOutcome::InProgress`] until its lease runs out, then the next call runs with
    /// [`Attempt::takeover`] set. An [`Attempt`] the closure moved elsewhere stops renewing once
    /// the closure's future is done; while one of its renewals is in flight, the call waits
    /// for it before storing the result.
    ///
    /// # Errors
    /// As [`IdempotentFn::call`].
    pub async fn call_async<F, Fut>(
        &self,
        key: &str,
        input: &[u8],
        f: F,
    ) -> Result<CallOutcome<Vec<u8>, Vec<u8>>>
    where
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = std::result::Result<Vec<u8>, Failure<Vec<u8>>>>,
    {
        self.run_async::<Raw, _, _, _, _>(key, Fingerprint::of(input), f)
            .await
    }

    /// [`IdempotentFn::call`] with the input, the result and the deterministic failure as
    /// serde values, stored as JSON (feature `serde`). The fingerprint is the SHA-256 of the
    /// input's JSON: give it a type that serializes the same way each time (a `BTreeMap`, not
    /// a `HashMap`).
    ///
    /// ```
    /// use idemdb::{Failure, IdempotentFn, Scope, Store};
    /// use std::collections::BTreeMap;
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "quote"));
    /// let input = BTreeMap::from([("sku", 7)]);
    /// let quote = |_: &idemdb::Attempt| Ok::<(String, u64), Failure<String>>(("EUR".into(), 1250));
    /// let first = f.call_json("q-1", &input, quote)?.into_result();
    /// let again = f.call_json("q-1", &input, |_| -> Result<(String, u64), Failure<String>> { unreachable!() })?;
    /// assert_eq!(again.into_result(), first);
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// As [`IdempotentFn::call`].
    ///
    /// # Errors
    /// As [`IdempotentFn::call`], and [`Error::ResultEncoding`] if the input or the result
    /// does not encode as JSON (the closure did not run, or ran and its result was not stored:
    /// the claim stays in progress, as after [`Failure::Ambiguous`]), or if a stored result
    /// does not decode as `T` or `E` (a type changed since it was stored).
    #[cfg(feature = "serde")]
    pub fn call_json<T, E>(
        &self,
        key: &str,
        input: &impl serde::Serialize,
        f: impl FnOnce(&Attempt) -> std::result::Result<T, Failure<E>>,
    ) -> Result<CallOutcome<T, E>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: serde::Serialize + serde::de::DeserializeOwned,
    {
        self.run::<Json, _, _>(key, Json::fingerprint(input)?, f)
    }

    /// [`IdempotentFn::call_json`] for async closures, without blocking the thread.
    ///
    /// ```
    /// use idemdb::{Failure, IdempotentFn, Scope, Store};
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// let f = IdempotentFn::new(Store::in_memory()?, Scope::new("acme", "reserve"));
    /// let out = f.call_json_async("r-1", &("sku-7", 2), |_| async {
    ///     Ok::<Vec<u32>, Failure<String>>(vec![101, 102])
    /// }).await?;
    /// assert_eq!(out.into_result(), Some(Ok(vec![101, 102])));
    /// # Ok::<(), idemdb::Error>(()) })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Concurrency
    /// As [`IdempotentFn::call_async`].
    ///
    /// # Errors
    /// As [`IdempotentFn::call_json`].
    #[cfg(feature = "serde")]
    pub async fn call_json_async<T, E, F, Fut>(
        &self,
        key: &str,
        input: &impl serde::Serialize,
        f: F,
    ) -> Result<CallOutcome<T, E>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: serde::Serialize + serde::de::DeserializeOwned,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = std::result::Result<T, Failure<E>>>,
    {
        let fingerprint = Json::fingerprint(input)?;
        self.run_async::<Json, _, _, _, _>(key, fingerprint, f)
            .await
    }

    fn once<'a>(&'a self, key: &'a str, fingerprint: Fingerprint) -> Once<'a> {
        Once {
            store: &self.store,
            scope: &self.scope,
            key,
            fingerprint,
            wait: self.wait,
        }
    }

    fn run<C, T, E>(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        f: impl FnOnce(&Attempt) -> std::result::Result<T, Failure<E>>,
    ) -> Result<CallOutcome<T, E>>
    where
        C: Codec<T> + Codec<E>,
    {
        let ran = self
            .once(key, fingerprint)
            .run(|attempt| step::<C, T, E>(f(attempt)))?;
        outcome::<C, T, E>(ran)
    }

    async fn run_async<C, T, E, F, Fut>(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        f: F,
    ) -> Result<CallOutcome<T, E>>
    where
        C: Codec<T> + Codec<E>,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = std::result::Result<T, Failure<E>>>,
    {
        let ran = self
            .once(key, fingerprint)
            .run_async(|attempt| async move { step::<C, T, E>(f(attempt).await) })
            .await?;
        outcome::<C, T, E>(ran)
    }
}

/// The closure's result as a step: encoded for storing, or a failure that stores nothing.
/// `Err` in the failure side is an encoding error, reported once the claim is settled.
fn step<C, T, E>(
    result: std::result::Result<T, Failure<E>>,
) -> Step<std::result::Result<T, E>, Result<E>>
where
    C: Codec<T> + Codec<E>,
{
    let (status, encoded, value) = match result {
        Ok(v) => (STATUS_OK, <C as Codec<T>>::encode(&v), Ok(v)),
        Err(Failure::Deterministic(e)) => (STATUS_FAILED, <C as Codec<E>>::encode(&e), Err(e)),
        Err(Failure::Transient(e)) => return Step::Release(Ok(e)),
        Err(Failure::Ambiguous(e)) => return Step::Leave(Ok(e)),
    };
    match encoded {
        Ok(body) => Step::Store(Response::new(status, body), value),
        // It ran, and what it returned cannot be stored: as an ambiguous failure.
        Err(e) => Step::Leave(Err(e)),
    }
}

fn outcome<C, T, E>(ran: Ran<std::result::Result<T, E>, Result<E>>) -> Result<CallOutcome<T, E>>
where
    C: Codec<T> + Codec<E>,
{
    Ok(match ran {
        Ran::Executed { value, takeover } => CallOutcome::Executed {
            result: value,
            takeover,
        },
        Ran::Replayed(stored) => CallOutcome::Replayed {
            result: if stored.status() == STATUS_OK {
                Ok(<C as Codec<T>>::decode(stored.into_body())?)
            } else {
                Err(<C as Codec<E>>::decode(stored.into_body())?)
            },
        },
        Ran::InProgress { retry_after } => CallOutcome::InProgress { retry_after },
        Ran::Mismatch { completed } => CallOutcome::Mismatch { completed },
        Ran::Released(error) => CallOutcome::Released { error: error? },
        Ran::Unresolved(error) => CallOutcome::Unresolved { error: error? },
        Ran::Orphaned => CallOutcome::Orphaned,
    })
}
