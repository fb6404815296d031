//! Byte offsets in a plan file turned into `line:column` and a source snippet.

/// A 1-based line and column (in characters) of byte `offset` in `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = text[line_start..offset].chars().count() + 1;
    (line, col)
}

/// The source line holding byte `offset`, with a caret under its column:
///
/// ```text
///    |
///  3 | stage = = 3
///    |         ^
/// ```
pub fn snippet(text: &str, offset: usize) -> String {
    let (line, col) = line_col(text, offset);
    let source = text.lines().nth(line - 1).unwrap_or("");
    let number = line.to_string();
    let pad = " ".repeat(number.len());
    let caret_pad: String = source
        .chars()
        .take(col - 1)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    format!("{pad} |\n{number} | {source}\n{pad} | {caret_pad}^")
}

/// For an error at byte `offset`: the 1-based index of the `[[job]]` table it lies in
/// (if any), and the key the line starts with (if it is a `key = value` line).
pub fn job_and_key(text: &str, offset: usize) -> (Option<usize>, Option<String>) {
    let (line, _) = line_col(text, offset);
    let lines: Vec<&str> = text.lines().collect();
    let headers = lines
        .iter()
        .take(line)
        .filter(|l| l.replace(' ', "").starts_with("[[job]]"))
        .count();
    let key = lines.get(line - 1).and_then(|l| {
        let (key, _) = l.split_once('=')?;
        let key = key.trim().trim_matches('"');
        (!key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then(|| key.to_owned())
    });
    ((headers > 0).then_some(headers), key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_become_lines_and_columns() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 4), (1, 5));
        assert_eq!(line_col(text, 6), (2, 1));
        // Columns count characters, not bytes: "é" is two bytes.
        assert_eq!(line_col(text, 10), (2, 4));
        assert_eq!(line_col(text, 999), (3, 1));
    }

    #[test]
    fn errors_are_placed_in_their_job_and_key() {
        let text = "on_failure = 1\n[[job]]\ncommand = \"a\"\n\n[[ job ]]\npriority = \"x\"\n";
        assert_eq!(job_and_key(text, 2), (None, Some("on_failure".into())));
        assert_eq!(job_and_key(text, 16), (Some(1), None));
        let at = text.find("\"x\"").unwrap();
        assert_eq!(job_and_key(text, at), (Some(2), Some("priority".into())));
    }

    #[test]
    fn snippet_points_at_the_column() {
        let text = "x = 1\nstage = = 3\n";
        assert_eq!(snippet(text, 14), "  |\n2 | stage = = 3\n  |         ^");
    }
}
