//! `--config FILE`: several upstreams, in the `mcpServers` JSON shape MCP hosts use, plus the
//! gateway's own members per upstream.
//!
//! ```json
//! {"mcpServers": {
//!   "files": {"command": "python", "args": ["files.py"], "env": {"ROOT": "/srv"}},
//!   "pay": {"url": "http://127.0.0.1:8000/mcp", "honoursKey": true,
//!           "readOnlyTools": ["balance"], "trustReadOnlyHints": false}
//! }}
//! ```
//!
//! Per upstream: `command` (with `args` and `env`) for a child process on stdio, or `url` for a
//! Streamable HTTP server (`http://` only: put a TLS-terminating proxy on the same host in front
//! of an `https://` one). The gateway's own members: `readOnlyTools` (never keyed),
//! `trustReadOnlyHints` (default true), `honoursKey` (default false). Members hosts commonly add:
//! `type` is checked against the transport (`stdio`, or `http`/`streamable-http`), `description`
//! is ignored, and `disabled: true` leaves the upstream out, as a host would. Any other member is
//! refused: a typo (`readOnlyTool`, `honorsKey`) must not silently weaken a guarantee. Members
//! of the file beside `mcpServers` (a host's other settings) are ignored.

use crate::rules::ToolRules;
use serde_json::{Map, Value};
use std::path::Path;

/// The upstreams of a config file, in the file's order.
#[derive(Debug, PartialEq)]
pub(crate) struct Config {
    pub(crate) upstreams: Vec<Upstream>,
}

/// One upstream server of a config.
#[derive(Debug, PartialEq)]
pub(crate) struct Upstream {
    /// Its name: the prefix of its tools' and prompts' names toward the client (`NAME__tool`).
    pub(crate) name: String,
    pub(crate) transport: Transport,
    /// Tools (by the upstream's own names) that are never keyed.
    pub(crate) read_only_tools: Vec<String>,
    /// Whether a tool it marks `readOnlyHint: true` is left unkeyed.
    pub(crate) trust_read_only_hints: bool,
    /// Whether it deduplicates calls by the forwarded `_meta["io.idemdb/key"]` itself.
    pub(crate) honours_key: bool,
}

/// How the gateway reaches an upstream.
#[derive(Debug, PartialEq)]
pub(crate) enum Transport {
    /// A child process on stdio: the command and its arguments, and variables added to the
    /// inherited environment.
    Command {
        command: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// A Streamable HTTP endpoint (`http://` only).
    Http { url: String },
}

/// Between an upstream's name and a tool's or prompt's name, toward the client.
pub(crate) const SEPARATOR: &str = "__";

impl Config {
    /// The tool rules the config sets, by the names the client sees (`NAME__tool`).
    pub(crate) fn rules(&self) -> ToolRules {
        let mut rules = ToolRules::default();
        for upstream in &self.upstreams {
            let prefix = format!("{}{SEPARATOR}", upstream.name);
            for tool in &upstream.read_only_tools {
                rules.read_only.insert(format!("{prefix}{tool}"));
            }
            if !upstream.trust_read_only_hints {
                rules.untrusted_hints.push(prefix.clone());
            }
            if upstream.honours_key {
                rules.honours_key.push(prefix);
            }
        }
        rules
    }
}

/// Reads and checks the config file at `path`.
///
/// # Errors
/// The file cannot be read, is not JSON, or a member is wrong: the error names the file and the
/// member.
pub(crate) fn load(path: &Path) -> Result<Config, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|why| format!("{}: {why}", path.display()))
}

/// Checks a config's text; errors name the member (the caller adds the file).
pub(crate) fn parse(text: &str) -> Result<Config, String> {
    let file: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let servers = file
        .get("mcpServers")
        .ok_or("no mcpServers member")?
        .as_object()
        .ok_or("mcpServers: must be an object of upstreams by name")?;
    let mut upstreams = Vec::new();
    for (name, server) in servers {
        let at = format!("mcpServers.{name}");
        check_name(name).map_err(|why| format!("{at}: {why}"))?;
        let server = server
            .as_object()
            .ok_or_else(|| format!("{at}: must be an object"))?;
        if let Some(upstream) = upstream(name, server).map_err(|why| format!("{at}.{why}"))? {
            upstreams.push(upstream);
        }
    }
    if upstreams.is_empty() {
        return Err("mcpServers: no upstream (none given, or all disabled)".into());
    }
    Ok(Config { upstreams })
}

/// Names become prefixes that must split back unambiguously: `NAME__tool` splits at its first
/// `__` only if NAME has no `__` and does not end with `_`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an upstream's name must not be empty".into());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err("an upstream's name may have only ASCII letters, digits, '-' and '_'".into());
    }
    if name.contains(SEPARATOR) || name.ends_with('_') {
        return Err(
            "an upstream's name must not contain \"__\" nor end with '_' (it prefixes its tools \
             as NAME__tool)"
                .into(),
        );
    }
    Ok(())
}

