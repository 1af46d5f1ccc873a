//! Tool-call keys: stable, injective renderings of harness-owned identifiers.

use crate::model::scope::MAX_KEY_LEN;
use sha2::{Digest, Sha256};
use std::fmt;

/// An idempotency key for one logical tool call, derived from identifiers the harness owns:
/// the task (or run) id, the step number, the tool name and, optionally, the tool-call id the
/// runtime assigned. Never from the arguments, never from the model: a retry with reworded
/// arguments, or a replay of the step after a resume, lands on the same key.
///
/// # Encoding (stable across processes and versions)
///
/// `tc1:` followed by the parts joined with `:` — task, step in decimal, tool, and the call id
/// when there is one — where every byte of task, tool and call id that is `%`, `:` or outside
/// visible ASCII (0x21..=0x7E) is written as `%XX` (uppercase hex). Escaping makes the parts
/// unambiguous: `("a:b", 1, "c")` and `("a", 1, "b:c")` differ. If that text would exceed 255
/// bytes, the key is instead `tc1h:` and the 64 lowercase hex digits of the SHA-256 of the parts,
/// each prefixed with its length as a `u64` little-endian (the step as its 8 little-endian
/// bytes); long ids are hashed, never cut.
///
/// ```
/// use idemdb::agent::ToolCallKey;
/// let key = ToolCallKey::new("task-42", 3, "create_incident");
/// assert_eq!(key.as_str(), "tc1:task-42:3:create_incident");
/// assert_ne!(ToolCallKey::new("a:b", 1, "c"), ToolCallKey::new("a", 1, "b:c"));
/// let long = ToolCallKey::new(&"t".repeat(400), 1, "x");
/// assert!(long.as_str().starts_with("tc1h:") && long.as_str().len() == 69);
/// assert!(idemdb::validate_key(long.as_str()).is_ok());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolCallKey {
    rendered: String,
    tool: String,
}

impl ToolCallKey {
    /// The key of the call to `tool` at `step` of `task`.
    pub fn new(task: &str, step: u64, tool: &str) -> ToolCallKey {
        ToolCallKey::render(task, step, tool, None)
    }

    /// The same, further told apart by the tool-call id the runtime assigned (for a step that
    /// calls one tool several times).
    pub fn with_call_id(task: &str, step: u64, tool: &str, call_id: &str) -> ToolCallKey {
        ToolCallKey::render(task, step, tool, Some(call_id))
    }

    /// A key the harness minted itself for the call to `tool` (say, a tool-call id it keeps
    /// across retries), used as it is: the tool sees this very key. It must be a valid
    /// idempotency key ([`crate::validate_key`]) and not begin with `tc1:` or `tc1h:`, which the
    /// derived keys use, so that it can never stand for a derived key's call.
    ///
    /// ```
    /// use idemdb::agent::ToolCallKey;
    /// let key = ToolCallKey::given("run-42/call-7", "create_incident")?;
    /// assert_eq!((key.as_str(), key.tool()), ("run-42/call-7", "create_incident"));
    /// assert!(ToolCallKey::given("tc1:t:1:x", "x").is_err());
    /// assert!(ToolCallKey::given("two words", "x").is_err());
    /// # Ok::<(), idemdb::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`crate::Error::InvalidKey`]: empty, too long, a byte outside visible ASCII, or a derived
    /// key's prefix ([`crate::InputProblem::Reserved`]).
    pub fn given(key: &str, tool: &str) -> crate::Result<ToolCallKey> {
        crate::validate_key(key)?;
        if let Some(prefix) = ["tc1:", "tc1h:"].into_iter().find(|p| key.starts_with(p)) {
            return Err(crate::Error::InvalidKey {
                reason: crate::InputProblem::Reserved { prefix },
            });
        }
        Ok(ToolCallKey {
            rendered: key.to_owned(),
            tool: tool.to_owned(),
        })
    }

