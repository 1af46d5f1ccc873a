//! The STORE argument: a store file, or a `postgres://` URL.

use crate::output::{Exit, Failure, Out};
use idemdb::{PageCheck, Store};
use std::path::Path;

/// How to reach the store the command works on.
pub(crate) struct Target {
    pub(crate) store: String,
    schema: String,
}

impl Target {
    pub(crate) fn new(store: String, schema: String) -> Target {
        Target { store, schema }
    }

    pub(crate) fn is_url(&self) -> bool {
        self.store.starts_with("postgres://") || self.store.starts_with("postgresql://")
    }

    /// The store file's path (`None` for a URL).
    pub(crate) fn path(&self) -> Option<&Path> {
        (!self.is_url()).then(|| Path::new(&self.store))
    }

    /// Opens the store, which must exist: a command never creates a store by accident. A
    /// spinner turns while it opens. A file's pages are trusted, as a service opens them.
    pub(crate) fn open(&self, out: &Out) -> Result<Store, Failure> {
        self.open_checking(out, PageCheck::Trust)
    }

    /// [`Target::open`], with every page of a store file read and its checksum verified first
    /// (redb's integrity check): what `verify` opens with.
    pub(crate) fn open_verified(&self, out: &Out) -> Result<Store, Failure> {
        self.open_checking(out, PageCheck::Verify)
    }

    /// [`Target::open`] even after an open of the file that never finished: to read what a
    /// damaged store still holds. Such an open leaves a marker that makes the next open verify
    /// every page (and refuse a damaged file); this one trusts the pages anyway, and puts the
    /// marker back afterwards, so a service's next start still verifies.
    pub(crate) fn open_past_damage(&self, out: &Out) -> Result<Store, Failure> {
        let marker = self.path().map(|path| {
            let mut name = path.as_os_str().to_owned();
            name.push("-opening");
            std::path::PathBuf::from(name)
        });
        let kept = marker
            .as_ref()
            .and_then(|m| std::fs::read(m).ok().map(|bytes| (m.clone(), bytes)));
        if let Some((marker, _)) = &kept {
            let _ = std::fs::remove_file(marker);
        }
        let opened = self.open_checking(out, PageCheck::Trust);
        if let Some((marker, bytes)) = kept {
            let _ = std::fs::write(marker, bytes);
        }
        opened
    }

    fn open_checking(&self, out: &Out, check: PageCheck) -> Result<Store, Failure> {
        let spinner = out.spinner("opening");
        let opened = self.open_quietly(check);
        spinner.finish_and_clear();
        opened
    }

    fn open_quietly(&self, check: PageCheck) -> Result<Store, Failure> {
        match self.path() {
            Some(path) => {
                if !path
                    .try_exists()
                    .map_err(|e| Failure::from(idemdb::Error::Io(e)))?
                {
                    return Err(Failure::new(
                        Exit::NoStore,
                        format!("no store at {} (nothing was created)", path.display()),
                    ));
                }
                // A disk that fails under the command should fail the command, not be retried.
                Ok(Store::builder()
                    .heal_after(None)
                    .page_check(check)
                    .open(path)?)
            }
            None => self.connect(),
        }
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn connect(&self) -> Result<Store, Failure> {
        // Refused here to name the option; `connect` would refuse it too, without naming it.
        idemdb::validate_schema(&self.schema)
            .map_err(|e| Failure::new(Exit::Usage, format!("--schema: {e}")))?;
        Ok(Store::builder()
            .schema(self.schema.clone())
            .connect(&self.store)?)
    }

    #[cfg(not(feature = "postgres"))]
    pub(crate) fn connect(&self) -> Result<Store, Failure> {
        let _ = &self.schema;
        Err(Failure::new(
            Exit::Usage,
            "this idemdb was built without PostgreSQL: install it with \
             `cargo install idemdb-cli --features postgres`",
        ))
    }
}
