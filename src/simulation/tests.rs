//! The simulated disk against a plain model: every write kept in order with whether it reached
//! the disk, and the images rebuilt from nothing by replaying them.

use super::{CrashImage, SimDisk, SplitMix64};
use redb::StorageBackend;

/// One write or length change, and whether a successful sync has since made it durable
/// (`None`: not yet synced; `Some(false)`: a failed sync covered it, so it never will be).
struct Issued {
    offset: usize,
    data: Vec<u8>,
    set_len: bool,
    durable: Option<bool>,
}

fn below(rng: &mut SplitMix64, n: u64) -> usize {
    usize::try_from(rng.next_u64() % n).expect("small")
}

fn replay<'a>(issued: impl Iterator<Item = &'a Issued>) -> Vec<u8> {
    let mut image = Vec::new();
    for w in issued {
        if w.set_len {
            image.resize(w.offset, 0);
        } else {
            let end = w.offset + w.data.len();
            if image.len() < end {
                image.resize(end, 0);
            }
            image[w.offset..end].copy_from_slice(&w.data);
        }
    }
    image
}

/// A sync writes what was issued since the last sync,
/// except what a failed sync covered, whatever mix of writes, length changes and failed syncs
/// came before.
#[test]
fn durable_image_is_every_synced_write_replayed_in_order() {
    for seed in 0..200 {
        let mut rng = SplitMix64::new(seed);
        let disk = SimDisk::new();
        let file = disk.backend();
        let mut issued: Vec<Issued> = Vec::new();
        for _ in 0..40 {
            match rng.next_u64() % 10 {
                0..=5 => {
                    let offset = below(&mut rng, 20_000);
                    let len = 1 + below(&mut rng, 3000);
                    let byte = rng.next_u64().to_le_bytes()[0];
                    file.write(offset as u64, &vec![byte; len]).unwrap();
                    issued.push(Issued {
                        offset,
                        data: vec![byte; len],
                        set_len: false,
                        durable: None,
                    });
                }
                6 => {
                    let len = below(&mut rng, 24_000);
                    file.set_len(len as u64).unwrap();
                    issued.push(Issued {
                        offset: len,
                        data: Vec::new(),
                        set_len: true,
                        durable: None,
                    });
                }
                7 => {
                    disk.fail_sync_after(0, false);
                    assert!(file.sync_data().is_err());
                    for w in issued.iter_mut().filter(|w| w.durable.is_none()) {
                        w.durable = Some(false);
                    }
                }
                _ => {
                    file.sync_data().unwrap();
                    for w in issued.iter_mut().filter(|w| w.durable.is_none()) {
                        w.durable = Some(true);
                    }
                }
            }
        }
        let live = replay(issued.iter());
        assert_eq!(disk.image(), live, "seed {seed}: live image");
        assert_eq!(
            disk.image_len(),
            live.len() as u64,
            "seed {seed}: live length"
        );
        let crashed = disk.fork();
        crashed.crash(CrashImage::Durable);
        let durable = replay(issued.iter().filter(|w| w.durable == Some(true)));
        assert_eq!(crashed.image(), durable, "seed {seed}: durable image");
    }
}
