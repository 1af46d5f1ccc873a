//! The gateway: claim before the tool runs, store its result, replay it on every retry.

use super::key::ToolCallKey;
use crate::error::{Error, Result};
use crate::idempotent::{Attempt, Failure, Once, Ran, Step, STATUS_FAILED, STATUS_OK};
use crate::model::claim::{Resolution, StaleClaim, Takeover};
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::store::Store;
use sha2::{Digest, Sha256};
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

/// The endpoint part of every tool call's scope: tool calls never share records with HTTP
/// endpoints of the same tenant.
const ENDPOINT: &str = "agent tool call";
/// The stored response's header holding the SHA-256 of the arguments of the first attempt.
const ARGS_HEADER: &str = "idemdb-tool-args-sha256";

/// What a retry with the same key but different arguments gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ArgumentPolicy {
    /// The first result is replayed, and the outcome says the arguments changed, so the harness
    /// can log it. The default: a model that retries a timed-out tool often rewords its
    /// arguments, and that retry must not repeat the side effect.
    #[default]
    ReplayFirst,
    /// A retry with different arguments is refused ([`Outcome::Mismatch`]) and nothing runs:
    /// for tools where different arguments can only mean a different intent.
    Strict,
}

/// A stored tool result: `Ok` for success, `Err` for a deterministic failure
/// ([`Failure::Deterministic`]).
///
/// ```
/// use idemdb::agent::{Gateway, Outcome, ToolCallKey, ToolResult};
/// use idemdb::{Failure, Store};
/// let gateway = Gateway::new(Store::in_memory()?);
/// let key = ToolCallKey::new("task-7", 1, "transfer");
/// let refused = gateway.call("agent-a", &key, b"{}", |_| {
///     Err(Failure::Deterministic(b"insufficient funds".to_vec()))
/// })?;
/// let expected: ToolResult = Err(b"insufficient funds".to_vec());
/// assert_eq!(refused, Outcome::Executed { result: expected, takeover: None });
/// # Ok::<(), idemdb::Error>(())
/// ```
pub type ToolResult = std::result::Result<Vec<u8>, Vec<u8>>;

/// The outcome of [`Gateway::call`], in the words of [`crate::CallOutcome`], with one addition:
/// a replay says whether the arguments changed. Every variant is an expected answer; `Err` from
/// a call means the store failed.
///
/// ```
/// use idemdb::agent::{Gateway, Outcome, ToolCallKey};
/// use idemdb::{Failure, Store};
/// let gateway = Gateway::new(Store::in_memory()?);
/// let key = ToolCallKey::new("task-7", 3, "page_oncall");
/// let out = gateway.call("agent-a", &key, b"{}", |_| Err(Failure::Transient(b"503".to_vec())))?;
/// assert_eq!(out, Outcome::Released { error: b"503".to_vec() });
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum Outcome {
    /// The tool ran in this call; its result is stored.
    Executed {
        /// What the tool returned (stored and replayed to every retry): `Ok`, or a
        /// [`Failure::Deterministic`] as `Err`.
        result: ToolResult,
        /// `Some` when this call took over an earlier attempt that was abandoned (it crashed,
        /// hung up, or failed with [`Failure::Ambiguous`]) and whose lease ran out: the tool ran
        /// with [`Attempt::takeover`] set, and the harness may want to log that it reconciled.
        takeover: Option<Takeover>,
    },
    /// The tool had already run for this key: its stored result, and whether this attempt's
    /// arguments differ from the first's (a reworded retry). The tool did not run.
    Replayed {
        /// The stored result.
        result: ToolResult,
        /// The arguments differ from those of the attempt that ran.
        arguments_changed: bool,
    },
    /// Another attempt of this call is running now (and did not finish within
    /// [`GatewayBuilder::wait_for_in_flight`]). Nothing ran.
    InProgress {
        /// When to try again.
        retry_after: Duration,
    },
    /// [`ArgumentPolicy::Strict`] only: the key was used with other arguments. Nothing ran,
    /// nothing changed.
    Mismatch {
        /// Whether the call with the other arguments completed (`true`) or is in progress.
        completed: bool,
    },
    /// The tool failed with [`Failure::Transient`]: the key was released, so a later attempt
    /// runs it again.
    Released {
        /// What the tool returned.
        error: Vec<u8>,
    },
    /// The tool failed with [`Failure::Ambiguous`]: the call stays in progress until its lease
    /// runs out (or [`Gateway::reap`] resolves it), then the next attempt reconciles.
    Unresolved {
        /// What the tool returned.
        error: Vec<u8>,
    },
    /// The store keeps stale claims ([`crate::StalePolicy::Keep`]) and an earlier attempt of
    /// this call is known gone mid-call (it failed with [`Failure::Ambiguous`], panicked, or
    /// its process died): whether the tool acted is unknown, so it does not run again. Answered
    /// at once. [`Gateway::reap`], [`crate::Store::resolve`] (`idemdb resolve`) or, for a tool
    /// that deduplicates by the key itself, [`Gateway::release_lost`] settles it.
    Orphaned,
}

