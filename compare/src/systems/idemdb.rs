//! idemdb: `Store::open` with the default builder. A claim returns once its record is fsynced;
//! concurrent callers share one commit (group commit).

use super::{fail, Client, Result, Setup, System};
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
    dir: PathBuf,
}

impl IdemdbSystem {
    /// Opens a new store and preloads `keys` completed records through the async API, with
    /// thousands of claims and completions in flight so that they commit in large batches.
    pub fn open(setup: &Setup, keys: u64) -> Result<IdemdbSystem> {
        std::fs::create_dir_all(&setup.dir)?;
        let store = Store::open(setup.dir.join("store.idem"))?;
        let scopes: Vec<Scope> = (0..TENANTS)
            .map(|t| Scope::new(format!("tenant_{t}"), ENDPOINT))
            .collect();
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
                        store.complete_async(ticket, response(payload)).await?;
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
            dir: setup.dir.clone(),
        })
    }
}

fn response(payload: &Payload) -> Response {
    Response::new(STATUS, payload.response_body.clone())
}

impl System for IdemdbSystem {
    fn client(&self) -> Result<Box<dyn Client + '_>> {
        Ok(Box::new(IdemdbClient {
            system: self,
            ticket: None,
        }))
    }

    fn fsyncs(&self) -> Option<u64> {
        Some(self.store.stats().commit_batches)
    }

    fn destroy(self: Box<Self>) -> Result<()> {
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(dir)?;
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
                self.ticket = Some(ticket);
                Ok(())
            }
            other => fail(format!("idemdb: new key not acquired: {other:?}")),
        }
    }

    fn complete(&mut self, _req: &Request) -> Result<()> {
        let Some(ticket) = self.ticket.take() else {
            return fail("idemdb: complete without a claim");
        };
        self.system
            .store
            .complete(ticket, response(&self.system.payload))?;
        Ok(())
    }
}
