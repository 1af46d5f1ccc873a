//! The file engine: one process owns one redb file. Decisions come from a lock-striped index in
//! memory; writes go through a group-commit pipeline that makes each batch durable with one
//! journal append and one `fdatasync`, and applies it to redb. `docs/design.md` has the whole
//! argument.

pub(crate) mod asynchronous;
pub(crate) mod batch;
pub(crate) mod commit;
pub(crate) mod hashing;
pub(crate) mod heads;
pub(crate) mod heal;
#[cfg(feature = "export")]
pub(crate) mod import;
pub(crate) mod index;
pub(crate) mod journal;
pub(crate) mod layout;
pub(crate) mod load;
pub(crate) mod maintenance;
pub(crate) mod marker;
pub(crate) mod open;
pub(crate) mod platform;
pub(crate) mod read;
pub(crate) mod record;
pub(crate) mod scan;
pub(crate) mod space;
pub(crate) mod store;
pub(crate) mod tenants;
#[cfg(test)]
mod tests;
pub(crate) mod upgrade;
pub(crate) mod watch;

pub(crate) use store::FileStore;
