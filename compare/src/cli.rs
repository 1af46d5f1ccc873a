//! The command line, parsed by hand.

use crate::runner::Workload;
use crate::systems::Kind;
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: idemdb-compare [options]
  --systems LIST        idemdb,naive-redb,sqlite,postgres,redis,fsync-floor (default: all)
  --workloads LIST      claim,cycle (default: both)
  --callers LIST        caller threads per cell (default: 1,4,16,64,256)
  --keys LIST           keys preloaded per system (default: 100000)
  --seconds S           measured window per cell (default: 3)
  --warmup S            warm-up before each window (default: 0.5)
  --response-bytes N    response body size (default: 256)
  --postgres CONN       e.g. \"host=127.0.0.1 port=54329 user=postgres dbname=idem\"
  --redis HOST:PORT     a Redis with appendonly yes, appendfsync always
  --out DIR             results directory (default: target/compare)
  --data-dir DIR        where the embedded systems' files go (default: a fresh directory
                        under target/compare/data; never tmpfs)
  --seed N              the workload's seed (default: 2020202)
  --max-other PCT       a cell during which other processes used more than PCT % of the
                        CPUs is retried after the machine quietens (default: 20)
  --max-preload S       a preload still running after S seconds is stopped, its rate
                        reported and the system skipped for that key count (default: 600)
  --retries N           retries of such a cell; the least disturbed attempt is kept
                        (default: 3; 0 disables)";

/// The command line.
#[derive(Debug, Clone)]
pub struct Args {
    pub systems: Vec<Kind>,
    pub workloads: Vec<Workload>,
    pub callers: Vec<usize>,
    pub keys: Vec<u64>,
    pub seconds: f64,
    pub warmup: f64,
    pub response_bytes: usize,
    pub postgres: Option<String>,
    pub redis: Option<String>,
    pub out: PathBuf,
    pub data_dir: Option<PathBuf>,
    pub seed: u64,
    pub max_other: f64,
    pub max_preload: f64,
    pub retries: usize,
}

fn list<T>(value: &str, what: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    let items: Vec<T> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse(s).ok_or_else(|| format!("{what}: bad value {s:?}")))
        .collect::<Result<_, _>>()?;
    if items.is_empty() {
        return Err(format!("{what}: empty list"));
    }
    Ok(items)
}

fn seconds(value: &str, what: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| format!("{what}: bad number of seconds {value:?}"))
}

impl Args {
    /// Parses the arguments after the program name; `Err("")` asks for the usage text.
    pub fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut args = Args {
            systems: Kind::ALL.to_vec(),
            workloads: Workload::ALL.to_vec(),
            callers: vec![1, 4, 16, 64, 256],
            keys: vec![100_000],
            seconds: 3.0,
            warmup: 0.5,
            response_bytes: 256,
            postgres: None,
            redis: None,
            out: PathBuf::from("target/compare"),
            data_dir: None,
            seed: 2_020_202,
            max_other: 20.0,
            max_preload: 600.0,
            retries: 3,
        };
        while let Some(flag) = argv.next() {
            if flag == "-h" || flag == "--help" {
                return Err(String::new());
            }
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (flag.clone(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| argv.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match name.as_str() {
                "--systems" => args.systems = list(&value()?, &name, Kind::parse)?,
                "--workloads" => args.workloads = list(&value()?, &name, Workload::parse)?,
                "--callers" => {
                    args.callers = list(&value()?, &name, |s| s.parse().ok().filter(|&n| n > 0))?;
                }
                "--keys" => args.keys = list(&value()?, &name, |s| s.parse().ok())?,
                "--seconds" => args.seconds = seconds(&value()?, &name)?,
                "--warmup" => args.warmup = seconds(&value()?, &name)?,
                "--response-bytes" => {
                    args.response_bytes = value()?
                        .parse()
                        .map_err(|_| format!("{name}: not a number"))?;
                }
                "--postgres" => args.postgres = Some(value()?),
                "--redis" => args.redis = Some(value()?),
                "--out" => args.out = PathBuf::from(value()?),
                "--data-dir" => args.data_dir = Some(PathBuf::from(value()?)),
                "--max-other" => {
                    args.max_other = value()?
                        .parse()
                        .ok()
                        .filter(|p: &f64| *p > 0.0)
                        .ok_or_else(|| format!("{name}: not a positive percentage"))?;
                }
                "--max-preload" => args.max_preload = seconds(&value()?, &name)?,
                "--retries" => {
                    args.retries = value()?
                        .parse()
                        .map_err(|_| format!("{name}: not a number"))?;
                }
                "--seed" => {
                    args.seed = value()?
                        .parse()
                        .map_err(|_| format!("{name}: not a number"))?
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if args.seconds <= 0.0 {
            return Err("--seconds must be positive".into());
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        Args::parse(args.iter().map(|s| (*s).to_string()))
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
        assert_eq!(a.callers, vec![1, 64]);
        assert_eq!(a.keys, vec![10_000]);
        assert_eq!(a.workloads, vec![Workload::Claim]);
        assert!((a.seconds - 1.0).abs() < f64::EPSILON);
    }

    #[test]
    fn bad_flags_are_errors() {
        assert!(parse(&["--systems", "mysql"]).is_err());
        assert!(parse(&["--callers", "0"]).is_err());
        assert!(parse(&["--seconds"]).is_err());
        assert!(parse(&["--frobnicate"]).is_err());
    }
}
