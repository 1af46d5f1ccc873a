//! The store's schema in PostgreSQL: named, created and migrated on connect under a lock, and
//! checked for a version this library can read. Also the durability settings each session
//! runs with.

use super::pooler::PoolMode;
use super::rows::db_error;
use super::sql::{COUNTED, COUNT_RECORDS, CREATE, CREATE_USAGE, SCHEMA_VERSION};
use crate::error::{Error, InputProblem, Result};
use tokio_postgres::Client;

/// The longest schema name: PostgreSQL's identifiers are at most 63 bytes (`NAMEDATALEN - 1`).
const MAX_NAME_LEN: usize = 63;

/// The prefix PostgreSQL keeps for its system schemas: `CREATE SCHEMA pg_x` fails (SQLSTATE
/// 42939).
const RESERVED_PREFIX: &str = "pg_";

/// The schema-name rule [`crate::validate_schema`] documents (and exports).
///
/// # Errors
/// [`Error::InvalidSchema`] with the first thing wrong with `name`.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let bytes = name.as_bytes();
    let reason = if bytes.is_empty() {
        InputProblem::Empty
    } else if bytes.len() > MAX_NAME_LEN {
        InputProblem::TooLong {
            len: bytes.len(),
            max: MAX_NAME_LEN,
        }
    } else if let Some(at) = bytes.iter().enumerate().position(|(at, &b)| {
        !(b.is_ascii_lowercase() || b == b'_' || (at > 0 && b.is_ascii_digit()))
    }) {
        InputProblem::BadByte {
            byte: bytes[at],
            at,
        }
    } else if name.starts_with(RESERVED_PREFIX) {
        InputProblem::Reserved {
            prefix: RESERVED_PREFIX,
        }
    } else {
        return Ok(());
    };
    Err(Error::InvalidSchema {
        name: name.to_owned(),
        reason,
    })
}

/// `text` with `{s}` replaced by the quoted schema name.
pub(crate) fn qualify(text: &str, schema: &str) -> String {
    text.replace("{s}", &format!("\"{schema}\""))
}

/// Creates the schema if it is missing and checks its version, under a transaction-scoped
/// advisory lock so that replicas connecting at once do not race.
///
/// # Errors
/// [`Error::UnsupportedFormat`] for a schema a newer idemdb made; [`Error::Database`] for the
/// server's refusals (no `CREATE` permission, ...).
pub(crate) async fn migrate(client: &mut Client, schema: &str) -> Result<()> {
    let tx = locked(client, schema).await?;
    let meta = qualify("{s}.meta", schema);
    let exists: Option<String> = tx
        .query_one("SELECT to_regclass($1::text)::text", &[&meta])
        .await
        .map_err(db_error)?
        .get(0);
    let mut found = None;
    if exists.is_some() {
        found = tx
            .query_opt(&format!("SELECT schema_version FROM {meta}"), &[])
            .await
            .map_err(db_error)?
            .map(|row| row.get::<_, i32>(0));
        match found {
            Some(found) if found > SCHEMA_VERSION => {
                return Err(Error::UnsupportedFormat {
                    found: u64::try_from(found).unwrap_or_default(),
                    supported: u64::try_from(SCHEMA_VERSION).unwrap_or_default(),
                });
            }
            // Up to date: no DDL at all, so a role that may only read and write the tables
            // (not create in the database) connects to a schema made by another.
            Some(SCHEMA_VERSION) => return tx.commit().await.map_err(db_error),
            _ => {}
        }
    }
    tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
        .await
        .map_err(db_error)?;
    // Creating what is missing makes version 1; version 2 adds the tables and functions that
    // counting the records needs (the counting starts with the first store that has bounds).
    tx.batch_execute(&qualify(CREATE, schema))
        .await
        .map_err(db_error)?;
    tx.batch_execute(&qualify(CREATE_USAGE, schema))
        .await
        .map_err(db_error)?;
    if found == Some(1) {
        tx.batch_execute(&qualify("UPDATE {s}.meta SET schema_version = 2", schema))
            .await
            .map_err(db_error)?;
    }
    tx.commit().await.map_err(db_error)
}

/// A transaction holding the schema's migration lock (transaction-scoped, so that replicas
/// connecting at once do not race, and a transaction pooler keeps it on one session).
async fn locked<'c>(
    client: &'c mut Client,
    schema: &str,
) -> Result<tokio_postgres::Transaction<'c>> {
    let tx = client.transaction().await.map_err(db_error)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('idemdb schema ' || $1::text))",
        &[&schema],
    )
    .await
    .map_err(db_error)?;
    Ok(tx)
}

