//! The command line, parsed with clap.

use crate::runner::{Callers, Workload};
use crate::systems::Kind;
use clap::Parser;
use std::path::PathBuf;

/// Runs idemdb next to naive redb, SQLite, PostgreSQL, Redis and the disk's fsync floor, on one
/// durable-claim workload, in one run (see compare/README.md).
///
/// The list options take one comma-separated value (`--callers 1,4,16` or `--callers=1,4,16`);
/// spaces around items and empty items are ignored, an empty list is an error. An option given
/// twice keeps its last value.
//
// The command line; its doc comments are the help text. The lists are spelt `std::vec::Vec`
// so that clap takes each as one value parsed whole, not as an option that may be repeated.
#[derive(Debug, Clone, Parser)]
#[command(name = "idemdb-compare", args_override_self = true)]
pub struct Args {
    /// Systems to run, any of idemdb, idemdb-lz4, naive-redb, sqlite, postgres,
    /// idemdb-postgres, redis, fsync-floor (every one but idemdb-lz4 by default)
    #[arg(
        long,
        value_name = "LIST",
        default_value = "idemdb,naive-redb,sqlite,postgres,idemdb-postgres,redis,fsync-floor",
        value_parser = systems
    )]
    pub systems: std::vec::Vec<Kind>,
    /// Workloads to run, any of claim, cycle, charge (cycle with 1-4 KB JSON charges)
    #[arg(long, value_name = "LIST", default_value = "claim,cycle", value_parser = workloads)]
    pub workloads: std::vec::Vec<Workload>,
    /// Caller threads per cell; PxC: P harness processes of C caller threads each, on one
    /// shared server (postgres, idemdb-postgres and redis only)
    #[arg(long, value_name = "LIST", default_value = "1,4,16,64,256", value_parser = callers)]
    pub callers: std::vec::Vec<Callers>,
    /// Keys preloaded per system, e.g. 100000,10000000
    #[arg(long, value_name = "LIST", default_value = "100000", value_parser = keys)]
    pub keys: std::vec::Vec<u64>,
    /// Measured window per cell, in seconds
    #[arg(long, value_name = "S", default_value = "3", value_parser = positive_seconds)]
    pub seconds: f64,
    /// Warm-up before each window, in seconds
    #[arg(long, value_name = "S", default_value = "0.5", value_parser = seconds)]
    pub warmup: f64,
    /// Response body size in bytes
    #[arg(long, value_name = "N", default_value = "256")]
    pub response_bytes: usize,
    /// PostgreSQL connection, e.g. "host=127.0.0.1 port=54329 user=postgres dbname=idem"
    /// [default: none, postgres is skipped]
    #[arg(long, value_name = "CONN")]
    pub postgres: Option<String>,
    /// A Redis with appendonly yes, appendfsync always [default: none, redis is skipped]
    #[arg(long, value_name = "HOST:PORT")]
    pub redis: Option<String>,
    /// Results directory
    #[arg(long, value_name = "DIR", default_value = "target/compare")]
    pub out: PathBuf,
    /// Where the embedded systems' files go; never tmpfs [default: a fresh directory under
    /// target/compare/data]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The workload's seed
    #[arg(long, value_name = "N", default_value = "2020202")]
    pub seed: u64,
    /// A cell during which other processes used more than PCT % of the CPUs is retried after
    /// the machine quietens
    #[arg(long, value_name = "PCT", default_value = "20", value_parser = percentage)]
    pub max_other: f64,
    /// A preload still running after S seconds is stopped, its rate reported and the system
    /// skipped for that key count
    #[arg(long, value_name = "S", default_value = "600", value_parser = seconds)]
    pub max_preload: f64,
    /// Retries of such a cell; the least disturbed attempt is kept (0 disables)
    #[arg(long, value_name = "N", default_value = "3")]
    pub retries: usize,
    /// Internal: run as child process INDEX of a multi-process cell, started by the harness
    /// itself with one system, one workload and one `PxC` caller layout (see processes.rs)
    #[arg(long, value_name = "INDEX", hide = true, requires = "child_cell")]
    pub child: Option<usize>,
    /// Internal: the cell number a child draws its keys from
    #[arg(long, value_name = "N", hide = true, requires = "child")]
    pub child_cell: Option<u64>,
    /// Internal: the PostgreSQL schema of the parent's idemdb-postgres store
    #[arg(long, value_name = "NAME", hide = true, requires = "child")]
    pub child_schema: Option<String>,
}

