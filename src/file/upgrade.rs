//! Upgrades of an older store format, run once at its first open: the heads table built from
//! the records (format 2), the `expiry` table dropped (format 3).

use crate::error::Result;
use crate::file::batch::head_of;
use crate::file::batch::quick_repair;
use crate::file::hashing::{Hashing, SipKey};
use crate::file::heads::HEADS;
use crate::file::layout::EXPIRY;
use crate::file::layout::FORMAT_KEY;
use crate::file::layout::META;
use crate::file::layout::RECORDS;
use crate::file::layout::SECRET_KEYS;
use crate::file::layout::STORE_FORMAT;
use crate::file::load::out_of_order;
use redb::{Database, ReadableTable, TableDefinition};

/// Writes the `heads` table afresh from the records, under `secret`, and makes the file
/// [`STORE_FORMAT`] (dropping the `expiry` table of format 3 or below), in one durable commit:
/// the upgrade of a format-2 file, the repair of a
/// damaged heads table, and the re-keying after a hash collision. Every record is read and its
/// checksum verified, as every open did before heads existed.
///
/// # Errors
/// [`Error::Corrupted`] naming the first record that fails, or pages out of order; nothing is
/// changed then.
pub(crate) fn rebuild_heads(db: &Database, secret: SipKey) -> Result<u64> {
    let hashing = Hashing::new(secret);
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    let mut rebuilt = 0;
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
        meta.insert(FORMAT_KEY, STORE_FORMAT)?;
    }
    txn.commit()?;
    Ok(rebuilt)
}

/// Upgrades a file of format 3 to [`STORE_FORMAT`] in one durable commit: drops the `expiry`
/// table, which nothing reads any more. A crash before the commit leaves format 3, upgraded
/// again at the next open.
pub(crate) fn drop_expiry_table(db: &Database) -> Result<()> {
    let mut txn = db.begin_write()?;
    quick_repair(&mut txn);
    delete_table(&txn, EXPIRY)?;
    txn.open_table(META)?.insert(FORMAT_KEY, STORE_FORMAT)?;
    txn.commit()?;
    Ok(())
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
