//! Parser robustness: it never panics, and its errors point at the right place.

mod common;

use common::*;
use glmc_ir::{parse_module, print_module, verify_module, ParseError};
use proptest::prelude::*;

/// 1-based line and column (in chars) of the first `needle` in `text`.
fn pos_of(text: &str, needle: &str) -> (usize, usize) {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the text"));
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let col = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .chars()
        .count()
        + 1;
    (line, col)
}

#[track_caller]
fn parse_err(text: &str) -> ParseError {
    match parse_module(text) {
        Ok(_) => panic!("should not parse:\n{text}"),
        Err(e) => e,
    }
}

#[track_caller]
fn assert_err_at(text: &str, at: &str, what: &[&str]) -> ParseError {
    let e = parse_err(text);
    let (line, col) = pos_of(text, at);
    assert_eq!(
        (e.line, e.col),
        (line, col),
        "{e} should point at {at:?} ({line}:{col})"
    );
    for w in what {
        assert!(
            e.message.contains(w),
            "{:?} should contain {w:?}",
            e.message
        );
    }
    assert_eq!(e.to_string(), format!("{line}:{col}: {}", e.message));
    e
}

fn little_text() -> String {
    print_module(&little_module(1))
}

/// `little_text` with the first occurrence of `from` replaced by `to` (which must differ).
fn edit(from: &str, to: &str) -> String {
    let text = little_text();
    assert!(text.contains(from), "{from:?} not in the module");
    text.replacen(from, to, 1)
}

const SMALL: &str = r#"glmc.module "m"
state "c" : f32[4]

func @f {
  %0 = input {index=0} : f32[s,4] "x"
  %1 = input {index=1} : i64[s] "pos"
  %2 = weight {recipe=hf("w", [2, 4])} : f32[2,4] "w"
  %3 = matmul %0, %2 : f32[s,2] "y"
  %4 = cache.update %0, %1 {batched=false, state="c"} : f32[t,4] "c"
  return %3 "y", %4 "c"
}
"#;

#[test]
fn small_module_parses_and_verifies() {
    let m = parse_module(SMALL).unwrap();
    verify_module(&m).unwrap();
    assert_eq!(print_module(&m), SMALL);
}

#[test]
fn unknown_op_reports_its_line_and_column() {
    let text = edit("= rmsnorm ", "= rmsnorn ");
    let e = assert_err_at(&text, "rmsnorn", &["unknown op `rmsnorn`"]);
    // It is the node of the first layer's input norm, well inside the text, after `  %N = `.
    assert!(e.line > 5, "{e}");
    let line = text.lines().nth(e.line - 1).unwrap();
    assert!(line.starts_with("  %"), "{line}");
    assert_eq!(e.col, line.find("rmsnorn").unwrap() + 1, "{e}");
}

#[test]
fn unknown_attribute_is_named() {
    let text = edit("{eps=1e-5}", "{eps=1e-5, epsilon=2.0}");
    assert_err_at(
        &text,
        "rmsnorm %",
        &["op `rmsnorm` has no attribute `epsilon`", "(it has: eps)"],
    );
}

#[test]
fn missing_and_ill_typed_attributes() {
    let text = edit("{eps=1e-5}", "");
    assert_err_at(&text, "rmsnorm %", &["op `rmsnorm` needs attribute `eps`"]);
    let text = SMALL.replace("{index=1}", "{index=\"one\"}");
    assert_err_at(
        &text,
        "input {index=\"one\"}",
        &[
            "attribute `index` of `input`",
            "expected a non-negative integer, found a string",
        ],
    );
    let text = SMALL.replace("batched=false", "batched=no");
    assert_err_at(
        &text,
        "cache.update",
        &["attribute `batched`", "true or false"],
    );
    let text = SMALL.replace("hf(\"w\", [2, 4])", "hf(\"w\")");
    assert_err_at(&text, "weight", &["recipe `hf` takes 2 arguments, found 1"]);
    let text = SMALL.replace("{index=0}", "{index=0, index=1}");
    let e = parse_err(&text);
    assert!(
        e.message.contains("attribute `index` is given twice"),
        "{e}"
    );
    assert_eq!(e.line, 5);
}

#[test]
fn use_before_definition() {
    let text = SMALL.replace("matmul %0, %2", "matmul %0, %7");
    assert_err_at(&text, "%7", &["%7 is used before it is defined"]);
    // A result too.
    let text = SMALL.replace("return %3", "return %9");
    assert_err_at(&text, "%9", &["%9 is used before it is defined"]);
    // A node may not read itself.
    let text = SMALL.replace("matmul %0, %2", "matmul %0, %3");
    assert_err_at(&text, "%3 :", &["%3 is used before it is defined"]);
}