/// One upstream's members; `None` when it is `disabled`. Errors start with the member's name.
fn upstream(name: &str, server: &Map<String, Value>) -> Result<Option<Upstream>, String> {
    const KNOWN: [&str; 10] = [
        "command",
        "args",
        "env",
        "url",
        "type",
        "description",
        "disabled",
        "readOnlyTools",
        "trustReadOnlyHints",
        "honoursKey",
    ];
    if let Some(unknown) = server.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!(
            "{unknown}: not a member the gateway knows (it takes {}); refused so that a typo \
             cannot weaken a guarantee",
            KNOWN.join(", ")
        ));
    }
    if flag(server, "disabled", false)? {
        return Ok(None);
    }
    if let Some(description) = server.get("description") {
        if !description.is_string() {
            return Err("description: must be a string".into());
        }
    }
    let kind = match server.get("type") {
        None => None,
        Some(Value::String(kind)) => Some(kind.as_str()),
        Some(_) => return Err("type: must be a string".into()),
    };
    let transport = match (server.get("command"), server.get("url")) {
        (Some(_), Some(_)) => return Err("url: give command or url, not both".into()),
        (None, None) => return Err("command: give command (stdio) or url (HTTP)".into()),
        (Some(command), None) => {
            if !matches!(kind, None | Some("stdio")) {
                return Err(format!("type: {kind:?} does not go with command (stdio)"));
            }
            command_transport(command, server.get("args"), server.get("env"))?
        }
        (None, Some(url)) => {
            match kind {
                None | Some("http" | "streamable-http" | "streamableHttp") => {}
                Some("sse") => {
                    return Err("type: the old HTTP+SSE transport is not offered; give the \
                                server's Streamable HTTP endpoint"
                        .into())
                }
                Some(other) => return Err(format!("type: {other:?} does not go with url")),
            }
            for member in ["args", "env"] {
                if server.contains_key(member) {
                    return Err(format!("{member}: only for a command upstream"));
                }
            }
            Transport::Http {
                url: http_url(url)?,
            }
        }
    };
    let read_only_tools = match server.get("readOnlyTools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => tools
            .iter()
            .map(|t| match t {
                Value::String(t) if !t.is_empty() => Ok(t.clone()),
                _ => Err("readOnlyTools: must be an array of tool names".to_owned()),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("readOnlyTools: must be an array of tool names".into()),
    };
    Ok(Some(Upstream {
        name: name.to_owned(),
        transport,
        read_only_tools,
        trust_read_only_hints: flag(server, "trustReadOnlyHints", true)?,
        honours_key: flag(server, "honoursKey", false)?,
    }))
}

fn flag(server: &Map<String, Value>, member: &str, default: bool) -> Result<bool, String> {
    match server.get(member) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{member}: must be true or false")),
    }
}

