//! Upgrades of an older store format, run once at its first open: the heads table built from
//! the records (format 2), the `expiry` table dropped (format 3), the records counted (format 4).

use crate::error::{Damaged, Error, Result};
use crate::file::batch::head_of;
use crate::file::batch::quick_repair;
use crate::file::hashing::{Hashing, SipKey};
use crate::file::heads::{StoredHead, HEADS};
use crate::file::layout::EXPIRY;
use crate::file::layout::FORMAT_KEY;
use crate::file::layout::META;
use crate::file::layout::RECORDS;
use crate::file::layout::SECRET_KEYS;
use crate::file::layout::{STORE_FORMAT, UNCOUNTED_FORMAT};
use crate::file::load::out_of_order;
use redb::{Database, ReadableTable, TableDefinition};

/// Writes the `heads` table afresh from the records, under `secret`, and makes a file of format
/// 2 or 3 format 4 (dropping the `expiry` table), in one durable commit: the upgrade of a
/// format-2 file, the repair of a damaged heads table, and the re-keying after a hash
/// collision. Every record is read and its
/// checksum verified, as every open did before heads existed.
///
/// The records are the authority only over heads they can account for: a head is written and
/// deleted in the same transaction as its record (invariant 10), so a readable head whose
/// record is missing means the records table lost it. Then nothing is rebuilt: rebuilding would
/// forget the record, and every retry of its key would run again.
///
/// # Errors
/// [`Error::Corrupted`] naming the first record that fails, pages out of order, or records the
/// heads hold and the records table lacks; nothing is changed then.
pub(crate) fn rebuild_heads(db: &Database, secret: SipKey) -> Result<u64> {
    let hashing = Hashing::new(secret);
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    let mut rebuilt = 0;
    refuse_lost_records(&txn)?;
    delete_table(&txn, HEADS)?;
    delete_table(&txn, EXPIRY)?;
    {
        let records = txn.open_table(RECORDS)?;
        let mut heads = txn.open_table(HEADS)?;
        let mut previous = None;
        for entry in records.iter()? {
            let (fence, value) = entry?;
            let (fence, value) = (fence.value(), value.value());
            if previous.is_some_and(|p| fence <= p) {
                return Err(out_of_order("records", fence, previous, 0));
            }
            previous = Some(fence);
            heads.insert(fence, head_of(&hashing, fence, value)?)?;
            rebuilt += 1;
        }
        let mut meta = txn.open_table(META)?;
        meta.insert(SECRET_KEYS[0], secret.k0)?;
        meta.insert(SECRET_KEYS[1], secret.k1)?;
        // Format 2 had no heads; it is counted once the open has read it all (`count_records`).
        if meta.get(FORMAT_KEY)?.map(|v| v.value()) < Some(UNCOUNTED_FORMAT) {
            meta.insert(FORMAT_KEY, UNCOUNTED_FORMAT)?;
        }
    }
    txn.commit()?;
    Ok(rebuilt)
}

/// Upgrades a file of format 3 to format 4 in one durable commit: drops the `expiry`
/// table, which nothing reads any more. A crash before the commit leaves format 3, upgraded
/// again at the next open.
pub(crate) fn drop_expiry_table(db: &Database) -> Result<()> {
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    delete_table(&txn, EXPIRY)?;
    txn.open_table(META)?.insert(FORMAT_KEY, UNCOUNTED_FORMAT)?;
    txn.commit()?;
    Ok(())
}

/// Upgrades a file of format 4, 5 or 6 (or one an upgrade above just brought to 4) to
/// [`STORE_FORMAT`] in one durable commit: records how many records it holds (`record_count`;
/// formats 5 and 6 kept it already, and the open has checked it) and the format, after which
/// records of record format 2, and completions apart from their claims, may be written. Run last in the open, once every check the open makes
/// has passed, so that a damaged file is refused unchanged rather than counted; nothing before
/// it writes a record. A crash before the commit leaves the old format, upgraded again at the
/// next open. (What a format 4 file holds cannot be checked against a count it never kept:
/// this upgrade trusts it as the format 4 open did.)
pub(crate) fn count_records(db: &Database) -> Result<()> {
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    txn.open_table(META)?.insert(FORMAT_KEY, STORE_FORMAT)?;
    crate::file::layout::write_record_count(&txn)?;
    txn.commit()?;
    Ok(())
}

/// How many lost records [`refuse_lost_records`] names.
const NAMED: usize = 8;

/// `Err(Corrupted)` if the heads table holds a fence the records table lacks. A heads table
/// that cannot be read is no evidence either way (it is what a rebuild repairs).
fn refuse_lost_records(txn: &redb::WriteTransaction) -> Result<()> {
    let lost = match heads_without_records(txn) {
        Ok(lost) => lost,
        Err(_) => return Ok(()),
    };
    if lost.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = lost.iter().take(NAMED).map(u64::to_string).collect();
    Err(Error::Corrupted {
        damaged: Damaged::Pages,
        reason: format!(
            "the heads table holds {} records that the records table lacks (fences {}{}): the \
             records table's pages were damaged or written over; nothing was changed",
            lost.len(),
            named.join(", "),
            if lost.len() > NAMED { ", ..." } else { "" }
        ),
    })
}

/// The fences of the heads whose records are missing, in order: one pass over both tables,
/// which are ordered by fence. Only a head that passes its checksum, which covers its fence,
/// is evidence: one damaged or written to another fence is what a rebuild repairs.
fn heads_without_records(txn: &redb::WriteTransaction) -> Result<Vec<u64>> {
    let heads = match txn.open_table(HEADS) {
        Ok(heads) => heads,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let records = txn.open_table(RECORDS)?;
    let mut records = records.iter()?.map(|r| r.map(|(k, _)| k.value()));
    let mut record = records.next().transpose()?;
    let mut lost = Vec::new();
    for head in heads.iter()? {
        let (fence, bytes) = head?;
        let fence = fence.value();
        if StoredHead::decode(fence, &bytes.value()).is_none() {
            continue;
        }
        while record.is_some_and(|r| r < fence) {
            record = records.next().transpose()?;
        }
        if record != Some(fence) {
            lost.push(fence);
        }
    }
    Ok(lost)
}

pub(super) fn delete_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<()> {
    match txn.delete_table(table) {
        Ok(_) | Err(redb::TableError::TableDoesNotExist(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