/// Wraps tool execution so each logical tool call has its side effect at most once per key,
/// across retries, reworded arguments, concurrent duplicates and process restarts.
///
/// ```
/// use idemdb::agent::{Gateway, Outcome, ToolCallKey};
/// use idemdb::Store;
/// let gateway = Gateway::new(Store::in_memory()?);
/// let key = ToolCallKey::new("task-7", 2, "create_incident");
/// let mut incidents = 0;
/// let first = gateway.call("agent-a", &key, br#"{"title":"DB down"}"#, |_attempt| {
///     incidents += 1;
///     Ok(br#"{"incident":"INC-1"}"#.to_vec())
/// })?;
/// assert!(matches!(first, Outcome::Executed { result: Ok(_), takeover: None }));
/// // The model times out and retries, rewording its arguments: no second incident.
/// let retry = gateway.call("agent-a", &key, br#"{"title":"Database is down"}"#, |_attempt| {
///     incidents += 1;
///     Ok(b"never".to_vec())
/// })?;
/// assert!(matches!(retry, Outcome::Replayed { arguments_changed: true, .. }));
/// assert_eq!(incidents, 1);
/// # Ok::<(), idemdb::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Gateway {
    store: Store,
    policy: ArgumentPolicy,
    wait: Duration,
}

/// Configures a [`Gateway`].
#[derive(Debug, Clone)]
#[must_use]
pub struct GatewayBuilder {
    gateway: Gateway,
}

impl GatewayBuilder {
    /// What a retry with different arguments gets. Default: [`ArgumentPolicy::ReplayFirst`].
    pub fn argument_policy(mut self, policy: ArgumentPolicy) -> Self {
        self.gateway.policy = policy;
        self
    }

    /// How long a duplicate of an in-flight call waits for the first attempt to finish (and
    /// then gets its replay) before answering [`Outcome::InProgress`]. Default: zero (answer at
    /// once).
    pub fn wait_for_in_flight(mut self, bound: Duration) -> Self {
        self.gateway.wait = bound;
        self
    }

    /// The gateway.
    pub fn build(self) -> Gateway {
        self.gateway
    }
}

impl Gateway {
    /// A gateway over `store` with the defaults.
    pub fn new(store: Store) -> Gateway {
        Gateway::builder(store).build()
    }

    /// A builder to change the defaults.
    pub fn builder(store: Store) -> GatewayBuilder {
        GatewayBuilder {
            gateway: Gateway {
                store,
                policy: ArgumentPolicy::default(),
                wait: Duration::ZERO,
            },
        }
    }

