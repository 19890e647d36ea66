use super::*;

fn parse(text: &str) -> FileOutcome {
    let env = |name: &str| match name {
        "SET_KEY" => Some("sk-from-env".to_owned()),
        _ => None,
    };
    parse_file(Path::new("m/app.yaml"), text, &env)
}

fn messages(out: &FileOutcome) -> Vec<String> {
    out.problems.iter().map(ToString::to_string).collect()
}

const GOOD_PROVIDER: &str = "apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata:
  name: anthropic
spec:
  type: anthropic
  apiKeySecretRef: {name: llm-keys, key: anthropic}
  defaultModel: claude-opus-4-6
";

#[test]
fn splits_documents_with_start_lines() {
    let docs = split_documents("a: 1\n---\nb: 2\n---\n\n---\n# c\nc: 3\n...\n");
    let starts: Vec<usize> = docs.iter().map(|(l, _)| *l).collect();
    assert_eq!(starts, vec![1, 3, 7]);
    assert_eq!(split_documents("--- {a: 1}\n").len(), 1);
}

#[test]
fn one_broken_document_does_not_stop_the_others() {
    let text = format!(
        "{GOOD_PROVIDER}---\napiVersion: kortex.dev/v1alpha1\nkind: LLMProvider\nmetadata:\n  name: azure\nspec:\n  type: azure\n---\nkey: [unclosed\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: x}}\n---\napiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {{name: default}}\nspec: {{sessions: ['*'], provider: anthropic}}\n"
    );
    let out = parse(&text);
    let names: Vec<String> = out
        .objects
        .iter()
        .map(|(_, id, _)| id.to_string())
        .collect();
    assert_eq!(
        names,
        vec![
            "LLMProvider default/anthropic",
            "ChatPolicy default/default"
        ]
    );
    let msgs = messages(&out);
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert!(
        msgs[0].starts_with("m/app.yaml:10: document 2 (LLMProvider default/azure): spec.type: unknown variant `azure`"),
        "{}",
        msgs[0]
    );
    assert!(
        msgs[0].contains("expected one of `anthropic`, `openai`, `ollama`, `openai-compatible`"),
        "{}",
        msgs[0]
    );
    assert!(
        msgs[1].starts_with("m/app.yaml:17: document 3: invalid YAML"),
        "{}",
        msgs[1]
    );
    assert_eq!(
        msgs[2],
        "m/app.yaml:19: document 4: skipped apps/v1 Deployment: not a kind Kortex reads"
    );
    assert_eq!(out.problems[2].severity, Severity::Warning);
    assert_eq!(out.failed.len(), 2);
    assert_eq!(
        out.failed[0].identity.as_ref().map(|i| i.name.as_str()),
        Some("azure")
    );
    assert!(out.failed[1].identity.is_none());
}

#[test]
fn unknown_fields_and_schema_bounds_are_named() {
    let text = "apiVersion: kortex.dev/v1alpha1
kind: LLMProvider
metadata: {name: typo}
spec:
  type: openai
  defaultModle: gpt-5
  maxTokens: 0
  models: []
  headers:
    - {name: 'bad header', value: x}
";
    let out = parse(text);
    assert!(out.objects.is_empty());
    let msgs = messages(&out);
    assert!(
        msgs.iter().any(|m| m
            .ends_with("spec.defaultModle: unknown field (not in the schema; check its spelling)")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter().any(|m| m
            .contains("spec.maxTokens: Invalid value: 0: should be greater than or equal to 1")),
        "{msgs:#?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("spec.headers[0].name: Invalid value: \"bad header\"")),
        "{msgs:#?}"
    );
    assert_eq!(
        msgs.len(),
        3,
        "empty lists are not unknown fields: {msgs:#?}"
    );
}

#[test]
fn other_versions_of_our_group_are_errors_and_names_are_checked() {
    let out = parse(
        "apiVersion: kortex.dev/v1beta1\nkind: LLMProvider\nmetadata: {name: a}\n---\napiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {name: Bad_Name}\nspec: {sessions: ['*'], provider: a}\n---\napiVersion: kortex.dev/v1alpha1\nkind: ChatPolicy\nmetadata: {namespace: x}\nspec: {}\n",
    );
    let msgs = messages(&out);
    assert!(
        msgs[0].contains("apiVersion: kortex.dev/v1beta1 LLMProvider is not served"),
        "{msgs:#?}"
    );
    assert!(
        msgs[1].contains("metadata.name: Invalid value: \"Bad_Name\""),
        "{msgs:#?}"
    );
    assert!(
        msgs[2].contains("metadata.name: Required value"),
        "{msgs:#?}"
    );
    assert!(out.objects.is_empty());
}

#[test]
fn secrets_take_env_vars_and_record_unset_ones() {
    let out = parse(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: llm-keys}\nstringData:\n  a: ${SET_KEY}\n  b: ${UNSET_KEY}\n  c: literal $${SET_KEY} and $5\n",
    );
    assert!(out.problems.is_empty(), "{:?}", messages(&out));
    let Some((_, _, Object::Secret(s))) = out.objects.first() else {
        panic!("no secret")
    };
    let data = s.string_data.clone().unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("sk-from-env"));
    assert_eq!(data.get("b"), None);
    assert_eq!(
        data.get("c").map(String::as_str),
        Some("literal ${SET_KEY} and $5")
    );
    let ann = s.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        ann.get(UNSET_ENV_ANNOTATION).map(String::as_str),
        Some("b=UNSET_KEY")
    );
}

#[test]
fn lists_and_json_documents_load() {
    let out = parse(
        r#"{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "kortex.dev/v1alpha1", "kind": "LLMProvider", "metadata": {"name": "o", "namespace": "team-a"}, "spec": {"type": "ollama"}}]}"#,
    );
    assert!(out.problems.is_empty(), "{:?}", messages(&out));
    assert_eq!(out.objects[0].1.to_string(), "LLMProvider team-a/o");
}

#[test]
fn secret_values_never_appear_in_errors() {
    let out =
        parse("apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData:\n  pin: 987654321\n");
    let msgs = messages(&out);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].contains("stringData.pin: invalid value (not shown"),
        "{}",
        msgs[0]
    );
    assert!(!msgs[0].contains("987654321"), "{}", msgs[0]);
}
