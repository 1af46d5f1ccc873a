//! `idemdb purge` and `idemdb verify`.

use crate::open::Target;
use crate::output::{span, Exit, Failure, Out, Outcome};
use idemdb::Query;
use serde_json::json;
use std::ops::ControlFlow;
use std::time::Instant;

pub(crate) fn purge(target: &Target, out: &Out) -> Outcome {
    let started = Instant::now();
    let store = target.open(out)?;
    let bar = out.spinner("purging");
    let purged = store.purge_expired()?;
    bar.finish_and_clear();
    let took = started.elapsed();
    if out.json {
        out.json(&json!({ "purged": purged, "seconds": took.as_secs_f64() }));
    } else {
        println!("purged {purged} expired records in {}", span(took));
    }
    Ok(())
}

/// Opens the store with every check its open makes, then reads every record in full.
pub(crate) fn verify(target: &Target, out: &Out) -> Outcome {
    let started = Instant::now();
    let store = match target.open_verified(out) {
        Ok(store) => store,
        Err(f) if f.exit == Exit::Damaged => return damaged(out, "open", &f.message),
        Err(f) => return Err(f),
    };
    let opened = started.elapsed();
    // A file's index count is free (and checked below); PostgreSQL's is a count of the table.
    let indexed = store.record_count()?;
    let bar = out.progress("verifying", (indexed > 0).then_some(indexed));
    let read = store.scan(&Query::all(), |_| {
        bar.inc(1);
        ControlFlow::Continue(())
    });
    bar.finish_and_clear();
    let read = match read {
        Ok(n) => n,
        Err(e) => {
            let f = Failure::from(e);
            if f.exit == Exit::Damaged {
                return damaged(out, "read", &f.message);
            }
            return Err(f);
        }
    };
    if target.path().is_some() && read != indexed {
        let why =
            format!("the index built at open holds {indexed} records, but {read} were read back");
        return damaged(out, "read", &why);
    }
    let took = started.elapsed();
    let checks: &[&str] = if target.path().is_some() {
        &[
            "pages: every page's checksum, as redb's integrity check on open",
            "journal: bound to this store file, replayed and checkpointed into it",
            "meta: format, store id, fence reservation, journal epoch",
            "index: every record's head read at open, its CRC-32 checked, no key held twice",
            "records: every record read in full, its CRC-32 checked, at its own fence",
        ]
    } else {
        &[
            "schema: version checked on connect",
            "records: every row read in full",
        ]
    };
    if out.json {
        out.json(&json!({
            "ok": true, "records": read, "checks": checks,
            "open_seconds": opened.as_secs_f64(), "seconds": took.as_secs_f64(),
        }));
    } else {
        println!("ok: {read} records, no damage found");
        for c in checks {
            println!("  checked {c}");
        }
        println!("took {} (open {})", span(took), span(opened));
    }
    Ok(())
}

/// Reports damage found at `stage`, and exits with [`Exit::Damaged`].
fn damaged(out: &Out, stage: &str, what: &str) -> Outcome {
    if out.json {
        out.json(
            &json!({ "ok": false, "stage": stage, "damage": what, "exit": Exit::Damaged as u8 }),
        );
    } else {
        println!("DAMAGED ({stage}): {what}");
        println!(
            "The store refuses to serve rather than forget a payment. Restore the store file \
             and its journal together from a backup, or export what a copy still reads."
        );
    }
    Err(Failure::new(Exit::Damaged, format!("verify found damage: {what}")).reported())
}
