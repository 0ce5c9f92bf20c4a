//! The price table the host estimates a session's spend with while it runs (Claude Code prints
//! its cost only on its result line; Codex never does).
//!
//! The table ships as data, `host/prices.json`, embedded in the binary; an operator replaces it
//! with `--prices FILE` (`SHOPFLOOR_HOST_PRICES`) when prices change before a release does.
//! Prices are USD per million tokens. A model is priced by the longest `match` prefix its name
//! starts with, so a dated name (`claude-sonnet-4-5-20250929`) and the alias a node asked for
//! (`claude-sonnet-4-5`) find the same row. A model no row names is priced by its family, the
//! longest `family` prefix it starts with (`claude-opus-`, `gpt-5`: a release newer than the
//! table), and the estimate says so ([`Basis::Family`]); one of no known family at the most
//! expensive row ([`Basis::UnknownModel`]). The table also lists the models each harness uses by
//! default or offers (`harnesses`), which `shopfloor check --host` prices.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The table shipped with this release.
pub const SHIPPED: &str = include_str!("../prices.json");

/// One row: the prices of the models whose names start with one of `matches`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Price {
    #[serde(rename = "match")]
    pub matches: Vec<String>,
    pub input: f64,
    pub output: f64,
    /// A 5-minute cache write (Anthropic); a 1-hour write costs 1.6 times it.
    pub cache_write: f64,
    pub cache_read: f64,
    /// Prefixes of the family this row prices when no row names a model.
    #[serde(default)]
    pub family: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct File {
    models: Vec<Price>,
    #[serde(default)]
    harnesses: BTreeMap<String, Vec<String>>,
}

/// The table.
#[derive(Debug, Clone)]
pub struct Prices {
    rows: Vec<Price>,
    /// The most expensive row: the price of a model the table does not know.
    dearest: Price,
    /// By harness (`claude-code`, `codex`), the models its CLI uses by default or offers.
    harnesses: BTreeMap<String, Vec<String>>,
}

/// On what an estimate is based, from the surest to the least sure (an estimate over several
/// models is as sure as its least sure part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Basis {
    /// Every model the session used is in the table.
    PriceTable,
    /// A model is not in the table: it was priced by its family's row.
    Family,
    /// A model is not in the table: it was priced at the most expensive row.
    UnknownModel,
}

impl Basis {
    pub fn name(self) -> &'static str {
        match self {
            Basis::PriceTable => "price_table",
            Basis::Family => "model_family",
            Basis::UnknownModel => "unknown_model",
        }
    }
}

/// Token counts of one model call, as Anthropic splits them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Input not read from nor written to the cache.
    pub input: i64,
    pub cache_write_5m: i64,
    pub cache_write_1h: i64,
    pub cache_read: i64,
    pub output: i64,
}

impl Prices {
    /// Parses a table; every price must be a finite, non-negative number and the table not empty.
    pub fn parse(text: &str) -> Result<Prices, String> {
        let file: File = serde_json::from_str(text).map_err(|e| format!("not a price table: {e}"))?;
        if file.models.is_empty() {
            return Err("the price table names no model".into());
        }
        for p in &file.models {
            let ok = [p.input, p.output, p.cache_write, p.cache_read].iter().all(|v| v.is_finite() && *v >= 0.0);
            if !ok || p.matches.is_empty() || p.matches.iter().any(|m| m.trim().is_empty()) {
                return Err(format!("price row {:?}: each row needs names to match and non-negative prices", p.matches));
            }
        }
        let weight = |p: &Price| p.output + p.input + p.cache_write + p.cache_read;
        let dearest = file.models.iter().max_by(|a, b| weight(a).total_cmp(&weight(b))).cloned().expect("not empty");
        Ok(Prices { rows: file.models, dearest, harnesses: file.harnesses })
    }

    /// The table shipped with this release.
    pub fn shipped() -> Prices {
        Prices::parse(SHIPPED).expect("host/prices.json is a valid price table (a unit test checks it)")
    }

    /// The table in `path`, or the shipped one without a path.
    pub fn load(path: Option<&std::path::Path>) -> Result<Prices, String> {
        match path {
            None => Ok(Prices::shipped()),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read the price table {}: {e}", p.display()))?;
                Prices::parse(&text).map_err(|e| format!("{}: {e}", p.display()))
            }
        }
    }

    /// The row of a model, by the longest prefix of its name; `None` when no row matches.
    pub fn find(&self, model: &str) -> Option<&Price> {
        longest(&self.rows, model, |p| &p.matches)
    }

    /// The row that prices a model, and on what basis: its own, its family's, or the dearest.
    pub fn row(&self, model: Option<&str>) -> (&Price, Basis) {
        let Some(model) = model else { return (&self.dearest, Basis::UnknownModel) };
        if let Some(p) = self.find(model) {
            return (p, Basis::PriceTable);
        }
        match longest(&self.rows, model, |p| &p.family) {
            Some(p) => (p, Basis::Family),
            None => (&self.dearest, Basis::UnknownModel),
        }
    }

    /// The models each harness's CLI uses by default or offers, by harness.
    pub fn harness_models(&self, harness: &str) -> &[String] {
        self.harnesses.get(harness).map_or(&[], Vec::as_slice)
    }

    /// What `tokens` of `model` cost, and on what basis (an unknown or absent model is priced at
    /// the most expensive row).
    pub fn cost(&self, model: Option<&str>, t: &Tokens) -> (f64, Basis) {
        let (p, basis) = self.row(model);
        let usd = (t.input as f64 * p.input
            + t.cache_write_5m as f64 * p.cache_write
            + t.cache_write_1h as f64 * p.cache_write * 1.6
            + t.cache_read as f64 * p.cache_read
            + t.output as f64 * p.output)
            / 1_000_000.0;
        (usd, basis)
    }
}

