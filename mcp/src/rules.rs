//! Which tools are keyed, and which upstreams deduplicate by the key themselves: the per-tool
//! rules of a gateway, by the names the client sees (with several upstreams, `UPSTREAM__TOOL`).

use std::collections::HashSet;

/// The rules of one gateway. The default: every tool is keyed unless its upstream's
/// `tools/list` marks it `readOnlyHint: true`, and no upstream honours the key.
#[derive(Debug, Default, Clone)]
pub(crate) struct ToolRules {
    /// Tools never keyed, whatever their annotations say (a config's `readOnlyTools`).
    pub(crate) read_only: HashSet<String>,
    /// Name prefixes of upstreams whose `readOnlyHint`s are not trusted (a config's
    /// `trustReadOnlyHints: false`): their tools are keyed unless listed in `read_only`. The
    /// empty prefix is every tool.
    pub(crate) untrusted_hints: Vec<String>,
    /// Name prefixes of upstreams that deduplicate calls by the key the gateway forwards (a
    /// config's `honoursKey: true`): a call of theirs lost mid-way may be forwarded again under
    /// the same key, since the upstream runs a key's side effect at most once itself.
    pub(crate) honours_key: Vec<String>,
}

impl ToolRules {
    /// Whether a call of `tool` is left unkeyed; `hinted` is whether its upstream's
    /// `tools/list` marked it `readOnlyHint: true`.
    pub(crate) fn read_only(&self, tool: &str, hinted: bool) -> bool {
        self.read_only.contains(tool)
            || (hinted
                && !self
                    .untrusted_hints
                    .iter()
                    .any(|p| tool.starts_with(p.as_str())))
    }

    /// Whether `tool`'s upstream deduplicates by the forwarded key.
    pub(crate) fn honours_key(&self, tool: &str) -> bool {
        self.honours_key
            .iter()
            .any(|p| tool.starts_with(p.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_are_trusted_unless_the_upstream_is_not_and_lists_win() {
        let rules = ToolRules {
            read_only: HashSet::from(["pay__balance".to_owned()]),
            untrusted_hints: vec!["pay__".into()],
            honours_key: vec!["stripe__".into()],
        };
        assert!(rules.read_only("docs__search", true));
        assert!(!rules.read_only("docs__write", false));
        assert!(!rules.read_only("pay__refund", true), "an untrusted hint");
        assert!(rules.read_only("pay__balance", false), "listed");
        assert!(rules.honours_key("stripe__charge"));
        assert!(!rules.honours_key("pay__refund"));
        assert!(ToolRules::default().read_only("x", true));
        assert!(!ToolRules::default().read_only("x", false));
    }
}
