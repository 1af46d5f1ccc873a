//! `idemdb-mcp`'s command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) const USAGE: &str = "\
usage: idemdb-mcp serve --store STORE [OPTIONS] (-- COMMAND [ARG...] | --config FILE)

  --store STORE          a store file, or a postgres:// URL (feature `postgres`)
  --tenant TENANT        whom calls act for, on stdio (default: default)
  --wait SECONDS         how long a duplicate waits for the call in flight (default: 30)
  --lease SECONDS        a keyed call's lease, renewed while its upstream works (default: 60)
  --strict               refuse unkeyed calls of keyed tools, and retries with other arguments
  --config FILE          several upstreams, in a host's `mcpServers` JSON
  --listen IP:PORT       Streamable HTTP on IP:PORT (/mcp) instead of stdio
  --tenant-header NAME   on HTTP, the request header naming the tenant (default: x-idemdb-tenant)
  --allow-origin ORIGIN  on HTTP, an Origin allowed besides the listener's own (repeatable)
  --max-sessions N       on HTTP, at most N sessions at once (default: 256)
  --session-idle SECONDS on HTTP, a session idle this long ends (default: 600)
  --metrics IP:PORT      serve Prometheus metrics on IP:PORT (feature `metrics`)";

/// `serve`'s arguments.
#[derive(Debug, PartialEq)]
pub(crate) struct Serve {
    pub(crate) store: String,
    pub(crate) tenant: String,
    /// How long a duplicate of a keyed call in flight waits for its result.
    pub(crate) wait: Duration,
    /// A keyed call's lease: renewed every third of it while the upstream works, so a claim
    /// whose lease ran out was lost with its gateway.
    pub(crate) lease: Duration,
    /// `--strict`: see [`crate::keyed::Keying::strict`].
    pub(crate) strict: bool,
    pub(crate) upstream: Upstreams,
    pub(crate) http: Option<Http>,
    pub(crate) metrics: Option<SocketAddr>,
}

/// Where the upstream servers come from.
#[derive(Debug, PartialEq)]
pub(crate) enum Upstreams {
    /// One child process: the command after `--`.
    Command(Vec<String>),
    /// Several, in a config file.
    Config(PathBuf),
}

/// Streamable HTTP's settings (`--listen`).
#[derive(Debug, PartialEq)]
pub(crate) struct Http {
    pub(crate) listen: SocketAddr,
    pub(crate) tenant_header: String,
    pub(crate) allowed_origins: Vec<String>,
    pub(crate) max_sessions: usize,
    pub(crate) session_idle: Duration,
}

/// How long a duplicate of a keyed call in flight waits for its result, by default.
const WAIT: Duration = Duration::from_secs(30);
/// A keyed call's lease, by default.
const LEASE: Duration = Duration::from_secs(60);