/// The row with the longest of its `prefixes` that `model` starts with.
fn longest<'a>(rows: &'a [Price], model: &str, prefixes: impl Fn(&Price) -> &Vec<String>) -> Option<&'a Price> {
    let model = model.trim().to_ascii_lowercase();
    rows.iter()
        .flat_map(|p| prefixes(p).iter().map(move |m| (m, p)))
        .filter(|(m, _)| model.starts_with(&m.to_ascii_lowercase()))
        .max_by_key(|(m, _)| m.len())
        .map(|(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_parses_and_finds_models_by_their_longest_prefix() {
        let p = Prices::shipped();
        assert_eq!(p.find("claude-sonnet-4-5-20250929").map(|r| r.input), Some(3.0));
        assert_eq!(p.find("claude-opus-4-5-20251101").map(|r| r.output), Some(25.0));
        assert_eq!(p.find("claude-opus-5-5").map(|r| r.output), Some(20.0));
        assert_eq!(p.find("claude-opus-5").map(|r| r.output), Some(25.0));
        assert_eq!(p.find("opus").map(|r| r.input), Some(4.0));
        assert_eq!(p.find("claude-opus-4-1-20250805").map(|r| r.output), Some(75.0));
        assert_eq!(p.find("claude-3-5-haiku-20241022").map(|r| r.input), Some(0.80));
        assert_eq!(p.find("gpt-5-codex").map(|r| r.output), Some(10.0));
        assert_eq!(p.find("gpt-5-mini").map(|r| r.output), Some(2.0));
        assert_eq!(p.find("o4-mini").map(|r| r.input), Some(1.10));
        assert_eq!(p.find("sonnet").map(|r| r.input), Some(2.0));
        assert!(p.find("<synthetic>").is_none());
    }

    #[test]
    fn costs_agree_with_what_claude_code_reported() {
        // The per-model costUSD of a real Claude Code 2.1 result line.
        let p = Prices::shipped();
        let sonnet = Tokens { input: 6, cache_write_5m: 8982, cache_read: 42853, output: 583, ..Tokens::default() };
        let (usd, basis) = p.cost(Some("claude-sonnet-4-5-20250929"), &sonnet);
        assert!((usd - 0.055_301_4).abs() < 1e-9, "{usd}");
        assert_eq!(basis, Basis::PriceTable);
        let haiku = Tokens { input: 2, cache_read: 14934, output: 125, ..Tokens::default() };
        assert!((p.cost(Some("claude-haiku-4-5-20251001"), &haiku).0 - 0.002_120_4).abs() < 1e-9);
    }

    #[test]
    fn an_unknown_model_is_priced_by_its_family_else_at_the_dearest_row_and_says_so() {
        let p = Prices::shipped();
        let t = Tokens { output: 1_000_000, ..Tokens::default() };
        // A newer release of a known family: its family's row (the latest of it).
        assert_eq!(p.cost(Some("claude-opus-6"), &t), (20.0, Basis::Family));
        assert_eq!(p.cost(Some("claude-fable-9"), &t), (40.0, Basis::Family));
        assert_eq!(p.cost(Some("gpt-6.1-luna"), &t), (6.0, Basis::Family));
        // No family: the dearest row.
        assert_eq!(p.cost(Some("claude-zeta-9"), &t), (75.0, Basis::UnknownModel));
        assert_eq!(p.cost(None, &t), (75.0, Basis::UnknownModel));
    }

    /// Every model the pinned CLIs use by default or offer, aliases included, is priced by the
    /// table; the ones without published prices by their family.
    #[test]
    fn the_pinned_clis_models_are_priced() {
        let p = Prices::shipped();
        let basis = |m: &str| p.row(Some(m)).1;
        for harness in ["claude-code", "codex"] {
            let models = p.harness_models(harness);
            assert!(!models.is_empty(), "{harness}");
            for m in models {
                assert_ne!(basis(m), Basis::UnknownModel, "{harness}: {m}");
            }
        }
        for m in ["claude-opus-5-5", "opus", "sonnet", "haiku", "fable", "gpt-5.6-sol", "gpt-5.5"] {
            assert_eq!(basis(m), Basis::PriceTable, "{m}");
        }
        assert_eq!(basis("gpt-6.1-sol"), Basis::Family);
    }

    #[test]
    fn a_bad_table_is_refused() {
        assert!(Prices::parse(r#"{"models":[]}"#).is_err());
        assert!(Prices::parse(r#"{"models":[{"match":["x"],"input":-1,"output":1,"cache_write":0,"cache_read":0}]}"#).is_err());
        assert!(Prices::parse("[]").is_err());
    }
}
