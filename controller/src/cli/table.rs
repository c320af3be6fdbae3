//! Output of the people-facing commands: a plain-text table, or JSON (`-o json`).

use serde::Serialize;

/// How a command prints what it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns, for people.
    #[default]
    Table,
    /// One JSON document, for scripts.
    Json,
}

/// Prints `value` as pretty JSON.
pub fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Lays out `rows` under `header` in columns separated by two spaces; `-` stands for nothing.
///
/// ```
/// use cojob_controller::cli::table::render;
/// let text = render(&["A", "LONGER"], &[vec!["xyz".into(), String::new()]]);
/// assert_eq!(text, "A    LONGER\nxyz  -\n");
/// ```
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let cell = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, c) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell(c).chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<String>| {
        let last = cells.len().saturating_sub(1);
        for (i, c) in cells.iter().enumerate() {
            out.push_str(c);
            if i < last {
                let pad = widths[i] - c.chars().count() + 2;
                out.push_str(&" ".repeat(pad));
            }
        }
        out.push('\n');
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row.iter().map(|c| cell(c)).collect());
    }
    out
}