#[test]
fn value_errors() {
    let text = SMALL.replace("matmul %0, %2", "matmul %0#1, %2");
    assert_err_at(&text, "%0#1", &["%0 has no output #1"]);
    let text = SMALL.replace("%3 = matmul", "%2 = matmul");
    assert_err_at(&text, "%2 = matmul", &["%2 is defined twice"]);
    let text = SMALL.replace("%3 = matmul", "%3#0 = matmul");
    // `%3#0` lexes as output 0 of %3; it defines %3 like `%3` does.
    assert!(parse_module(&text).is_ok());
    let text = SMALL.replace("%3 = matmul", "%3#1 = matmul");
    assert_err_at(&text, "%3#1", &["without `#`"]);
    let text = SMALL.replace("%3 = matmul", "% = matmul");
    let e = parse_err(&text);
    assert!(e.message.contains("expected a value id after `%`"), "{e}");
    assert_eq!(e.line, 8);
}

#[test]
fn type_errors_point_at_the_type() {
    let text = SMALL.replace("f32[s,2] \"y\"", "f33[s,2] \"y\"");
    assert_err_at(&text, "f33", &["unknown dtype `f33`"]);
    let text = SMALL.replace("f32[s,2] \"y\"", "f32[s,-2] \"y\"");
    assert_err_at(&text, "-2", &["expected a dimension"]);
    let text = SMALL.replace("f32[s,2] \"y\"", "f32[s,2.5] \"y\"");
    assert_err_at(&text, "2.5", &["expected a dimension"]);
    let text = SMALL.replace("state \"c\" : f32[4]", "state \"c\" : f32[4");
    let e = parse_err(&text);
    assert!(e.message.contains("expected `]`"), "{e}");
    let text = SMALL.replace(
        "state \"c\" : f32[4]",
        "state \"c\" : f32[4]\nstate \"c\" : f32[4]",
    );
    let e = parse_err(&text);
    assert!(e.message.contains("state \"c\" is declared twice"), "{e}");
    assert_eq!((e.line, e.col), (3, 7), "{e}");
}

#[test]
fn attribute_value_errors_point_at_the_value() {
    let text = SMALL.replace("{index=1}", "{index=:}");
    assert_err_at(&text, ":}", &["expected an attribute value"]);
    let text = SMALL.replace("{index=1}", "{index=[1, ,]}");
    assert_err_at(&text, ",]", &["expected an attribute value"]);
}

#[test]
fn lexical_errors() {
    let text = SMALL.replace("%4 \"c\"\n}", "%4 \"c\n}");
    let e = parse_err(&text);
    assert!(e.message.contains("unterminated string"), "{e}");
    assert_eq!((e.line, e.col), (12, 1), "{e}");
    let text = SMALL.replace("matmul %0", "matmul $0");
    assert_err_at(&text, "$", &["unexpected character '$'"]);
    let text = SMALL.replace("\"pos\"", "\"p\\qos\"");
    let e = parse_err(&text);
    assert!(e.message.contains("unknown escape"), "{e}");
    let text = SMALL.replace("\"pos\"", "\"p\\u{110000}\"");
    let e = parse_err(&text);
    assert!(e.message.contains("bad `\\u{..}` escape"), "{e}");
    let text = SMALL.replace(
        "{index=1}",
        "{index=99999999999999999999999999999999999999999}",
    );
    let e = parse_err(&text);
    assert!(e.message.contains("bad number"), "{e}");
    // Comments and blank lines are fine.
    let text = SMALL.replace("func @f {\n", "// a comment\nfunc @f { // another\n\n");
    assert_eq!(print_module(&parse_module(&text).unwrap()), SMALL);
}

#[test]
fn structure_errors() {
    let e = parse_err("");
    assert_eq!((e.line, e.col), (1, 1));
    assert!(e.message.contains("expected `glmc.module`"), "{e}");
    let text = SMALL.replace("  return %3 \"y\", %4 \"c\"\n", "");
    let e = parse_err(&text);
    assert!(
        e.message.contains("expected a node `%N = ...` or `return`"),
        "{e}"
    );
    let text = SMALL.replace("return %3 \"y\", %4 \"c\"", "return %3 \"y\" %4 \"c\"");
    assert_err_at(&text, "%4 \"c\"", &["expected `}`"]);
    let text = SMALL.replace("func @f", "fn @f");
    assert_err_at(&text, "fn", &["expected `func`"]);
    let text = SMALL.replace("\"y\"\n", "\n");
    let e = parse_err(&text);
    assert!(e.message.contains("expected the node name"), "{e}");
}

