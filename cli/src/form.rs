//! An approval's form on the command line: its fields as the API describes them
//! (`{type, required, options, default, description}`), `name=value` arguments typed by the
//! form, and asking each missing field in turn, showing its type, options and default.
//!
//! The server checks the answer again (a missing required field is refused and the run keeps
//! waiting); the checks here only save a round trip and say what is wanted.

use serde_json::{Map, Value};

use super::error::ClientError;

/// One field of a form.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    pub name: String,
    /// `string`, `number`, `boolean` or `choice`.
    pub kind: String,
    pub required: bool,
    pub options: Vec<Value>,
    pub default: Option<Value>,
    pub description: Option<String>,
}

/// The fields of a form, in the order the API lists them.
pub(crate) fn fields(form: &Value) -> Vec<Field> {
    let Some(map) = form.as_object() else { return Vec::new() };
    map.iter()
        .map(|(name, spec)| Field {
            name: name.clone(),
            kind: spec.get("type").and_then(Value::as_str).unwrap_or("string").to_owned(),
            required: spec.get("required").and_then(Value::as_bool).unwrap_or(false),
            options: spec.get("options").and_then(Value::as_array).cloned().unwrap_or_default(),
            default: spec.get("default").filter(|d| !d.is_null()).cloned(),
            description: spec.get("description").and_then(Value::as_str).map(str::to_owned),
        })
        .collect()
}

/// A JSON value as a person types it: strings bare, everything else as JSON.
pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Field {
    /// `ticket (string, required)`, `size (choice: small|large, default small)`.
    pub(crate) fn describe(&self) -> String {
        let mut parts = vec![if self.kind == "choice" && !self.options.is_empty() {
            format!("choice: {}", self.options.iter().map(show).collect::<Vec<_>>().join("|"))
        } else if self.kind == "boolean" {
            "boolean: yes|no".to_owned()
        } else {
            self.kind.clone()
        }];
        if self.required {
            parts.push("required".into());
        }
        if let Some(d) = &self.default {
            parts.push(format!("default {}", show(d)));
        }
        format!("{} ({})", self.name, parts.join(", "))
    }

    /// A typed value from what was typed; `Err` says what is wanted.
    pub(crate) fn parse(&self, text: &str) -> Result<Value, String> {
        let text = text.trim();
        match self.kind.as_str() {
            "number" => match serde_json::from_str::<Value>(text) {
                Ok(v @ Value::Number(_)) => Ok(v),
                _ => Err(format!("{} must be a number", self.name)),
            },
            "boolean" => match text.to_ascii_lowercase().as_str() {
                "y" | "yes" | "true" | "1" => Ok(Value::Bool(true)),
                "n" | "no" | "false" | "0" => Ok(Value::Bool(false)),
                _ => Err(format!("{} must be yes or no", self.name)),
            },
            "choice" => self
                .options
                .iter()
                .find(|o| show(o) == text)
                .cloned()
                .ok_or_else(|| format!("{} must be one of {}", self.name, self.options.iter().map(show).collect::<Vec<_>>().join(", "))),
            _ => Ok(Value::String(text.to_owned())),
        }
    }
}

/// Splits `name=value` arguments.
pub(crate) fn pairs(args: &[String], flag: &str) -> Result<Vec<(String, String)>, ClientError> {
    args.iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
            _ => Err(ClientError::Usage(format!("{flag} takes name=value, not `{a}`"))),
        })
        .collect()
}

/// The answer from `--field name=value` arguments, each typed by its field. A name the form
/// does not have is sent as text, and the server says so.
pub(crate) fn given(fields: &[Field], args: &[String]) -> Result<Map<String, Value>, ClientError> {
    let mut answer = Map::new();
    for (name, text) in pairs(args, "--field")? {
        let value = match fields.iter().find(|f| f.name == name) {
            Some(f) => f.parse(&text).map_err(ClientError::Usage)?,
            None => Value::String(text),
        };
        answer.insert(name, value);
    }
    Ok(answer)
}