    /// The store underneath (to reap, purge, or inspect).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Runs `tool` for the call `key` of `tenant` (the agent, user or workspace the call acts
    /// for; calls of different tenants never share records) unless it already ran. `args` are
    /// the call's arguments, as the model sent them: the gateway hashes them to tell a reworded
    /// retry (see [`ArgumentPolicy`]); the tool itself gets them from its caller (the closure
    /// captures them), and gets the claim as an [`Attempt`].
    ///
    /// The claim is durable before `tool` runs. On `Ok` the result is stored (durably) and
    /// replayed to every later call with this key; on [`Failure::Deterministic`] the failure is
    /// stored and replayed; on [`Failure::Transient`] the key is released; on
    /// [`Failure::Ambiguous`] the claim is left in progress for a reconciling takeover.
    ///
    /// # Concurrency
    /// Concurrent calls with one key run `tool` once; the others wait up to the configured
    /// bound for its result, or get [`Outcome::InProgress`]. If `tool` panics, or the process
    /// dies while it runs, the claim stays in progress until its lease runs out (the panic
    /// resumes in the caller); the next call then runs the tool with [`Attempt::takeover`]
    /// set, so it can reconcile first.
    ///
    /// # Errors
    /// The store's errors: [`Error::InvalidScope`] for an empty or over-long tenant,
    /// [`Error::ResponseTooLarge`] for an oversize result (the claim is released), I/O errors.
    pub fn call(
        &self,
        tenant: &str,
        key: &ToolCallKey,
        args: &[u8],
        tool: impl FnOnce(&Attempt) -> std::result::Result<Vec<u8>, Failure<Vec<u8>>>,
    ) -> Result<Outcome> {
        let scope = Scope::new(tenant, ENDPOINT);
        let args_digest: [u8; 32] = Sha256::digest(args).into();
        let fingerprint = match self.policy {
            ArgumentPolicy::ReplayFirst => Fingerprint::builder()
                .part(b"idemdb agent tool")
                .part(key.tool().as_bytes())
                .finish(),
            ArgumentPolicy::Strict => Fingerprint::from_bytes(args_digest),
        };
        let mut panicked = None;
        let once = Once {
            store: &self.store,
            scope: &scope,
            key: key.as_str(),
            fingerprint,
            wait: self.wait,
        };
        let ran = once.run(|attempt| {
            let result = match panic::catch_unwind(AssertUnwindSafe(|| tool(attempt))) {
                Ok(Ok(result)) => Ok(result),
                Ok(Err(Failure::Deterministic(failure))) => Err(failure),
                Ok(Err(Failure::Transient(error))) => return Step::Release(error),
                Ok(Err(Failure::Ambiguous(error))) => return Step::Leave(error),
                // As if the tool's process died: the claim stays in progress (the tool may
                // have acted), and the panic goes on once it is left so.
                Err(panic) => {
                    panicked = Some(panic);
                    return Step::Leave(Vec::new());
                }
            };
            let response = response_of(result).with_header(ARGS_HEADER, hex(&args_digest));
            let result = result_of(&response);
            Step::Store(response, result)
        });
        if let Some(panic) = panicked {
            panic::resume_unwind(panic);
        }
        match ran {
            Ok(Ran::Executed { value, takeover }) => Ok(Outcome::Executed {
                result: value,
                takeover,
            }),
            Ok(Ran::Replayed(stored)) => Ok(replayed(&stored, &args_digest)),
            Ok(Ran::InProgress { retry_after }) => Ok(Outcome::InProgress { retry_after }),
            Ok(Ran::Mismatch { completed }) => Ok(Outcome::Mismatch { completed }),
            Ok(Ran::Released(error)) => Ok(Outcome::Released { error }),
            Ok(Ran::Unresolved(error)) => Ok(Outcome::Unresolved { error }),
            Ok(Ran::Orphaned) => Ok(Outcome::Orphaned),
            Err(Error::ResponseTooLarge {
                size,
                limit,
                ticket: Some(ticket),
            }) => {
                self.store.release(*ticket)?;
                Err(Error::ResponseTooLarge {
                    size,
                    limit,
                    ticket: None,
                })
            }
            Err(e) => Err(e),
        }
    }
}

impl Gateway {
    /// Hands every abandoned tool call of this gateway to `resolve`, and stores what it
    /// decides: calls whose lease ran out, and at once every call a previous process left
    /// (see [`Store::reap`]). Call it at startup and then periodically, with a resolver that
    /// looks the side effect up in the tool's own system by the call's key.
    ///
    /// The resolver gets the store's own [`StaleClaim`]: the call's tenant is
    /// `claim.scope.tenant()`, its key ([`ToolCallKey::as_str`], what the tool's system knows
    /// the effect by) is `claim.key`. It decides a [`Resolution`] of a [`ToolResult`]:
    ///
    /// | the resolver returns | the call | later attempts get |
    /// | --- | --- | --- |
    /// | `Complete(Ok(result))`: the tool ran | completed, `result` stored | `Replayed { result: Ok(result) }` |
    /// | `Complete(Err(error))`: it failed deterministically | completed, `error` stored | `Replayed { result: Err(error) }` |
    /// | `Release`: it did not run | released | the tool runs again |
    /// | `Keep`: not known yet | left in progress | offered again at the next reap |
    ///
    /// A resolved call replays to every later attempt exactly as if the tool had returned that
    /// result; its first arguments are unknown to the reaper, so `arguments_changed` is `false`
    /// for it. Claims in the same store that are not this gateway's tool calls (an HTTP
    /// endpoint's) are left alone. Returns how many calls were resolved.
    ///
    /// ```
    /// use idemdb::agent::{Gateway, Outcome, ToolCallKey};
    /// use idemdb::{Failure, ManualClock, Resolution, Store};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let gateway = Gateway::new(Store::builder().clock(clock.clone()).in_memory()?);
    /// let key = ToolCallKey::new("task-7", 2, "create_incident");
    /// // The tool timed out after sending: did it create the incident? Nobody knows yet.
    /// let out = gateway.call("agent-a", &key, b"{}", |_| Err(Failure::Ambiguous(b"timeout".to_vec())))?;
    /// assert!(matches!(out, Outcome::Unresolved { .. }));
    /// clock.advance(Duration::from_secs(61));
    /// // The reconciler finds INC-9 in the incident system, created under this key.
    /// let resolved = gateway.reap(|claim| {
    ///     assert_eq!((claim.scope.tenant(), claim.key.as_str()), ("agent-a", key.as_str()));
    ///     Resolution::Complete(Ok(b"INC-9".to_vec()))
    /// })?;
    /// assert_eq!(resolved, 1);
    /// let retry = gateway.call("agent-a", &key, b"{}", |_| Ok(b"never".to_vec()))?;
    /// assert_eq!(retry, Outcome::Replayed { result: Ok(b"INC-9".to_vec()), arguments_changed: false });
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// As [`Store::reap`]: the resolver runs with no lock held; a call that changes meanwhile
    /// (completed, taken over) is left as it is.
    ///
    /// # Errors
    /// As [`Store::reap`]; [`Error::ResponseTooLarge`] for an oversize result (calls resolved
    /// before it stay resolved).
    pub fn reap(
        &self,
        mut resolve: impl FnMut(&StaleClaim) -> Resolution<ToolResult>,
    ) -> Result<usize> {
        self.store.reap(|claim| {
            if claim.scope.endpoint() != ENDPOINT {
                return Resolution::Keep;
            }
            match resolve(claim) {
                Resolution::Complete(result) => Resolution::Complete(response_of(result)),
                Resolution::Release => Resolution::Release,
                Resolution::Keep => Resolution::Keep,
            }
        })
    }

