//! The RON front end and the JSON importer return Ok or Err, never panic, on arbitrary text and
//! on random edits of valid files.

mod common;

use std::path::Path;

use glmc_models::{import_hf_str, ModelConfig};
use proptest::prelude::*;

/// One edit of a valid file: at a fraction of its length, delete some bytes and insert a
/// fragment. Fragments favour what breaks parsers and validators: numbers (huge, zero,
/// negative, float), brackets, quotes, keywords, field names.
#[derive(Clone, Debug)]
struct Edit {
    at: f64,
    delete: usize,
    insert: String,
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|x| x.to_string()),
        Just("0".to_string()),
        Just("1".to_string()),
        prop::sample::select(vec![
            "(",
            ")",
            "[",
            "]",
            "{",
            "}",
            ",",
            ":",
            "\"",
            "Some(",
            "None",
            "true",
            "null",
            "shared",
            "full",
            "\"S\"",
            "sparse",
            "dense",
            "1e400",
            "-0.0",
            "NaN",
            "inf",
            "//",
            "/*",
            "r#",
            "'",
            "\\u{0}",
            "hidden_size",
            "\"index_topk_freq\": 0,",
            "\"rope_scaling\": {},",
            "\"indexer_types\": [\"shared\"],",
            "\u{feff}",
            "\u{1F600}",
        ])
        .prop_map(str::to_string),
        "\\PC{0,12}",
    ]
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    prop::collection::vec(
        (0.0..1.0f64, 0usize..16, fragment()).prop_map(|(at, delete, insert)| Edit {
            at,
            delete,
            insert,
        }),
        1..6,
    )
}

/// Applies `edits` at char boundaries so the result stays a `str`.
fn apply(text: &str, edits: &[Edit]) -> String {
    let mut out = text.to_string();
    for e in edits {
        let chars: Vec<(usize, char)> = out.char_indices().collect();
        let start_char = ((chars.len() as f64) * e.at) as usize;
        let start = chars.get(start_char).map_or(out.len(), |c| c.0);
        let end = chars.get(start_char + e.delete).map_or(out.len(), |c| c.0);
        out.replace_range(start..end, &e.insert);
    }
    out
}

fn check_ron(text: &str) {
    if let Ok(config) = ModelConfig::from_ron_str(text, Path::new("fuzz.ron")) {
        // An accepted config stays accepted after a round trip, and its helpers are total.
        let again = ModelConfig::from_ron_str(&config.to_ron_string(), Path::new("fuzz.ron"));
        assert_eq!(again.unwrap(), config);
        let _ = (
            config.qk_head_dim(),
            config.softmax_scale(),
            config.kv_cache_dim(),
        );
        for i in 0..config.num_layers_with_mtp() {
            let _ = (config.is_moe_layer(i), config.indexer_source_layer(i));
        }
    }
}

fn check_json(text: &str) {
    if let Ok(imported) = import_hf_str(text, Path::new("fuzz/config.json"), "fuzz") {
        let config = imported.config;
        let again = ModelConfig::from_ron_str(&config.to_ron_string(), Path::new("fuzz.ron"));
        assert_eq!(
            again.unwrap(),
            config,
            "an imported config is a valid model.ron"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn ron_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
        check_ron(&text);
    }

    #[test]
    fn json_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
        check_json(&text);
    }

    #[test]
    fn ron_never_panics_on_edited_configs(file in prop::sample::select(glmc_models::SHIPPED_CONFIGS.to_vec()), edits in edits()) {
        check_ron(&apply(&common::shipped_text(file), &edits));
    }

    #[test]
    fn json_never_panics_on_edited_configs(file in prop::sample::select(vec!["glm5-config.json", "tf517-tiny-shared.json", "tf517-glm5-freq4-offset3.json"]), edits in edits()) {
        let text = std::fs::read_to_string(common::data(file)).unwrap();
        check_json(&apply(&text, &edits));
    }
}

/// The edit machinery itself must be able to produce both accepted and rejected files, or the
/// properties above would test nothing.
#[test]
fn edits_reach_both_outcomes() {
    let text = common::shipped_text("tiny-sparse.ron");
    let keep = Edit {
        at: 0.0,
        delete: 0,
        insert: String::new(),
    };
    assert!(ModelConfig::from_ron_str(&apply(&text, &[keep]), Path::new("x")).is_ok());
    let break_it = Edit {
        at: 0.5,
        delete: 3,
        insert: "((".to_string(),
    };
    assert!(ModelConfig::from_ron_str(&apply(&text, &[break_it]), Path::new("x")).is_err());
}
