//! Reading what `claude -p --output-format stream-json --verbose` prints (see the harness
//! module's notes): its messages' token counts as they come, its result lines' figures, and
//! how it ended.

use std::collections::HashSet;

use serde_json::Value;

use super::{Exit, Reader, exit_reason, num, refused_class, short};
use crate::prices::{Basis, Tokens};

/// The last token counts of one Claude Code message (its assistant lines repeat its id).
#[derive(Debug, Clone, Default)]
pub(super) struct Message {
    /// The model that answered; `None` for Claude Code's own `<synthetic>` messages.
    model: Option<String>,
    tokens: Tokens,
}

/// The figures of a result line (Claude Code prints one per prompt it answers; with
/// stream-json input, several in one session, each cumulative for the session).
#[derive(Debug, Clone, Default)]
pub(super) struct Settled {
    cost: Option<f64>,
    input: i64,
    output: i64,
    turns: i32,
    model: Option<String>,
    /// The messages this result line accounts for.
    messages: HashSet<String>,
}

/// Claude Code's name for the messages it makes itself (an API error, an interruption).
const SYNTHETIC: &str = "<synthetic>";

fn real_model(m: Option<&str>) -> Option<String> {
    m.map(str::trim).filter(|m| !m.is_empty() && *m != SYNTHETIC).map(str::to_owned)
}

/// A tool call Claude Code refused (an entry of its result line's `permission_denials`), in
/// short words: the tool and what it was for (`Write NOTES.md`, `Bash rm -rf build`).
fn denial(d: &Value) -> String {
    let tool = d.get("tool_name").and_then(Value::as_str).unwrap_or("a tool");
    let input = &d["tool_input"];
    let what = ["file_path", "notebook_path", "command", "url", "path"].iter().find_map(|k| input.get(*k).and_then(Value::as_str));
    match what {
        Some(what) => short(&format!("{tool} {what}"), 120),
        None => tool.to_owned(),
    }
}

