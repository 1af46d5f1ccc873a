//! idemdb: `Store::open` with the default builder (idemdb-lz4: with `compress_responses(true)`) (a claim returns once its record is fsynced;
//! concurrent callers share one commit), or `Store::connect` to the comparison's PostgreSQL
//! server with the default builder (a claim returns once PostgreSQL committed it; claims that
//! queue up share one statement and one commit).

use super::{fail, Client, Pending, Result, Setup, System, TaskClient};
use crate::executor;
use crate::workload::{Payload, Request, ENDPOINT, STATUS, TENANTS};
use idemdb::{Claim, Fingerprint, Response, Scope, Store, Ticket};
use std::path::PathBuf;

/// Futures kept in flight by the preload: enough for batches of thousands of writes.
const PRELOAD_IN_FLIGHT: usize = 8192;

pub struct IdemdbSystem {
    store: Store,
    scopes: Vec<Scope>,
    payload: Payload,
    place: Place,
}

/// Where the store lives, to be removed by `destroy`.
enum Place {
    Dir(PathBuf),
    Schema { url: String, schema: String },
}

impl IdemdbSystem {
    /// Opens a new store file and preloads it (see [`IdemdbSystem::preload`]); `compress`:
    /// with `compress_responses`.
    pub fn open(setup: &Setup, keys: u64, compress: bool) -> Result<IdemdbSystem> {
        std::fs::create_dir_all(&setup.dir)?;
        let store = Store::builder()
            .compress_responses(compress)
            .open(setup.dir.join("store.idem"))?;
        IdemdbSystem::preload(store, setup, keys, Place::Dir(setup.dir.clone()))
    }

    /// Connects a new store to the PostgreSQL server, in a fresh schema, and preloads it.
    pub fn connect(setup: &Setup, keys: u64) -> Result<IdemdbSystem> {
        let Some(url) = setup.postgres.clone() else {
            return fail("idemdb-postgres: no --postgres given");
        };
        let schema = format!("compare_{}", std::process::id());
        drop_schema(&url, &schema)?;
        let store = Store::builder().schema(schema.clone()).connect(&url)?;
        IdemdbSystem::preload(store, setup, keys, Place::Schema { url, schema })
    }

    /// Connects to the schema another process created and preloaded (a multi-process cell's
    /// parent), with the default builder as [`IdemdbSystem::connect`]: nothing is preloaded or
    /// dropped. Its clients forget unspent tickets as the parent's do (see
    /// `IdemdbClient::claim`).
    pub fn attach(setup: &Setup, schema: &str) -> Result<IdemdbSystem> {
        let Some(url) = setup.postgres.clone() else {
            return fail("idemdb-postgres: no --postgres given");
        };
        let store = Store::builder().schema(schema).connect(&url)?;
        let place = Place::Schema {
            url,
            schema: schema.to_owned(),
        };
        Ok(IdemdbSystem {
            store,
            scopes: scopes(),
            payload: setup.payload.clone(),
            place,
        })
    }

    /// Preloads `keys` completed records through the async API, with thousands of claims and
    /// completions in flight so that they commit in large batches.
    fn preload(store: Store, setup: &Setup, keys: u64, place: Place) -> Result<IdemdbSystem> {
        let scopes = scopes();
        let payload = setup.payload.clone();
        let mut requests = setup.preload_requests();
        let started = std::time::Instant::now();
        executor::run_all(keys, PRELOAD_IN_FLIGHT, |i| {
            let step = setup.preload_step("idemdb", i, keys, started);
            let req = requests.next_request();
            let (store, scopes, payload) = (&store, &scopes, &payload);
            async move {
                step?;
                let fp = Fingerprint::of(&req.body);
                match store.claim_async(&scopes[req.tenant], &req.key, fp).await? {
                    Claim::Acquired(ticket) => {
                        store
                            .complete_async(ticket, response(payload, &req))
                            .await?;
                        Ok(())
                    }
                    other => fail(format!("idemdb preload: new key not acquired: {other:?}")),
                }
            }
        })?;
        Ok(IdemdbSystem {
            store,
            scopes,
            payload,
            place,
        })
    }

    fn on_postgres(&self) -> bool {
        matches!(self.place, Place::Schema { .. })
    }
}

