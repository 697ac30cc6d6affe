//! The README shows the API example whole: the text a newcomer copies is
//! the program a test compiles and runs under udrun
//! (`crates/tools/tests/api_example.rs`).

#[test]
fn the_readme_shows_the_ring_example_as_it_is() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap_or_default();
    let ring = std::fs::read_to_string(format!("{root}/crates/udbtl/examples/ring.rs"))
        .unwrap_or_default();
    assert!(!ring.is_empty(), "examples/ring.rs is missing");
    assert!(
        readme.contains(&format!("```rust\n{ring}```")),
        "README.md must show crates/udbtl/examples/ring.rs whole, in a ```rust block"
    );
}
