//! `idemdb`: the operator's command for an idemdb store, a file or (feature `postgres`) a
//! PostgreSQL database. See `docs/operations.md` for every command, its output and its exit
//! codes.

mod inspect;
mod maintain;
mod open;
mod output;
mod resolve;
mod transfer;

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

/// Inspect and repair an idemdb store: a store file, or a postgres:// URL.
///
/// A store file is owned by one process: stop the service that holds it first (or offer the
/// same inspection from inside the service with `Store::scan`). Opening a file recovers its
/// journal, as the service's own restart would.
#[derive(Debug, Parser)]
#[command(name = "idemdb", version, after_help = output::EXIT_CODES)]
struct Cli {
    /// Print one JSON document instead of tables, for scripts.
    #[arg(long, global = true)]
    json: bool,
    /// The PostgreSQL schema of the store (a postgres:// STORE only).
    #[arg(long, global = true, default_value = "idemdb")]
    schema: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Records by status and by tenant, file sizes, the highest fence, the oldest claim.
    Stats(Store),
    /// Records, in the order stored on a file (by fence: claims in progress oldest first,
    /// completions in the order they completed), by key on PostgreSQL.
    List(inspect::ListArgs),
    /// One record, with its stored response.
    Get(inspect::GetArgs),
    /// Release or complete a stuck claim, fenced so that it cannot clobber a newer attempt.
    Resolve(resolve::ResolveArgs),
    /// Delete every record whose TTL ran out.
    Purge(Store),
    /// Open the store with every check (pages, journal, records), then read every record in
    /// full; report what is damaged.
    Verify(Store),
    /// Write every live record to standard output, one JSON line each.
    Export(transfer::ExportArgs),
    /// Read an export from standard input into a new store file or an empty PostgreSQL store.
    Import(Store),
}

/// The store argument every command takes.
#[derive(Debug, Args)]
struct Store {
    /// A store file, or a postgres:// URL.
    store: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = output::Out::new(cli.json);
    let target = |store: &str| open::Target::new(store.to_owned(), cli.schema.clone());
    let result = match &cli.command {
        Command::Stats(s) => inspect::stats(&target(&s.store), &out),
        Command::List(a) => inspect::list(&target(a.store()), a, &out),
        Command::Get(a) => inspect::get(&target(a.store()), a, &out),
        Command::Resolve(a) => resolve::resolve(&target(a.store()), a, &out),
        Command::Purge(s) => maintain::purge(&target(&s.store), &out),
        Command::Verify(s) => maintain::verify(&target(&s.store), &out),
        Command::Export(s) => transfer::export(&target(s.store()), s, &out),
        Command::Import(s) => transfer::import(&target(&s.store), &out),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(&out),
    }
}