/// A comma-separated list, each item read by `item`.
fn list<T>(value: &str, item: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    let items: Vec<T> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(item)
        .collect::<Result<_, _>>()?;
    if items.is_empty() {
        return Err("empty list".into());
    }
    Ok(items)
}

fn systems(value: &str) -> Result<Vec<Kind>, String> {
    list(value, |s| {
        Kind::parse(s).ok_or_else(|| {
            let known: Vec<_> = Kind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown system {s:?} (known: {})", known.join(", "))
        })
    })
}

fn workloads(value: &str) -> Result<Vec<Workload>, String> {
    list(value, |s| {
        Workload::parse(s).ok_or_else(|| {
            let known: Vec<_> = Workload::ALL.iter().map(|w| w.name()).collect();
            format!("unknown workload {s:?} (known: {})", known.join(", "))
        })
    })
}

fn callers(value: &str) -> Result<Vec<Callers>, String> {
    list(value, |s| {
        Callers::parse(s).ok_or_else(|| {
            format!(
                "bad caller count {s:?} (a whole number, 1 or more, or PxC: P processes of \
                 C callers each, e.g. 4x16)"
            )
        })
    })
}

fn keys(value: &str) -> Result<Vec<u64>, String> {
    list(value, |s| {
        s.parse()
            .map_err(|_| format!("bad key count {s:?} (a whole number)"))
    })
}

/// A finite number of seconds, 0 or more.
fn seconds(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| "not a number of seconds (0 or more)".into())
}

/// A finite number of seconds, more than 0.
fn positive_seconds(value: &str) -> Result<f64, String> {
    let s = seconds(value)?;
    if s > 0.0 {
        Ok(s)
    } else {
        Err("must be positive".into())
    }
}