/// Makes the schema count its records, if it does not yet (a store with bounds needs the
/// counts): under the migration lock, [`COUNT_RECORDS`].
///
/// # Errors
/// [`Error::Database`] for the server's refusals (creating a trigger needs to own the table).
pub(crate) async fn count_records(client: &mut Client, schema: &str) -> Result<()> {
    let tx = locked(client, schema).await?;
    let counted: bool = tx
        .query_one(&qualify(COUNTED, schema), &[])
        .await
        .map_err(db_error)?
        .get(0);
    if !counted {
        tx.batch_execute(&qualify(COUNT_RECORDS, schema))
            .await
            .map_err(db_error)?;
    }
    tx.commit().await.map_err(db_error)
}

/// Refuses a server that cannot keep an acknowledged commit: `fsync = off` loses committed
/// transactions in a crash, whatever a session asks for.
///
/// # Errors
/// [`Error::Database`] naming the setting.
pub(crate) async fn check_durability(client: &Client) -> Result<()> {
    let fsync: String = client
        .query_typed_one("SELECT current_setting('fsync')", &[])
        .await
        .map_err(db_error)?
        .get(0);
    if fsync != "on" {
        return Err(Error::Database {
            sqlstate: None,
            reason: format!(
                "the server runs with fsync = {fsync}: a crash loses committed claims, so idemdb refuses it (set fsync = on)"
            ),
            driver: None,
        });
    }
    Ok(())
}

/// Makes the session's commits wait until they are durable: `synchronous_commit = on` (the
/// WAL flushed locally, and on every synchronous standby named in
/// `synchronous_standby_names`), unless the server already asks for `remote_apply`, which is
/// stronger. `off`, `local` and `remote_write` are never kept: with them a commit can be
/// acknowledged and then lost in a crash or a failover. Behind a transaction pooler the
/// session is not the store's to set: such a level is refused instead.
///
/// # Errors
/// [`Error::Database`] if the server refuses the setting, or (in
/// [`PoolMode::Transaction`]) names the level found and what to set.
pub(crate) async fn make_commits_durable(client: &Client, mode: PoolMode) -> Result<()> {
    let level: String = client
        .query_typed_one("SELECT current_setting('synchronous_commit')", &[])
        .await
        .map_err(db_error)?
        .get(0);
    if level == "remote_apply" || level == "on" {
        return Ok(());
    }
    match mode {
        PoolMode::Session => client
            .batch_execute("SET synchronous_commit = on")
            .await
            .map_err(db_error),
        PoolMode::Transaction => Err(Error::Database {
            sqlstate: None,
            reason: format!(
                "behind a transaction pooler, the server's sessions run with synchronous_commit = \
                 {level}, so an acknowledged claim could be lost in a crash, and idemdb may not \
                 set it on a shared session: set it for the role (ALTER ROLE ... SET \
                 synchronous_commit = on) or the server"
            ),
            driver: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in [
            "idemdb",
            "a",
            "payments_v2",
            "_x",
            "x_pg_",
            "pg",
            &"a".repeat(63),
        ] {
            assert!(crate::validate_schema(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "1abc",
            "Idemdb",
            "a-b",
            "a\"b",
            "a b",
            "é",
            "pg_x",
            "pg_",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(
                    crate::validate_schema(bad),
                    Err(Error::InvalidSchema { ref name, .. }) if name == bad
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_refused_schema_name_says_why_and_what_a_good_one_is() {
        let reason = |name: &str| match crate::validate_schema(name) {
            Err(Error::InvalidSchema { reason, .. }) => reason,
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(reason(""), InputProblem::Empty);
        assert_eq!(
            reason(&"a".repeat(64)),
            InputProblem::TooLong { len: 64, max: 63 }
        );
        assert_eq!(reason("1abc"), InputProblem::BadByte { byte: b'1', at: 0 });
        assert_eq!(reason("ab-c"), InputProblem::BadByte { byte: b'-', at: 2 });
        assert_eq!(reason("pg_x"), InputProblem::Reserved { prefix: "pg_" });
        let message = crate::validate_schema("pg_x").unwrap_err().to_string();
        for part in ["\"pg_x\"", "reserved", "lower-case", "such as idemdb"] {
            assert!(message.contains(part), "{message}");
        }
    }

    #[test]
    fn every_placeholder_is_qualified() {
        let q = qualify(CREATE, "s1");
        assert!(!q.contains("{s}"));
        assert!(q.contains("\"s1\".records"));
    }
}
