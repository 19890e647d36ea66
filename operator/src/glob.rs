//! Whole-string globs with `*` (any run of characters) and `?` (one character), as used
//! by every list of names in the custom resources. Deny lists beat allow lists.

/// Whether `pattern` matches all of `text`.
pub fn matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with single-star backtracking: linear for typical patterns,
    // never exponential.
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether any pattern matches.
pub fn any_matches<S: AsRef<str>>(patterns: &[S], text: &str) -> bool {
    patterns.iter().any(|p| matches(p.as_ref(), text))
}

/// Allowed when some `allow` glob matches and no `deny` glob does.
pub fn allowed<A: AsRef<str>, D: AsRef<str>>(allow: &[A], deny: &[D], text: &str) -> bool {
    any_matches(allow, text) && !any_matches(deny, text)
}

/// How specific a glob is, for choosing among matches: fewer wildcards first, then more
/// literal characters. Larger is more specific.
pub fn specificity(pattern: &str) -> (std::cmp::Reverse<usize>, usize) {
    let wildcards = pattern.chars().filter(|c| matches!(c, '*' | '?')).count();
    let literals = pattern.chars().count() - wildcards;
    (std::cmp::Reverse(wildcards), literals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_string_semantics() {
        assert!(matches("incident-*", "incident-42"));
        assert!(!matches("incident-*", "my-incident-42"));
        assert!(matches("*", ""));
        assert!(matches("a?c", "abc"));
        assert!(!matches("a?c", "ac"));
        assert!(matches("*-prod-*", "shop-prod-eu"));
        assert!(!matches("prod", "production"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("a*b*c", "axxbyy"));
        // Regex metacharacters are literal.
        assert!(matches("a.b", "a.b"));
        assert!(!matches("a.b", "axb"));
    }

    #[test]
    fn deny_beats_allow() {
        assert!(allowed(&["*"], &["get_logs"], "get_events"));
        assert!(!allowed(&["*"], &["get_*"], "get_logs"));
        assert!(!allowed::<&str, &str>(&[], &[], "x"));
    }

    #[test]
    fn specificity_orders_fewer_wildcards_then_literals() {
        assert!(specificity("incident-42") > specificity("incident-*"));
        assert!(specificity("incident-*") > specificity("*"));
        assert!(specificity("incident-4?") > specificity("inc*"));
        assert!(specificity("incident-*") > specificity("inc-*"));
    }
}
