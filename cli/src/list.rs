//! A page of a list, as the commands ask for it (`--limit`, `--cursor`) and print it.

use clap::Args;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::ClientError;
use super::http::{Answer, with_query};
use super::say;
use super::table::{Style, Table, Tint};

/// Prints a list the API answered: its bytes with `--json`, else a table of `headers` with the
/// row `row` makes of each item (or `nothing` when there is none) and where the next page
/// starts.
pub(crate) fn print_list<T: DeserializeOwned>(
    answer: &Answer, json: bool, headers: &[&'static str], nothing: &str, row: impl Fn(&T) -> Vec<(String, Tint)>,
) -> Result<u8, ClientError> {
    if json {
        say!("{}", answer.text());
        return Ok(0);
    }
    let list: Page<T> = answer.json()?;
    let mut t = Table::new(headers);
    for item in &list.items {
        t.row(row(item));
    }
    print_table(&t, Style::detect(), nothing, list.next_cursor.as_deref());
    Ok(0)
}

/// Prints a table, or says there is nothing, and where the next page starts.
pub(crate) fn print_table(table: &Table, style: Style, nothing: &str, next_cursor: Option<&str>) {
    if table.is_empty() {
        eprintln!("{nothing}");
    } else {
        for l in table.render(style) {
            say!("{l}");
        }
    }
    if let Some(c) = next_cursor {
        eprintln!("more: --cursor {c}");
    }
}

#[derive(Debug, Args)]
pub(crate) struct PageArgs {
    /// Page size, 1 to 200 (the server's default is 50).
    #[arg(long)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[arg(long)]
    cursor: Option<String>,
}

impl PageArgs {
    pub(crate) fn url(&self, url: reqwest::Url) -> reqwest::Url {
        let limit = self.limit.map(|l| l.to_string());
        with_query(url, &[("limit", limit.as_deref()), ("cursor", self.cursor.as_deref())])
    }
}

#[derive(Deserialize)]
pub(crate) struct Page<T> {
    pub items: Vec<T>,
    #[serde(default)]
    pub next_cursor: Option<String>,
}
