//! A page of a list, as the commands ask for it (`--limit`, `--cursor`) and print it.

use clap::Args;
use serde::Deserialize;

use super::http::with_query;
use super::say;
use super::table::{Style, Table};

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
    pub(crate) items: Vec<T>,
    #[serde(default)]
    pub(crate) next_cursor: Option<String>,
}