/// The workload's scopes, one per tenant.
fn scopes() -> Vec<Scope> {
    (0..TENANTS)
        .map(|t| Scope::new(format!("tenant_{t}"), ENDPOINT))
        .collect()
}

fn drop_schema(url: &str, schema: &str) -> Result<()> {
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))?;
    Ok(())
}

fn response(payload: &Payload, req: &Request) -> Response {
    Response::new(STATUS, payload.body(req).to_vec())
}

impl System for IdemdbSystem {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        Ok(Box::new(IdemdbClient {
            system: self,
            ticket: None,
        }))
    }

    fn task_client(&self) -> Option<Box<dyn TaskClient>> {
        Some(Box::new(IdemdbTaskClient {
            store: self.store.clone(),
            scopes: self.scopes.clone(),
            payload: self.payload.clone(),
            on_postgres: self.on_postgres(),
            ticket: None,
        }))
    }

    fn fsyncs(&self) -> Option<u64> {
        Some(self.store.stats().commit_batches)
    }

    fn shared_schema(&self) -> Option<&str> {
        match &self.place {
            Place::Schema { schema, .. } => Some(schema),
            Place::Dir(_) => None,
        }
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        let IdemdbSystem { store, place, .. } = *self;
        drop(store);
        match place {
            Place::Dir(dir) => std::fs::remove_dir_all(dir)?,
            Place::Schema { url, schema } => drop_schema(&url, &schema)?,
        }
        Ok(())
    }
}

struct IdemdbClient<'a> {
    system: &'a IdemdbSystem,
    /// The ticket of the last claim, for `complete` (dropped unused by the claim workload: the
    /// claim then stays in progress until its lease runs out, which nothing here waits for).
    ticket: Option<Ticket>,
}

impl Client for IdemdbClient<'_> {
    fn claim(&mut self, req: &Request) -> Result<()> {
        let s = self.system;
        let fp = Fingerprint::of(&req.body);
        match s.store.claim(&s.scopes[req.tenant], &req.key, fp)? {
            Claim::Acquired(ticket) => {
                if let Some(unspent) = self.ticket.replace(ticket) {
                    if s.on_postgres() {
                        // On PostgreSQL a ticket dropped unspent marks its claim an orphan
                        // with a statement of its own; the claim workload measures claims.
                        // The same in the child processes of a multi-process cell, whose
                        // stores `attach` to the parent's schema.
                        std::mem::forget(unspent);
                    }
                }
                Ok(())
            }
            other => fail(format!("idemdb: new key not acquired: {other:?}")),
        }
    }

    fn complete(&mut self, req: &Request) -> Result<()> {
        let Some(ticket) = self.ticket.take() else {
            return fail("idemdb: complete without a claim");
        };
        self.system
            .store
            .complete(ticket, response(&self.system.payload, req))?;
        Ok(())
    }
}

/// A tokio task's client: `claim_async` and `complete_async` on its own handle of the store,
/// with the tickets kept and forgotten as [`IdemdbClient`] does.
struct IdemdbTaskClient {
    store: Store,
    scopes: Vec<Scope>,
    payload: Payload,
    on_postgres: bool,
    ticket: Option<Ticket>,
}

impl TaskClient for IdemdbTaskClient {
    fn claim<'a>(&'a mut self, req: &'a Request) -> Pending<'a> {
        Box::pin(async move {
            let fp = Fingerprint::of(&req.body);
            match self
                .store
                .claim_async(&self.scopes[req.tenant], &req.key, fp)
                .await?
            {
                Claim::Acquired(ticket) => {
                    if let Some(unspent) = self.ticket.replace(ticket) {
                        if self.on_postgres {
                            // As in `IdemdbClient::claim`.
                            std::mem::forget(unspent);
                        }
                    }
                    Ok(())
                }
                other => fail(format!("idemdb: new key not acquired: {other:?}")),
            }
        })
    }

    fn complete<'a>(&'a mut self, req: &'a Request) -> Pending<'a> {
        Box::pin(async move {
            let Some(ticket) = self.ticket.take() else {
                return fail("idemdb: complete without a claim");
            };
            self.store
                .complete_async(ticket, response(&self.payload, req))
                .await?;
            Ok(())
        })
    }
}