fn command_transport(
    command: &Value,
    args: Option<&Value>,
    env: Option<&Value>,
) -> Result<Transport, String> {
    let mut line = match command {
        Value::String(c) if !c.trim().is_empty() => vec![c.clone()],
        _ => return Err("command: must be a non-empty string".into()),
    };
    match args {
        None => {}
        Some(Value::Array(args)) => {
            for arg in args {
                line.push(
                    arg.as_str()
                        .ok_or("args: must be an array of strings")?
                        .to_owned(),
                );
            }
        }
        Some(_) => return Err("args: must be an array of strings".into()),
    }
    let env = match env {
        None => Vec::new(),
        Some(Value::Object(env)) => env
            .iter()
            .map(|(k, v)| match v {
                Value::String(v) if !k.is_empty() && !k.contains('=') => Ok((k.clone(), v.clone())),
                _ => Err(format!(
                    "env.{k}: must be a string, under a name without '='"
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("env: must be an object of strings".into()),
    };
    Ok(Transport::Command { command: line, env })
}

fn http_url(url: &Value) -> Result<String, String> {
    let url = url.as_str().ok_or("url: must be a string")?;
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(format!(
            "url: {url}: https is not offered yet; run a TLS-terminating proxy on the same host \
             and give its http://127.0.0.1 address"
        ));
    }
    if !lower.starts_with("http://") {
        return Err(format!("url: {url}: must be an http:// URL"));
    }
    match url.parse::<hyper::Uri>() {
        Ok(uri) if uri.host().is_some_and(|h| !h.is_empty()) => Ok(url.to_owned()),
        _ => Err(format!("url: {url}: not a URL with a host")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_hosts_config_with_the_gateways_members_gives_upstreams_and_rules() {
        let config = parse(
            &json!({"globalShortcut": "x", "mcpServers": {
                "files": {"command": "python", "args": ["files.py", "-v"], "env": {"ROOT": "/srv"},
                          "type": "stdio", "description": "the files"},
                "pay": {"url": "http://127.0.0.1:8000/mcp", "type": "http", "honoursKey": true,
                        "readOnlyTools": ["balance"], "trustReadOnlyHints": false},
                "old": {"command": "x", "disabled": true},
            }})
            .to_string(),
        )
        .unwrap();
        assert_eq!(
            config.upstreams,
            vec![
                Upstream {
                    name: "files".into(),
                    transport: Transport::Command {
                        command: vec!["python".into(), "files.py".into(), "-v".into()],
                        env: vec![("ROOT".into(), "/srv".into())],
                    },
                    read_only_tools: vec![],
                    trust_read_only_hints: true,
                    honours_key: false,
                },
                Upstream {
                    name: "pay".into(),
                    transport: Transport::Http {
                        url: "http://127.0.0.1:8000/mcp".into()
                    },
                    read_only_tools: vec!["balance".into()],
                    trust_read_only_hints: false,
                    honours_key: true,
                },
            ]
        );
        let rules = config.rules();
        assert!(rules.read_only("pay__balance", false));
        assert!(!rules.read_only("pay__refund", true), "hints not trusted");
        assert!(rules.read_only("files__read", true));
        assert!(!rules.read_only("files__balance", false));
        assert!(rules.honours_key("pay__charge"));
        assert!(!rules.honours_key("files__write"));
    }

    #[test]
    fn a_bad_config_is_refused_naming_the_member() {
        for (bad, says) in [
            (json!([]), "no mcpServers"),
            (json!({"mcpServers": []}), "mcpServers: must be an object"),
            (json!({"mcpServers": {}}), "no upstream"),
            (
                json!({"mcpServers": {"a": {"command": "x", "disabled": true}}}),
                "no upstream",
            ),
            (
                json!({"mcpServers": {"": {"command": "x"}}}),
                "must not be empty",
            ),
            (
                json!({"mcpServers": {"a b": {"command": "x"}}}),
                "mcpServers.a b: an upstream's name may have only",
            ),
            (
                json!({"mcpServers": {"a__b": {"command": "x"}}}),
                "must not contain",
            ),
            (json!({"mcpServers": {"a_": {"command": "x"}}}), "end with"),
            (
                json!({"mcpServers": {"a": 1}}),
                "mcpServers.a: must be an object",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "honorsKey": true}}}),
                "mcpServers.a.honorsKey: not a member",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "honoursKey": "yes"}}}),
                "mcpServers.a.honoursKey: must be true or false",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "trustReadOnlyHints": 0}}}),
                "trustReadOnlyHints: must be true or false",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "readOnlyTools": "ls"}}}),
                "mcpServers.a.readOnlyTools: must be an array",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "readOnlyTools": [""]}}}),
                "readOnlyTools: must be an array",
            ),
            (
                json!({"mcpServers": {"a": {}}}),
                "mcpServers.a.command: give",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "url": "http://h"}}}),
                "not both",
            ),
            (
                json!({"mcpServers": {"a": {"command": ""}}}),
                "command: must be a non-empty",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "args": [1]}}}),
                "mcpServers.a.args: must be an array of strings",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}),
                "mcpServers.a.env.K: must be a string",
            ),
            (
                json!({"mcpServers": {"a": {"command": "x", "type": "http"}}}),
                "mcpServers.a.type",
            ),
            (
                json!({"mcpServers": {"a": {"url": "https://api.example/mcp"}}}),
                "TLS-terminating proxy",
            ),
            (
                json!({"mcpServers": {"a": {"url": "ftp://h/mcp"}}}),
                "must be an http:// URL",
            ),
            (
                json!({"mcpServers": {"a": {"url": "http://"}}}),
                "not a URL with a host",
            ),
            (
                json!({"mcpServers": {"a": {"url": "http://h/mcp", "type": "sse"}}}),
                "Streamable HTTP",
            ),
            (
                json!({"mcpServers": {"a": {"url": "http://h/mcp", "args": []}}}),
                "mcpServers.a.args: only for a command",
            ),
        ] {
            let err = parse(&bad.to_string()).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert!(parse("{").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn errors_name_the_file() {
        let path =
            std::env::temp_dir().join(format!("idemdb-mcp-config-{}.json", std::process::id()));
        std::fs::write(
            &path,
            r#"{"mcpServers": {"a": {"command": "x", "honoursKey": 1}}}"#,
        )
        .unwrap();
        let err = load(&path).unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert!(
            err.starts_with(&format!("{}: mcpServers.a.honoursKey", path.display())),
            "{err}"
        );
        assert!(load(Path::new("/nonexistent/idemdb.json"))
            .unwrap_err()
            .starts_with("/nonexistent/idemdb.json: "));
    }
}