/// `--input name=value`: a value that reads as JSON (`5`, `true`, `{"a":1}`, `"quoted"`) is
/// that JSON; anything else is text.
pub(crate) fn input(args: &[String]) -> Result<Map<String, Value>, ClientError> {
    let mut map = Map::new();
    for (name, text) in pairs(args, "--input")? {
        let value = serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text));
        map.insert(name, value);
    }
    Ok(map)
}

/// Where the questions are asked: a plain terminal, or `runs follow`'s raw-mode screen.
pub(crate) trait Prompt {
    /// Shows `question` and reads one line; `None` when the person gave up (end of input,
    /// Esc, Ctrl-C).
    async fn line(&mut self, question: &str) -> Option<String>;
    /// Shows a line of text.
    fn note(&mut self, text: &str);
}

/// Asks each field not already answered, in turn. An empty line keeps the default (or leaves
/// an optional field out); a required field without a default is asked again. `None` when the
/// person gave up.
pub(crate) async fn ask(fields: &[Field], answer: &mut Map<String, Value>, prompt: &mut impl Prompt) -> Option<()> {
    let missing: Vec<&Field> = fields.iter().filter(|f| !answer.contains_key(&f.name)).collect();
    for field in missing {
        if let Some(d) = &field.description {
            prompt.note(&format!("  {d}"));
        }
        loop {
            let text = prompt.line(&format!("{}: ", field.describe())).await?;
            if text.trim().is_empty() {
                if field.required && field.default.is_none() {
                    prompt.note(&format!("  {} is required", field.name));
                    continue;
                }
                break;
            }
            match field.parse(&text) {
                Ok(v) => {
                    answer.insert(field.name.clone(), v);
                    break;
                }
                Err(why) => prompt.note(&format!("  {why}")),
            }
        }
    }
    Some(())
}

/// Questions on a terminal in its ordinary (cooked) mode: asked on standard error, answered on
/// standard input.
pub(crate) struct Terminal;

impl Prompt for Terminal {
    async fn line(&mut self, question: &str) -> Option<String> {
        use std::io::Write as _;
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "{question}");
        let _ = err.flush();
        drop(err);
        let read = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            match std::io::stdin().read_line(&mut line) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(line.trim_end_matches(['\r', '\n']).to_owned()),
            }
        });
        read.await.ok().flatten()
    }

    fn note(&mut self, text: &str) {
        eprintln!("{text}");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fields_are_typed_from_what_is_typed() {
        let form = json!({
            "ticket": { "type": "string", "required": true },
            "size": { "type": "choice", "options": ["small", "large"], "default": "small" },
            "ship": { "type": "boolean" },
            "hours": { "type": "number" }
        });
        let f = fields(&form);
        let get = |n: &str| f.iter().find(|x| x.name == n).unwrap().clone();
        assert_eq!(get("ticket").describe(), "ticket (string, required)");
        assert_eq!(get("size").describe(), "size (choice: small|large, default small)");
        assert_eq!(get("size").parse("large"), Ok(json!("large")));
        assert!(get("size").parse("huge").unwrap_err().contains("small, large"));
        assert_eq!(get("ship").parse("Yes"), Ok(json!(true)));
        assert_eq!(get("hours").parse("2.5"), Ok(json!(2.5)));
        assert!(get("hours").parse("two").is_err());
        let answer = given(&f, &["hours=3".into(), "other=x".into()]).unwrap();
        assert_eq!(Value::Object(answer), json!({ "hours": 3, "other": "x" }));
        assert!(matches!(given(&f, &["hours".into()]), Err(ClientError::Usage(_))));
        assert_eq!(Value::Object(input(&["n=5".into(), "s=text".into(), "b=true".into()]).unwrap()), json!({ "n": 5, "s": "text", "b": true }));
    }
}
