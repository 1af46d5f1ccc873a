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

/// Opens the store with every check its open makes, then reads every record in full. On
/// damage, it lists every damaged record it can find, not the first: a trusting open reads past
/// the pages the verified one refused.
pub(crate) fn verify(target: &Target, out: &Out) -> Outcome {
    let started = Instant::now();
    let store = match target.open_verified(out) {
        Ok(store) => store,
        Err(f) if f.exit == Exit::Damaged => {
            let records = match target.open_past_damage(out) {
                Ok(store) => damaged_records(&store, out),
                // The pages it needs to find any record are damaged too.
                Err(_) => Vec::new(),
            };
            return damaged(out, "open", &f.message, &records);
        }
        Err(f) => return Err(f),
    };
    let opened = started.elapsed();
    // A file's index count is free (and checked below); PostgreSQL's is a count of the table.
    let indexed = store.record_count()?;
    let bar = out.progress("verifying", (indexed > 0).then_some(indexed));
    let mut records = Vec::new();
    let read = store.scan_past_damage(
        &Query::all(),
        |_| {
            bar.inc(1);
            ControlFlow::Continue(())
        },
        |e| records.push(e.to_string()),
    );
    bar.finish_and_clear();
    let read = match read {
        Ok(n) => n,
        Err(e) => {
            let f = Failure::from(e);
            if f.exit == Exit::Damaged {
                return damaged(out, "read", &f.message, &records);
            }
            return Err(f);
        }
    };
    if !records.is_empty() {
        let what = format!(
            "{} of {indexed} records are damaged: {}",
            records.len(),
            records.join("; ")
        );
        return damaged(out, "read", &what, &records);
    }
    if target.path().is_some() && read != indexed {
        let why =
            format!("the index built at open holds {indexed} records, but {read} were read back");
        return damaged(out, "read", &why, &records);
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

/// Every damaged record a (trusting) store can name, each as its error's text.
fn damaged_records(store: &idemdb::Store, out: &Out) -> Vec<String> {
    let bar = out.spinner("listing damaged records");
    let mut records = Vec::new();
    let _ = store.scan_past_damage(
        &Query::all(),
        |_| ControlFlow::Continue(()),
        |e| records.push(e.to_string()),
    );
    bar.finish_and_clear();
    records
}

/// Reports damage found at `stage`, with every damaged record found (`records`), and exits
/// with [`Exit::Damaged`].
fn damaged(out: &Out, stage: &str, what: &str, records: &[String]) -> Outcome {
    if out.json {
        out.json(&json!({
            "ok": false, "stage": stage, "damage": what, "damaged_records": records,
            "exit": Exit::Damaged as u8,
        }));
    } else {
        println!("DAMAGED ({stage}): {what}");
        if !records.is_empty() {
            println!("{} damaged records:", records.len());
            for r in records {
                println!("  {r}");
            }
        }
        println!(
            "The store refuses to serve rather than forget a payment. Restore the store file \
             and its journal together from a backup, or carry every intact record into a new \
             store: `idemdb export --past-damage STORE | idemdb import NEW`."
        );
    }
    Err(Failure::new(Exit::Damaged, format!("verify found damage: {what}")).reported())
}
