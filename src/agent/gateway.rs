//! The gateway: claim before the tool runs, store its result, replay it on every retry.

use super::key::ToolCallKey;
use crate::error::{Error, Result};
use crate::idempotent::{Attempt, Once, Ran, Step, STATUS_FAILED, STATUS_OK};
use crate::model::claim::{Resolution, Takeover};
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::store::Store;
use sha2::{Digest, Sha256};
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, SystemTime};

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
    /// A retry with different arguments is refused ([`Outcome::ArgumentsChanged`]) and nothing
    /// runs: for tools where different arguments can only mean a different intent.
    Strict,
}

/// How a tool failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ToolError {
    /// A failure of the moment that certainly did **not** perform the side effect (connection
    /// refused, a 503 or 429 answered before any work, a rate limit): the key is released, and
    /// the next attempt runs the tool again.
    Transient(String),
    /// The side effect may or may not have happened (a timeout after the request was sent, a
    /// connection reset mid-response). The claim is left in progress: duplicates get
    /// [`Outcome::InFlight`] until its lease runs out, then the next attempt runs with
    /// [`ToolContext::takeover`] set, so it looks the effect up before repeating it. Never
    /// report an ambiguous failure as `Transient`: releasing would repeat the side effect.
    Ambiguous(String),
    /// A deterministic failure (invalid arguments, a refused operation): stored like a result
    /// and replayed to every retry.
    Failed(Vec<u8>),
}

/// What a tool sees when the gateway runs it.
#[derive(Debug)]
pub struct ToolContext<'a> {
    /// The arguments of this attempt.
    pub args: &'a [u8],
    /// The claim's fencing token: pass it to the tool server if it can refuse stale writers.
    pub fence: u64,
    /// `Some` when an earlier attempt of this call was abandoned (it crashed or its lease ran
    /// out) and may have performed the side effect: reconcile first (look the effect up by the
    /// key) before performing it again.
    pub takeover: Option<&'a Takeover>,
    attempt: &'a Attempt,
}

impl ToolContext<'_> {
    /// Renews this call's lease to run until `by` from now, so a slow tool is not taken over
    /// by a duplicate. Call it periodically from a tool that may outlast the store's lease.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] if the call was already taken over or reaped: stop, another
    /// attempt owns the side effect now.
    pub fn extend_lease(&self, by: Duration) -> Result<()> {
        self.attempt.extend_lease(by)
    }
}

/// A stored tool result: `Ok` for success, `Err` for a deterministic failure.
pub type ToolResult = std::result::Result<Vec<u8>, Vec<u8>>;

