//! Name patterns in Redis glob syntax (`*` and `?`): which keys and channels the operator's
//! policy allows, which dead letters a selection chooses by reason. Vocabulary, not policy: the
//! domain's own types match with them, so they live below everything that applies them.

use std::fmt;

use wildmatch::WildMatch;

/// A set of key (or channel) name patterns, in Redis glob syntax (`*` and `?`).
#[derive(Clone, Debug)]
pub struct Patterns {
    text: String,
    /// `None`: every name.
    patterns: Option<Vec<WildMatch>>,
}

impl Patterns {
    /// Every name.
    pub fn any() -> Self {
        Self {
            text: "*".into(),
            patterns: None,
        }
    }

    /// From the patterns an operator gave; an empty list or `*` allows every name.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Self {
        let list: Vec<&str> = patterns
            .iter()
            .map(|p| p.as_ref().trim())
            .filter(|p| !p.is_empty())
            .collect();
        if list.is_empty() || list.contains(&"*") {
            return Self::any();
        }
        Self {
            text: list.join(","),
            patterns: Some(list.iter().map(|p| WildMatch::new(p)).collect()),
        }
    }

    pub fn allows(&self, name: &[u8]) -> bool {
        match &self.patterns {
            None => true,
            Some(patterns) => {
                let name = String::from_utf8_lossy(name);
                patterns.iter().any(|p| p.matches(&name))
            }
        }
    }

    /// Whether every name is allowed (no key needs to be looked at).
    pub fn is_any(&self) -> bool {
        self.patterns.is_none()
    }
}

impl fmt::Display for Patterns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_patterns_are_redis_globs_and_braces_are_literal() {
        let keys = Patterns::new(&["{orders}:*", "count:?"]);
        assert!(keys.allows(b"{orders}:totals"));
        assert!(keys.allows(b"count:7"));
        assert!(!keys.allows(b"count:77"));
        assert!(!keys.allows(b"orders:totals"));
        assert!(!keys.allows(b"secrets"));
        assert!(Patterns::new::<&str>(&[]).allows(b"anything"));
        assert!(Patterns::new(&["a*", "*"]).is_any());
    }
}