impl Reader {
    pub(super) fn claude(&mut self, line: &str) -> &'static str {
        let Ok(v) = serde_json::from_str::<Value>(line) else { return self.stderr(line) };
        match v.get("type").and_then(Value::as_str) {
            Some("assistant") => {
                let message = &v["message"];
                let id = message.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                let u = &message["usage"];
                // A 1-hour cache write costs more than a 5-minute one; lines without the split
                // count every write as 5-minute.
                let write = num(u, "cache_creation_input_tokens");
                let write_1h = u.pointer("/cache_creation/ephemeral_1h_input_tokens").and_then(Value::as_i64).unwrap_or(0).clamp(0, write);
                let tokens = Tokens {
                    input: num(u, "input_tokens"),
                    cache_write_5m: write - write_1h,
                    cache_write_1h: write_1h,
                    cache_read: num(u, "cache_read_input_tokens"),
                    output: num(u, "output_tokens"),
                };
                let model = real_model(message.get("model").and_then(Value::as_str));
                if model.is_some() {
                    self.assistant_model.clone_from(&model);
                }
                self.messages.insert(id, Message { model, tokens });
                if let Some(content) = message.get("content").and_then(Value::as_array) {
                    self.tool_calls += content.iter().filter(|c| c.get("type").and_then(Value::as_str) == Some("tool_use")).count() as i32;
                }
                "assistant"
            }
            Some("user") => "tool_result",
            Some("system") => {
                if v.get("subtype").and_then(Value::as_str) == Some("init") {
                    self.init_model = real_model(v.get("model").and_then(Value::as_str));
                }
                "system"
            }
            Some("result") => {
                // A result line without figures (Claude Code interrupted mid-stream prints
                // `error_during_execution` with no cost, usage or modelUsage) settles nothing:
                // what was counted before stays counted, and the messages stay priced.
                let settled = self.settle(&v);
                if settled.cost.is_some() {
                    self.settled = Some(settled);
                }
                // Cumulative for the session, like its figures: the last line's list holds.
                if let Some(denials) = v.get("permission_denials").and_then(Value::as_array) {
                    self.refused = denials.iter().map(denial).collect();
                }
                self.result = Some(v);
                "result"
            }
            _ => "other",
        }
    }

    /// The figures of a result line: tokens and cost summed over every model of `modelUsage`
    /// when it has any (a budget stop leaves `usage` all zeros; helper models appear only
    /// there), else `usage` and `total_cost_usd`.
    fn settle(&self, v: &Value) -> Settled {
        let models = v.get("modelUsage").and_then(Value::as_object).filter(|m| !m.is_empty());
        let (input, output, model_cost) = match models {
            Some(models) => models.values().fold((0, 0, 0.0), |(i, o, c), m| {
                (
                    i + num(m, "inputTokens") + num(m, "cacheReadInputTokens") + num(m, "cacheCreationInputTokens"),
                    o + num(m, "outputTokens"),
                    c + m.get("costUSD").and_then(Value::as_f64).unwrap_or(0.0),
                )
            }),
            None => {
                let u = &v["usage"];
                (num(u, "input_tokens") + num(u, "cache_creation_input_tokens") + num(u, "cache_read_input_tokens"), num(u, "output_tokens"), 0.0)
            }
        };
        let cost = v
            .get("total_cost_usd")
            .and_then(Value::as_f64)
            .or_else(|| models.map(|_| model_cost))
            .filter(|c| c.is_finite() && *c >= 0.0)
            .map(|c| (c * 1_000_000.0).round() / 1_000_000.0);
        let model = models.and_then(|m| self.main_model(m.iter().map(|(k, u)| (k.as_str(), u.get("costUSD").and_then(Value::as_f64).unwrap_or(0.0)))));
        Settled {
            cost,
            input,
            output,
            turns: v.get("num_turns").and_then(Value::as_i64).unwrap_or(0).clamp(0, i64::from(i32::MAX)) as i32,
            model,
            messages: self.messages.keys().cloned().collect(),
        }
    }

    /// The session's model among `modelUsage`'s: the only one; else the one asked for (a key
    /// that starts with the alias, `claude-sonnet-4-5` → `claude-sonnet-4-5-20250929`, or the
    /// alias's family, `sonnet`); else the init line's; else the one that cost most.
    fn main_model<'a>(&self, models: impl Iterator<Item = (&'a str, f64)>) -> Option<String> {
        let models: Vec<(&str, f64)> = models.filter(|(k, _)| real_model(Some(k)).is_some()).collect();
        if models.len() <= 1 {
            return models.first().map(|(k, _)| (*k).to_owned());
        }
        if let Some(asked) = self.requested_model.as_deref().map(str::to_ascii_lowercase) {
            let exact = models.iter().find(|(k, _)| k.to_ascii_lowercase() == asked || k.to_ascii_lowercase().starts_with(&format!("{asked}-")));
            let family = models.iter().find(|(k, _)| !asked.contains('-') && k.to_ascii_lowercase().split('-').any(|w| w == asked));
            if let Some((k, _)) = exact.or(family) {
                return Some((*k).to_owned());
            }
        }
        if let Some(init) = self.init_model.as_deref() {
            if let Some((k, _)) = models.iter().find(|(k, _)| *k == init) {
                return Some((*k).to_owned());
            }
        }
        models.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(k, _)| (*k).to_owned())
    }

    /// The price of a message: its own model, else the session's.
    fn estimate<'a>(&self, messages: impl Iterator<Item = &'a Message>) -> (f64, Basis) {
        let fallback = self.assistant_model.as_deref().or(self.init_model.as_deref()).or(self.requested_model.as_deref());
        messages.fold((0.0, Basis::PriceTable), |(usd, basis), m| {
            if m.tokens == Tokens::default() {
                return (usd, basis);
            }
            let (c, b) = self.prices.cost(m.model.as_deref().or(fallback), &m.tokens);
            (usd + c, basis.max(b))
        })
    }

    /// Claude Code's running totals: the last result line's figures plus the messages that came
    /// after it (all of them before the first result line).
    pub(super) fn claude_usage(&mut self) {
        let none = Settled::default();
        let settled = self.settled.as_ref().unwrap_or(&none);
        let live: Vec<&Message> = self.messages.iter().filter(|(id, _)| !settled.messages.contains(*id)).map(|(_, m)| m).collect();
        let (estimate, basis) = self.estimate(live.iter().copied());
        let input = settled.input + live.iter().map(|m| m.tokens.input + m.tokens.cache_write_5m + m.tokens.cache_write_1h + m.tokens.cache_read).sum::<i64>();
        let output = settled.output + live.iter().map(|m| m.tokens.output).sum::<i64>();
        let turns = settled.turns + live.len() as i32;
        let any = !self.messages.is_empty() || settled.cost.is_some();
        let estimated = any.then(|| ((settled.cost.unwrap_or(0.0) + estimate) * 1_000_000.0).round() / 1_000_000.0);
        let basis = any.then(|| if live.is_empty() { Basis::PriceTable } else { basis }.name().to_owned());
        let lower_bound = !live.is_empty();
        let cost = settled.cost;
        let model = settled.model.clone().or_else(|| self.assistant_model.clone()).or_else(|| self.init_model.clone()).or_else(|| self.requested_model.clone());
        let u = &mut self.usage;
        (u.input_tokens, u.output_tokens, u.turns, u.tool_calls) = (input, output, turns, self.tool_calls);
        (u.cost_usd, u.estimated_cost_usd, u.estimate_basis, u.output_tokens_lower_bound, u.model) = (cost, estimated, basis, lower_bound, model);
    }

    /// Why a Claude Code session failed, and the class of its failure; `None` for a success.
    pub(super) fn claude_failure(&self, exit: Exit, text: &str) -> Option<(String, &'static str)> {
        let Some(r) = self.result.as_ref() else { return Some((self.with_last_words(format!("no result line ({})", exit_reason(exit))), "ordinary")) };
        let subtype = r.get("subtype").and_then(Value::as_str);
        // `is_error` fails a `success` (an API error says `success` with it); an `error_…`
        // subtype fails whether or not the line says `is_error`.
        let is_error = r.get("is_error").and_then(Value::as_bool).unwrap_or(false);
        if !is_error && !subtype.is_some_and(|s| s.starts_with("error")) {
            return None;
        }
        let api_status = r.get("api_error_status").and_then(Value::as_i64);
        let first_error = r.get("errors").and_then(Value::as_array).and_then(|e| e.iter().find_map(Value::as_str)).map(|e| short(e, 150));
        Some(match (subtype, api_status) {
            (Some("error_max_turns"), _) => ("turn cap reached".into(), "ordinary"),
            (Some("error_max_budget_usd"), _) => (super::BUDGET_CAP.into(), "final"),
            // A request the API refuses (an unknown model, a bad key) is refused again:
            // final. Overload (529), rate limits (429) and 5xx may pass.
            (_, Some(status)) => {
                // Claude Code's answer is `API Error: 400 <the API's message>`: the words once.
                let said = text.trim().strip_prefix("API Error:").map_or(text, |rest| rest.trim_start().trim_start_matches(|c: char| c.is_ascii_digit()));
                let words = if said.trim().is_empty() { "the API refused the request".to_owned() } else { short(said, 150) };
                (format!("API error {status}: {words}"), refused_class(status))
            }
            (Some("error_during_execution"), _) => {
                (first_error.map_or_else(|| "error during execution".to_owned(), |e| format!("error during execution: {e}")), "ordinary")
            }
            _ => {
                let error = first_error.or_else(|| (!text.trim().is_empty()).then(|| short(text, 150)));
                (error.map_or_else(|| "harness error".to_owned(), |e| format!("harness error: {e}")), "ordinary")
            }
        })
    }
}