/// The outcome of [`Gateway::call`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum Outcome {
    /// The tool ran in this call; its result is stored.
    Executed {
        /// What the tool returned (stored and replayed to every retry).
        result: ToolResult,
        /// `Some` when this call took over an earlier attempt that was abandoned (it crashed,
        /// hung up, or reported [`ToolError::Ambiguous`]) and whose lease ran out: the tool ran
        /// with [`ToolContext::takeover`] set, and the harness may want to log that it
        /// reconciled.
        takeover: Option<Takeover>,
    },
    /// The tool had already run for this key: its stored result, and whether this attempt's
    /// arguments differ from the first's (a reworded retry).
    Replayed {
        /// The stored result.
        result: ToolResult,
        /// The arguments differ from those of the attempt that ran.
        arguments_changed: bool,
    },
    /// Another attempt of this call is running now (and did not finish within the wait bound).
    InFlight {
        /// When to try again.
        retry_after: Duration,
    },
    /// The tool failed for the moment; the key was released, so a later attempt runs it again.
    Released {
        /// What the tool said.
        reason: String,
    },
    /// [`ArgumentPolicy::Strict`] only: the key was used with other arguments. Nothing ran.
    ArgumentsChanged,
    /// The tool reported [`ToolError::Ambiguous`]: the call stays in progress until its lease
    /// runs out, then the next attempt reconciles.
    Unresolved {
        /// What the tool said.
        reason: String,
    },
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
/// let first = gateway.call("agent-a", &key, br#"{"title":"DB down"}"#, |_ctx| {
///     incidents += 1;
///     Ok(br#"{"incident":"INC-1"}"#.to_vec())
/// })?;
/// assert!(matches!(first, Outcome::Executed { result: Ok(_), takeover: None }));
/// // The model times out and retries, rewording its arguments: no second incident.
/// let retry = gateway.call("agent-a", &key, br#"{"title":"Database is down"}"#, |_ctx| {
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
    /// then gets its replay) before answering [`Outcome::InFlight`]. Default: zero (answer at
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
    /// for; calls of different tenants never share records) unless it already ran.
    ///
    /// The claim is durable before `tool` runs. On `Ok` the result is stored (durably) and
    /// replayed to every later call with this key; on [`ToolError::Transient`] the key is
    /// released; on [`ToolError::Failed`] the failure is stored and replayed.
    ///
    /// # Concurrency
    /// Concurrent calls with one key run `tool` once; the others wait up to the configured
    /// bound for its result, or get [`Outcome::InFlight`]. If `tool` panics, or the process
    /// dies while it runs, the claim stays in progress until its lease runs out; the next call
    /// then runs the tool with [`ToolContext::takeover`] set, so it can reconcile first.
    ///
    /// # Errors
    /// The store's errors: [`Error::InvalidScope`] for an empty or over-long tenant,
    /// [`Error::ResponseTooLarge`] for an oversize result (the claim is released), I/O errors.
    pub fn call(
        &self,
        tenant: &str,
        key: &ToolCallKey,
        args: &[u8],
        tool: impl FnOnce(&ToolContext<'_>) -> std::result::Result<Vec<u8>, ToolError>,
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
            let ctx = ToolContext {
                args,
                fence: attempt.fence(),
                takeover: attempt.takeover(),
                attempt,
            };
            let (status, body) = match panic::catch_unwind(AssertUnwindSafe(|| tool(&ctx))) {
                Ok(Ok(result)) => (STATUS_OK, result),
                Ok(Err(ToolError::Failed(failure))) => (STATUS_FAILED, failure),
                Ok(Err(ToolError::Transient(reason))) => return Step::Release(reason),
                Ok(Err(ToolError::Ambiguous(reason))) => return Step::Leave(reason),
                // As if the tool's process died: the claim stays in progress (the tool may
                // have acted), and the panic goes on once it is left so.
                Err(panic) => {
                    panicked = Some(panic);
                    return Step::Leave(String::new());
                }
            };
            let response = Response::new(status, body).with_header(ARGS_HEADER, hex(&args_digest));
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
            Ok(Ran::InProgress { retry_after }) => Ok(Outcome::InFlight { retry_after }),
            Ok(Ran::Mismatch { .. }) => Ok(Outcome::ArgumentsChanged),
            Ok(Ran::Released(reason)) => Ok(Outcome::Released { reason }),
            Ok(Ran::Unresolved(reason)) => Ok(Outcome::Unresolved { reason }),
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
    /// A call resolved as [`CallResolution::Executed`] replays to every later attempt exactly as
    /// if the tool had returned that result ([`Outcome::Replayed`] with `Ok`); its first
    /// arguments are unknown to the reaper, so `arguments_changed` is `false` for it. Claims in
    /// the same store that are not this gateway's tool calls (an HTTP endpoint's) are left
    /// alone. Returns how many calls were resolved.
    ///
    /// ```
    /// use idemdb::agent::{CallResolution, Gateway, Outcome, ToolCallKey, ToolError};
    /// use idemdb::{ManualClock, Store};
    /// use std::time::Duration;
    /// let clock = ManualClock::new();
    /// let gateway = Gateway::new(Store::builder().clock(clock.clone()).in_memory()?);
    /// let key = ToolCallKey::new("task-7", 2, "create_incident");
    /// // The tool timed out after sending: did it create the incident? Nobody knows yet.
    /// let out = gateway.call("agent-a", &key, b"{}", |_| Err(ToolError::Ambiguous("timeout".into())))?;
    /// assert!(matches!(out, Outcome::Unresolved { .. }));
    /// clock.advance(Duration::from_secs(61));
    /// // The reconciler finds INC-9 in the incident system, created under this key.
    /// let resolved = gateway.reap(|call| {
    ///     assert_eq!(call.key, key.as_str());
    ///     CallResolution::Executed(b"INC-9".to_vec())
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
    pub fn reap(&self, mut resolve: impl FnMut(&StaleCall) -> CallResolution) -> Result<usize> {
        self.store.reap(|stale| {
            if stale.scope.endpoint() != ENDPOINT {
                return Resolution::Keep;
            }
            let call = StaleCall {
                tenant: stale.scope.tenant().to_owned(),
                key: stale.key.clone(),
                fence: stale.fence,
                claimed_at: stale.claimed_at,
                orphan: stale.orphan,
            };
            match resolve(&call) {
                CallResolution::Executed(result) => {
                    Resolution::Complete(Response::new(STATUS_OK, result))
                }
                CallResolution::Failed(failure) => {
                    Resolution::Complete(Response::new(STATUS_FAILED, failure))
                }
                CallResolution::NotExecuted => Resolution::Release,
                CallResolution::Undecided => Resolution::Keep,
            }
        })
    }
}

/// An abandoned tool call, as [`Gateway::reap`] hands it to the resolver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StaleCall {
    /// The tenant the call was made for.
    pub tenant: String,
    /// The call's key ([`ToolCallKey::as_str`]): what the tool's system knows the effect by.
    pub key: String,
    /// The abandoned attempt's fencing token.
    pub fence: u64,
    /// When the abandoned attempt claimed the call.
    pub claimed_at: SystemTime,
    /// Left by a previous process (rather than abandoned in this one).
    pub orphan: bool,
}

/// What the resolver of [`Gateway::reap`] found for one [`StaleCall`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallResolution {
    /// The side effect happened, with this result: stored, and replayed as `Ok` to every
    /// later attempt.
    Executed(Vec<u8>),
    /// The tool failed deterministically with this: stored, and replayed as `Err`.
    Failed(Vec<u8>),
    /// The side effect did not happen: the key is released and the next attempt runs the tool.
    NotExecuted,
    /// Not known yet: the call stays in progress and is offered again at the next reap.
    Undecided,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
