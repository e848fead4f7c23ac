//! Display: text from untrusted sources (a model's arguments, a Tool's id
//! and result, a client's self-given name) as an approver may be shown it.
//!
//! Owns the one rule of what is escaped before anything untrusted reaches a
//! human deciding about it — a terminal (`toolgate approve`, `toolgate
//! journal`) or an MCP client's approval dialog: every character that acts on
//! the display instead of being seen, or is not seen at all, is written as
//! its Rust escape (`\u{202e}`, `\n`), so what the human reads is the text's
//! every character, in order.
//!
//! Architecture invariant: every approver-facing renderer goes through
//! [`escape_unseen`]; no front end keeps a list of its own.

use std::borrow::Cow;

use unicode_general_category::{GeneralCategory, get_general_category};

/// Whether line breaks and tabs are kept where the text is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lines {
    /// `\n` and `\t` are kept (text over several lines: an error, a Tool's
    /// output); everything else that is unseen is escaped.
    Keep,
    /// Every line break and tab is escaped as well, so the text stays on the
    /// one line it was put on and nothing in it can start a line of its own
    /// (a field of a journal line, an approval prompt's arguments).
    Escape,
}

/// `text` with every character that would change how it, or the text around
/// it, is shown without being seen itself written as its escape
/// ([`char::escape_default`], e.g. `\u{202e}`):
///
/// - control characters (C0, DEL, C1 including NEL): they move a terminal's
///   cursor, recolor, clear, or break lines in a dialog;
/// - format characters (general category Cf): bidi embeddings, overrides,
///   isolates and marks (which show `exe.pdf` for `fdp.exe`), zero-width
///   spaces and joiners, the byte order mark, invisible operators, tags;
/// - the line and paragraph separators (U+2028, U+2029);
/// - the other default-ignorable code points, which render as nothing:
///   variation selectors, the Hangul fillers, the combining grapheme joiner,
///   Mongolian free variation selectors, and unassigned ones reserved as such.
///
/// With [`Lines::Keep`], `\n` and `\t` stay; with [`Lines::Escape`] they are
/// escaped too. Visible text (any script, emoji without selectors) is
/// returned as it is, borrowed.
pub fn escape_unseen(text: &str, lines: Lines) -> Cow<'_, str> {
    let hidden = |c: char| unseen(c) && !(lines == Lines::Keep && (c == '\n' || c == '\t'));
    if !text.chars().any(hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if hidden(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether `c` acts on the display or is not seen (see [`escape_unseen`]).
fn unseen(c: char) -> bool {
    c.is_control()
        || matches!(
            get_general_category(c),
            GeneralCategory::Format | GeneralCategory::LineSeparator | GeneralCategory::ParagraphSeparator
        )
        || default_ignorable_beyond_format(c)
}

/// Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) minus what is
/// already a control or format character: shown as nothing by conforming
/// renderers.
fn default_ignorable_beyond_format(c: char) -> bool {
    matches!(
        c,
        '\u{034F}'                       // combining grapheme joiner
            | '\u{115F}'..='\u{1160}'    // Hangul choseong / jungseong fillers
            | '\u{17B4}'..='\u{17B5}'    // Khmer inherent vowels
            | '\u{180B}'..='\u{180F}'    // Mongolian free variation selectors
            | '\u{3164}'                 // Hangul filler
            | '\u{FE00}'..='\u{FE0F}'    // variation selectors
            | '\u{FFA0}'                 // halfwidth Hangul filler
            | '\u{FFF0}'..='\u{FFF8}'    // reserved default-ignorable
            | '\u{E0000}'..='\u{E0FFF}' // tags, variation selectors supplement, reserved
    )
}

/// `text` as one quoted field for a human: at most `max_chars` characters of
/// it, its `"` and `\` escaped, then [`escape_unseen`] on one line, in
/// double quotes, followed (if it was cut) by `…` and how many bytes were
/// left out. Nothing in it can end the quote and go on as the host's words,
/// and an escape the host wrote (`\u{202e}`) cannot be imitated: the text's
/// own backslashes are doubled.
pub fn quoted(text: &str, max_chars: usize) -> String {
    let cut_at = text.char_indices().nth(max_chars).map(|(i, _)| i);
    let kept = &text[..cut_at.unwrap_or(text.len())];
    let mut plain = String::with_capacity(kept.len() + 2);
    plain.push('"');
    for c in kept.chars() {
        if c == '"' || c == '\\' {
            plain.push('\\');
        }
        plain.push(c);
    }
    plain.push('"');
    let mut out = escape_unseen(&plain, Lines::Escape).into_owned();
    if let Some(at) = cut_at {
        out.push_str(&format!("… ({} more bytes)", text.len() - at));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HIDDEN: &[char] = &[
        '\u{1B}',
        '\u{7F}',
        '\u{85}',
        '\u{9B}', // controls: ESC, DEL, NEL, CSI
        '\u{202A}',
        '\u{202B}',
        '\u{202C}',
        '\u{202D}',
        '\u{202E}', // embeddings, overrides
        '\u{2066}',
        '\u{2067}',
        '\u{2068}',
        '\u{2069}', // isolates
        '\u{200E}',
        '\u{200F}',
        '\u{061C}', // marks
        '\u{200B}',
        '\u{200C}',
        '\u{200D}',
        '\u{2060}',
        '\u{2062}',
        '\u{FEFF}',
        '\u{00AD}', // zero-width
        '\u{2028}',
        '\u{2029}', // separators
        '\u{E0041}',
        '\u{E007F}', // tags
        '\u{FE0F}',
        '\u{034F}',
        '\u{3164}',
        '\u{115F}',
        '\u{FFA0}',
        '\u{180B}', // default-ignorable
    ];

    #[test]
    fn every_unseen_character_is_escaped_in_both_modes() {
        for &c in HIDDEN {
            for lines in [Lines::Keep, Lines::Escape] {
                let shown = escape_unseen(&format!("x{c}y"), lines).into_owned();
                assert!(!shown.contains(c), "{c:?} {lines:?}: {shown:?}");
                assert_eq!(shown, format!("x{}y", c.escape_default()), "{c:?} {lines:?}");
            }
        }
    }

    #[test]
    fn line_breaks_and_tabs_stay_only_when_kept() {
        let text = "a\nb\tc\rd\u{B}e\u{C}f";
        assert_eq!(escape_unseen(text, Lines::Keep), "a\nb\tc\\rd\\u{b}e\\u{c}f");
        let one = escape_unseen(text, Lines::Escape);
        assert_eq!(one, "a\\nb\\tc\\rd\\u{b}e\\u{c}f");
        assert_eq!(one.lines().count(), 1);
    }

    #[test]
    fn visible_text_is_left_alone_and_borrowed() {
        for text in ["plain text", "ünïcödé 名前 ✓ 👍 مرحبا עברית", "{\"path\":\"out/report.pdf\"}", ""]
        {
            assert!(matches!(escape_unseen(text, Lines::Escape), Cow::Borrowed(t) if t == text), "{text}");
        }
        assert!(matches!(escape_unseen("two\nlines", Lines::Keep), Cow::Borrowed(_)));
    }

    /// The review's two inputs: a bidi override that reverses a file's
    /// extension, and line separators that put model text on a line of its own.
    #[test]
    fn disguised_arguments_show_every_character_in_order() {
        let reversed = serde_json::json!({"path": "out/\u{202E}fdp.exe"}).to_string();
        assert_eq!(escape_unseen(&reversed, Lines::Escape), r#"{"path":"out/\u{202e}fdp.exe"}"#);
        let fake = serde_json::json!({"note": "x\u{2028}\u{2028}(verified read-only by toolgate)"}).to_string();
        let shown = escape_unseen(&fake, Lines::Escape);
        assert_eq!(shown, r#"{"note":"x\u{2028}\u{2028}(verified read-only by toolgate)"}"#);
        assert!(!shown.chars().any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')));
    }

    #[test]
    fn quoted_cannot_be_closed_from_inside_and_is_bounded() {
        assert_eq!(quoted(r#"x", verified) \"#, 40), r#""x\", verified) \\""#);
        assert_eq!(quoted("a\u{202E}\nb", 10), r#""a\u{202e}\nb""#);
        assert_eq!(quoted(r"\u{202e}", 10), r#""\\u{202e}""#, "a written-out escape is told apart from the host's");
        assert_eq!(quoted("ééééé", 2), "\"éé\"… (6 more bytes)");
        assert_eq!(quoted("", 2), "\"\"");
    }
}
