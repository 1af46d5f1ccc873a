//! One conformance suite, two engines: a test written once with [`on_every_engine!`] runs as
//! `<name>::file` on a store file in a temporary directory and, with the `postgres` feature,
//! as `<name>::postgres` on the PostgreSQL server named by `IDEMDB_PG_URL` (start one with
//! `scripts/with-postgres`), in a schema of its own.
//!
//! A [`Backend`] is one place a store lives: a file path, or a schema and an owner name.
//! Opening it again is a reopen (file) or a reconnect of the same replica (PostgreSQL).

#![allow(dead_code)]

use idemdb::{Store, StoreBuilder};

/// Where a test's store lives.
pub(crate) enum Place {
    File(tempfile::TempDir),
    #[cfg(feature = "postgres")]
    Postgres {
        url: String,
        schema: String,
    },
}

/// One store's place, on one engine.
pub(crate) struct Backend {
    pub(crate) place: Place,
}

impl Backend {
    /// A store file in a fresh temporary directory.
    pub(crate) fn file() -> Backend {
        Backend {
            place: Place::File(tempfile::tempdir().unwrap()),
        }
    }

    /// A fresh schema on the test server, named after `test` (and this process, so that runs
    /// against a long-lived server never meet).
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(test: &str) -> Backend {
        use std::hash::{Hash, Hasher};
        let url = std::env::var("IDEMDB_PG_URL").unwrap_or_else(|_| {
            panic!(
                "IDEMDB_PG_URL is not set: run the PostgreSQL suite as \
                 `scripts/with-postgres cargo test --release --features postgres`"
            )
        });
        let mut h = std::collections::hash_map::DefaultHasher::new();
        test.hash(&mut h);
        std::process::id().hash(&mut h);
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .hash(&mut h);
        Backend {
            place: Place::Postgres {
                url,
                schema: format!("t_{:016x}", h.finish()),
            },
        }
    }

    pub(crate) fn engine(&self) -> &'static str {
        match &self.place {
            Place::File(_) => "file",
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => "postgres",
        }
    }

    pub(crate) fn is_file(&self) -> bool {
        matches!(self.place, Place::File(_))
    }

    /// The store file's path (file engine only).
    pub(crate) fn path(&self) -> std::path::PathBuf {
        match &self.place {
            Place::File(dir) => dir.path().join("store.idem"),
            #[cfg(feature = "postgres")]
            Place::Postgres { .. } => panic!("a PostgreSQL store has no file"),
        }
    }

    /// The store at this place with the default settings.
    pub(crate) fn store(&self) -> Store {
        self.open(Store::builder())
    }

    /// The store at this place with `builder`'s settings; opened again, it is the same store
    /// (a reopen, or a reconnect of the same replica).
    pub(crate) fn open(&self, builder: StoreBuilder) -> Store {
        self.try_open(builder).unwrap()
    }

    pub(crate) fn try_open(&self, builder: StoreBuilder) -> idemdb::Result<Store> {
        match &self.place {
            Place::File(_) => builder.open(self.path()),
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema } => builder
                .schema(schema.clone())
                .owner("replica-1")
                .connect(url),
        }
    }

    /// A second replica of the same store: on PostgreSQL another `Store` (another owner) on
    /// the same schema; a file has one owner, so this is `None`.
    pub(crate) fn replica(&self, builder: StoreBuilder, owner: &str) -> Option<Store> {
        let _ = (&builder, owner);
        match &self.place {
            Place::File(_) => None,
            #[cfg(feature = "postgres")]
            Place::Postgres { url, schema } => Some(
                builder
                    .schema(schema.clone())
                    .owner(owner)
                    .connect(url)
                    .unwrap(),
            ),
        }
    }
}

/// Writes each test once; it runs on every engine (see the module's doc).
#[macro_export]
macro_rules! on_every_engine {
    ($( $(#[$meta:meta])* fn $name:ident($b:ident: Backend) $body:block )*) => {$(
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn body($b: $crate::engines::Backend) $body

            #[test]
            fn file() {
                body($crate::engines::Backend::file())
            }

            #[cfg(feature = "postgres")]
            #[test]
            fn postgres() {
                body($crate::engines::Backend::postgres(module_path!()))
            }
        }
    )*};
}
