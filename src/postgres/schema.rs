//! The store's schema in PostgreSQL: named, created and migrated on connect under a lock, and
//! checked for a version this library can read. Also the durability settings each session
//! runs with.

use super::rows::db_error;
use super::sql::{CREATE, SCHEMA_VERSION};
use crate::error::{Error, Result};
use tokio_postgres::Client;

/// Checks a schema name: 1 to 63 bytes of lower-case ASCII letters, digits and `_`, not
/// starting with a digit, so it needs no quoting anywhere an operator types it.
pub(crate) fn check_name(name: &str) -> std::result::Result<(), String> {
    let ok = (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
        && !name.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "schema name {name:?} is not 1 to 63 lower-case ASCII letters, digits and _ (not starting with a digit or pg_)"
        ))
    }
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
    let tx = client.transaction().await.map_err(db_error)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('idemdb schema ' || $1::text))",
        &[&schema],
    )
    .await
    .map_err(db_error)?;
    let meta = qualify("{s}.meta", schema);
    let exists: Option<String> = tx
        .query_one("SELECT to_regclass($1::text)::text", &[&meta])
        .await
        .map_err(db_error)?
        .get(0);
    if exists.is_some() {
        let found: Option<i32> = tx
            .query_opt(&format!("SELECT schema_version FROM {meta}"), &[])
            .await
            .map_err(db_error)?
            .map(|row| row.get(0));
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
    // Version 1 is the only one so far: creating what is missing is the whole migration.
    tx.batch_execute(&qualify(CREATE, schema))
        .await
        .map_err(db_error)?;
    tx.commit().await.map_err(db_error)
}

/// Refuses a server that cannot keep an acknowledged commit: `fsync = off` loses committed
/// transactions in a crash, whatever a session asks for.
///
/// # Errors
/// [`Error::Database`] naming the setting.
pub(crate) async fn check_durability(client: &Client) -> Result<()> {
    let fsync: String = client
        .query_one("SELECT current_setting('fsync')", &[])
        .await
        .map_err(db_error)?
        .get(0);
    if fsync != "on" {
        return Err(Error::Database {
            sqlstate: None,
            reason: format!(
                "the server runs with fsync = {fsync}: a crash loses committed claims, so idemdb refuses it (set fsync = on)"
            ),
        });
    }
    Ok(())
}

/// Makes the session's commits wait until they are durable: `synchronous_commit = on` (the
/// WAL flushed locally, and on every synchronous standby named in
/// `synchronous_standby_names`), unless the server already asks for `remote_apply`, which is
/// stronger. `off`, `local` and `remote_write` are never kept: with them a commit can be
/// acknowledged and then lost in a crash or a failover.
///
/// # Errors
/// [`Error::Database`] if the server refuses the setting.
pub(crate) async fn make_commits_durable(client: &Client) -> Result<()> {
    let level: String = client
        .query_one("SELECT current_setting('synchronous_commit')", &[])
        .await
        .map_err(db_error)?
        .get(0);
    if level != "remote_apply" && level != "on" {
        client
            .batch_execute("SET synchronous_commit = on")
            .await
            .map_err(db_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in ["idemdb", "a", "payments_v2", "_x", &"a".repeat(63)] {
            assert!(check_name(good).is_ok(), "{good}");
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
            &"a".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_placeholder_is_qualified() {
        let q = qualify(CREATE, "s1");
        assert!(!q.contains("{s}"));
        assert!(q.contains("\"s1\".records"));
    }
}
