//! Reading records by fence, each checked (its CRC, its place) as it is decoded.

use crate::error::{Damaged, Error, Result};
use crate::file::layout::RECORDS;
use crate::file::load::check_place;
use crate::file::record::{Head, Record};
use crate::model::scope::display_scoped_key;
use redb::{Database, ReadableDatabase};

/// A record with the scoped key it carries.
pub(crate) type Keyed = (Box<[u8]>, Record);

/// Reads and verifies the record at `fence`, with the scoped key it carries; `None` if there
/// is none.
pub(crate) fn read_at(db: &Database, fence: u64) -> Result<Option<Keyed>> {
    Ok(read_many(db, [fence])?.pop().flatten())
}

/// [`read_at`] for each fence, in one read transaction: one snapshot of the file.
pub(crate) fn read_many(
    db: &Database,
    fences: impl IntoIterator<Item = u64>,
) -> Result<Vec<Option<Keyed>>> {
    let txn = db.begin_read()?;
    let records = txn.open_table(RECORDS)?;
    let mut out = Vec::new();
    for fence in fences {
        out.push(match records.get(fence)? {
            Some(v) => {
                let (key, record) = decode_at(fence, v.value())?;
                Some((key.into(), record))
            }
            None => None,
        });
    }
    Ok(out)
}

pub(super) fn corrupted(fence: u64, key: &[u8], reason: impl ToString) -> Error {
    Error::Corrupted {
        damaged: Damaged::Record {
            fence: Some(fence),
            key: Some(display_scoped_key(key)),
        },
        reason: reason.to_string(),
    }
}

/// Decodes and verifies the record stored at `fence`.
pub(super) fn decode_at(fence: u64, value: &[u8]) -> Result<(&[u8], Record)> {
    let (key, record, place) =
        Record::decode_placed(value).map_err(|e| damaged(fence, value, e))?;
    check_place(fence, key, place)?;
    Ok((key, record))
}

/// Decodes and verifies the head of the record stored at `fence`.
pub(super) fn decode_head_at(fence: u64, value: &[u8]) -> Result<(&[u8], Head)> {
    let (key, head, place) = Record::decode_head(value).map_err(|e| damaged(fence, value, e))?;
    check_place(fence, key, place)?;
    Ok((key, head))
}

pub(super) fn damaged(fence: u64, value: &[u8], e: crate::file::record::DecodeFailure) -> Error {
    let key = Record::unverified_key(value)
        .and_then(crate::model::scope::split_scoped_key)
        .map(|(scope, key)| {
            format!(
                "{:?}/{:?}/{key} (read from the damaged record)",
                scope.tenant(),
                scope.endpoint()
            )
        });
    Error::Corrupted {
        damaged: Damaged::Record {
            fence: Some(fence),
            key,
        },
        reason: e.to_string(),
    }
}