fn percentage(value: &str) -> Result<f64, String> {
    value
        .parse()
        .ok()
        .filter(|p: &f64| *p > 0.0)
        .ok_or_else(|| "not a positive percentage".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("idemdb-compare").chain(args.iter().copied()))
    }

    fn error_kind(args: &[&str]) -> ErrorKind {
        parse(args).expect_err("should not parse").kind()
    }

    #[test]
    fn the_command_is_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        let all_but_lz4 = Kind::ALL.into_iter().filter(|&k| k != Kind::IdemdbLz4);
        assert_eq!(a.systems, all_but_lz4.collect::<Vec<_>>());
        assert_eq!(a.workloads, [Workload::Claim, Workload::Cycle]);
        assert_eq!(a.callers, [1, 4, 16, 64, 256].map(Callers::Threads));
        assert_eq!(a.keys, vec![100_000]);
        assert!((a.seconds - 3.0).abs() < f64::EPSILON);
        assert!((a.warmup - 0.5).abs() < f64::EPSILON);
        assert_eq!(a.response_bytes, 256);
        assert_eq!(a.postgres, None);
        assert_eq!(a.redis, None);
        assert_eq!(a.out, PathBuf::from("target/compare"));
        assert_eq!(a.data_dir, None);
        assert_eq!(a.seed, 2_020_202);
        assert!((a.max_other - 20.0).abs() < f64::EPSILON);
        assert!((a.max_preload - 600.0).abs() < f64::EPSILON);
        assert_eq!(a.retries, 3);
        assert_eq!(a.child, None);
        assert_eq!(a.child_cell, None);
        assert_eq!(a.child_schema, None);
    }

    #[test]
    fn flags_parse_lists_and_numbers() {
        let a = parse(&[
            "--systems",
            "idemdb,sqlite",
            "--callers=1,64",
            "--keys",
            "10000",
            "--seconds",
            "1",
            "--workloads",
            "claim",
        ])
        .unwrap();
        assert_eq!(a.systems, vec![Kind::Idemdb, Kind::Sqlite]);
        assert_eq!(a.callers, [1, 64].map(Callers::Threads));
        assert_eq!(a.keys, vec![10_000]);
        assert_eq!(a.workloads, vec![Workload::Claim]);
        assert!((a.seconds - 1.0).abs() < f64::EPSILON);
    }

    #[test]
    fn every_scalar_option_parses() {
        let a = parse(&[
            "--warmup=0",
            "--response-bytes",
            "4096",
            "--postgres",
            "host=127.0.0.1 port=54329 user=postgres dbname=idem",
            "--redis",
            "127.0.0.1:63790",
            "--out",
            "target/compare/smoke",
            "--data-dir",
            "/var/tmp/x",
            "--seed",
            "7",
            "--max-other",
            "12.5",
            "--max-preload",
            "0",
            "--retries",
            "0",
        ])
        .unwrap();
        assert!(a.warmup.abs() < f64::EPSILON);
        assert_eq!(a.response_bytes, 4096);
        assert_eq!(
            a.postgres.as_deref(),
            Some("host=127.0.0.1 port=54329 user=postgres dbname=idem")
        );
        assert_eq!(a.redis.as_deref(), Some("127.0.0.1:63790"));
        assert_eq!(a.out, PathBuf::from("target/compare/smoke"));
        assert_eq!(a.data_dir, Some(PathBuf::from("/var/tmp/x")));
        assert_eq!(a.seed, 7);
        assert!((a.max_other - 12.5).abs() < f64::EPSILON);
        assert!(a.max_preload.abs() < f64::EPSILON);
        assert_eq!(a.retries, 0);
    }

    #[test]
    fn systems_list() {
        let all = "idemdb,idemdb-lz4,naive-redb,sqlite,postgres,idemdb-postgres,redis,fsync-floor";
        assert_eq!(parse(&["--systems", all]).unwrap().systems, Kind::ALL);
        assert_eq!(
            parse(&["--systems=fsync-floor, redis,,"]).unwrap().systems,
            vec![Kind::FsyncFloor, Kind::Redis]
        );
        assert_eq!(
            parse(&["--systems", "naive-redb"]).unwrap().systems,
            vec![Kind::NaiveRedb]
        );
    }

    #[test]
    fn workloads_list() {
        assert_eq!(
            parse(&["--workloads", "cycle,claim"]).unwrap().workloads,
            vec![Workload::Cycle, Workload::Claim]
        );
        assert_eq!(
            parse(&["--workloads", "charge,cycle"]).unwrap().workloads,
            vec![Workload::Charge, Workload::Cycle]
        );
        assert_eq!(
            parse(&["--workloads= cycle "]).unwrap().workloads,
            vec![Workload::Cycle]
        );
    }

    #[test]
    fn callers_list() {
        assert_eq!(
            parse(&["--callers", "1, 4,,256"]).unwrap().callers,
            [1, 4, 256].map(Callers::Threads)
        );
        assert_eq!(
            parse(&["--callers", "64"]).unwrap().callers,
            [Callers::Threads(64)]
        );
        let four_by_sixteen = Callers::Processes {
            processes: 4,
            each: 16,
        };
        assert_eq!(
            parse(&["--callers", "4x16"]).unwrap().callers,
            [four_by_sixteen]
        );
        assert_eq!(
            parse(&["--callers=1,64,4x16"]).unwrap().callers,
            [Callers::Threads(1), Callers::Threads(64), four_by_sixteen]
        );
        for bad in ["0x16", "4x0", "x16", "4x", "1,64,4x", "4x16x2", "4*16"] {
            let message = parse(&["--callers", bad]).unwrap_err().to_string();
            assert!(message.contains("bad caller count"), "{bad}: {message}");
        }
        let message = parse(&["--callers", "1,0x16"]).unwrap_err().to_string();
        assert!(message.contains("bad caller count \"0x16\""), "{message}");
        assert!(message.contains("PxC"), "{message}");
    }

    #[test]
    fn child_flags_are_hidden_and_need_each_other() {
        let a = parse(&[
            "--child",
            "2",
            "--child-cell",
            "1000064",
            "--child-schema",
            "compare_42",
            "--callers",
            "4x16",
        ])
        .unwrap();
        assert_eq!(a.child, Some(2));
        assert_eq!(a.child_cell, Some(1_000_064));
        assert_eq!(a.child_schema.as_deref(), Some("compare_42"));
        assert_eq!(
            error_kind(&["--child", "2"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            error_kind(&["--child-schema", "x"]),
            ErrorKind::MissingRequiredArgument
        );
        let help = Args::command().render_long_help().to_string();
        assert!(!help.contains("--child"), "{help}");
    }

    #[test]
    fn keys_list() {
        assert_eq!(
            parse(&["--keys", "100000,10000000"]).unwrap().keys,
            vec![100_000, 10_000_000]
        );
        assert_eq!(parse(&["--keys=0"]).unwrap().keys, vec![0]);
    }

    #[test]
    fn a_repeated_option_keeps_its_last_value() {
        // run.sh passes --postgres and --redis before the caller's own arguments.
        let a = parse(&[
            "--redis",
            "a:1",
            "--keys",
            "1",
            "--redis",
            "b:2",
            "--keys=2,3",
        ])
        .unwrap();
        assert_eq!(a.redis.as_deref(), Some("b:2"));
        assert_eq!(a.keys, vec![2, 3]);
    }

    #[test]
    fn bad_values_are_errors() {
        for args in [
            &["--systems", "mysql"][..],
            &["--systems", "idemdb,mysql"],
            &["--systems", ""],
            &["--systems", " , "],
            &["--workloads", "read"],
            &["--callers", "0"],
            &["--callers", "1,x"],
            &["--callers", "0x16"],
            &["--callers", "4x0"],
            &["--callers", "x16"],
            &["--callers", "4x"],
            &["--keys=-5"],
            &["--keys", "1e6"],
            &["--seconds", "0"],
            &["--seconds", "-1"],
            &["--seconds", "inf"],
            &["--warmup", "NaN"],
            &["--max-preload", "soon"],
            &["--max-other", "0"],
            &["--max-other", "NaN"],
            &["--response-bytes=-1"],
            &["--retries", "two"],
            &["--seed", "1.5"],
        ] {
            let kind = error_kind(args);
            assert!(
                matches!(
                    kind,
                    ErrorKind::ValueValidation | ErrorKind::UnknownArgument
                ),
                "{args:?}: {kind:?}"
            );
        }
        // The message names the option and says what is wrong.
        let message = parse(&["--systems", "idemdb,mysql"])
            .unwrap_err()
            .to_string();
        assert!(message.contains("--systems"), "{message}");
        assert!(message.contains("unknown system \"mysql\""), "{message}");
        assert!(message.contains("fsync-floor"), "{message}");
        let message = parse(&["--callers", "0"]).unwrap_err().to_string();
        assert!(message.contains("bad caller count \"0\""), "{message}");
        let message = parse(&["--systems="]).unwrap_err().to_string();
        assert!(message.contains("empty list"), "{message}");
        let message = parse(&["--seconds", "0"]).unwrap_err().to_string();
        assert!(message.contains("must be positive"), "{message}");
    }

    #[test]
    fn unknown_flags_and_missing_values_are_errors() {
        assert_eq!(error_kind(&["--frobnicate"]), ErrorKind::UnknownArgument);
        assert_eq!(error_kind(&["--frobnicate=1"]), ErrorKind::UnknownArgument);
        assert_eq!(error_kind(&["extra"]), ErrorKind::UnknownArgument);
        assert_eq!(error_kind(&["--seconds"]), ErrorKind::InvalidValue);
        assert_eq!(error_kind(&["--systems"]), ErrorKind::InvalidValue);
    }

    #[test]
    fn help_lists_every_option_with_its_default() {
        assert_eq!(error_kind(&["--help"]), ErrorKind::DisplayHelp);
        assert_eq!(
            error_kind(&["--seconds", "1", "-h"]),
            ErrorKind::DisplayHelp
        );
        for help in [
            Args::command().render_help().to_string(),
            Args::command().render_long_help().to_string(),
        ] {
            for (option, default) in [
                (
                    "--systems <LIST>",
                    "[default: idemdb,naive-redb,sqlite,postgres,idemdb-postgres,redis,fsync-floor]",
                ),
                ("--workloads <LIST>", "[default: claim,cycle]"),
                ("--callers <LIST>", "[default: 1,4,16,64,256]"),
                ("--keys <LIST>", "[default: 100000]"),
                ("--seconds <S>", "[default: 3]"),
                ("--warmup <S>", "[default: 0.5]"),
                ("--response-bytes <N>", "[default: 256]"),
                ("--postgres <CONN>", "[default: none, postgres is skipped]"),
                ("--redis <HOST:PORT>", "[default: none, redis is skipped]"),
                ("--out <DIR>", "[default: target/compare]"),
                (
                    "--data-dir <DIR>",
                    "[default: a fresh directory under target/compare/data]",
                ),
                ("--seed <N>", "[default: 2020202]"),
                ("--max-other <PCT>", "[default: 20]"),
                ("--max-preload <S>", "[default: 600]"),
                ("--retries <N>", "[default: 3]"),
            ] {
                // An entry is an option's line and the lines under it, up to the next option.
                let mut entries: Vec<String> = Vec::new();
                for line in help.lines() {
                    match entries.last_mut() {
                        Some(entry) if !line.trim_start().starts_with('-') => {
                            entry.push(' ');
                            entry.push_str(line);
                        }
                        _ => entries.push(line.to_owned()),
                    }
                }
                let entry = entries
                    .iter()
                    .find(|e| e.trim_start().starts_with(option))
                    .unwrap_or_else(|| panic!("{option} missing from:\n{help}"));
                let entry = entry.split_whitespace().collect::<Vec<_>>().join(" ");
                assert!(
                    entry.contains(default),
                    "{option} without {default} in:\n{help}"
                );
            }
        }
    }
}