pub(crate) fn parse(args: &[String]) -> Result<Serve, String> {
    let (ours, command) = match args.iter().position(|a| a == "--") {
        Some(at) => (&args[..at], Some(args[at + 1..].to_vec())),
        None => (args, None),
    };
    let mut ours = ours.iter();
    if ours.next().map(String::as_str) != Some("serve") {
        return Err("the only command is `serve`".into());
    }
    let mut store = None;
    let mut tenant = String::from("default");
    let (mut wait, mut lease, mut strict) = (WAIT, LEASE, false);
    let (mut config, mut listen, mut metrics) = (None, None, None);
    let mut tenant_header = String::from("x-idemdb-tenant");
    let mut allowed_origins = Vec::new();
    let (mut max_sessions, mut session_idle) = (256usize, Duration::from_secs(600));
    let mut http_only = Vec::new();
    while let Some(arg) = ours.next() {
        let mut value = || {
            ours.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--store" => store = Some(value()?),
            "--tenant" => tenant = value()?,
            "--strict" => strict = true,
            "--wait" => wait = seconds(arg, &value()?, false)?,
            "--lease" => lease = seconds(arg, &value()?, true)?,
            "--config" => config = Some(PathBuf::from(value()?)),
            "--listen" => listen = Some(address(arg, &value()?)?),
            "--metrics" => metrics = Some(address(arg, &value()?)?),
            "--tenant-header" => {
                tenant_header = value()?.to_ascii_lowercase();
                http_only.push(arg);
            }
            "--allow-origin" => {
                allowed_origins.push(value()?);
                http_only.push(arg);
            }
            "--max-sessions" => {
                let n = value()?;
                max_sessions = n
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("--max-sessions {n}: not a positive number"))?;
                http_only.push(arg);
            }
            "--session-idle" => {
                session_idle = seconds(arg, &value()?, true)?;
                http_only.push(arg);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let store = store.ok_or("--store is required")?;
    let upstream = match (command, config) {
        (Some(command), None) if !command.is_empty() => Upstreams::Command(command),
        (None, Some(config)) => Upstreams::Config(config),
        (Some(_), Some(_)) => {
            return Err("give the upstream after `--`, or --config, not both".into())
        }
        _ => return Err("the upstream server's command goes after `--` (or give --config)".into()),
    };
    if let (None, Some(arg)) = (listen, http_only.first()) {
        return Err(format!("{arg} is for HTTP: give --listen too"));
    }
    let http = listen.map(|listen| Http {
        listen,
        tenant_header,
        allowed_origins,
        max_sessions,
        session_idle,
    });
    Ok(Serve {
        store,
        tenant,
        wait,
        lease,
        strict,
        upstream,
        http,
        metrics,
    })
}

fn seconds(arg: &str, text: &str, positive: bool) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !positive || !d.is_zero())
        .ok_or_else(|| format!("{arg} {text}: not a number of seconds"))
}

fn address(arg: &str, text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{arg} {text}: not an IP:PORT address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn serve_takes_a_store_a_tenant_and_the_upstream_command() {
        assert_eq!(
            parse(&args(
                "serve --store s.idem --tenant acme --wait 1.5 --lease 9 --strict \
                 -- python server.py --flag"
            )),
            Ok(Serve {
                store: "s.idem".into(),
                tenant: "acme".into(),
                wait: Duration::from_millis(1500),
                lease: Duration::from_secs(9),
                strict: true,
                upstream: Upstreams::Command(args("python server.py --flag")),
                http: None,
                metrics: None,
            })
        );
        let http = parse(&args(
            "serve --store s --config c.json --listen 127.0.0.1:8080 --tenant-header X-Org \
             --allow-origin http://app --max-sessions 4 --session-idle 30 --metrics 127.0.0.1:9",
        ))
        .unwrap();
        assert_eq!(http.upstream, Upstreams::Config("c.json".into()));
        assert_eq!(
            http.http,
            Some(Http {
                listen: "127.0.0.1:8080".parse().unwrap(),
                tenant_header: "x-org".into(),
                allowed_origins: vec!["http://app".into()],
                max_sessions: 4,
                session_idle: Duration::from_secs(30),
            })
        );
        assert_eq!(http.metrics, Some("127.0.0.1:9".parse().unwrap()));
    }

    #[test]
    fn bad_arguments_are_refused_with_what_is_wrong() {
        for (bad, says) in [
            ("", "only command"),
            ("serve -- x", "--store is required"),
            ("serve --store", "needs a value"),
            ("serve --store s", "after `--`"),
            ("serve --store s --", "after `--`"),
            ("serve --store s --config c -- x", "not both"),
            ("serve --store s --nope -- x", "unknown argument"),
            ("serve --store s --listen nowhere -- x", "not an IP:PORT"),
            ("serve --store s --max-sessions 4 -- x", "give --listen too"),
            (
                "serve --store s --listen 127.0.0.1:1 --max-sessions 0 -- x",
                "not a positive",
            ),
            (
                "serve --store s --wait soon -- x",
                "not a number of seconds",
            ),
            ("serve --store s --wait -1 -- x", "not a number of seconds"),
            ("serve --store s --lease 0 -- x", "not a number of seconds"),
        ] {
            let err = parse(&args(bad)).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert_eq!(
            parse(&args("serve --store s --wait 0 -- x")).unwrap().wait,
            Duration::ZERO
        );
    }
}