    /// Releases the call `key` of `tenant` if an earlier attempt of it was lost (its holder is
    /// known gone, or its lease ran out), so that the next call runs the tool again. Only for a
    /// tool that deduplicates by the key it is given ([`ToolCallKey::as_str`]), such as a
    /// payment API taking an `Idempotency-Key`: running it again under the same key cannot
    /// repeat its side effect, and returns the first run's result. Returns `true` if a lost
    /// claim was released; `false` if nothing changed (no record, a completion, or a claim
    /// whose holder is live).
    ///
    /// ```
    /// use idemdb::agent::{Gateway, Outcome, ToolCallKey};
    /// use idemdb::{Failure, StalePolicy, Store};
    /// let store = Store::builder().stale_policy(StalePolicy::Keep).in_memory()?;
    /// let gateway = Gateway::new(store);
    /// let key = ToolCallKey::new("task-7", 1, "charge");
    /// // The payment API's answer was lost: charged or not, nobody knows.
    /// let lost = gateway.call("agent-a", &key, b"{}", |_| Err(Failure::Ambiguous(Vec::new())))?;
    /// assert!(matches!(lost, Outcome::Unresolved { .. }));
    /// let retry = gateway.call("agent-a", &key, b"{}", |_| Ok(b"never".to_vec()))?;
    /// assert_eq!(retry, Outcome::Orphaned);
    /// // The API deduplicates by the key: asking it again is safe.
    /// assert!(gateway.release_lost("agent-a", &key)?);
    /// let again = gateway.call("agent-a", &key, b"{}", |_| Ok(b"ch_1".to_vec()))?;
    /// assert!(matches!(again, Outcome::Executed { result: Ok(_), .. }));
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Concurrency
    /// As [`Store::resolve`]: only the lost claim read here is released; a call that claimed
    /// the key meanwhile is left alone, and of two concurrent `release_lost` one releases.
    ///
    /// # Errors
    /// [`Error::InvalidScope`] for a bad tenant; the store's I/O or database errors.
    pub fn release_lost(&self, tenant: &str, key: &ToolCallKey) -> Result<bool> {
        let scope = Scope::new(tenant, ENDPOINT);
        match self.store.get(&scope, key.as_str())? {
            Some(entry) => {
                self.store
                    .resolve(&scope, key.as_str(), entry.fence, Resolution::Release)
            }
            None => Ok(false),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A tool result as stored, without the arguments' digest (which only a call knows).
fn response_of(result: ToolResult) -> Response {
    match result {
        Ok(body) => Response::new(STATUS_OK, body),
        Err(failure) => Response::new(STATUS_FAILED, failure),
    }
}

fn result_of(stored: &Response) -> ToolResult {
    if stored.status() == STATUS_OK {
        Ok(stored.body().to_vec())
    } else {
        Err(stored.body().to_vec())
    }
}

/// A stored result as a replay. A result stored by [`Gateway::reap`] has no first arguments to
/// compare with: it is not reported as changed.
fn replayed(stored: &Response, args_digest: &[u8; 32]) -> Outcome {
    let first = stored
        .headers()
        .iter()
        .find(|(name, _)| name == ARGS_HEADER)
        .map(|(_, v)| v.as_slice());
    Outcome::Replayed {
        result: result_of(stored),
        arguments_changed: first.is_some_and(|f| f != hex(args_digest).as_bytes()),
    }
}
