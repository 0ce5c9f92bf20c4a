//! Tests of parsing and validation against the fixtures in `engine/tests/fixtures/workflows`,
//! and of expression evaluation, template rendering and the `validate` report.

use std::path::PathBuf;

use super::parse;

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/workflows").join(name)
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(fixture_path(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

#[test]
fn dump() {
    for name in std::fs::read_dir(fixture_path("")).unwrap() {
        let name = name.unwrap().file_name().into_string().unwrap();
        println!("== {name}");
        match parse(&fixture(&name)) {
            Ok(d) => println!("OK {d:#?}"),
            Err(ps) => for p in ps { println!("{}:{}: {p}", p.line, p.col) },
        }
    }
}