    fn render(task: &str, step: u64, tool: &str, call_id: Option<&str>) -> ToolCallKey {
        let mut text = String::from("tc1:");
        escape(task, &mut text);
        text.push(':');
        text.push_str(&step.to_string());
        text.push(':');
        escape(tool, &mut text);
        if let Some(id) = call_id {
            text.push(':');
            escape(id, &mut text);
        }
        let rendered = if text.len() <= MAX_KEY_LEN {
            text
        } else {
            let mut h = Sha256::new();
            for part in [task.as_bytes(), &step.to_le_bytes(), tool.as_bytes()]
                .into_iter()
                .chain(call_id.map(str::as_bytes))
            {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part);
            }
            let digest: [u8; 32] = h.finalize().into();
            let mut out = String::from("tc1h:");
            for b in digest {
                out.push_str(&format!("{b:02x}"));
            }
            out
        };
        ToolCallKey {
            rendered,
            tool: tool.to_owned(),
        }
    }

    /// The rendered key: 1..=255 bytes of visible ASCII, a valid idempotency key.
    pub fn as_str(&self) -> &str {
        &self.rendered
    }

    /// The tool this call is to.
    pub fn tool(&self) -> &str {
        &self.tool
    }
}

fn escape(part: &str, out: &mut String) {
    for &b in part.as_bytes() {
        if b == b'%' || b == b':' || !(0x21..=0x7E).contains(&b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
}

impl fmt::Display for ToolCallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rendered)
    }
}

impl fmt::Debug for ToolCallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ToolCallKey({})", self.rendered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renders_readably_and_escapes_separators() {
        assert_eq!(ToolCallKey::new("t", 0, "x").as_str(), "tc1:t:0:x");
        assert_eq!(
            ToolCallKey::new("a b:%", 7, "é").as_str(),
            "tc1:a%20b%3A%25:7:%C3%A9"
        );
        assert_eq!(
            ToolCallKey::with_call_id("t", 1, "x", "call_9").as_str(),
            "tc1:t:1:x:call_9"
        );
        assert_eq!(ToolCallKey::new("", 1, "").as_str(), "tc1::1:");
    }

    #[test]
    fn long_ids_are_hashed_not_cut() {
        let a = ToolCallKey::new(&"a".repeat(300), 1, "tool");
        let b = ToolCallKey::new(&format!("{}b", "a".repeat(299)), 1, "tool");
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("tc1h:"));
        assert_eq!(a.as_str().len(), 69);
        // Pinned (computed independently with Python's hashlib): the encoding is stable
        // across versions.
        assert_eq!(
            ToolCallKey::new(&"x".repeat(256), 2, "t").as_str(),
            "tc1h:bf24cf1e529a75543762049d81df4b1d268afd0d9952c8daea75f1eef6764b98"
        );
    }

    proptest! {
        /// Distinct (task, step, tool) triples never share a key, including triples built to
        /// collide through separators.
        #[test]
        fn distinct_triples_never_share_a_key(
            a in ("[a:%b ]{0,4}", 0u64..3, "[a:%b ]{0,4}"),
            b in ("[a:%b ]{0,4}", 0u64..3, "[a:%b ]{0,4}"),
        ) {
            let ka = ToolCallKey::new(&a.0, a.1, &a.2);
            let kb = ToolCallKey::new(&b.0, b.1, &b.2);
            prop_assert_eq!(ka == kb, a == b);
            prop_assert!(crate::validate_key(ka.as_str()).is_ok());
        }

        #[test]
        fn every_key_is_valid(task in ".{0,300}", step in any::<u64>(), tool in ".{0,100}") {
            let k = ToolCallKey::new(&task, step, &tool);
            prop_assert!(crate::validate_key(k.as_str()).is_ok(), "{}", k);
            prop_assert_eq!(k, ToolCallKey::new(&task, step, &tool));
        }
    }
}