#[test]
fn non_finite_floats_are_rejected() {
    // `1e400` overflows f64 to infinity, which the printer cannot write back as a number.
    let text = edit("{eps=1e-5}", "{eps=1e400}");
    assert_err_at(&text, "1e400", &["1e400"]);
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    let deep = "[".repeat(200_000);
    let text = SMALL.replace("{index=1}", &format!("{{index={deep}"));
    let e = parse_err(&text);
    assert!(e.message.contains("nested"), "{e}");
    // Moderate nesting is fine, as in recipes.
    let nested = format!("{}1{}", "[".repeat(20), "]".repeat(20));
    let text = SMALL.replace("{index=1}", &format!("{{index={nested}}}"));
    let e = parse_err(&text);
    assert!(
        e.message
            .contains("expected a non-negative integer, found a list"),
        "{e}"
    );
}

#[test]
fn parsed_text_need_not_verify() {
    // The parser checks syntax and references; types are the verifier's job.
    let text = SMALL.replace("f32[s,2] \"y\"", "f32[s,3] \"y\"");
    let m = parse_module(&text).unwrap();
    let e = verify_module(&m).unwrap_err().to_string();
    assert!(e.contains("node \"y\" (matmul of"), "{e}");
    assert!(
        e.contains("declared output f32[s,3] but the operands give f32[s,2]"),
        "{e}"
    );
}

/// Applies byte-level edits to `text`, at char boundaries.
fn mutate(text: &str, edits: &[(u8, usize, char)]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for &(kind, at, c) in edits {
        let at = if chars.is_empty() {
            0
        } else {
            at % chars.len()
        };
        match kind % 3 {
            0 if !chars.is_empty() => {
                chars.remove(at);
            }
            1 => chars.insert(at, c),
            _ if !chars.is_empty() => chars[at] = c,
            _ => chars.push(c),
        }
    }
    chars.into_iter().collect()
}

fn interesting_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => proptest::sample::select(
            "%#=:,{}[]()\"\\@-.e0123456789 \n/_abfsti".chars().collect::<Vec<_>>()
        ),
        1 => any::<char>(),
    ]
}

/// Whatever parses prints to a fixed point of parse ∘ print, and neither verification nor
/// printing panics on it.
fn check_parsed(text: &str) -> Result<(), TestCaseError> {
    if let Ok(m) = parse_module(text) {
        let _ = verify_module(&m);
        let printed = print_module(&m);
        let again = parse_module(&printed)
            .map_err(|e| TestCaseError::fail(format!("reparse: {e}\n{printed}")))?;
        prop_assert_eq!(print_module(&again), printed);
    }
    Ok(())
}

const TOKENS: &[&str] = &[
    "glmc.module",
    "\"m\"",
    "state",
    "func",
    "@f",
    "@",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    "=",
    "%0",
    "%1",
    "%2",
    "%1#1",
    "input",
    "weight",
    "matmul",
    "moe.route",
    "add",
    "return",
    "index",
    "recipe",
    "hf",
    "stack",
    "\"w\"",
    "f32",
    "bf16",
    "i64",
    "s",
    "t",
    "4",
    "2",
    "0",
    "-1",
    "1.5",
    "1e400",
    "\"x\"",
    "\n",
    "eps",
    "rmsnorm",
    "true",
    "//",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn never_panics_on_arbitrary_strings(s in any::<String>()) {
        let _ = parse_module(&s);
        check_parsed(&s)?;
    }

    #[test]
    fn never_panics_on_token_soup(toks in proptest::collection::vec(proptest::sample::select(TOKENS), 0..80)) {
        let mut s = String::from("glmc.module \"m\"\n");
        s.push_str(&toks.join(" "));
        let _ = parse_module(&s);
        check_parsed(&s)?;
    }

    #[test]
    fn never_panics_on_mutations_of_a_valid_module(
        edits in proptest::collection::vec((0u8..3, any::<usize>(), interesting_char()), 1..8)
    ) {
        let text = mutate(SMALL_LAYER.with(|t| t.clone()).as_str(), &edits);
        let _ = parse_module(&text);
        check_parsed(&text)?;
    }
}

thread_local! {
    static SMALL_LAYER: String = little_text();
}

#[test]
fn mutation_helper_edits() {
    assert_eq!(mutate("abc", &[(0, 1, 'x')]), "ac");
    assert_eq!(mutate("abc", &[(1, 1, 'x')]), "axbc");
    assert_eq!(mutate("abc", &[(2, 4, 'x')]), "axc");
    assert_eq!(mutate("", &[(0, 4, 'x'), (2, 0, 'y')]), "y");
}
