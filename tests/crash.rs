//! Power loss, simulated: a fixed workload is run on a simulated disk whose power is cut at
//! every write and sync in turn; each pre-crash state is crashed several ways (no unsynced
//! write survives, all do, a random subset does, a subset torn at 512-byte sectors), reopened,
//! and checked against what the store acknowledged. Also: disk full and failing fsync.
//!
//! `IDEMDB_CRASH_STEPS` (default 300) sets the workload length and `IDEMDB_CRASH_SEEDS`
//! (default 3) how many workloads to sweep; `IDEMDB_CRASH_IMAGES` (default 4) how many images
//! per crash point.

// Test arithmetic on small counts; the lint guards the on-disk format.
#![allow(clippy::cast_possible_truncation)]

mod crash_model;

use crash_model::{crash_and_check, old_ticket_is_fenced_off, run_on, workload, Stop};
use idemdb::simulation::{CrashImage, SimDisk};
use idemdb::{Error, ManualClock};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn images(seed: u64, n: u64) -> Vec<CrashImage> {
    let mut out = vec![CrashImage::Durable, CrashImage::All];
    for i in 0..n.saturating_sub(2) {
        let s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i;
        out.push(if i % 2 == 0 {
            CrashImage::Subset(s)
        } else {
            CrashImage::Torn(s)
        });
    }
    out
}

#[test]
fn power_loss_at_every_write_and_sync() {
    let steps_len = env("IDEMDB_CRASH_STEPS", 300) as usize;
    let seeds = env("IDEMDB_CRASH_SEEDS", 3);
    let per_point = env("IDEMDB_CRASH_IMAGES", 4);
    let (mut points, mut checked_images, mut keys_checked, mut acked) = (0u64, 0u64, 0usize, 0u64);
    for seed in 0..seeds {
        let steps = workload(0xC0FFEE + seed, steps_len);
        // A dry run counts the I/O events of the whole workload, opening included.
        let disk = SimDisk::new();
        let (model, stop) = run_on(&disk, ManualClock::new(), &steps);
        assert!(matches!(stop, Stop::Done), "{stop:?}");
        let events = disk.events();
        assert!(
            model.acknowledged > steps_len as u64 / 3,
            "a workload that does something"
        );
        // Creation is atomic (built aside, then linked into place), so the sweep starts from a
        // created store and cuts the power at every event after it.
        let created = SimDisk::new();
        drop(run_on(&created, ManualClock::new(), &[]));
        let events = events - created.events();
        for point in 0..=events {
            let disk = created.fork();
            disk.cut_power_after(point);
            let (mut model, _stop) = run_on(&disk, ManualClock::new(), &steps);
            acked += model.acknowledged;
            for (i, image) in images(point ^ seed << 32, per_point)
                .into_iter()
                .enumerate()
            {
                let crashed = disk.fork();
                keys_checked += crash_and_check(&crashed, image, &model);
                if i == 0 {
                    let store = model.builder().open_simulated(&crashed).unwrap();
                    old_ticket_is_fenced_off(&mut model, &store);
                }
                checked_images += 1;
            }
            points += 1;
        }
    }
    println!(
        "power loss: {seeds} workload(s) of {steps_len} steps, {points} crash points, \
         {checked_images} images checked ({keys_checked} key states, {acked} acknowledged \
         operations before the crashes), 0 lost"
    );
}

/// A disk that fills up: every write fails from some point on. Every call then fails, nothing
/// failed is acknowledged, and what was acknowledged survives.
#[test]
fn disk_full_fails_stop_and_keeps_what_was_acknowledged() {
    let steps = workload(7, 200);
    for after in [0, 3, 10, 40, 90] {
        let disk = SimDisk::new();
        let (model, stop) = run_on(&disk, ManualClock::new(), &[]);
        assert!(matches!(stop, Stop::Done));
        let mut model = model;
        let store = model.builder().open_simulated(&disk).unwrap();
        disk.fail_write_after(after, true);
        let stop = model.run(&store, &steps);
        match stop {
            Stop::Failed(Error::Io(_) | Error::Storage(_) | Error::Halted { .. }) => {}
            other => panic!("after {after} writes: {other:?}"),
        }
        // Fail-stop: nothing is answered any more.
        assert!(matches!(
            store.get(&idemdb::Scope::new("acme", "POST /v1/payments"), "key-0"),
            Err(Error::Halted { .. })
        ));
        drop(store);
        for image in [CrashImage::Durable, CrashImage::All] {
            crash_and_check(&disk.fork(), image, &model);
        }
    }
}

/// An fsync that fails once: the batch fails, the store halts (a retried fsync can falsely
/// succeed after the kernel dropped the dirty pages), and a reopen finds exactly what was
/// acknowledged.
#[test]
fn failed_fsync_fails_stop_and_keeps_what_was_acknowledged() {
    let steps = workload(11, 200);
    for after in [1, 5, 20, 60] {
        let disk = SimDisk::new();
        let (mut model, _) = run_on(&disk, ManualClock::new(), &[]);
        let store = model.builder().open_simulated(&disk).unwrap();
        disk.fail_sync_after(after, false);
        let stop = model.run(&store, &steps);
        assert!(matches!(stop, Stop::Failed(_)), "sync {after}: {stop:?}");
        let later = store.claim(
            &idemdb::Scope::new("acme", "POST /v1/payments"),
            "another",
            idemdb::Fingerprint::of(b"x"),
        );
        assert!(matches!(later, Err(Error::Halted { .. })), "{later:?}");
        drop(store);
        for image in [
            CrashImage::Durable,
            CrashImage::All,
            CrashImage::Torn(after),
        ] {
            crash_and_check(&disk.fork(), image, &model);
        }
    }
}
