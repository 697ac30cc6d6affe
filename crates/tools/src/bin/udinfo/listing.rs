//! Text and parsable output: sections, aligned rows, wrapped help.

use std::fmt::Display;
use std::io::{self, BufWriter, Write};

use udbtl_btl::params::Source;

/// Help lines are wrapped to this many characters.
pub(crate) const HELP_WIDTH: usize = 76;

/// Where the listing goes, and in which form.
pub(crate) struct Listing<'a> {
    pub(crate) out: BufWriter<io::StdoutLock<'a>>,
    pub(crate) parsable: bool,
    /// Headings written so far.
    pub(crate) sections: usize,
}

impl Listing<'_> {
    /// A section heading, after a blank line unless it is the first.
    pub(crate) fn heading(&mut self, title: &str, detail: &str) -> io::Result<()> {
        if self.sections > 0 {
            writeln!(self.out)?;
        }
        self.sections += 1;
        writeln!(self.out, "{title}  ({detail})")
    }

    pub(crate) fn line(&mut self, text: &str) -> io::Result<()> {
        writeln!(self.out, "{text}")
    }

    /// A parsable line: the keys, then the value, `:`-separated.
    pub(crate) fn field(&mut self, keys: &[&str], value: impl Display) -> io::Result<()> {
        writeln!(self.out, "{}:{value}", keys.join(":"))
    }

    /// Writes rows as columns two spaces apart; the last column is not
    /// padded. A row's notes follow it on their own lines.
    pub(crate) fn table(&mut self, rows: &[Row]) -> io::Result<()> {
        let mut widths: Vec<usize> = Vec::new();
        for row in rows {
            for (i, cell) in row.cells.iter().enumerate() {
                let len = cell.chars().count();
                match widths.get_mut(i) {
                    Some(width) => *width = (*width).max(len),
                    None => widths.push(len),
                }
            }
        }
        for row in rows {
            let mut line = " ".repeat(row.indent);
            for (i, cell) in row.cells.iter().enumerate() {
                if i + 1 == row.cells.len() {
                    line.push_str(cell);
                } else {
                    let width = widths.get(i).copied().unwrap_or(0);
                    line.push_str(&format!("{cell:<width$}  "));
                }
            }
            writeln!(self.out, "{}", line.trim_end())?;
            for note in &row.notes {
                writeln!(self.out, "{}{note}", " ".repeat(row.indent + 4))?;
            }
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// One line of a table, with notes printed under it.
pub(crate) struct Row {
    pub(crate) cells: Vec<String>,
    pub(crate) notes: Vec<String>,
    pub(crate) indent: usize,
}

impl Row {
    pub(crate) fn new<S: ToString>(cells: impl IntoIterator<Item = S>) -> Self {
        Self {
            cells: cells.into_iter().map(|c| c.to_string()).collect(),
            notes: Vec::new(),
            indent: 2,
        }
    }

    pub(crate) fn note(mut self, text: impl Into<String>) -> Self {
        self.notes.push(text.into());
        self
    }

    pub(crate) const fn indent(mut self, indent: usize) -> Self {
        self.indent = indent;
        self
    }
}

/// Splits `text` into lines of at most `width` characters at spaces (a
/// longer word gets a line of its own).
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// How a listing names where a parameter's value came from.
pub(crate) const fn source(source: Source) -> &'static str {
    match source {
        Source::Default => "default",
        Source::Config => "config",
        Source::Environment => "environment",
    }
}
